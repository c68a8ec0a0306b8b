"""Gateways we did not write, under the same load as ours: nginx, HAProxy, Caddy, LiteLLM.

One ``pathprobe compare`` run (local mode, synthetic engine of known time, unary calls so
every proxy that can report does): the server's gRPC port directly, pathprobe's
passthrough gateway, nginx, HAProxy and Caddy as gRPC proxies; the server's OpenAI route
directly and LiteLLM's proxy in front of it. Interleaved rounds, order rotated per round.

For each path and concurrency it writes:

- added latency: p50 and p99 of e2e minus those of its direct path (gRPC proxies against
  ``direct-grpc``, LiteLLM against ``direct-openai``), with the spread of the per-round p50s;
- CPU per request of the path's own processes (proxy and its children; the shared server
  excluded), from compare's ``path_cpu``;
- the self-report against the measured tax: what the proxy's own entries say it spent
  (``<hop>.total - <hop>.upstream``; LiteLLM's ``x-litellm-overhead-duration-ms`` too),
  beside what was measured from outside: the mean of (e2e - client serialization -
  srv.total) minus the same on the direct path.

    python bench/third_party_bench.py [--rounds 3] [--duration 5] [--concurrency 1,4] [--no-write]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pathprobe.analysis.lab.compare import run_compare  # noqa: E402
from pathprobe.analysis.lab.config import parse_config  # noqa: E402
from pathprobe.analysis.report.records import read_records  # noqa: E402

#: path -> (its direct baseline, the prefix of the hop it reports, or None)
PATHS = {
    "direct-grpc": (None, None),
    "passthrough": ("direct-grpc", "gw"),
    "nginx": ("direct-grpc", "nginx"),
    "haproxy": ("direct-grpc", "haproxy"),
    "caddy": ("direct-grpc", "caddy"),
    "direct-openai": (None, None),
    "litellm": ("direct-openai", "litellm"),
}


def config(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    return {
        "out": str(out),
        "tracing": False,
        "baseline": "direct-grpc",
        "bootstrap": 500,
        "server": {
            "engine": "synthetic",
            "model": "tiny",
            "prefill_ms_per_token": 0.05,
            "decode_ms_per_token": args.decode_ms,
            "max_batch_size": 8,
        },
        "load": {
            "duration_s": args.duration,
            "warmup_s": 2,
            "rounds": args.rounds,
            "concurrency": [int(c) for c in args.concurrency.split(",")],
            "stream": False,
            "max_tokens": args.max_tokens,
            "prompt_tokens": 64,
        },
        "targets": [
            {"name": "direct-grpc", "kind": "direct", "protocol": "grpc"},
            {"name": "passthrough", "kind": "gateway", "mode": "passthrough"},
            {"name": "nginx", "kind": "nginx"},
            {"name": "haproxy", "kind": "haproxy"},
            {"name": "caddy", "kind": "caddy"},
            {"name": "direct-openai", "kind": "direct", "protocol": "openai"},
            {"name": "litellm", "kind": "litellm"},
        ],
    }


def entries_of(rec: dict[str, Any]) -> dict[str, float]:
    """The record's timing entries as one dict (records with a hop list, or the merged dict)."""
    if rec.get("hops"):
        out: dict[str, float] = {}
        for hop in rec["hops"]:
            out.update(hop.get("entries") or {})
        return out
    return dict(rec.get("entries") or {})


def records(out: Path, name: str, conc: int) -> list[dict[str, Any]]:
    recs: list[dict[str, Any]] = []
    for f in sorted((out / "runs" / name / f"c{conc}").glob("r*/records.jsonl")):
        recs += [r for r in read_records(f) if r.get("ok")]
    return recs


def outside_server_ms(recs: list[dict[str, Any]]) -> float | None:
    """Mean of e2e - client (de)serialization - srv.total: everything not the server."""
    vals = [
        r["e2e_ms"] - r["client_encode_ms"] - r["client_decode_ms"] - e["srv.total"]
        for r in recs
        if "srv.total" in (e := entries_of(r))
    ]
    return float(np.mean(vals)) if vals else None


def self_report(recs: list[dict[str, Any]], prefix: str | None) -> dict[str, Any]:
    if prefix is None:
        return {}
    out: dict[str, Any] = {}
    own = [
        e[f"{prefix}.total"] - e[f"{prefix}.upstream"]
        for r in recs
        if f"{prefix}.total" in (e := entries_of(r)) and f"{prefix}.upstream" in e
    ]
    if own:
        out["hop_own_mean_ms"] = float(np.mean(own))
        out["hop_own_p50_ms"] = float(np.median(own))
        out["hop_reported_share"] = len(own) / len(recs)
    up = [e[f"{prefix}.upstream"] for r in recs if f"{prefix}.upstream" in (e := entries_of(r))]
    if up and not own:
        out["upstream_only"] = True
        out["hop_reported_share"] = len(up) / len(recs)
    says = [e[f"{prefix}.overhead"] for r in recs if f"{prefix}.overhead" in (e := entries_of(r))]
    if says:
        out["says_overhead_mean_ms"] = float(np.mean(says))
        out["says_overhead_p50_ms"] = float(np.median(says))
    return out


def summarize(report: dict[str, Any], out: Path) -> list[dict[str, Any]]:
    rows = []
    for conc in report["concurrency"]:
        base_recs: dict[str, list[dict[str, Any]]] = {}
        for name, (base, prefix) in PATHS.items():
            t = report["targets"].get(name)
            if t is None or t["status"] != "ok":
                rows.append(
                    {
                        "path": name,
                        "concurrency": conc,
                        "status": t["status"] if t else "absent",
                        "reason": t["reason"] if t else "",
                    }
                )
                continue
            g = t["by_concurrency"].get(str(conc))
            if not g:
                continue
            recs = records(out, name, conc)
            base_recs[name] = recs
            row: dict[str, Any] = {
                "path": name,
                "concurrency": conc,
                "status": "ok",
                "baseline": base,
                "n": g["ok"],
                "p50_ms": g["e2e"]["p50"]["value"],
                "p99_ms": g["e2e"]["p99"]["value"],
                "round_p50s_ms": [v["p50"] for v in g["rounds"].values()],
                "cpu_ms_per_request": (g.get("path_cpu") or {}).get("ms_per_request"),
                "outside_server_mean_ms": outside_server_ms(recs),
                **self_report(recs, prefix),
            }
            if base is not None:
                b = report["targets"][base]["by_concurrency"][str(conc)]
                row["added_p50_ms"] = row["p50_ms"] - b["e2e"]["p50"]["value"]
                row["added_p99_ms"] = row["p99_ms"] - b["e2e"]["p99"]["value"]
                rp = [v["p50"] for v in b["rounds"].values()]
                row["added_p50_by_round_ms"] = [a - c for a, c in zip(row["round_p50s_ms"], rp)]
                ob = outside_server_ms(base_recs.get(base) or records(out, base, conc))
                if ob is not None and row["outside_server_mean_ms"] is not None:
                    row["measured_tax_mean_ms"] = row["outside_server_mean_ms"] - ob
            rows.append(row)
    return rows


def _f(v: Any, nd: int = 3) -> str:
    return "–" if v is None else f"{v:.{nd}f}"


def markdown(rows: list[dict[str, Any]], env: dict[str, Any], cmd: str, wall_s: float) -> str:
    lines = [
        f"# Third-party gateways beside ours, {env['date']}",
        "",
        f"Machine: {env['cpu']}, {env['cpus']} cores, {env['platform']}; load average {env['load_start']} "
        f"at start, {env['load_end']} at end (a shared box).",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in env["versions"].items()) + ".",
        f"Run: `{cmd}` ({wall_s:.0f} s) — one `pathprobe compare` in local mode: synthetic engine "
        "(known time), unary calls, interleaved rounds with the order rotated per round, the same load "
        "on every path. Added = percentile(path) − percentile(its direct path); per-round p50 differences "
        "in brackets (min..max). CPU = the path's own processes (proxy and its children; not the shared "
        "server) per request.",
        "",
    ]
    for conc in sorted({r["concurrency"] for r in rows}):
        lines += [
            f"## Concurrency {conc}",
            "",
            "| path | vs | n | p50 ms | p99 ms | added p50 ms [rounds] | added p99 ms | CPU ms/req | "
            "hop's own time, self-reported (mean) | says overhead (mean) | measured tax (mean) |",
            "|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|",
        ]
        for r in (x for x in rows if x["concurrency"] == conc):
            if r["status"] != "ok":
                lines.append(f"| {r['path']} | – | – | {r['status']}: {r['reason']} | | | | | | | |")
                continue
            rounds = r.get("added_p50_by_round_ms")
            rr = f" [{min(rounds):.3f}..{max(rounds):.3f}]" if rounds else ""
            own = "upstream only" if r.get("upstream_only") else _f(r.get("hop_own_mean_ms"))
            share = r.get("hop_reported_share")
            if share is not None and share < 0.999:
                own += f" ({share:.0%} of requests)"
            lines.append(
                f"| {r['path']} | {r.get('baseline') or '–'} | {r['n']} | {_f(r['p50_ms'])} | {_f(r['p99_ms'])} | "
                f"{_f(r.get('added_p50_ms'))}{rr} | {_f(r.get('added_p99_ms'))} | {_f(r.get('cpu_ms_per_request'))} | "
                f"{own} | {_f(r.get('says_overhead_mean_ms'))} | {_f(r.get('measured_tax_mean_ms'))} |"
            )
        lines.append("")
    return "\n".join(lines)


def environment() -> dict[str, Any]:
    from importlib import metadata

    def out(cmd: list[str]) -> str:
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=False)
        except OSError:
            return "absent"
        return (p.stdout or p.stderr).strip().splitlines()[0] if (p.stdout or p.stderr).strip() else "?"

    from pathprobe import proxies

    lite = proxies.executable("litellm")
    versions = {
        "Python": platform.python_version(),
        "pathprobe": metadata.version("pathprobe"),
        "grpcio": metadata.version("grpcio"),
        "nginx": out(["nginx", "-v"]).replace("nginx version: ", ""),
        "HAProxy": out(["haproxy", "-v"]).split(" - ")[0].replace("HAProxy version ", ""),
        "Caddy": out(["caddy", "version"]),
        "LiteLLM": out(
            [str(Path(lite).parent / "python"), "-c", "import importlib.metadata as m; print(m.version('litellm'))"]
        )
        if lite
        else "absent",
    }
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next(ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {
        "date": dt.date.today().isoformat(),
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "platform": f"Linux {platform.release()}",
        "versions": versions,
        "load_start": f"{os.getloadavg()[0]:.2f}",
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--concurrency", default="1,4")
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--decode-ms", type=float, default=1.0)
    p.add_argument("--out", default="")
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args()
    env = environment()
    out = Path(args.out or tempfile.mkdtemp(prefix="third-party-"))
    cfg = parse_config(config(args, out), "third_party_bench")
    import time

    t0 = time.monotonic()
    report = run_compare(cfg, html=False)
    wall = time.monotonic() - t0
    env["load_end"] = f"{os.getloadavg()[0]:.2f}"
    rows = summarize(report.to_dict(), out)
    shown = [a for i, a in enumerate(sys.argv[1:]) if a != "--out" and (i == 0 or sys.argv[i] != "--out")]
    cmd = "python bench/third_party_bench.py " + " ".join(shown)
    md = markdown(rows, env, cmd.strip(), wall)
    print(md)
    if not args.no_write:
        res = ROOT / "docs" / "results"
        stem = f"{env['date']}-third-party-gateways"
        (res / f"{stem}.json").write_text(json.dumps({"env": env, "rows": rows, "wall_s": wall}, indent=1))
        (res / f"{stem}.md").write_text(md + "\n")
        print(f"wrote {res / stem}.md / .json", file=sys.stderr)


if __name__ == "__main__":
    main()
