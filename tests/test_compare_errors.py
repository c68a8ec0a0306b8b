"""compare fails early on bad input, and reports a configuration that dies mid-run while the others finish."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import yaml


def _run(args, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "pathprobe", "compare", *args], capture_output=True, text=True, timeout=timeout
    )


def test_port_in_use_fails_before_starting_anything(tmp_path):
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        cfg = tmp_path / "c.yaml"
        cfg.write_text(
            yaml.safe_dump({"out": str(tmp_path / "out"), "server": {"engine": "synthetic", "grpc_port": port}})
        )
        t0 = time.monotonic()
        res = _run([str(cfg)])
    assert res.returncode == 2, res.stderr
    assert f"server.grpc_port: 127.0.0.1:{port} is already in use" in res.stderr
    assert time.monotonic() - t0 < 30
    assert not (tmp_path / "out" / "logs" / "server.log").exists()


def test_unreachable_target_fails_early(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused
        res = _run(
            [
                "--remote",
                "--out",
                str(tmp_path / "out"),
                "--targets",
                "vllm",
                "--target",
                f"vllm=openai+http://127.0.0.1:{port}",
            ]
        )
    assert res.returncode == 2
    assert f"'vllm': openai+http://127.0.0.1:{port} is unreachable: Connection refused" in res.stderr


def test_unknown_key_and_wrong_type(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("load:\n  duration_s: 2\n  concurency: [1]\ntargets:\n  - {name: a, kind: direct, enabled: maybe}\n")
    res = _run([str(cfg)])
    assert res.returncode == 2
    assert "load.concurency: unknown key" in res.stderr
    assert "targets[0].enabled: Input should be a valid boolean" in res.stderr


@pytest.mark.slow
def test_configuration_crashing_mid_run_is_reported_and_others_complete(tmp_path):
    out = tmp_path / "out"
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "out": str(out),
                "tracing": False,
                "bootstrap": 200,
                "server": {"engine": "synthetic", "decode_ms_per_token": 1},
                "load": {"duration_s": 2, "warmup_s": 1, "rounds": 3, "concurrency": [1], "max_tokens": 4},
                "targets": [
                    {"name": "direct-grpc", "kind": "direct"},
                    {"name": "passthrough", "kind": "gateway", "mode": "passthrough"},
                    {"name": "transcode", "kind": "gateway", "mode": "transcode"},
                ],
            }
        )
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "pathprobe", "compare", str(cfg)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 300
        first = out / "runs" / "passthrough" / "c1" / "r0" / "records.jsonl"
        while not first.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.2)
        pid = json.loads((out / "processes.json").read_text())["passthrough"]
        os.kill(pid, signal.SIGKILL)  # the gateway dies after its first measured round
        stdout, stderr = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, stderr[-3000:]  # 1: a configuration failed; the report is still written
    report = json.loads((out / "report.json").read_text())
    t = report["targets"]
    assert t["passthrough"]["status"] == "failed"
    assert "passthrough exited with code -9" in t["passthrough"]["reason"]
    for name in ("direct-grpc", "transcode"):
        assert t[name]["status"] == "ok"
        g = t[name]["by_concurrency"]["1"]
        assert set(g["rounds"]) == {"0", "1", "2"} and g["errors"] == 0 and g["ok"] > 10
    assert "passthrough" in stdout and "exited with code -9" in stdout
    assert "| transcode |" in stdout


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as fh:
            return "\nState:\tZ" not in fh.read()
    except FileNotFoundError:
        return False


def _pids_mentioning(text: str) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/cmdline", "rb") as fh:
                    if text.encode() in fh.read() and _alive(int(d)):
                        out.append(int(d))
            except OSError:
                pass
    return out


def test_sigterm_ends_every_process_compare_started(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pathprobe",
            "compare",
            "--engine",
            "synthetic",
            "--out",
            str(out),
            "--targets",
            "direct-grpc,passthrough",
            "--duration",
            "30",
            "--warmup",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 180
        while not list((out / "runs").glob("*/c1/r0/load.log")):  # a load run is in flight
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.2)
        time.sleep(1.0)
        pids = json.loads((out / "processes.json").read_text())
        assert {"server", "passthrough"} <= set(pids)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, stderr[-2000:]
    assert "every process it started was ended" in stderr
    for name, pid in pids.items():
        assert not _alive(pid), name
    assert _pids_mentioning(str(out)) == []  # no load generator or Locust child left either
