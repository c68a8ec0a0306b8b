"""The delaying TCP relay against a plain TCP echo server (ground truth: known delays)."""

from __future__ import annotations

import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
from pathprobe.netem import DelayRelay, LinkSpec


@pytest.fixture()
def echo() -> Iterator[tuple[str, int]]:
    srv = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def handle(c: socket.socket) -> None:
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with c:
            while data := c.recv(65536):
                c.sendall(data)

    def accept() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                c, _ = srv.accept()
            except (TimeoutError, OSError):
                continue
            threading.Thread(target=handle, args=(c,), daemon=True).start()

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield srv.getsockname()[:2]
    stop.set()
    t.join()
    srv.close()


def rtts(addr: tuple[str, int], n: int, size: int = 100) -> list[float]:
    out = []
    with socket.create_connection(addr) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(n):
            t0 = time.perf_counter()
            s.sendall(b"x" * size)
            got = 0
            while got < size:
                got += len(s.recv(65536))
            out.append((time.perf_counter() - t0) * 1e3)
    return out


def test_delay_applies_once_per_direction(echo):
    base = statistics.median(rtts(echo, 50))
    with DelayRelay(echo, LinkSpec()) as r0:
        zero = statistics.median(rtts(("127.0.0.1", r0.port), 50))
    for d in (2.0, 10.0):
        with DelayRelay(echo, LinkSpec(delay_ms=d)) as r:
            med = statistics.median(rtts(("127.0.0.1", r.port), 30))
        added = med - zero
        # one round trip crosses the relay twice: + 2 D
        assert abs(added - 2 * d) <= max(0.1 * 2 * d, 0.5), (d, med, zero, base)


def test_bytes_order_and_eof_are_kept(echo):
    payload = bytes(range(256)) * 4000  # ~1 MB, many chunks
    with DelayRelay(echo, LinkSpec(delay_ms=1, jitter_ms=2)) as r:
        with socket.create_connection(("127.0.0.1", r.port)) as s:
            threading.Thread(target=lambda: (s.sendall(payload), s.shutdown(socket.SHUT_WR)), daemon=True).start()
            got = bytearray()
            while chunk := s.recv(65536):
                got += chunk
    assert bytes(got) == payload  # in order, complete, and EOF passed through both ways


def test_rate_limit_and_loss(echo):
    size = 50_000
    with DelayRelay(echo, LinkSpec(rate_mbit=4)) as r:  # 50 kB at 4 Mbit/s = 100 ms per direction
        t = rtts(("127.0.0.1", r.port), 1, size)[0]
    assert 100 <= t <= 400
    with DelayRelay(echo, LinkSpec(loss=0.5, rto_ms=50), seed=1) as r:
        ts = rtts(("127.0.0.1", r.port), 20)
    slow = [x for x in ts if x >= 50]
    assert 2 <= len(slow) <= 19  # roughly half the chunks pay an RTO; never all, never none


def test_upstream_down_resets_client():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[:2]  # bound, not listening: connect is refused
        with DelayRelay(dead, LinkSpec(delay_ms=1)) as r, socket.create_connection(("127.0.0.1", r.port)) as c:
            c.settimeout(5)
            try:
                assert c.recv(10) == b""
            except ConnectionResetError:
                pass


def test_cli_runs_relay(echo):
    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    p = port.getsockname()[1]
    port.close()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pathprobe",
            "netem",
            "--listen",
            f"127.0.0.1:{p}",
            "--upstream",
            f"{echo[0]}:{echo[1]}",
            "--delay-ms",
            "3",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        assert f"127.0.0.1:{p}" in line and "delay 3 ms one-way" in line
        assert statistics.median(rtts(("127.0.0.1", p), 10)) >= 6
    finally:
        proc.terminate()
        proc.wait(10)
    bad = subprocess.run(
        [sys.executable, "-m", "pathprobe", "netem", "--upstream", "nohost"], capture_output=True, text=True
    )
    assert bad.returncode == 2 and "--upstream: expected HOST:PORT" in bad.stderr
