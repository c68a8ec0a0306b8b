"""GatewayConfig: flags > environment > defaults, bad values named."""

from __future__ import annotations

import pytest
from pathprobe.errors import ConfigError
from pathprobe.gateway.config import ENV, GatewayConfig


def test_precedence_flag_env_default() -> None:
    env = {ENV["upstream"]: "127.0.0.1:9001", ENV["timeout"]: "5", ENV["decode_metadata"]: "false"}
    cfg = GatewayConfig.from_values({"timeout": 7.0, "mode": None}, env)
    assert cfg.targets == ["127.0.0.1:9001"]  # env
    assert cfg.timeout == 7.0  # flag beats env
    assert cfg.decode_metadata is False  # env bool
    assert cfg.mode == "passthrough" and cfg.listen_port == 8600  # defaults
    assert cfg.pool_size == 64


def test_http_modes_take_upstream_http() -> None:
    cfg = GatewayConfig.from_values({"mode": "reencode", "upstream": "a:1", "upstream_http": "b:2,c:3"}, {})
    assert cfg.targets == ["b:2", "c:3"] and cfg.http_upstream
    assert GatewayConfig(mode="transcode", upstream="a:1", upstream_http="b:2").targets == ["a:1"]


@pytest.mark.parametrize(
    "given, env, needle",
    [
        ({}, {}, "--upstream"),
        ({"upstream": "x:1"}, {ENV["threads"]: "many"}, ENV["threads"]),
        ({"upstream": "x:1", "balance": "random"}, {}, "--balance"),
        ({"upstream": "x:1", "max_body_bytes": 0}, {}, "--max-body-bytes"),
        ({"upstream": "x:1", "health_timeout": float("nan")}, {}, "--health-timeout"),
        ({"upstream": "x"}, {}, "--upstream"),
    ],
)
def test_bad_values_name_the_key(given, env, needle) -> None:
    with pytest.raises(ConfigError, match=needle.replace("-", r"\-")):
        GatewayConfig.from_values(given, env)
