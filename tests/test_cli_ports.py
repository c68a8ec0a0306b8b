"""``--http-port 0`` / ``--grpc-port 0`` pick free ports, and the startup line names the bound ones."""

from __future__ import annotations

import re
import subprocess
import sys
import time
import urllib.request

import pytest


@pytest.mark.slow
@pytest.mark.parametrize("front_end", ["aiohttp", "fastapi"])
def test_serve_on_port_zero_reports_the_bound_ports(front_end: str) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pathprobe",
            "serve",
            "--engine",
            "synthetic",
            "--grpc-port",
            "0",
            "--http-port",
            "0",
            "--http-server",
            front_end,
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        line = ""
        while time.monotonic() < deadline and "pathprobe serve:" not in line:
            line = proc.stderr.readline() if proc.stderr else ""
            assert line or proc.poll() is None, "serve exited before its startup line"
        m = re.search(r"grpc=(?:grpcs?://)?[\d.]+:(\d+) http=https?://[\d.]+:(\d+)", line)
        assert m, line
        grpc_port, http_port = int(m.group(1)), int(m.group(2))
        assert grpc_port > 0 and http_port > 0
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/healthz", timeout=10) as resp:
            assert resp.status == 200
    finally:
        proc.terminate()
        proc.wait(30)
