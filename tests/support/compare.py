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
    ``html``), assert it exited 0 (its output's tail in the message); its report.json and stdout.

    Past ``timeout`` compare is sent SIGTERM, on which it ends every process it started (a SIGKILL
    would leave its servers, gateways and proxies running into the next test), then killed."""
    path.write_text(yaml.safe_dump(cfg))
    cmd = [sys.executable, "-m", "pathprobe", "compare", str(path)] + ([] if html else ["--no-html"])
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                out, err = proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
            raise AssertionError(f"compare ran past {timeout} s\n{out[-3000:]}{err[-3000:]}") from None
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    report: dict[str, Any] = json.loads((Path(cfg["out"]) / "report.json").read_text())
    return report, out


def run_compare(cfg: dict[str, Any], path: Path, *, html: bool = False, timeout: float = 900) -> dict[str, Any]:
    """:func:`run_compare_with_output`'s report."""
    return run_compare_with_output(cfg, path, html=html, timeout=timeout)[0]
