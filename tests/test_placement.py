"""CPU placement of a local compare: the plan, the cores the real processes get, the report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pathprobe.analysis.lab.config import CompareConfig
from pathprobe.analysis.lab.placement import ENV_PLACEMENT, plan
from pathprobe.analysis.lab.stack import Stack
from pathprobe.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent


def test_plan_splits_cores_without_overlap(monkeypatch) -> None:
    monkeypatch.delenv(ENV_PLACEMENT, raising=False)
    for n in (3, 4, 8, 16, 64):
        p = plan("auto", tuple(range(n)))
        assert p.enabled
        groups = [set(p.server), set(p.proxies), set(p.load)]
        assert all(groups) and set().union(*groups) == set(range(n))
        assert sum(map(len, groups)) == n  # disjoint
        assert len(p.server) >= n - 2 * max(1, n // 8)
        assert p.env("server") == {"OMP_NUM_THREADS": str(len(p.server))}
    two = plan("auto", (0, 1))
    assert not two.enabled and two.cpus("server") == () and two.preexec("load") is None
    forced = plan("on", (0, 1))
    assert forced.enabled and forced.server == (1,) and forced.proxies == forced.load == (0,)
    assert not plan("on", (0,)).enabled
    assert not plan("off", tuple(range(8))).enabled


def test_env_overrides_and_bad_mode(monkeypatch) -> None:
    monkeypatch.setenv(ENV_PLACEMENT, "off")
    assert not plan("on", tuple(range(8))).enabled
    monkeypatch.setenv(ENV_PLACEMENT, "sometimes")
    with pytest.raises(ConfigError, match="placement"):
        plan("auto")


@pytest.mark.slow
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_processes_run_on_their_cores(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv(ENV_PLACEMENT, raising=False)
    cfg = CompareConfig.model_validate(
        {
            "placement": "on",
            "out": str(tmp_path),
            "tracing": False,
            "server": {"engine": "synthetic", "prefill_ms_per_token": 0, "decode_ms_per_token": 0},
            "targets": [{"name": "pt", "kind": "gateway", "mode": "passthrough"}],
        }
    )
    stack = Stack(cfg, tmp_path, lambda _m: None)
    try:
        stack.start_server()
        path = stack.build(cfg.targets[0])
        assert path.status == "ok", path.reason
        server, gateway = stack.server.pid, path.procs[0].pid
        assert os.sched_getaffinity(server) == set(stack.placement.server)
        assert os.sched_getaffinity(gateway) == set(stack.placement.proxies)
        assert set(stack.placement.server).isdisjoint(stack.placement.proxies)
        # every thread of the server (grpc, the engine loop, torch) inherited the pinning
        for tid in os.listdir(f"/proc/{server}/task"):
            assert os.sched_getaffinity(int(tid)) == set(stack.placement.server)
        # the engine runs in a process of its own (server.engine_process, default true), on the server's cores
        assert stack.engine_process
        children = [int(p) for p in Path(f"/proc/{server}/task/{server}/children").read_text().split()]
        assert children and all(os.sched_getaffinity(c) == set(stack.placement.server) for c in children)
    finally:
        stack.close()


@pytest.mark.slow
def test_compare_reports_its_placement(tmp_path) -> None:
    out = tmp_path / "out"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "pathprobe",
            "compare",
            "--engine",
            "synthetic",
            "--decode-ms-per-token",
            "0.2",
            "--duration",
            "1",
            "--warmup",
            "0.5",
            "--rounds",
            "1",
            "--concurrency",
            "1",
            "--targets",
            "direct-grpc,passthrough",
            "--no-tracing",
            "--no-html",
            "--placement",
            "on",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if k != ENV_PLACEMENT},
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    pl = json.loads((out / "report.json").read_text())["meta"]["placement"]
    assert pl["enabled"] and pl["server"] and pl["load"] and not set(pl["server"]) & set(pl["load"])
    assert pl["engine_process"] is True


def test_switches_read_unquoted_yaml_on_and_off(tmp_path) -> None:
    """YAML 1.1 reads ``on`` / ``off`` as booleans; the auto|on|off keys take them back."""
    from pathprobe.analysis.lab.config import load_config

    path = tmp_path / "c.yaml"
    path.write_text("placement: on\nserver: {engine: synthetic, engine_process: off}\n")
    cfg = load_config(path)
    assert (cfg.placement, cfg.server.engine_process) == ("on", False)
    path.write_text("placement: sometimes\n")
    with pytest.raises(ConfigError, match="placement"):
        load_config(path)


def test_engine_process_is_on_unless_turned_off(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv(ENV_PLACEMENT, raising=False)

    def apart(**server: object) -> bool:
        cfg = CompareConfig.model_validate({"placement": "off", "out": str(tmp_path), "server": server})
        return Stack(cfg, tmp_path, lambda _m: None).engine_process

    assert apart() and apart(engine_process=True) and not apart(engine_process=False)
