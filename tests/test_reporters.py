"""Gateways we did not write: what they say in their own headers becomes a Server-Timing hop.

Recorded responses (tests/data/gateways/):
- ``litellm-1.108.7-chat*.http``: LiteLLM proxy 1.108.7's response headers as it sent them in
  front of ``pathprobe serve --engine synthetic`` (with ``LITELLM_DETAILED_TIMING=true`` and
  ``return_response_headers: true``; ids replaced, cost headers trimmed).
- ``envoy-unary.http``: Envoy's router headers in the format of Envoy's documentation
  (``server: envoy``, ``x-envoy-upstream-service-time`` in whole ms); Envoy cannot run here.

They are replayed by a real HTTP server on loopback and read by the load generator's real
OpenAI target, so the same code reads them as reads a live gateway.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from pathprobe import reporters, timing

DATA = Path(__file__).parent / "data" / "gateways"


def recorded(name: str) -> tuple[int, list[tuple[str, str]], bytes]:
    head, _, body = (DATA / name).read_bytes().partition(b"\n\n")
    lines = head.decode().splitlines()
    status = int(lines[0].split()[1])
    headers = [(k.strip(), v.strip()) for k, _, v in (ln.partition(":") for ln in lines[1:])]
    return status, headers, body


def getter(headers: list[tuple[str, str]]):
    d: dict[str, str] = {}
    for k, v in headers:
        d.setdefault(k.lower(), v)
    return d.get


def test_litellm_unary_headers_become_its_hop_after_the_servers_entries():
    _, headers, _ = recorded("litellm-1.108.7-chat.http")
    values = reporters.litellm(getter(headers))
    assert len(values) == 2  # the server's entries passed back, then LiteLLM's own hop
    assert timing.parse(values[0])["srv.total"] == pytest.approx(26.214)
    hop = timing.parse(values[1])
    assert hop == pytest.approx(
        {"litellm.upstream": 38.295, "litellm.overhead": 29.471, "litellm.callback": 0.0, "litellm.total": 67.766}
    )
    assert values[1].endswith("litellm.total;dur=67.766;desc=litellm")  # the closing entry


def test_litellm_stream_headers_are_a_time_to_first_byte_and_are_not_used():
    _, headers, _ = recorded("litellm-1.108.7-chat-stream.http")
    assert reporters.litellm(getter(headers)) == []


def test_envoy_reports_only_its_upstream_time():
    _, headers, _ = recorded("envoy-unary.http")
    assert reporters.envoy(getter(headers)) == ["envoy.upstream;dur=9.000;desc=envoy"]
    assert reporters.litellm(getter(headers)) == []


@pytest.mark.parametrize("bad", ["None", "", "abc", "-3", "nan", "inf"])
def test_a_value_that_is_not_a_duration_is_ignored_never_guessed(bad):
    get = {"x-envoy-upstream-service-time": bad, "x-litellm-response-duration-ms": bad}.get
    assert reporters.gateway_values(get) == []


def test_litellm_without_optional_headers_still_closes_its_hop():
    get = {"x-litellm-response-duration-ms": "12.5"}.get
    assert reporters.litellm(get) == ["litellm.total;dur=12.500;desc=litellm"]


# --- replayed through the load generator's HTTP client -----------------------------------


class _Replay(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    response_file = ""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        status, headers, body = recorded(self.server.response_file)  # type: ignore[attr-defined]
        self.send_response(status)
        for k, v in headers:
            if k.lower() not in ("content-length", "date", "server"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        return None


@pytest.fixture()
def replay() -> Iterator[ThreadingHTTPServer]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Replay)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    yield srv
    srv.shutdown()
    srv.server_close()


@pytest.mark.parametrize(
    "name, api, stream, expect",
    [
        ("envoy-unary.http", "completions", False, {"srv.total": 7.9, "envoy.upstream": 9.0}),
        (
            "litellm-1.108.7-chat.http",
            "chat",
            False,
            {"srv.total": 26.214, "litellm.upstream": 38.295, "litellm.total": 67.766},
        ),
    ],
)
def test_load_generator_reads_recorded_gateway_responses(replay, name, api, stream, expect):
    from pathprobe.loadgen.targets import CallSpec, OpenAITarget, Outcome

    replay.response_file = name  # type: ignore[attr-defined]
    target = OpenAITarget(f"http://127.0.0.1:{replay.server_address[1]}", timeout_s=10, api=api)
    try:
        out = Outcome()
        target.call(CallSpec(prompt="hi", max_tokens=8, stream=stream, model="synthetic"), {}, out)
    finally:
        target.close()
    assert out.ok, out.error
    for key, value in expect.items():
        assert out.entries[key] == pytest.approx(value)


class _RecordedCall:
    """A finished gRPC call's metadata as an Envoy router in front of our server returns it:
    ``x-envoy-upstream-service-time`` in the response headers (initial metadata), the
    server's ``server-timing`` in the trailers."""

    def __init__(self, initial, trailing):
        self._initial, self._trailing = initial, trailing

    def initial_metadata(self):
        return self._initial

    def trailing_metadata(self):
        return self._trailing


def test_grpc_response_headers_become_the_outer_hops():
    from pathprobe.loadgen.targets import entries_from_call

    srv = "srv.decode;dur=0.010, srv.queue;dur=0.005, srv.decode_steps;dur=7.000, srv.total;dur=7.600"
    call = _RecordedCall(
        initial=(("server", "envoy"), ("x-envoy-upstream-service-time", "9")), trailing=(("server-timing", srv),)
    )
    chain = entries_from_call(call)
    assert [h.kind for h in chain.hops] == ["srv", "envoy"]
    assert chain["envoy.upstream"] == 9.0 and chain["srv.total"] == 7.6
    # a proxy that writes Server-Timing into the response headers (HAProxy, Caddy)
    call = _RecordedCall(
        initial=(("server-timing", "haproxy.upstream;dur=8.1, haproxy.total;dur=8.2;desc=h"),),
        trailing=(("server-timing", srv),),
    )
    assert [h.kind for h in entries_from_call(call).hops] == ["srv", "haproxy"]
