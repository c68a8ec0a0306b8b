"""``pathprobe load``: a Locust run with per-request segment accounting.

Every argument goes to Locust (``-u``, ``-r``, ``-t``, ``--headless``, ``-H``,
``--master``/``--worker``, ...) with pathprobe's locustfile and flags (``--out``,
``--stream``, ``--arrival``, ...; see ``pathprobe load --help``). Locust runs in a child
process (SIGINT/SIGTERM are forwarded), so gevent's monkey patching never touches the
caller. ``--sweep 1,4,16,64`` runs one Locust run per concurrency and writes
``sweep.json`` next to the per-run folders.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

from pathprobe import environment
from pathprobe.errors import ConfigError

LOCUSTFILE = str(Path(__file__).with_name("locustfile.py"))


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "load",
        add_help=False,
        help="a Locust run against grpc://, http://, openai+http:// or ollama+http:// with per-request segment split",
        description=__doc__,
        prefix_chars="\x00",  # every token belongs to Locust; parsed below
    )
    p.add_argument("locust_args", nargs=argparse.REMAINDER)
    p.set_defaults(func=run)


def _opt_value(args: Sequence[str], *names: str) -> str | None:
    """Last value of an option given as ``-x V``, ``--xx V``, ``--xx=V`` or ``-xV``."""
    val = None
    i = 0
    while i < len(args):
        a = args[i]
        for n in names:
            if a == n and i + 1 < len(args):
                val = args[i + 1]
                i += 1
                break
            if n.startswith("--") and a.startswith(n + "="):
                val = a.split("=", 1)[1]
                break
            if not n.startswith("--") and a.startswith(n) and len(a) > len(n) and not a.startswith("--"):
                val = a[len(n) :]
                break
        i += 1
    return val


def _without(args: Sequence[str], *names: str) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        hit = False
        for n in names:
            if a == n:
                i += 2
                hit = True
                break
            if (n.startswith("--") and a.startswith(n + "=")) or (
                not n.startswith("--") and a.startswith(n) and len(a) > len(n) and not a.startswith("--")
            ):
                i += 1
                hit = True
                break
        if not hit:
            out.append(a)
            i += 1
    return out


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def validate(args: Sequence[str]) -> None:
    """Catch the common mistakes before Locust starts (errors name the flag)."""
    from pathprobe.loadgen.targets import parse_host

    if any(a in ("-h", "--help", "-V", "--version", "--worker", "-l", "--list") for a in args):
        return
    host = _opt_value(args, "-H", "--host") or environment.get(environment.LOCUST_HOST)
    if host:
        kind, _ = parse_host(host)
        if kind == "openai-sdk" and not _installed("openai"):
            raise ConfigError(
                f"host: {host} goes through the official openai SDK, which is not installed "
                "(pip install openai, or 'pathprobe[loadgen]'); openai+http:// needs no SDK"
            )
    elif ("--headless" in args or "--autostart" in args) and _opt_value(args, "-f", "--locustfile", "--config") is None:
        raise ConfigError(
            "host: give the target with -H/--host: grpc://HOST:PORT, http://HOST:PORT or openai+http://HOST:PORT"
        )
    pf = _opt_value(args, "--prompt-file")
    if pf and not os.path.isfile(pf):
        raise ConfigError(f"prompt-file: no such file: {pf}")
    _check_config(args)
    _check_tokenizer(_opt_value(args, "--tokenizer"))


def _check_tokenizer(spec: str | None) -> None:
    """``tiny`` / ``none`` / ``preset:NAME`` / an existing folder (checked here, before Locust starts)."""
    if spec is None or spec in ("tiny", "none", ""):
        return
    from pathprobe import models

    if spec.startswith("preset:"):
        name = spec.split(":", 1)[1]
        try:
            built = (models.preset_dir(name) / "tokenizer.json").is_file()
        except ConfigError as exc:
            raise ConfigError(f"tokenizer: {exc.message}") from None
        if not built and not _installed("transformers"):
            raise ConfigError(
                f"tokenizer: building {spec}'s tokenizer needs transformers "
                "(pip install 'pathprobe[server]'), or use --tokenizer tiny or none"
            )
        return
    if not os.path.isdir(spec):
        raise ConfigError(f"tokenizer: {spec!r} is not tiny, none, preset:NAME or an existing model folder")


# ``python -m locust``, named ``pathprobe load`` in Locust's usage and error messages
_LOCUST_MAIN = "import sys; sys.argv[0] = 'pathprobe load'; from locust.main import main; main()"


def locust_command(args: Sequence[str]) -> list[str]:
    cmd = [sys.executable, "-c", _LOCUST_MAIN]
    if _opt_value(args, "-f", "--locustfile") is None:
        cmd += ["-f", LOCUSTFILE]
    return cmd + list(args)


def _run_child(cmd: list[str], env: dict[str, str] | None = None) -> int:
    proc = subprocess.Popen(cmd, env=env)

    def forward(signum: int, _frame: FrameType | None) -> None:
        if proc.poll() is None:
            proc.send_signal(signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while True:
            try:
                return proc.wait()
            except KeyboardInterrupt:  # pragma: no cover - forwarded above
                continue
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def run(ns: argparse.Namespace) -> int:
    args = list(ns.locust_args or [])
    if args and args[0] == "--":
        args = args[1:]
    if not _installed("locust"):
        raise ModuleNotFoundError("No module named 'locust'", name="locust")  # named by the CLI, with its extra
    if any(a in ("-h", "--help") for a in args):
        rc = _run_child(locust_command(args))
        print_pathprobe_help()
        return rc
    validate(args)
    sweep = _opt_value(args, "--sweep")
    if not sweep:
        return _run_child(locust_command(args))
    return run_sweep(args, sweep)


class _HelpParser(argparse.ArgumentParser):
    def add_argument(self, *args: Any, **kwargs: Any) -> Any:  # drop Locust-only keywords
        kwargs.pop("include_in_web_ui", None)
        return super().add_argument(*args, **kwargs)


class _FlagParser(_HelpParser):
    """pathprobe's flags alone, picked out of a Locust command line (the rest is Locust's)."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(message)


def _check_config(args: Sequence[str]) -> None:
    """Build the run's :class:`~pathprobe.loadgen.config.Config` from the flags and environment,
    as each Locust process will: its checks fail here, before Locust starts."""
    from pathprobe.loadgen.config import Config
    from pathprobe.loadgen.flags import add_arguments

    parser = _FlagParser(add_help=False, allow_abbrev=False)
    add_arguments(parser)
    cfg = Config.from_options(parser.parse_known_args(list(args))[0])
    from pathprobe.loadgen.datasets import check_inputs

    check_inputs(cfg.trace, cfg.trace_format, cfg.prompt_set, cfg.prompt_file, cfg.corpus)


def print_pathprobe_help() -> None:
    from pathprobe.loadgen.flags import add_arguments

    p = _HelpParser(
        prog="pathprobe load",
        add_help=False,
        usage=argparse.SUPPRESS,
        description="pathprobe options (with Locust's options above; host: grpc://HOST:PORT, "
        "http://HOST:PORT, openai+http://HOST:PORT or ollama+http://HOST:PORT):",
    )
    add_arguments(p)
    print()
    p.print_help()


def run_sweep(args: list[str], sweep: str) -> int:
    from pathprobe.loadgen.prompts import parse_int_list

    levels = parse_int_list(sweep, "sweep")
    if _opt_value(args, "-t", "--run-time") is None:
        raise ConfigError("sweep: give each run a duration with -t/--run-time (e.g. -t 20s)")
    if "--headless" not in args:
        args = [*args, "--headless"]
    out = _opt_value(args, "--out") or "pathprobe-load"
    base = _without(args, "--sweep", "-u", "--users", "-r", "--spawn-rate", "--out")
    env = {**os.environ, environment.PATHPROBE_SWEEP_CHILD: "1"}
    runs: dict[str, Any] = {}
    worst = 0
    for n in levels:
        sub = os.path.join(out, f"u{n}")
        print(f"pathprobe load: sweep {n} users -> {sub}", flush=True)
        rc = _run_child(locust_command([*base, "-u", str(n), "-r", str(n), "--out", sub]), env)
        worst = max(worst, rc)
        path = os.path.join(sub, "summary.json")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as fh:
                runs[str(n)] = json.load(fh)
        else:
            runs[str(n)] = {"error": f"run exited with {rc} and wrote no summary"}
        if rc < 0 or rc > 1:  # 1 = some requests failed (Locust's convention); keep sweeping
            break
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "sweep.json"), "w", encoding="utf-8") as fh:
        json.dump({"users": levels, "runs": runs}, fh, indent=2)
    print(format_sweep(levels, runs))
    return worst


def format_sweep(levels: Sequence[int], runs: dict[str, Any]) -> str:
    cols = ("e2e", "network", "serialization", "queueing", "inference", "ttft")
    head = f"{'users':>6}{'route':>24}{'req/s':>9}" + "".join(f"{c + ' p50':>19}" for c in cols) + f"{'e2e p99':>11}"
    lines = ["pathprobe load: concurrency sweep (ms)", head]
    for n in levels:
        s = runs.get(str(n)) or {}
        for route, rs in (s.get("routes") or {}).items():
            m = rs.get("metrics", {})
            cells = "".join(f"{(m.get(c) or {}).get('p50', float('nan')):>19.3f}" for c in cols)
            p99 = (m.get("e2e") or {}).get("p99", float("nan"))
            lines.append(f"{n:>6}{route:>24}{(rs.get('rps') or 0):>9.1f}{cells}{p99:>11.3f}")
        if "error" in s:
            lines.append(f"{n:>6}  {s['error']}")
        client = s.get("client") or {}
        if client.get("saturated"):
            lines.append(
                f"{n:>6}  WARNING: client saturated at {n} users ({client.get('reason')}): network hop 1 "
                "includes client-side waiting; use --processes N or more workers"
            )
    return "\n".join(lines)
