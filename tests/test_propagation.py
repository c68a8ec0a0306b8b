"""The trace propagation check, against real proxies in front of a real traced server: it tells a
hop that starts its own span (our gateway), one that forwards ``traceparent`` unchanged (HAProxy,
and nginx as pathprobe configures it) and one that drops it (nginx told to clear the header, as
ingress-nginx does for gRPC backends) apart, over HTTP and gRPC."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from pathprobe import proxies
from pathprobe.analysis.lab import propagation as prop
from pathprobe.analysis.lab.propagation import HopSpec
from pathprobe.analysis.report.traces import Span

from tests.support.procs import Server, free_port
from tests.test_gateway import Gateway
from tests.test_proxies import Running

pytestmark = pytest.mark.slow

#: what makes nginx drop the header towards its upstream, per protocol
DROP = {"grpc": 'grpc_set_header traceparent "";', "http": 'proxy_set_header traceparent "";'}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Path]]:
    tmp = tmp_path_factory.mktemp("propagation")
    spans = tmp / "server-spans.jsonl"
    srv = Server(tmp, "--engine", "synthetic", "--traces-file", str(spans))
    yield srv, spans
    srv.stop()


def _url(protocol: str, port: int) -> str:
    return f"{'grpc' if protocol == 'grpc' else 'http'}://127.0.0.1:{port}"


def _upstream(srv: Server, protocol: str) -> str:
    return srv.grpc_target if protocol == "grpc" else f"127.0.0.1:{srv.http_port}"


def _proxy(name: str, protocol: str, srv: Server, tmp: Path, drop: bool = False) -> Running:
    if proxies.executable(name) is None:
        pytest.skip(proxies.missing_reason(name))
    port = free_port()
    launch = proxies.launch(name, tmp / f"{name}-{protocol}", f"127.0.0.1:{port}", [_upstream(srv, protocol)], protocol)
    if drop:
        text = launch.config.read_text()
        anchor = "grpc_pass grpc://llm;" if protocol == "grpc" else "proxy_pass http://llm;"
        assert anchor in text, "the nginx template changed: update DROP"
        launch.config.write_text(text.replace(anchor, f"{anchor}\n            {DROP[protocol]}"))
    return Running(launch, port, tmp / f"{name}-{protocol}.log")


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_direct_the_server_is_a_child_of_the_client(server, protocol: str) -> None:
    srv, spans = server
    port = srv.grpc_port if protocol == "grpc" else srv.http_port
    result = prop.check(_url(protocol, port), [], HopSpec("server", spans))
    assert [(h.label, h.verdict) for h in result.hops] == [("server", prop.OWN_SPAN)], result
    assert result.holds


@pytest.mark.parametrize("protocol", ["grpc", "http"])
@pytest.mark.parametrize("name", ["haproxy", "caddy"])
def test_haproxy_and_caddy_as_configured_forward_unchanged(server, tmp_path: Path, name: str, protocol: str) -> None:
    srv, spans = server
    hop = _proxy(name, protocol, srv, tmp_path)
    try:
        result = prop.check(_url(protocol, hop.port), [HopSpec(name)], HopSpec("server", spans))
    finally:
        hop.stop()
    verdicts = [(h.label, h.verdict) for h in result.hops]
    assert verdicts == [(name, prop.PASSES_UNCHANGED), ("server", prop.OWN_SPAN)], result
    assert result.holds


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_nginx_as_configured_forwards_and_a_dropping_nginx_breaks_the_chain(
    server, tmp_path: Path, protocol: str
) -> None:
    srv, spans = server
    keeps = _proxy("nginx", protocol, srv, tmp_path / "keeps")
    try:
        kept = prop.check(_url(protocol, keeps.port), [HopSpec("nginx")], HopSpec("server", spans))
    finally:
        keeps.stop()
    assert [h.verdict for h in kept.hops] == [prop.PASSES_UNCHANGED, prop.OWN_SPAN], kept
    drops = _proxy("nginx", protocol, srv, tmp_path / "drops", drop=True)
    try:
        dropped = prop.check(_url(protocol, drops.port), [HopSpec("nginx")], HopSpec("server", spans))
    finally:
        drops.stop()
    assert [h.verdict for h in dropped.hops] == [prop.NEW_ROOT, prop.OWN_SPAN], dropped
    assert not dropped.holds


def test_our_gateway_starts_its_own_span(server, tmp_path: Path) -> None:
    srv, spans = server
    gw_spans = tmp_path / "gateway-spans.jsonl"
    gw = Gateway(tmp_path, "passthrough", srv.grpc_target, "--traces-file", str(gw_spans))
    try:
        result = prop.check(f"grpc://127.0.0.1:{gw.port}", [HopSpec("passthrough", gw_spans)], HopSpec("server", spans))
    finally:
        gw.stop()
    assert [(h.label, h.verdict) for h in result.hops] == [
        ("passthrough", prop.OWN_SPAN),
        ("server", prop.OWN_SPAN),
    ], result


def _span(trace: str, span: str, parent: str, kind: str = "SERVER") -> Span:
    return Span(trace, span, parent, "s", kind, 1, 2)


def test_judge_names_each_failure() -> None:
    """The walk itself, on spans made by hand: a traced hop that ignores the context, one under the
    wrong parent, and two silent hops in a row that lost it (either may have)."""
    t, p = "a" * 32, "b" * 16
    hops = [HopSpec("gw", Path("gw"))]
    srv = HopSpec("server", Path("srv"))
    fresh = {"gw": [_span("c" * 32, "1" * 16, "")], "server": [_span("c" * 32, "2" * 16, "1" * 16)]}
    assert [v.verdict for v in prop.judge(hops, srv, fresh, t, p)] == [prop.NEW_ROOT, prop.OWN_SPAN]
    wrong = {"gw": [_span(t, "1" * 16, "9" * 16)], "server": [_span(t, "2" * 16, "1" * 16)]}
    assert [v.verdict for v in prop.judge(hops, srv, wrong, t, p)] == [prop.WRONG_PARENT, prop.OWN_SPAN]
    two = [HopSpec("a"), HopSpec("b")]
    lost = {"server": [_span("d" * 32, "2" * 16, "")]}
    verdicts = prop.judge(two, srv, lost, t, p)
    assert [v.verdict for v in verdicts] == [prop.NEW_ROOT, prop.NEW_ROOT, prop.OWN_SPAN]
    assert "one of a, b" in verdicts[0].detail
    missing = prop.judge([], srv, {"server": []}, t, p)
    assert [v.verdict for v in missing] == [prop.NO_SPAN]


def test_a_span_in_the_probes_trace_is_found_outside_the_requests_window(tmp_path: Path) -> None:
    """A process maps its monotonic clock to wall time once, at start; a step of the wall clock later
    moves its spans in wall time (a CI run: the server's spans came out earlier than the request that
    made them, beyond the window's slack). In the probe's trace, a span is the request's wherever it
    lies; one of another trace only inside the window (a hop that lost the context)."""
    t = "a" * 32
    early = 1_000_000_000_000  # 1 s before the request's window
    window = (early + 1_000_000_000, early + 1_005_000_000)

    def span(trace: str, span_id: str, start: int) -> dict:
        return {"traceId": trace, "spanId": span_id, "name": "s", "kind": "SPAN_KIND_SERVER"} | {
            "startTimeUnixNano": str(start),
            "endTimeUnixNano": str(start + 1000),
        }

    spans = [span(t, "1" * 16, early), span("c" * 32, "2" * 16, window[0] + 1000), span("d" * 32, "3" * 16, early)]
    res = {"resource": {"attributes": []}, "scopeSpans": [{"scope": {"name": "x"}, "spans": spans}]}
    path = tmp_path / "spans.jsonl"
    path.write_text(json.dumps({"resourceSpans": [res]}) + "\n")
    found = prop._window(path, *window, t)
    assert sorted(s.span_id for s in found) == ["1" * 16, "2" * 16]
    assert [s.span_id for s in prop._window(path, *window)] == ["2" * 16]
