"""Long streams and saturation on loopback, no delay anywhere: does the split hold?

Runs ``pathprobe compare`` (synthetic engine, which sleeps its per-token time; nothing delayed)
over the paths a user tries first, then prints, per configuration, the medians of the split and
how many records have a segment (or a link) below zero. Scenarios:

- ``stream``: 512-token streams, tokens ``--ms-per-token`` apart (0.2 ms), c=1: direct gRPC,
  direct HTTP, every gateway mode;
- ``unary``: 8-token unary calls at c=1 and c=32, direct gRPC and through passthrough and
  transcode (saturation: where does the wait before a hop's first timestamp go?).

    python bench/long_streams.py --scenario stream --out out/long-streams
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
UNARY_TARGETS = [
    {"name": "direct-grpc", "kind": "direct", "protocol": "grpc"},
    {"name": "passthrough", "kind": "gateway", "mode": "passthrough"},
    {"name": "transcode", "kind": "gateway", "mode": "transcode"},
]


def config(scenario: str, out: Path, args: argparse.Namespace) -> dict:
    stream = scenario == "stream"
    return {
        "out": str(out),
        "bootstrap": 100,
        "slowest": 0,
        "tracing": False,
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
            "concurrency": [1] if stream else [1, 32],
            "stream": stream,
            "prompt_tokens": args.prompt_tokens,
            "max_tokens": args.tokens if stream else 8,
            "interleave": "run",
        },
        "targets": STREAM_TARGETS if stream else UNARY_TARGETS,
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
        med = {k: statistics.median(r["split"][k] for r in recs) for k in (*SEGMENTS, "e2e")}
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
    ap.add_argument("--scenario", choices=("stream", "unary"), default="stream")
    ap.add_argument("--out", type=Path, default=Path("out/long-streams"))
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--ms-per-token", type=float, default=0.2)
    ap.add_argument("--duration", type=float, default=6.0)
    ap.add_argument("--summary-only", action="store_true", help="re-read an earlier run's records")
    args = ap.parse_args()
    out = args.out / args.scenario
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
    cols = ("config", "c", "n", "negative", "e2e", *SEGMENTS, "links")
    print(" | ".join(cols))
    for row in summarize(out):
        print(" | ".join(str(row[c]) for c in cols))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
