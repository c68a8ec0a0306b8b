"""Do compare's verdicts repeat? Run ``pathprobe compare`` N times back to back and print, per
concurrency and configuration, each run's paired path-tax difference to the baseline and the
verdict it reached, and whether every run reached the same one.

A verdict is one of ``costs more`` / ``costs less`` / ``no clear difference`` (report.json:
``targets.<name>.by_concurrency.<c>.paired.verdict``; see ``pathprobe.analysis.report.paired``).
Reports written before that key existed are read from their ``verdicts`` list (a verdict or none).

The machine's load average (1 min) is sampled every 5 s during each run and printed beside it:
on a shared machine that is the first thing to read next to a disagreement.

    python bench/verdict_repeat.py [CONFIG] [--runs 2] [--out DIR] [-- EXTRA COMPARE FLAGS]
    python bench/verdict_repeat.py --analyze DIR/run1 DIR/run2 ...     # existing outputs only
    python bench/verdict_repeat.py --rejudge DIR/run1 DIR/run2 ...     # re-judge their runs/ with
                                                                       # this code, then compare

CONFIG defaults to ``configs/default.yaml``; each run writes ``DIR/runK`` (report.json, runs/),
and the table and figures go to ``DIR/verdict_repeat.json`` too.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def pathprobe_cmd() -> list[str]:
    exe = shutil.which("pathprobe", path=str(Path(sys.executable).parent)) or shutil.which("pathprobe")
    return [exe] if exe else [sys.executable, "-m", "pathprobe.cli"]


class LoadSampler:
    """The 1-minute load average every ``every_s`` seconds while a run lasts."""

    def __init__(self, every_s: float = 5.0) -> None:
        self.every_s = every_s
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while True:
            try:
                self.samples.append(float(Path("/proc/loadavg").read_text().split()[0]))
            except (OSError, ValueError, IndexError):
                pass
            if self._stop.wait(self.every_s):
                return

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict[str, float] | None:
        s = self.samples
        if not s:
            return None
        return {"min": min(s), "mean": round(sum(s) / len(s), 2), "max": max(s), "n": len(s)}


def run_once(config: str, out: Path, extra: list[str]) -> dict[str, Any]:
    cmd = [*pathprobe_cmd(), "compare", config, "--out", str(out), "--no-html", *extra]
    t0 = time.monotonic()
    with LoadSampler() as load, open(out.with_suffix(".log"), "w") as log:
        rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    if rc != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {rc}: see {out.with_suffix('.log')}")
    return {"out": str(out), "wall_s": round(time.monotonic() - t0, 1), "load1": load.summary()}


def rejudge(out: Path) -> None:
    cmd = [*pathprobe_cmd(), "compare", "--rerender", str(out), "--no-html"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, cwd=ROOT)


def outcomes(report: dict[str, Any]) -> dict[tuple[int, str], dict[str, Any]]:
    """(concurrency, configuration) -> verdict and paired difference, every non-baseline configuration."""
    base = report["baseline"]
    legacy = {(int(v["concurrency"]), v["target"]): v for v in report.get("verdicts") or []}
    out: dict[tuple[int, str], dict[str, Any]] = {}
    for name, t in report["targets"].items():
        if name == base:
            continue
        for c, g in (t.get("by_concurrency") or {}).items():
            pr = g.get("paired") or {}
            med = (pr.get("path_tax") or {}).get("median")
            verdict = pr.get("verdict")
            if verdict is None:  # a report from before per-configuration verdicts
                v = legacy.get((int(c), name))
                verdict = "none" if v is None else ("costs more" if v["path_tax_diff_ms"] > 0 else "costs less")
            out[(int(c), name)] = {
                "verdict": verdict,
                "diff_ms": None if med is None else med["value"],
                "ci": None if med is None else [med["lo"], med["hi"]],
                "min_effect_ms": pr.get("min_effect_ms", pr.get("min_difference_ms")),
                "n": pr.get("n"),
            }
    return out


def agreement(reports: list[dict[str, Any]]) -> dict[str, Any]:
    per = [outcomes(r) for r in reports]
    keys = sorted(set().union(*per))
    rows = []
    for k in keys:
        runs = [p.get(k) for p in per]
        verdicts = [r["verdict"] if r else "missing" for r in runs]
        rows.append(
            {
                "concurrency": k[0],
                "config": k[1],
                "runs": runs,
                "agree": len(set(verdicts)) == 1 and "missing" not in verdicts,
            }
        )
    return {"rows": rows, "agree": sum(r["agree"] for r in rows), "total": len(rows)}


def _cell(r: dict[str, Any] | None) -> str:
    if r is None:
        return "missing"
    if r["diff_ms"] is None:
        return r["verdict"]
    return f"{r['diff_ms']:+.3f} [{r['ci'][0]:+.3f}, {r['ci'][1]:+.3f}] min {r['min_effect_ms']:.2f}: {r['verdict']}"


def table(result: dict[str, Any], runs: list[dict[str, Any]]) -> str:
    n = len(runs)
    lines = [
        "| c | config | " + " | ".join(f"run {i + 1}: Δ path tax ms [95% CI], verdict" for i in range(n)) + " | same |",
        "|---:|---|" + "---|" * n + ":---:|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['concurrency']} | {r['config']} | "
            + " | ".join(_cell(x) for x in r["runs"])
            + f" | {'yes' if r['agree'] else '**no**'} |"
        )
    lines.append("")
    lines.append(f"same verdict in every run: {result['agree']} of {result['total']} (concurrency, configuration)")
    for i, run in enumerate(runs):
        ld = run.get("load1")
        lt = f"load average (1 min) {ld['min']:.2f}–{ld['max']:.2f}, mean {ld['mean']:.2f}" if ld else "load: –"
        wall = f"{run['wall_s']:.0f} s, " if run.get("wall_s") else ""
        lines.append(f"- run {i + 1}: {run['out']} ({wall}{lt})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", nargs="?", default="configs/default.yaml")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--out", default="verdict-repeat", help="folder for run1..runN (default: verdict-repeat)")
    ap.add_argument("--analyze", nargs="+", metavar="OUT", help="compare existing outputs' report.json only")
    ap.add_argument("--rejudge", nargs="+", metavar="OUT", help="re-judge existing outputs' runs/, then compare")
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    args = ap.parse_args(argv[:cut])
    extra = argv[cut + 1 :]  # after --: flags passed to every pathprobe compare
    if args.rejudge:
        for d in args.rejudge:
            rejudge(Path(d))
    dirs = [Path(d) for d in (args.analyze or args.rejudge or [])]
    runs: list[dict[str, Any]] = [{"out": str(d)} for d in dirs]
    if not dirs:
        base = Path(args.out)
        base.mkdir(parents=True, exist_ok=True)
        for i in range(args.runs):
            d = base / f"run{i + 1}"
            print(f"run {i + 1}/{args.runs}: {d}", file=sys.stderr, flush=True)
            runs.append(run_once(args.config, d, extra))
            dirs.append(d)
    reports = [json.loads((d / "report.json").read_text()) for d in dirs]
    result = agreement(reports)
    print(table(result, runs))
    summary_dir = dirs[0].parent
    if os.access(summary_dir, os.W_OK):
        (summary_dir / "verdict_repeat.json").write_text(
            json.dumps({"runs": runs, **result}, indent=1, default=list), encoding="utf-8"
        )
    return 0 if result["agree"] == result["total"] else 1


if __name__ == "__main__":
    sys.exit(main())
