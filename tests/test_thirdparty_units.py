"""Config and bookkeeping for third-party gateways and chains (no processes)."""

from __future__ import annotations

import pytest
from pathprobe.analysis.lab.config import parse_config
from pathprobe.analysis.report.selfreport import add_self_reports, claims, outside_server_ms, reference_for
from pathprobe.errors import ConfigError


def _target(**kw):
    return parse_config({"targets": [{"name": "t", **kw}]}).targets[0]


@pytest.mark.parametrize(
    "kind, protocol", [("nginx", "grpc"), ("haproxy", "grpc"), ("caddy", "grpc"), ("litellm", "openai")]
)
def test_third_party_kinds_default_protocol(kind, protocol):
    assert _target(kind=kind).protocol == protocol


@pytest.mark.parametrize("kind, bad", [("haproxy", "openai"), ("litellm", "grpc"), ("caddy", "openai")])
def test_a_protocol_the_proxy_cannot_carry_is_an_error_naming_the_key(kind, bad):
    with pytest.raises(ConfigError, match=rf"targets\[0\]: kind '{kind}' proxies .* not '{bad}'"):
        _target(kind=kind, protocol=bad)


def test_chain_protocols_must_meet_and_the_first_hop_sets_the_clients_protocol():
    t = _target(kind="chain", chain=[{"kind": "nginx"}, {"kind": "gateway", "mode": "passthrough"}])
    assert t.protocol == "grpc"
    t = _target(
        kind="chain",
        chain=[
            {"kind": "gateway", "mode": "http-proxy"},
            {"kind": "gateway", "mode": "transcode", "network": {"delay_ms": 3}},
        ],
    )
    assert t.protocol == "http" and t.chain[1].network.delay_ms == 3
    with pytest.raises(ConfigError, match=r"chain\[0\] sends grpc upstream but chain\[1\] accepts http"):
        _target(kind="chain", chain=[{"kind": "haproxy"}, {"kind": "gateway", "mode": "transcode"}])
    with pytest.raises(ConfigError, match=r"'chain' .* is needed by kind 'chain' and only by it"):
        _target(kind="gateway", mode="passthrough", chain=[{"kind": "nginx"}])
    with pytest.raises(ConfigError, match="needs at least one hop"):
        _target(kind="chain", chain=[])
    with pytest.raises(ConfigError, match="client link"):
        _target(kind="chain", chain=[{"kind": "nginx"}], network={"hop": "upstream", "delay_ms": 1})
    with pytest.raises(ConfigError, match="leave 'protocol' out"):
        _target(kind="chain", chain=[{"kind": "gateway", "mode": "passthrough", "protocol": "grpc"}])


def _rec(e2e, entries, ok=True):
    return {"ok": ok, "e2e_ms": e2e, "client_encode_ms": 0.1, "client_decode_ms": 0.1, "entries": entries}


def test_self_report_is_shown_beside_the_measured_tax_never_instead():
    lite = [
        _rec(50.0, {"srv.total": 10.0, "litellm.upstream": 15.0, "litellm.overhead": 19.0, "litellm.total": 34.0})
        for _ in range(4)
    ]
    direct = [_rec(11.2, {"srv.total": 10.0}) for _ in range(4)]
    targets = {
        "direct-openai": {"kind": "direct", "protocol": "openai", "status": "ok", "by_concurrency": {"1": {}}},
        "litellm": {"kind": "litellm", "protocol": "openai", "status": "ok", "by_concurrency": {"1": {}}},
    }
    lines = add_self_reports(targets, {"litellm": {1: lite}, "direct-openai": {1: direct}}, "direct-openai")
    sr = targets["litellm"]["by_concurrency"]["1"]["self_report"]
    assert sr["reference"] == "direct-openai"
    assert sr["claims"]["litellm.overhead"]["says_mean_ms"] == pytest.approx(19.0)
    assert sr["claims"]["litellm.overhead"]["hop_own_mean_ms"] == pytest.approx(19.0)
    assert sr["measured_tax_mean_ms"] == pytest.approx((50.0 - 0.2 - 10.0) - (11.2 - 0.2 - 10.0))
    assert [x["entry"] for x in lines] == ["litellm.overhead"]
    assert "direct-openai" not in {k for k, t in targets.items() if "self_report" in t["by_concurrency"]["1"]}


def test_claims_and_outside_server_use_the_hop_list_when_records_have_one():
    rec = {
        "ok": True,
        "e2e_ms": 30.0,
        "client_encode_ms": 0.0,
        "client_decode_ms": 0.0,
        "hops": [
            {"kind": "srv", "entries": {"srv.total": 10.0}},
            {"kind": "litellm", "entries": {"litellm.upstream": 12.0, "litellm.overhead": 5.0, "litellm.total": 17.0}},
        ],
    }
    assert outside_server_ms([rec]) == pytest.approx(20.0)
    assert claims([rec])["litellm.overhead"]["hop_own_mean_ms"] == pytest.approx(5.0)
    assert claims([_rec(5.0, {"srv.total": 1.0})]) == {}


def test_reference_is_a_direct_path_of_the_same_protocol_family_else_the_baseline():
    targets = {
        "direct-grpc": {"kind": "direct", "protocol": "grpc", "status": "ok"},
        "direct-http": {"kind": "direct", "protocol": "http", "status": "ok"},
        "litellm": {"kind": "litellm", "protocol": "openai", "status": "ok"},
        "nginx": {"kind": "nginx", "protocol": "grpc", "status": "ok"},
    }
    assert reference_for("litellm", targets, "direct-grpc") == "direct-http"
    assert reference_for("nginx", targets, "direct-http") == "direct-grpc"
    del targets["direct-http"]
    assert reference_for("litellm", targets, "direct-grpc") == "direct-grpc"
