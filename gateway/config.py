"""The gateway's configuration: one typed object, built once, handed to every mode.

Precedence: a value given to the constructor (a command-line flag) > the environment
variable named in :data:`ENV` > the field's default. Every mode reads this object; none
sees the raw command line.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from pathprobe import environment
from pathprobe.auth import ApiKeys, bearer, parse_keys
from pathprobe.errors import ConfigError
from pathprobe.tls import TlsFiles

MODES = ("passthrough", "transcode", "reencode", "http-proxy")
BALANCE = ("round-robin", "least-outstanding")
IMPLS = ("h2", "grpc")
LOOPS = ("auto", "asyncio", "uvloop")
POLLERS = ("legacy", "default")

#: field -> environment variable read when the flag is not given
ENV: dict[str, str] = environment.GATEWAY_OPTIONS

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def _convert(name: str, raw: str, kind: object) -> str | int | float | bool:
    """An environment string as the field's type; a bad value names the variable."""
    var = ENV[name]
    try:
        if kind is bool or kind == "bool":
            low = raw.strip().lower()
            if low in _TRUE:
                return True
            if low in _FALSE:
                return False
            raise ValueError(raw)
        if kind in (int, "int"):
            return int(raw)
        if kind in (float, "float"):
            return float(raw)
    except ValueError:
        raise ConfigError(f"{var}: expected {getattr(kind, '__name__', kind)}, got {raw!r}") from None
    return raw


@dataclass(slots=True)
class GatewayConfig:
    mode: str = "passthrough"
    listen: str = "127.0.0.1:8600"
    upstream: str | None = None
    upstream_http: str | None = None
    balance: str = "round-robin"
    health_interval: float = 1.0
    health_timeout: float = 1.0
    unhealthy_after: int = 2
    timeout: float = 600.0
    max_body_bytes: int = 4 * 1024 * 1024
    admin_port: int = 0
    admin_host: str | None = None
    threads: int = 64
    workers: int = 1
    worker_child: bool = False
    impl: str = "h2"
    loop: str = "auto"
    decode_metadata: bool = True
    grpc_poller: str = "legacy"
    pool_size: int = 64
    traces_file: str | None = None
    log_level: str = "WARNING"
    # TLS to clients (tls_ca: require client certificates, mTLS)
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    # TLS to upstreams (on when upstream_tls or any upstream_* file is set)
    upstream_tls: bool = False
    upstream_ca: str | None = None
    upstream_cert: str | None = None
    upstream_key: str | None = None
    upstream_server_name: str | None = None
    # overload: calls in flight per upstream at most (0: no cap), and the retry hint of a refusal
    max_inflight: int = 0
    retry_after_ms: float = 1000.0
    # SIGTERM: seconds health says NOT_SERVING before the listener closes, then seconds in-flight
    # calls get to finish
    drain_delay_s: float = 0.0
    drain_grace_s: float = 30.0
    # auth: keys clients must present (KEY[,KEY...]); the key sent upstream instead of the client's
    # (unset: the client's authorization / x-api-key goes upstream unchanged)
    api_key: str | None = None
    upstream_api_key: str | None = None
    # derived in __post_init__
    listen_host: str = field(init=False, default="")
    listen_port: int = field(init=False, default=0)
    targets: list[str] = field(init=False, default_factory=list)
    tls: TlsFiles | None = field(init=False, default=None)
    upstream_tls_files: TlsFiles | None = field(init=False, default=None)
    auth: ApiKeys = field(init=False, default_factory=ApiKeys)

    def __post_init__(self) -> None:
        from pathprobe.gateway.common import parse_hostport, parse_upstreams

        self._check_choices()
        self.listen_host, self.listen_port = parse_hostport(self.listen, "--listen")
        raw = (self.upstream_http or self.upstream) if self.http_upstream else self.upstream
        if not raw:
            flag = "--upstream-http or --upstream" if self.http_upstream else "--upstream"
            raise ConfigError(f"{flag}: required for --mode {self.mode}")
        self.targets = parse_upstreams(
            raw, "--upstream-http" if self.http_upstream and self.upstream_http else "--upstream"
        )
        self._check_numbers()
        if self.max_inflight < 0 or self.retry_after_ms < 0:
            raise ConfigError("--max-inflight/--retry-after-ms: must be >= 0")
        if self.drain_delay_s < 0 or self.drain_grace_s < 0:
            raise ConfigError("--drain-delay-s/--drain-grace-s: must be >= 0")
        self._tls()
        self.auth = ApiKeys(parse_keys(self.api_key, "--api-key"))
        if self.upstream_api_key is not None and not self.upstream_api_key.strip():
            raise ConfigError("--upstream-api-key: empty key")

    def _tls(self) -> None:
        if self.tls_cert or self.tls_key or self.tls_ca:
            self.tls = TlsFiles(self.tls_cert, self.tls_key, self.tls_ca, flag="--tls")
            if not self.tls.serving:
                raise ConfigError("--tls-cert/--tls-key: needed to serve TLS (--tls-ca alone only verifies clients)")
        if self.upstream_tls or self.upstream_ca or self.upstream_cert or self.upstream_server_name:
            self.upstream_tls_files = TlsFiles(
                self.upstream_cert, self.upstream_key, self.upstream_ca, self.upstream_server_name, flag="--upstream"
            )

    def _check_numbers(self) -> None:
        for name in ("max_body_bytes", "workers", "threads", "unhealthy_after", "pool_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')}: must be at least 1, got {getattr(self, name)}")
        for name in ("timeout", "health_timeout"):
            if not getattr(self, name) > 0:  # also rejects nan
                raise ConfigError(f"--{name.replace('_', '-')}: must be > 0 seconds, got {getattr(self, name)}")
        if not self.health_interval >= 0:
            raise ConfigError(f"--health-interval: must be >= 0 seconds (0 = off), got {self.health_interval}")
        if not 0 <= self.admin_port <= 65535:
            raise ConfigError(f"--admin-port: must be a TCP port, 0..65535 (0 = off), got {self.admin_port}")

    def _check_choices(self) -> None:
        for name, allowed in (
            ("mode", MODES),
            ("balance", BALANCE),
            ("impl", IMPLS),
            ("loop", LOOPS),
            ("grpc_poller", POLLERS),
        ):
            value = getattr(self, name)
            if value not in allowed:
                raise ConfigError(f"--{name.replace('_', '-')}: expected one of {', '.join(allowed)}, got {value!r}")

    @property
    def upstream_authorization(self) -> str | None:
        """The ``authorization`` value sent upstream in place of the client's, if configured."""
        return bearer(self.upstream_api_key.strip()) if self.upstream_api_key else None

    def __repr__(self) -> str:  # never print keys
        return f"GatewayConfig(mode={self.mode!r}, listen={self.listen!r}, targets={self.targets!r})"

    @property
    def upstream_scheme(self) -> str:
        """URL scheme of the HTTP upstreams."""
        return "https" if self.upstream_tls_files else "http"

    @property
    def http_upstream(self) -> bool:
        """reencode and http-proxy call the servers' HTTP port; the others their gRPC port."""
        return self.mode in ("reencode", "http-proxy")

    @classmethod
    def from_values(cls, given: Mapping[str, object], environ: Mapping[str, str] | None = None) -> GatewayConfig:
        """``given`` (flags; None = not given) > ``environ`` (default ``os.environ``) > defaults."""
        env = os.environ if environ is None else environ
        kwargs: dict[str, Any] = {}  # checked by the constructor, field by field
        for f in fields(cls):
            if not f.init:
                continue
            value = given.get(f.name)
            if value is None and f.name in ENV and ENV[f.name] in env:
                value = _convert(f.name, env[ENV[f.name]], f.type)
            if value is not None:
                kwargs[f.name] = value
        return cls(**kwargs)
