"""Run ``pathprobe compare`` on a config the test wrote, as a user would: a real subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml


def run_compare_with_output(
    cfg: dict[str, Any], path: Path, *, html: bool = False, timeout: float = 900
) -> tuple[dict[str, Any], str]:
    """Write ``cfg`` to ``path`` as YAML, run ``pathprobe compare`` on it (``--no-html`` unless
    ``html``), assert it exited 0 (its output's tail in the message); its report.json and stdout."""
    path.write_text(yaml.safe_dump(cfg))
    cmd = [sys.executable, "-m", "pathprobe", "compare", str(path)] + ([] if html else ["--no-html"])
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    report: dict[str, Any] = json.loads((Path(cfg["out"]) / "report.json").read_text())
    return report, res.stdout


def run_compare(cfg: dict[str, Any], path: Path, *, html: bool = False, timeout: float = 900) -> dict[str, Any]:
    """:func:`run_compare_with_output`'s report."""
    return run_compare_with_output(cfg, path, html=html, timeout=timeout)[0]
