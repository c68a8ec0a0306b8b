"""Start real pathprobe processes on loopback for tests, and always end them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import grpc
from pathprobe.analysis.lab.procs import free_port


def wait_http(url: str, timeout: float = 60.0, proc: subprocess.Popen | None = None, tls=None) -> None:
    """``tls``: the client's TlsFiles for an https:// URL."""
    ctx = tls.client_context() if tls is not None else None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before {url} answered")
        try:
            with urllib.request.urlopen(url, timeout=1, context=ctx) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} not ready after {timeout}s")


def wait_grpc(target: str, timeout: float = 60.0, proc: subprocess.Popen | None = None, tls=None) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from pathprobe.tls import grpc_channel

    deadline = time.monotonic() + timeout
    with grpc_channel(target, tls) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"process exited with {proc.returncode} before {target} answered")
            try:
                resp = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
                if resp.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.1)
    raise TimeoutError(f"{target} not serving after {timeout}s")


class Proc:
    """A child process whose output goes to a log file; ``stop()`` ends it."""

    def __init__(self, args: Sequence[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.args = list(args)
        self.log_path = log
        self._log = open(log, "wb")  # noqa: SIM115 - the child's output until stop() closes it
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.popen = subprocess.Popen(self.args, stdout=self._log, stderr=subprocess.STDOUT, env=full_env)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 10.0) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        self._log.close()


class Server(Proc):
    """``pathprobe serve`` on free loopback ports; ``client_tls``: how the test reaches a TLS server."""

    def __init__(
        self, tmp: Path, *extra: str, env: dict[str, str] | None = None, timeout: float = 120.0, client_tls=None
    ) -> None:
        self.client_tls = client_tls
        self.grpc_port = free_port()
        self.http_port = free_port()
        args = [
            sys.executable,
            "-m",
            "pathprobe",
            "serve",
            "--grpc-port",
            str(self.grpc_port),
            "--http-port",
            str(self.http_port),
            *extra,
        ]
        super().__init__(args, tmp / f"serve-{self.grpc_port}.log", env)
        try:
            wait_http(f"{self.http_url}/healthz", timeout, self.popen, client_tls)
            wait_grpc(self.grpc_target, timeout, self.popen, client_tls)
        except Exception:
            self.stop()
            raise RuntimeError(f"server did not start:\n{self.log()}") from None

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"{'https' if self.client_tls else 'http'}://127.0.0.1:{self.http_port}"


@contextmanager
def fake_upstream_behind(tmp: Path, mode: str, module: str, *args: str) -> Iterator[str]:
    """``python -m <module> --port P <args>`` (a test upstream from tests/support) behind a ``mode``
    gateway without health checks; yields the gateway's URL and stops both."""
    from tests.test_gateway import Gateway
    from tests.test_thirdparty_servers import wait_tcp

    port = free_port()
    upstream = Proc([sys.executable, "-m", module, "--port", str(port), *args], tmp / "upstream.log")
    try:
        wait_tcp(port, upstream)
        gw = Gateway(tmp, mode, f"127.0.0.1:{port}", "--health-interval", "0")
        try:
            yield gw.url
        finally:
            gw.stop()
    finally:
        upstream.stop()
