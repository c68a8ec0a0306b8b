"""The load generator at rate, over minutes: its achieved rate, CPU per request and memory.

Runs ``pathprobe load`` headless and open loop (``--arrival constant --rate R``) against an nginx
stub (a fixed answer carrying the server's timing entries: the stub is never what saturates) for
``--seconds``, with ``--processes P`` (Locust's local workers, the schedule split between them) and
``--records-detail`` (``timing`` by default: every record streamed to records.jsonl), and samples
every process of the load generator's tree every ``--sample-s``: RSS and CPU time (psutil). It
reports

- the achieved rate (requests the summary counts / measured seconds) against the target, the share
  of requests sent late against their schedule (the summary's schedule lag) and the client block's
  health (loop lag, saturation flag);
- CPU per request: the tree's CPU time over the run / requests (the stub is another process);
- memory: the tree's RSS at each sample, and its slope over the run after the first 30 s (MB per
  minute; flat memory is a slope near 0 while records stream to disk);
- where the machine stops it: the busiest process's CPU share (a worker at ~100 % of a core is the
  bottleneck; more workers, or a bigger machine).

    python bench/loadgen_soak.py [--rate 5000] [--seconds 300] [--processes 2] [--protocol http]
        [--users 64] [--records-detail timing] [--out docs/results]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gateway_sweep import nginx_stub

WARM_S = 30.0  # RSS before this is the load generator filling its pools, not growth


def tree(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def sample(procs: list[psutil.Process]) -> dict[str, Any]:
    rss, cpu, per = 0, 0.0, {}
    for p in procs:
        try:
            with p.oneshot():
                r, t = p.memory_info().rss, p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        rss += r
        c = t.user + t.system
        cpu += c
        per[p.pid] = c
    return {"rss_mb": rss / 2**20, "cpu_s": cpu, "per_pid_cpu_s": per}


def slope(xs: list[float], ys: list[float]) -> float | None:
    if len(xs) < 3:
        return None
    return statistics.linear_regression(xs, ys).slope


def last_half_slope(series: list[dict[str, Any]]) -> float | None:
    """MB per minute over the last half of the samples after warm-up (processes alive: RSS > 0).
    Memory that grows to a plateau (pools, the allocator's arenas) and stays there reads ~0 here
    while the whole window's slope still leans on the climb; a leak reads the same in both."""
    live = [s for s in series if s["t_s"] >= WARM_S and s["rss_mb"] > 0]
    half = live[len(live) // 2 :]
    k = slope([s["t_s"] for s in half], [s["rss_mb"] for s in half])
    return None if k is None else k * 60


def run(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    stub, gport, hport = nginx_stub(tmp / "stub", None, 8)
    host = f"http://127.0.0.1:{hport}" if args.protocol == "http" else f"grpc://127.0.0.1:{gport}"
    out = tmp / "load"
    cmd = [
        *(sys.executable, "-m", "pathprobe", "load", "--headless", "--only-summary", "-H", host),
        *("-u", str(args.users), "-r", str(args.users), "-t", f"{int(args.seconds)}s"),
        *("--arrival", "constant", "--rate", str(args.rate), "--tokenizer", "none", "--max-tokens", "8"),
        *("--records-detail", args.records_detail, "--out", str(out)),
        *(("--processes", str(args.processes)) if args.processes > 1 else ()),
    ]
    t0 = time.monotonic()
    load = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ps, samples = psutil.Process(load.pid), []
    try:
        while load.poll() is None:
            time.sleep(args.sample_s)
            s = sample(tree(ps))
            if s["per_pid_cpu_s"]:
                records = out / "records.jsonl"
                s["t_s"] = time.monotonic() - t0
                s["records_mb"] = records.stat().st_size / 2**20 if records.exists() else 0.0
                samples.append(s)
        log = load.stdout.read() if load.stdout else ""
    finally:
        stub.terminate()
        stub.wait(10)
    if load.returncode != 0:
        raise SystemExit(f"pathprobe load exited with {load.returncode}:\n{log[-3000:]}")
    return {"samples": samples, "summary": json.loads((out / "summary.json").read_text()), "cmd": cmd}


def reduce(args: argparse.Namespace, res: dict[str, Any]) -> dict[str, Any]:
    samples, summary = res["samples"], res["summary"]
    totals = summary["totals"]
    n = totals["requests"]
    cpu: dict[int, float] = {}  # per process, its last reading (an exited process keeps its last)
    for s in samples:
        cpu.update(s["per_pid_cpu_s"])
    most = max(len(s["per_pid_cpu_s"]) for s in samples)
    alive = [s for s in samples if len(s["per_pid_cpu_s"]) == most]  # every process still running
    warm = [s for s in alive if s["t_s"] >= WARM_S] or alive
    return {
        "target_rps": args.rate,
        "achieved_rps": n / args.seconds,
        "requests": n,
        "errors": totals.get("errors"),
        # over the window after warm-up (start-up's imports and pools are not per request); the requests in
        # that window from records.jsonl's growth (its bytes per record: the whole file's)
        "cpu_us_per_request": window_cpu_us(warm, samples[-1]["records_mb"] / n if n else 0.0),
        "cpu_s_total": sum(cpu.values()),
        "processes": most,
        "busiest_process_cpu_share": max(cpu.values()) / alive[-1]["t_s"],
        "rss_mb_first_after_warm": warm[0]["rss_mb"],
        "rss_mb_last": alive[-1]["rss_mb"],
        "rss_mb_max": max(s["rss_mb"] for s in alive),
        "rss_slope_mb_per_min": (slope([s["t_s"] for s in warm], [s["rss_mb"] for s in warm]) or 0.0) * 60,
        "records_mb": samples[-1]["records_mb"],
        "client": summary.get("client"),
        "series": (series := [{k: round(v, 3) for k, v in s.items() if k != "per_pid_cpu_s"} for s in samples]),
        "rss_slope_last_half_mb_per_min": last_half_slope(series),
    }


def window_cpu_us(warm: list[dict[str, Any]], mb_per_request: float) -> float | None:
    a, b = warm[0], warm[-1]
    done = (b["records_mb"] - a["records_mb"]) / mb_per_request if mb_per_request else 0.0
    return 1e6 * (b["cpu_s"] - a["cpu_s"]) / done if done > 0 else None


def markdown(meta: dict[str, Any], r: dict[str, Any]) -> str:
    c = r.get("client") or {}
    rows = [
        ("target / achieved req/s", f"{r['target_rps']:.0f} / {r['achieved_rps']:.0f}"),
        ("requests (errors)", f"{r['requests']} ({r['errors']})"),
        ("load generator CPU per request (after warm-up)", f"{r['cpu_us_per_request']:.1f} us"),
        ("processes; busiest one's share of a core", f"{r['processes']}; {100 * r['busiest_process_cpu_share']:.0f} %"),
        (
            "RSS after warm-up / last / max",
            f"{r['rss_mb_first_after_warm']:.0f} / {r['rss_mb_last']:.0f} / {r['rss_mb_max']:.0f} MB",
        ),
        ("RSS slope after warm-up", f"{r['rss_slope_mb_per_min']:+.2f} MB/min"),
        ("RSS slope, last half of the run", f"{r['rss_slope_last_half_mb_per_min']:+.2f} MB/min"),
        ("records.jsonl written", f"{r['records_mb']:.0f} MB"),
        ("client saturated / contended (its own flags)", f"{c.get('saturated')} / {c.get('contended')}"),
        ("client loop lag p99", f"{(c.get('loop_lag_ms') or {}).get('p99')} ms"),
    ]
    head = f"# Load generator soak, {meta['date']}\n\n`{' '.join(meta['argv'])}`\n\n{json.dumps(meta['env'])}\n\n"
    return head + "| | |\n|---|---|\n" + "".join(f"| {a} | {b} |\n" for a, b in rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=5000.0)
    ap.add_argument("--seconds", type=float, default=300.0)
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--users", type=int, default=64)
    ap.add_argument("--protocol", choices=("http", "grpc"), default="http")
    ap.add_argument("--records-detail", choices=("full", "timing"), default="timing")
    ap.add_argument("--sample-s", type=float, default=5.0)
    ap.add_argument("--out", default="", help="folder for <date>-loadgen-soak.{md,json} (default: print only)")
    ap.add_argument("--render", default="", help="a result's .json: write its .md again (no run)")
    args = ap.parse_args()
    if args.render:
        render(Path(args.render))
        return
    if not shutil.which("nginx"):
        raise SystemExit("nginx is needed for the stub (apt install nginx)")
    with tempfile.TemporaryDirectory() as tmp:
        res = run(args, Path(tmp))
    r = reduce(args, res)
    meta = {
        "date": dt.date.today().isoformat(),
        "argv": [Path(sys.argv[0]).name, *sys.argv[1:]],
        "env": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "loadavg_end": os.getloadavg(),
        },
    }
    md = markdown(meta, r)
    print(md)
    if args.out:
        base = Path(args.out) / f"{meta['date']}-loadgen-soak"
        base.with_suffix(".md").write_text(md)
        base.with_suffix(".json").write_text(json.dumps({"meta": meta, "result": r}, indent=1))


def render(path: Path) -> None:
    """Rewrite a result's Markdown from its JSON (figures added since it ran are computed from its series)."""
    data = json.loads(path.read_text())
    r = data["result"]
    r.setdefault("rss_slope_last_half_mb_per_min", last_half_slope(r["series"]))
    path.write_text(json.dumps(data, indent=1))
    path.with_suffix(".md").write_text(markdown(data["meta"], r))


if __name__ == "__main__":
    main()
