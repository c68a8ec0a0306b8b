"""``pathprobe compare [CONFIG.yaml]``: gateway configurations side by side under identical load.

Without a config file the built-in defaults are used (the same as configs/default.yaml:
the tiny model, every gateway mode, nginx when installed). Flags override the file.
Prints a Markdown table and writes OUT/report.json, OUT/report.html, OUT/report.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from pathprobe.errors import ConfigError

HELP = "run a matrix of gateway configurations under identical load and report side by side"


def _csv_ints(flag: str):
    def parse(text: str) -> list[int]:
        try:
            vals = [int(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
        if not vals:
            raise argparse.ArgumentTypeError("empty list")
        return vals

    return parse


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "compare", help=HELP, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("config", nargs="?", help="YAML config (see configs/default.yaml)")
    p.add_argument("--out", help="output folder (default: pathprobe-compare)")
    p.add_argument("--targets", help="comma-separated target names to run (others disabled)")
    p.add_argument("--baseline", help="target every other is tested against (default: the first)")
    p.add_argument("--remote", action="store_true", help="remote mode: start nothing, use each target's address")
    p.add_argument(
        "--target",
        action="append",
        default=[],
        metavar="NAME=URL",
        help="add an external target (grpc://H:P, http://H:P, openai+http://H:P); repeatable",
    )
    g = p.add_argument_group("server (local mode)")
    g.add_argument("--engine", choices=("synthetic", "transformers", "vllm"))
    g.add_argument("--model")
    g.add_argument("--max-batch-size", type=int)
    g.add_argument("--prefill-ms-per-token", type=float)
    g.add_argument("--decode-ms-per-token", type=float)
    g.add_argument(
        "--placement",
        choices=("auto", "on", "off"),
        help="pin server, proxies and load generator to separate cores (auto: from 3 cores)",
    )
    g = p.add_argument_group("load")
    g.add_argument("--duration", type=float, help="seconds per configuration, round and concurrency")
    g.add_argument("--warmup", type=float, help="warm-up seconds per configuration")
    g.add_argument("--rounds", type=int)
    g.add_argument("--concurrency", type=_csv_ints("--concurrency"), help="e.g. 1,4,16")
    g.add_argument("--stream", action=argparse.BooleanOptionalAction, default=None)
    g.add_argument("--max-tokens", type=_csv_ints("--max-tokens"), help="e.g. 16 or 16,512 (a payload sweep)")
    g.add_argument("--prompt-tokens", type=_csv_ints("--prompt-tokens"), help="e.g. 64 or 64,4096,32768")
    g.add_argument("--arrival", choices=("closed", "constant", "poisson"))
    g.add_argument("--rate", type=float, help="open-loop requests/s")
    g = p.add_argument_group("network condition (delaying relay on one hop)")
    g.add_argument("--delay-ms", type=float, help="ONE-WAY delay per direction: a request gains 2x this")
    g.add_argument("--hop", choices=("client", "upstream"), help="client<->gateway or gateway<->server (default)")
    g.add_argument("--jitter-ms", type=float)
    g.add_argument("--loss", type=float, help="probability a chunk costs one RTO")
    g.add_argument("--rate-mbit", type=float)
    g = p.add_argument_group("output")
    g.add_argument("--no-tracing", action="store_true", help="no trace files (no slowest-trace list)")
    g.add_argument("--no-html", action="store_true")
    g.add_argument(
        "--witness",
        choices=("none", "pcap"),
        help="pcap: capture the packets (tcpdump, root) and split each link's network into wire and "
        "stack time per request at concurrency 1 (report.json targets.*.witness)",
    )
    g.add_argument("--json-only", action="store_true", help="print report.json instead of the table")
    g.add_argument("--print-config", action="store_true", help="print the effective config and exit")
    g.add_argument(
        "--rerender",
        metavar="OUT",
        help="rebuild OUT's reports from its runs/ without running anything "
        "(with --baseline, to test against another configuration)",
    )
    p.set_defaults(func=run)


def apply_flags(data: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Merge flags into the raw config mapping (before validation, so errors name keys)."""

    def put(section: str | None, key: str, value: object) -> None:
        if value is None:
            return
        node = data if section is None else data.setdefault(section, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{section}: must be a mapping")
        node[key] = value

    put(None, "out", args.out)
    put(None, "baseline", args.baseline)
    put(None, "placement", args.placement)
    if args.remote:
        data["mode"] = "remote"
    put("server", "engine", args.engine)
    put("server", "model", args.model)
    put("server", "max_batch_size", args.max_batch_size)
    put("server", "prefill_ms_per_token", args.prefill_ms_per_token)
    put("server", "decode_ms_per_token", args.decode_ms_per_token)
    put("load", "duration_s", args.duration)
    put("load", "warmup_s", args.warmup)
    put("load", "rounds", args.rounds)
    put("load", "concurrency", args.concurrency)
    put("load", "stream", args.stream)
    for key in ("max_tokens", "prompt_tokens"):  # one size stays a number (the report's shape as before)
        sizes = getattr(args, key)
        put("load", key, sizes[0] if sizes and len(sizes) == 1 else sizes)
    put("load", "arrival", args.arrival)
    put("load", "rate", args.rate)
    for key in ("delay_ms", "hop", "jitter_ms", "loss", "rate_mbit"):
        value = getattr(args, key)
        if value is not None:
            if not isinstance(data.get("network"), dict):
                data["network"] = {}
            data["network"][key] = value
    put(None, "witness", args.witness)
    if args.no_tracing:
        data["tracing"] = False
    if args.target or args.targets:
        from pathprobe.analysis.lab.config import _default_targets

        targets = data.get("targets")
        if targets is None:
            targets = [t.model_dump(exclude_defaults=True) for t in _default_targets()]
        for spec in args.target:
            name, sep, url = spec.partition("=")
            if not sep or not name or not url:
                raise ConfigError(f"--target: expected NAME=URL, got {spec!r}")
            targets.append({"name": name, "kind": "external", "address": url})
        if args.targets:
            keep = [x.strip() for x in args.targets.split(",") if x.strip()]
            names = [t.get("name") for t in targets if isinstance(t, dict)]
            for k in keep:
                if k not in names:
                    raise ConfigError(f"--targets: no target named {k!r} (known: {', '.join(map(str, names))})")
            for t in targets:
                if isinstance(t, dict):
                    t["enabled"] = t.get("name") in keep
        data["targets"] = targets
    return data


def run(args: argparse.Namespace) -> int:
    import json
    import sys

    import yaml
    from pathprobe.analysis.lab.config import parse_config

    if args.rerender:
        from pathprobe.analysis.lab.rerender import rerender
        from pathprobe.analysis.report.markdown import markdown as _md

        print(_md(rerender(Path(args.rerender), baseline=args.baseline, html=not args.no_html)))
        return 0
    source = args.config or "<defaults>"
    if args.config:
        try:
            with open(args.config, encoding="utf-8") as fh:
                data = yaml.safe_load(fh) or {}
        except OSError as exc:
            raise ConfigError(f"{args.config}: cannot read config: {exc.strerror or exc}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"{args.config}: not valid YAML: {exc}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{args.config}: the top level must be a mapping of keys")
    else:
        data = {}
    data = apply_flags(data, args)
    cfg = parse_config(data, source)
    if args.print_config:
        print(yaml.safe_dump(json.loads(cfg.model_dump_json()), sort_keys=False))
        return 0
    from pathprobe.analysis.lab.compare import Interrupted, run_compare
    from pathprobe.analysis.report.markdown import markdown

    try:
        report = run_compare(cfg, html=not args.no_html)
    except Interrupted as exc:
        print(f"pathprobe compare: {exc}; every process it started was ended", file=sys.stderr)
        return 143
    if args.json_only:
        print(report.to_json())
    else:
        print(markdown(report))
    sys.stdout.flush()
    failed = [n for n, t in report.targets.items() if t.status == "failed"]
    return 1 if failed else 0
