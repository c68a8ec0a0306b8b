"""Paired per-hop ground truth past CI's sizes: 2048-token streams and 131072-token prompts.

CI asserts the per-hop ground truth at 512-token streams and 16k-token prompts
(tests/test_groundtruth_long.py); this runs the same harness (tests/test_groundtruth_hops.py: one
interleaved compare run, every path twice per hop behind the delaying relay, D = 0 and D > 0, each
delayed call paired with its D = 0 twin of the same cycle) at the sizes users run, and prints per
path and hop the paired medians: the delayed link's move (truth: 2 x D), the other link's, and
serialization, queueing and the hops' own time (truth: 0), with every record's negatives counted.

    python bench/groundtruth_length.py --scenario stream2048 --out out/gt-2048
    python bench/groundtruth_length.py --scenario prompt128k --out out/gt-128k
    python bench/groundtruth_length.py --scenario stream512 --out out/gt-512   # CI's case, to repeat
    python bench/groundtruth_length.py --scenario stream512-2ms --out out/gt-512-2ms   # tokens 2 ms apart
    python bench/groundtruth_length.py --scenario prompt128k --paths reencode,http-proxy,nginx --out OUT
    python bench/groundtruth_length.py --scenario prompt128k --paths nginx-http,haproxy --out OUT  # beside the tests'
    python bench/groundtruth_length.py --scenario prompt128k-stream --out OUT   # streamed, 131072-token prompts

Each configuration of a pair is its own gateway process: at 131072 tokens two such processes differ by up
to ~0.6 ms in their own per-request work (docs/results/2026-12-05-streamed-128k-prompts.md), above the
0.3 ms bound the tests hold at their sizes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.test_groundtruth_hops import HOPS, PATHS, _hops, _run, _value
from tests.test_groundtruth_long import _negatives

SCENARIOS = {
    # CI's 512-token case (tests/test_groundtruth_long.py), to repeat it and see its spread
    "stream512": {
        "stream": True,
        "load": {"max_tokens": 512, "duration_s": 6.0},
        "paths": [p for p in PATHS if p != "nginx"],
        "args": [],
    },
    # 2048 tokens from an engine that does not sleep: every hop falls behind, the hardest overlap
    "stream2048": {
        "stream": True,
        "load": {"max_tokens": 2048, "duration_s": 14.0},
        "paths": [p for p in PATHS if p != "nginx"],
        "args": [],
    },
    # tokens 2 ms apart (a busy GPU engine's pace): nothing falls behind, every hop waits for the next token
    "stream512-2ms": {
        "stream": True,
        "load": {"max_tokens": 512, "duration_s": 20.0},
        "paths": list(PATHS),
        "args": ["--decode-ms-per-token", "2"],
    },
    # CI's prompt size (tests/test_groundtruth_long.py), to repeat it on paths CI leaves out (nginx)
    "prompt16k": {
        "stream": False,
        "load": {"prompt_tokens": 16384, "max_tokens": 3, "duration_s": 20.0},
        "paths": ["direct", "passthrough", "transcode", "reencode", "http-proxy", "nginx"],
        "args": ["--max-context", "20000"],
    },
    # CI's prompt size, streamed: the body rule (srv.body) and the stream's end on one call
    "prompt16k-stream": {
        "stream": True,
        "load": {"prompt_tokens": 16384, "max_tokens": 32, "duration_s": 20.0},
        "paths": ["direct", "passthrough", "transcode", "reencode", "http-proxy", "nginx"],
        "args": ["--max-context", "20000"],
    },
    # the same, streamed
    "prompt128k-stream": {
        "stream": True,
        "load": {"prompt_tokens": 131072, "max_tokens": 32, "duration_s": 40.0, "timeout_s": 120},
        "paths": ["direct", "passthrough", "transcode", "nginx"],
        "args": ["--max-context", "140000"],
    },
    # ~800 KB of JSON per request; compare raises every size limit on the way for it
    "prompt128k": {
        "stream": False,
        "load": {"prompt_tokens": 131072, "max_tokens": 3, "duration_s": 40.0, "timeout_s": 120},
        "paths": ["direct", "passthrough", "transcode"],
        "args": ["--max-context", "140000"],
    },
}
#: proxies the benchmark runs beside the tests' paths: HAProxy forwards a request body as it comes, as
#: nginx's grpc_pass does (segments.STREAMS_REQUEST_BODY), and reports its own total; nginx's HTTP
#: proxy_pass buffers a body before it calls upstream, as our gateways do
EXTRA_PATHS = {"haproxy": {"kind": "haproxy"}, "nginx-http": {"kind": "nginx", "protocol": "http"}}
ALL_PATHS = {**PATHS, **EXTRA_PATHS}
METRICS = ("e2e", "network_hop1", "network_hop2", "serialization", "queueing", "own", "inference")


def _records(out: Path, name: str) -> dict[tuple, dict]:
    recs = [
        json.loads(line)
        for f in sorted((out / "runs" / name).glob("c*/r*/records.jsonl"))
        for line in f.read_text().splitlines()
        if line.strip()
    ]
    return {(r["worker"], r["user"], r["cycle"]): r for r in recs if r["ok"]}


def paired(out: Path, path: str, hop: str) -> dict[str, float]:
    base, wan = _records(out, f"{path}-{hop}-0"), _records(out, f"{path}-{hop}-d")
    keys = sorted(set(base) & set(wan))
    d: dict[str, float] = {"pairs": float(len(keys))}
    for m in METRICS:
        vals = [_value(wan[k], m) - _value(base[k], m) for k in keys]
        d[m] = statistics.median(vals) if vals else float("nan")
    return d


def undelayed_links(out: Path, path: str) -> list[float]:
    recs = [r for hop in _hops(path) for r in _records(out, f"{path}-{hop}-0").values()]
    links = [r["split"]["links"] for r in recs]
    return [statistics.median(x[i] for x in links) for i in range(max(len(x) for x in links))] if links else []


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", choices=sorted(SCENARIOS), required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--summary-only", action="store_true", help="re-read an earlier run")
    ap.add_argument("--paths", help=f"only these paths, comma-separated, not the scenario's ({', '.join(ALL_PATHS)})")
    args = ap.parse_args()
    sc = SCENARIOS[args.scenario]
    args.out.mkdir(parents=True, exist_ok=True)
    names = args.paths.split(",") if args.paths else sc["paths"]
    unknown = [p for p in names if p not in ALL_PATHS]
    if unknown:
        ap.error(f"--paths: unknown {', '.join(unknown)} (known: {', '.join(ALL_PATHS)})")
    paths = {p: ALL_PATHS[p] for p in names}
    run = args.out / ("stream" if sc["stream"] else "unary")
    if not args.summary_only:
        # compare's own wall time grows with the paths: 26 configurations of 131072-token streams
        # took over 15 min (40 s of load each, then their report)
        run = _run(args.out, stream=sc["stream"], load=sc["load"], paths=paths, args=sc["args"], timeout=4 * 3600)
    rows = []
    # every configuration's records once (runs/_interleaved holds the one load process's, all of them again)
    files = [f for f in run.glob("runs/*/c*/r*/records.jsonl") if f.parts[-4] != "_interleaved"]
    recs = [json.loads(line) for f in files for line in f.read_text().splitlines()]
    ok = [r for r in recs if r["ok"]]
    neg = [r for r in ok if _negatives(r)]
    print(f"{args.scenario}: {len(ok)} ok records of {len(recs)}, {len(neg)} with a negative segment/link/hop share")
    print("path | hop | 2D | pairs | e2e | moved link | other link | serialization | queueing | own | inference")
    for path in paths:
        for hop in _hops(path):
            d = paired(run, path, hop)
            moved, still = ("network_hop1", "network_hop2") if hop == "client" else ("network_hop2", "network_hop1")
            row = {"path": path, "hop": hop, "2D": 2 * HOPS[hop], **d, "moved": d[moved], "still": d[still]}
            rows.append(row)
            print(
                " | ".join(
                    str(x)
                    for x in (
                        path,
                        hop,
                        2 * HOPS[hop],
                        int(d["pairs"]),
                        *(
                            round(d[k], 3)
                            for k in ("e2e", moved, still, "serialization", "queueing", "own", "inference")
                        ),
                    )
                )
            )
        print(f"  {path} undelayed links (median network, ms): {[round(x, 3) for x in undelayed_links(run, path)]}")
    (args.out / "summary.json").write_text(
        json.dumps({"records": len(ok), "negative": len(neg), "rows": rows}, indent=1)
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
