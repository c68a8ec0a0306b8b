"""Wrong flags and values: exit code 2 and a message naming the flag, before anything serves."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
from pathprobe.cli import main


def _rc_and_err(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str]:
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse's own errors
        rc = int(exc.code or 0)
    return rc, capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["serve", "--engine", "synthetic", "--grpc-port", "99999"], "--grpc-port"),
        (["serve", "--engine", "synthetic", "--http-port", "-1"], "--http-port"),
        (["serve", "--engine", "synthetic", "--prefill-ms-per-token", "-1"], "--prefill-ms-per-token"),
        (["serve", "--engine", "synthetic", "--decode-ms-per-token", "nan"], "--decode-ms-per-token"),
        (["serve", "--engine", "synthetic", "--max-wait-ms", "-5"], "--max-wait-ms"),
        (["serve", "--engine", "synthetic", "--max-body-bytes", "0"], "--max-body-bytes"),
        (["serve", "--engine", "synthetic", "--max-context", "0"], "--max-context"),
        (["serve", "--engine", "synthetic", "--engine-option", "threads=2"], "--engine-option threads"),
        (["serve", "--engine", "transformers", "--engine-option", "cuda_graph=1"], "--engine-option cuda_graph"),
        (
            ["gateway", "--upstream", "127.0.0.1:1", "--listen", "127.0.0.1:0", "--health-interval", "-1"],
            "--health-interval",
        ),
        (
            ["gateway", "--upstream", "127.0.0.1:1", "--listen", "127.0.0.1:0", "--unhealthy-after", "0"],
            "--unhealthy-after",
        ),
        (["gateway", "--upstream", "127.0.0.1:1", "--listen", "127.0.0.1:0", "--timeout", "0"], "--timeout"),
        (["gateway", "--upstream", "127.0.0.1:1", "--listen", "127.0.0.1:0", "--admin-port", "70000"], "--admin-port"),
        (["gateway", "--upstream", "127.0.0.1:1", "--listen", "127.0.0.1:0", "--workers", "2"], "--workers"),
        (["gateway", "--upstream", "127.0.0.1:1", "--log-level", "LOUD"], "--log-level"),
        (["analyze", "--jaeger", "127.0.0.1:16686", "--service", "x"], "--jaeger"),
        (
            ["analyze", "--jaeger", "http://127.0.0.1:9", "--service", "x", "--write-trace", "slowest:x"],
            "--write-trace",
        ),
    ],
)
def test_bad_flag_value_names_the_flag(capsys: pytest.CaptureFixture[str], argv: list[str], flag: str) -> None:
    rc, err = _rc_and_err(capsys, argv)
    assert rc == 2
    assert flag in err


@pytest.fixture()
def busy_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.mark.parametrize("flag", ["--listen", "--admin-port"])
def test_gateway_on_a_busy_port_is_a_clear_error(capsys: pytest.CaptureFixture[str], busy_port: int, flag: str) -> None:
    """Without the check, the SO_REUSEPORT listener would silently share a port another process uses."""
    listen = f"127.0.0.1:{busy_port}" if flag == "--listen" else "127.0.0.1:0"
    argv = ["gateway", "--upstream", "127.0.0.1:1", "--listen", listen, "--health-interval", "0"]
    if flag == "--admin-port":
        argv += ["--admin-port", str(busy_port)]
    rc, err = _rc_and_err(capsys, argv)
    assert rc == 2
    assert flag in err and str(busy_port) in err


@pytest.mark.parametrize("verb", ["load", "compare"])
def test_help_into_a_reader_that_left_ends_without_traceback(verb: str) -> None:
    """``pathprobe load --help | head``: the reader closes the pipe before the help is written."""
    r, w = os.pipe()
    os.close(r)
    with os.fdopen(w, "wb") as out:
        proc = subprocess.run(
            [sys.executable, "-m", "pathprobe", verb, "--help"], stdout=out, stderr=subprocess.PIPE, timeout=120
        )
    err = proc.stderr.decode()
    assert "Traceback" not in err and "BrokenPipe" not in err, err[-2000:]


@pytest.mark.slow
def test_serve_on_a_busy_grpc_port_exits_2_without_traceback(busy_port: int) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pathprobe",
            "serve",
            "--engine",
            "synthetic",
            "--grpc-port",
            str(busy_port),
            "--http-port",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "--grpc-port" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("argv", "blocked", "extra"),
    [
        (["serve", "--engine", "synthetic", "--grpc-port", "0", "--http-port", "0"], "torch", "server"),
        (["load", "--headless", "-t", "1s", "-H", "grpc://127.0.0.1:9"], "locust", "loadgen"),
        (["make-model", "--out", "{tmp}/m"], "torch", "server"),
    ],
)
def test_a_verb_without_its_extra_names_the_extra(argv: list[str], blocked: str, extra: str, tmp_path) -> None:
    """What a component install sees when it runs another component's verb: exit 2, the pip command."""
    code = f"""
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] == {blocked!r}:  # as if not installed
            raise ModuleNotFoundError('No module named ' + repr(name), name=name)
sys.meta_path.insert(0, Block())
from pathprobe.cli import main
sys.exit(main({[a.replace("{tmp}", str(tmp_path)) for a in argv]!r}))
"""
    env = {**os.environ, "PATHPROBE_CACHE": str(tmp_path / "cache")}  # nothing built yet
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"pathprobe[{extra}]" in proc.stderr and blocked in proc.stderr and "Traceback" not in proc.stderr


def test_engine_option_keys_match_what_the_engines_read() -> None:
    """The --engine-option keys are the fields of the engine's option class: the transformers
    engine reads every one of them, and no engine reads an option by a string key."""
    import dataclasses
    import re
    from pathlib import Path

    from pathprobe.engineoptions import TransformersOptions

    src = (Path(__file__).resolve().parent.parent / "server" / "engine" / "hf.py").read_text(encoding="utf-8")
    read = set(re.findall(r"\b(?:opts|options)\.([a-z_]+)\b", src))
    assert read >= {f.name for f in dataclasses.fields(TransformersOptions)}
    engines = Path(__file__).resolve().parent.parent / "server" / "engine"
    others = [
        f.name
        for f in engines.glob("*.py")
        if re.search(r"(?:opts|options)(?:\.get\(|\[)", f.read_text(encoding="utf-8"))
    ]
    assert not others, f"engines reading options by a string key: {others}"
