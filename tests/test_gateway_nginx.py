"""The nginx reference config (deploy/nginx) does the passthrough job: same answers, srv.* intact."""

from __future__ import annotations

import importlib.util
import shutil
import socket
import subprocess
import time
from pathlib import Path

import grpc
import pytest

from tests.support.clients import grpc_generate, grpc_stream
from tests.support.procs import free_port
from tests.test_gateway import REQ

pytestmark = pytest.mark.skipif(
    shutil.which("nginx") is None, reason="nginx is not installed (Debian: apt-get install -y nginx)"
)

RENDER = Path(__file__).resolve().parent.parent / "deploy" / "nginx" / "render.py"


def load_render():
    spec = importlib.util.spec_from_file_location("nginx_render", RENDER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod.render


def start_nginx(prefix: Path, listen_port: int, upstreams: list[str]) -> subprocess.Popen:
    conf = load_render()(prefix, f"127.0.0.1:{listen_port}", upstreams)
    proc = subprocess.Popen(
        ["nginx", "-p", str(prefix), "-e", str(prefix / "error.log"), "-c", str(conf), "-g", "daemon off;"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"nginx exited: {proc.stderr.read().decode()}")  # type: ignore[union-attr]
        try:
            with socket.create_connection(("127.0.0.1", listen_port), timeout=0.5):
                return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise TimeoutError("nginx did not listen")


def stop_nginx(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def test_nginx_grpc_pass_with_keepalive(tmp_path, synthetic_server) -> None:
    port = free_port()
    proc = start_nginx(tmp_path / "ngx", port, [synthetic_server.grpc_target])
    try:
        direct, _ = grpc_generate(synthetic_server.grpc_target, **REQ)
        via, entries = grpc_generate(f"127.0.0.1:{port}", **REQ)
        assert via == direct
        assert "srv.total" in entries  # trailers pass through untouched
        chunks, entries = grpc_stream(f"127.0.0.1:{port}", **REQ)
        assert chunks == grpc_stream(synthetic_server.grpc_target, **REQ)[0]
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            with pytest.raises(grpc.RpcError) as err:
                ch.unary_unary("/pathprobe.v1.LLM/Generate")(b"\xff\xff", timeout=10)
            assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        conf = (tmp_path / "ngx" / "nginx.conf").read_text()
        assert "keepalive 16;" in conf and conf.count("keepalive_requests 1000000;") == 2
    finally:
        stop_nginx(proc)
