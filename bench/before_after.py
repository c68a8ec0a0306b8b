"""Before/after: two commits measured by the same benchmarks in one run, so a change that should
not move performance (a refactor) shows that it did not.

- the gateway benchmark (``bench/gateway_bench.py``) of each commit, alternated BEFORE, AFTER,
  BEFORE, AFTER, ... so slow spells of a shared machine hit both alike; each run is that commit's
  own benchmark over that commit's own package tree;
- the default ``pathprobe compare`` of each commit (``configs/default.yaml``, the demo), BEFORE then
  AFTER, when ``--compare`` is given (minutes each).

Each commit is checked out into a temporary work tree and laid out with ``bench/pkgtree.sh``; both
run with this interpreter's installed dependencies. Writes ``docs/results/<date>-before-after.md``
and ``.json`` (``--no-write``: print only).

    python bench/before_after.py BEFORE [--after HEAD] [--reps 2] [--calls 1500] [--compare]
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
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GATEWAY_KEYS = ("added_p50_us", "added_p99_us", "proxy_cpu_us_per_call")
COMPARE_KEYS = ("e2e_p50_ms", "network_ms", "serialization_ms", "other_ms", "inference_ms")


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout.strip()


def _tree(rev: str, tmp: Path, label: str) -> tuple[Path, Path]:
    """(work tree, package tree) of ``rev``."""
    work = tmp / label
    _git("worktree", "add", "--detach", str(work), rev)
    pkg = Path(
        subprocess.run(
            ["bash", str(work / "bench" / "pkgtree.sh"), str(tmp / f"{label}-pkg")],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    return work, pkg


def _env(pkg: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(pkg), "PYTHONUNBUFFERED": "1"}


def _gateway(work: Path, pkg: Path, out: Path, calls: int) -> dict[str, dict[str, float]]:
    cmd = [sys.executable, str(work / "bench" / "gateway_bench.py"), "--calls", str(calls), "--out", str(out)]
    subprocess.run(cmd, cwd=work, env=_env(pkg), check=True, stdout=subprocess.DEVNULL)
    result = json.loads(next(out.glob("*-gateway.json")).read_text())
    return {row["path"]: {k: row[k] for k in GATEWAY_KEYS if row.get(k) is not None} for row in result["rows"]}


def _compare(work: Path, pkg: Path, out: Path) -> dict[str, dict[str, float]]:
    cmd = [sys.executable, "-m", "pathprobe", "compare", str(work / "configs" / "default.yaml"), "--out", str(out)]
    subprocess.run(cmd, cwd=work, env=_env(pkg), check=True, stdout=subprocess.DEVNULL)
    report = json.loads((out / "report.json").read_text())
    return _compare_rows(report)


def _compare_rows(report: dict[str, object]) -> dict[str, dict[str, float]]:
    """name@c=N -> e2e p50 and mean segments, read from either commit's report.json."""
    rows: dict[str, dict[str, float]] = {}
    targets = report.get("targets", {})
    for name, t in (targets if isinstance(targets, dict) else {}).items():
        for conc, level in (t.get("by_concurrency") or {}).items():
            p50 = (level.get("e2e") or {}).get("p50")
            seg = level.get("segments") or {}
            rows[f"{name}@c={conc}"] = {
                "e2e_p50_ms": p50.get("value") if isinstance(p50, dict) else p50,
                **{
                    f"{s}_ms": (seg.get(s) or {}).get("mean")
                    for s in ("network", "serialization", "other", "inference")
                },
            }
    return rows


def _median(runs: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for path in runs[0]:
        keys = {k for r in runs for k in r.get(path, {})}
        out[path] = {
            k: statistics.median([r[path][k] for r in runs if r.get(path, {}).get(k) is not None]) for k in keys
        }
    return out


def _table(
    title: str, before: dict[str, dict[str, float]], after: dict[str, dict[str, float]], keys: tuple[str, ...]
) -> list[str]:
    lines = [
        f"## {title}",
        "",
        "| path | " + " | ".join(f"{k} before | after" for k in keys) + " |",
        "|---|" + "---:|---:|" * len(keys),
    ]
    for path in before:
        cells = []
        for k in keys:
            b, a = before[path].get(k), after.get(path, {}).get(k)
            cells += ["–" if b is None else f"{b:.1f}", "–" if a is None else f"{a:.1f}"]
        lines.append(f"| {path} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("before")
    ap.add_argument("--after", default="HEAD")
    ap.add_argument("--reps", type=int, default=2, help="gateway benchmark runs per commit, alternated")
    ap.add_argument("--calls", type=int, default=1500, help="iterations per gateway benchmark run")
    ap.add_argument("--compare", action="store_true", help="also the default compare of each commit (minutes)")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    revs = {"before": _git("rev-parse", "--short", args.before), "after": _git("rev-parse", "--short", args.after)}
    tmp = Path(tempfile.mkdtemp(prefix="before-after-"))
    result: dict[str, object] = {
        "revs": revs,
        "date_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "python": platform.python_version(),
        "loadavg_start": os.getloadavg(),
    }
    try:
        trees = {label: _tree(rev, tmp, label) for label, rev in revs.items()}
        gw: dict[str, list[dict[str, dict[str, float]]]] = {"before": [], "after": []}
        for rep in range(args.reps):
            for label in ("before", "after"):
                work, pkg = trees[label]
                gw[label].append(_gateway(work, pkg, tmp / f"gw-{label}-{rep}", args.calls))
                print(f"gateway bench {label} run {rep + 1}/{args.reps} done", file=sys.stderr)
        result["gateway"] = {label: _median(runs) for label, runs in gw.items()}
        result["gateway_runs"] = gw
        if args.compare:
            result["compare"] = {label: _compare(*trees[label], tmp / f"cmp-{label}") for label in ("before", "after")}
        result["loadavg_end"] = os.getloadavg()
    finally:
        for label in ("before", "after"):
            subprocess.run(["git", "worktree", "remove", "--force", str(tmp / label)], cwd=ROOT, capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
    md = _markdown(result, args)
    print(md)
    if not args.no_write:
        day = str(result["date_utc"])[:10]
        out = ROOT / "docs" / "results"
        (out / f"{day}-before-after.json").write_text(json.dumps(result, indent=1) + "\n")
        (out / f"{day}-before-after.md").write_text(md)
    return 0


def _markdown(r: dict[str, object], args: argparse.Namespace) -> str:
    revs = r["revs"]
    assert isinstance(revs, dict)
    lines = [
        f"# Before/after: {revs['before']} → {revs['after']}, {str(r['date_utc'])[:10]}",
        "",
        f"Machine: {r['machine']}; Python {r['python']}; load average {r['loadavg_start']} at start, "
        f"{r.get('loadavg_end')} at end (a shared box: compare the two columns, not the absolute figures).",
        f"Run: `python bench/before_after.py {revs['before']} --after {revs['after']} --reps {args.reps} "
        f"--calls {args.calls}{' --compare' if args.compare else ''}` — each commit's own gateway benchmark "
        f"on its own package tree, runs alternated before/after; medians of the {args.reps} runs per commit.",
        "",
    ]
    gw = r["gateway"]
    assert isinstance(gw, dict)
    lines += _table("Gateway benchmark (µs)", gw["before"], gw["after"], GATEWAY_KEYS)
    if "compare" in r:
        cmp = r["compare"]
        assert isinstance(cmp, dict)
        lines += _table("Default compare (ms)", cmp["before"], cmp["after"], COMPARE_KEYS)
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
