"""pathprobe's nginx / HAProxy / Caddy / LiteLLM configs, run for real in front of a real server.

Each proxy that can report its own time does so as a Server-Timing hop the load generator
reads; where it cannot (a stream whose response header is written before the stream ends,
Caddy over HTTP) it stays silent rather than wrong.
"""

from __future__ import annotations

import re
import socket
import subprocess
import time
from pathlib import Path

import pytest
from pathprobe import proxies
from pathprobe.errors import ConfigError

from tests.support.procs import free_port

pytestmark = pytest.mark.slow


def test_templates_fill_strictly(tmp_path):
    assert proxies.fill("a {{X}} b", {"X": "1"}) == "a 1 b"
    with pytest.raises(ConfigError, match=re.escape("no value for {{Y}}")):
        proxies.fill("{{Y}}", {})
    with pytest.raises(ConfigError, match="not 'openai'"):
        proxies.haproxy(tmp_path, "127.0.0.1:1", ["127.0.0.1:2"], "openai")


def _wait_port(port: int, popen: subprocess.Popen, log: Path, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if popen.poll() is not None:
            raise RuntimeError(f"proxy exited with {popen.returncode}: {log.read_text(errors='replace')[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"proxy not listening on {port}")


class Running:
    def __init__(self, launch: proxies.Launch, port: int, log: Path, timeout: float = 20.0) -> None:
        import os

        self.port = port
        self._log = open(log, "wb")  # noqa: SIM115 - held for the process's life, closed in stop()
        self.popen = subprocess.Popen(
            launch.args,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **launch.env},
            start_new_session=True,
        )
        try:
            _wait_port(port, self.popen, log, timeout)
        except Exception:
            self.stop()
            raise

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        self._log.close()


def start(proxy: str, protocol: str, server, tmp_path: Path) -> Running:
    if proxies.executable(proxy) is None:
        pytest.skip(proxies.missing_reason(proxy))
    port = free_port()
    upstream = server.grpc_target if protocol == "grpc" else f"127.0.0.1:{server.http_port}"
    launch = proxies.launch(proxy, tmp_path / proxy, f"127.0.0.1:{port}", [upstream], protocol)
    return Running(launch, port, tmp_path / f"{proxy}.log")


def call(protocol: str, port: int, stream: bool, outcome: list | None = None) -> dict[str, float]:
    from pathprobe.loadgen.targets import CallSpec, GrpcTarget, NativeHttpTarget, Outcome

    target = (
        GrpcTarget(f"127.0.0.1:{port}", 20) if protocol == "grpc" else NativeHttpTarget(f"http://127.0.0.1:{port}", 20)
    )
    try:
        out = Outcome()
        for _ in range(3):  # the first call also opens the proxy's upstream connection
            out = Outcome()
            target.call(CallSpec(prompt="hello there", max_tokens=32 if stream else 8, stream=stream), {}, out)
            assert out.ok, out.error
        if outcome is not None:
            outcome.append(out)
        return dict(out.entries)
    finally:
        target.close()


#: (proxy, protocol) -> the entries it adds to a unary response
REPORTS = {
    ("nginx", "grpc"): {"nginx.upstream", "nginx.total"},
    ("nginx", "http"): {"nginx.upstream", "nginx.total"},
    ("haproxy", "grpc"): {"haproxy.upstream", "haproxy.total"},
    ("haproxy", "http"): {"haproxy.upstream", "haproxy.total"},
    ("caddy", "grpc"): {"caddy.upstream"},
    ("caddy", "http"): set(),
}
#: nginx's clock has 1 ms resolution
RESOLUTION_MS = {"nginx": 1.0, "haproxy": 0.001, "caddy": 0.001}


@pytest.mark.parametrize("proxy, protocol", sorted(REPORTS))
def test_proxy_reports_its_hop_on_unary_calls(proxy, protocol, synthetic_server, tmp_path):
    run = start(proxy, protocol, synthetic_server, tmp_path)
    try:
        entries = call(protocol, run.port, stream=False)
    finally:
        run.stop()
    mine = {k for k in entries if k.startswith(proxy + ".")}
    assert mine == REPORTS[(proxy, protocol)]
    assert entries["srv.total"] > 0
    res = RESOLUTION_MS[proxy]
    if f"{proxy}.upstream" in entries:  # the upstream's time contains the server's whole handling
        assert entries[f"{proxy}.upstream"] >= entries["srv.total"] - res
    if f"{proxy}.total" in entries:
        assert entries[f"{proxy}.total"] >= entries[f"{proxy}.upstream"] - res


@pytest.mark.parametrize(
    "proxy, protocol, reports",
    [
        ("nginx", "grpc", True),  # gRPC trailers are written at the end of the stream
        ("nginx", "http", False),
        ("haproxy", "grpc", False),
        ("haproxy", "http", False),
        ("caddy", "grpc", False),
        ("caddy", "http", False),
    ],
)
def test_streams_are_reported_only_where_the_proxy_sees_their_end(proxy, protocol, reports, synthetic_server, tmp_path):
    run = start(proxy, protocol, synthetic_server, tmp_path)
    outs: list = []
    try:
        entries = call(protocol, run.port, stream=True, outcome=outs)
    finally:
        run.stop()
    # the tokens are forwarded as they come (32 tokens 1 ms apart: 31 ms from first to last), not held back to the end
    times = outs[-1].token_times
    assert (times[-1] - times[0]) / 1e6 >= 10.0, (proxy, protocol, times)
    assert entries["srv.total"] > 0
    assert (f"{proxy}.total" in entries) is reports
    if reports:
        # 32 tokens at 1 ms each: the stream's whole time, not the time to its first byte
        assert entries[f"{proxy}.upstream"] >= entries["srv.total"] - RESOLUTION_MS[proxy]


def test_litellm_reports_its_hop_and_passes_the_servers_entries_back(synthetic_server, tmp_path, monkeypatch):
    import json

    from pathprobe.loadgen.targets import ENV_HEADERS, CallSpec, OpenAITarget, Outcome

    if proxies.executable("litellm") is None:
        pytest.skip(proxies.missing_reason("litellm"))
    port = free_port()
    launch = proxies.launch(
        "litellm",
        tmp_path / "litellm",
        f"127.0.0.1:{port}",
        [f"127.0.0.1:{synthetic_server.http_port}"],
        "openai",
        model="synthetic",
    )
    run = Running(launch, port, tmp_path / "litellm.log", timeout=240)  # it imports for seconds
    try:
        monkeypatch.setenv(ENV_HEADERS, json.dumps(launch.headers))
        target = OpenAITarget(f"http://127.0.0.1:{port}", timeout_s=60, api="chat")
        try:
            for _ in range(3):
                out = Outcome()
                target.call(CallSpec(prompt="hello there", max_tokens=8, stream=False, model="synthetic"), {}, out)
                assert out.ok, out.error
        finally:
            target.close()
    finally:
        run.stop()
    e = out.entries
    assert e["srv.total"] > 0 and e["srv.decode_steps"] >= 6.0  # the server's own split survived LiteLLM
    assert e["litellm.upstream"] >= e["srv.total"]
    assert e["litellm.total"] >= e["litellm.upstream"]
    assert "litellm.overhead" in e  # what LiteLLM says about itself, kept beside the measurement
