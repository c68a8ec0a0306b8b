"""The ``pathprobe`` command: one verb per job.

Each verb lives in its own module exposing ``register(subparsers)``; those modules
import nothing heavy at import time, so ``pathprobe --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from pathprobe import __version__
from pathprobe.errors import PathprobeError

# verb -> module that registers it
VERBS = {
    "serve": "pathprobe.server.cli",
    "gateway": "pathprobe.gateway.cli",
    "load": "pathprobe.loadgen.cli",
    "compare": "pathprobe.analysis.lab.compare_cli",
    "analyze": "pathprobe.analysis.report.analyze_cli",
    "netem": "pathprobe.netem.cli",
    "make-model": "pathprobe.models",
}

#: verb -> the extra that installs what it needs (``pip install 'pathprobe[EXTRA]'``)
EXTRAS = {
    "serve": "server",
    "make-model": "server",
    "gateway": "gateway",
    "load": "loadgen",
    "compare": "all",
    "analyze": "analysis",
    "netem": "gateway",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pathprobe", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"pathprobe {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    for module in VERBS.values():
        try:
            importlib.import_module(module).register(sub)
        except ModuleNotFoundError as exc:  # a verb whose module is not written yet
            if exc.name != module:
                raise
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except PathprobeError as exc:
        print(f"pathprobe {args.verb}: error: {exc.message}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:  # a component installed without its extra
        if not exc.name or exc.name.split(".")[0] == "pathprobe":
            raise
        extra = EXTRAS.get(args.verb, "all")
        print(
            f"pathprobe {args.verb}: error: needs {exc.name.split('.')[0]}, which this install lacks: "
            f"pip install 'pathprobe[{extra}]'",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader went away (`pathprobe load --help | head`): no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's own flush at exit
        return 1


if __name__ == "__main__":
    sys.exit(main())
