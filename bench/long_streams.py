"""Long streams and saturation on loopback, no delay anywhere: does the split hold?

Runs ``pathprobe compare`` (synthetic engine, which sleeps its per-token time; nothing delayed)
over the paths a user tries first, then prints, per configuration, the medians of the split and
how many records have a segment (or a link) below zero. Scenarios:

- ``stream``: 512-token streams, tokens ``--ms-per-token`` apart (0.2 ms), c=1: direct gRPC,
  direct HTTP, every gateway mode;
- ``unary``: 8-token unary calls at c=1 and c=32 over every path (saturation: where does the wait
  before a hop's first timestamp go?); ``stream-sat``: the same for 32-token streams.

``--witness`` adds the packet witness (``compare --witness pcap``: at c=1 by time, at c=32 by trace
id, with tracing on) beside the split. The passthrough gateway is run twice: on uvloop (its
default: no loop wait measured) and on asyncio.

    python bench/long_streams.py --scenario stream --out out/long-streams
    python bench/long_streams.py --scenario unary --witness --out out/saturation
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

import yaml

SEGMENTS = ("network", "serialization", "queueing", "inference", "other", "unsplit")
STREAM_TARGETS = [
    {"name": "direct-grpc", "kind": "direct", "protocol": "grpc"},
    {"name": "direct-http", "kind": "direct", "protocol": "http"},
    {"name": "passthrough", "kind": "gateway", "mode": "passthrough"},
    {"name": "transcode", "kind": "gateway", "mode": "transcode"},
    {"name": "reencode", "kind": "gateway", "mode": "reencode"},
    {"name": "http-proxy", "kind": "gateway", "mode": "http-proxy"},
]
SATURATION_TARGETS = [
    *STREAM_TARGETS[:3],
    {"name": "passthrough-asyncio", "kind": "gateway", "mode": "passthrough", "gateway_args": ["--loop", "asyncio"]},
    *STREAM_TARGETS[3:],
]


def config(scenario: str, out: Path, args: argparse.Namespace) -> dict:
    stream = scenario != "unary"
    long = scenario == "stream"
    return {
        "out": str(out),
        "bootstrap": 100,
        "slowest": 0,
        "tracing": bool(args.witness),  # the witness finds a request's packets at c=32 by its trace id
        "server": {
            "engine": "synthetic",
            "prefill_ms_per_token": 0.0,
            "decode_ms_per_token": args.ms_per_token if stream else 0.0,
            "max_batch_size": 64,
            "engine_process": False,
        },
        "load": {
            "duration_s": args.duration,
            "warmup_s": 0.5,
            "rounds": 1,
            "concurrency": [1] if long else [1, 32],
            "stream": stream,
            "prompt_tokens": args.prompt_tokens,
            "max_tokens": args.tokens if long else (32 if stream else 8),
            "interleave": "run",
        },
        "witness": "pcap" if args.witness else "none",
        "targets": [
            t for t in (STREAM_TARGETS if long else SATURATION_TARGETS) if not args.targets or t["name"] in args.targets
        ],
    }


def records(run: Path) -> list[dict]:
    out = []
    for f in sorted(run.glob("r*/records.jsonl")):
        out += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    return [r for r in out if r["ok"] and r["split"]]


def negative(r: dict, eps: float = 1e-6) -> bool:
    s = r["split"]
    parts = [s[k] for k in SEGMENTS] + list(s["links"]) + [h["other"] for h in s["hops"]]
    return any(v < -eps for v in parts)


def summarize(out: Path) -> list[dict]:
    rows = []
    for cdir in sorted((out / "runs").glob("*/c*")):
        recs = records(cdir)
        if not recs:
            continue
        med = {k: statistics.median(r["split"].get(k, 0.0) for r in recs) for k in (*SEGMENTS, "e2e", "hop_wait")}
        nlinks = max(len(r["split"]["links"]) for r in recs)
        links = [
            statistics.median(r["split"]["links"][i] for r in recs if len(r["split"]["links"]) > i)
            for i in range(nlinks)
        ]
        rows.append(
            {
                "config": cdir.parent.name,
                "c": cdir.name,
                "n": len(recs),
                "negative": sum(negative(r) for r in recs),
                **{k: round(v, 2) for k, v in med.items()},
                "links": [round(v, 2) for v in links],
            }
        )
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", choices=("stream", "unary", "stream-sat"), default="stream")
    ap.add_argument(
        "--witness",
        action="store_true",
        help="the packet witness beside the split (c=1 by time; c=32 by trace id: tracing on)",
    )
    ap.add_argument("--out", type=Path, default=Path("out/long-streams"))
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--ms-per-token", type=float, default=0.2)
    ap.add_argument("--duration", type=float, default=6.0)
    ap.add_argument(
        "--targets", type=lambda v: v.split(","), default=[], help="only these configurations (names, comma-separated)"
    )
    ap.add_argument("--summary-only", action="store_true", help="re-read an earlier run's records")
    ap.add_argument("--rewitness", action="store_true", help="with --summary-only: the witness again from its pcap")
    args = ap.parse_args()
    out = args.out / args.scenario
    if args.rewitness:
        rewitness(out)
    if not args.summary_only:
        out.mkdir(parents=True, exist_ok=True)
        cfg = out.parent / f"{args.scenario}.yaml"
        cfg.write_text(yaml.safe_dump(config(args.scenario, out, args)))
        res = subprocess.run(
            [sys.executable, "-m", "pathprobe", "compare", str(cfg), "--no-html"], capture_output=True, text=True
        )
        if res.returncode != 0:
            print(res.stdout[-3000:], res.stderr[-3000:], file=sys.stderr)
            return 1
    cols = ("config", "c", "n", "negative", "e2e", *SEGMENTS, "hop_wait", "links")
    print(" | ".join(cols))
    for row in summarize(out):
        print(" | ".join(str(row[c]) for c in cols))
    witness(out)
    return 0


def rewitness(out: Path) -> None:
    """The witness of an earlier run, computed again from its capture and records (the chains are the
    report's): a change to the witness's analysis without running the load again."""
    from pathprobe.analysis.lab import wirestreams
    from pathprobe.analysis.lab import witness as wit

    path = out / "report.json"
    report = json.loads(path.read_text())
    pcap = out / "witness" / "capture.pcap"
    packets = wit.read_packets(pcap)
    chains = {
        name: wit.Chain([wit.LinkPorts(list(link["ports"]), link["inner"]) for link in t["witness"]["links"]])
        for name, t in report["targets"].items()
        if (t.get("witness") or {}).get("links")
    }
    by_trace = wirestreams.requests_by_trace(pcap, {p for c in chains.values() for link in c.links for p in link.ports})
    for name, chain in chains.items():
        by_c: dict[int, list[dict]] = {}
        for f in sorted((out / "runs" / name).glob("c*/r*/records.jsonl")):
            c = int(f.parent.parent.name[1:])
            by_c.setdefault(c, []).extend(json.loads(line) for line in f.read_text().splitlines() if line.strip())
        w = wit.analyze(by_c.get(1, []), packets, chain)
        if by_trace:
            w["by_concurrency"] = {
                str(c): wit.analyze_by_trace(recs, by_trace, chain) for c, recs in sorted(by_c.items())
            }
        report["targets"][name]["witness"] = w
    path.write_text(json.dumps(report, indent=1))


def witness(out: Path) -> None:
    """The packet witness per configuration and concurrency: per link, wire, the two stacks, the hop's booked wait,
    the witness's network and the split's."""
    path = out / "report.json"
    if not path.exists():
        return
    report = json.loads(path.read_text())
    cols = (
        "wire",
        "stack_outer",
        "stack_inner",
        "hop_wait",
        "hop_wait_over_p90",
        "outer_wait",
        "outer_wait_over_p90",
        "network",
    )
    for name, t in report.get("targets", {}).items():
        top = t.get("witness") or {}
        by_trace = sorted((top.get("by_concurrency") or {}).items(), key=lambda kv: int(kv[0]))
        for c, w in [("1", top), *((f"{c} (by trace id)", w) for c, w in by_trace)]:
            if not w.get("links"):
                continue
            links = "; ".join(" ".join(f"{k}={link.get(k, 0.0):.3f}" for k in cols) for link in w["links"])
            print(
                f"witness {name} c{c}: matched {w['matched']}/{w['requests']}"
                f" split={[round(x, 3) for x in w['split_network']]}"
                f" wait_over={w.get('wait_over', '-')} negative={w['negative_stacks']} | {links}"
            )


if __name__ == "__main__":
    raise SystemExit(main())
