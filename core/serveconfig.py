"""``pathprobe serve``'s configuration: one typed object, built once, as the gateway's.

Precedence: a value given to the constructor (a command-line flag) > the environment variable
named in :data:`ENV` > the field's default. Each key has its one default (the field's) and its
one check (:func:`check`, which the engine's own config calls too); the engine's options are
typed per engine (:mod:`pathprobe.engineoptions`). ``compare`` builds the ``serve`` command line
with :meth:`ServeConfig.to_argv`. No heavy import: the load generator and ``compare`` use it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Literal, cast

from pathprobe import engineoptions, environment
from pathprobe.engineoptions import EngineOptions
from pathprobe.errors import ConfigError
from pathprobe.tls import TlsFiles

ENGINES = ("transformers", "synthetic", "vllm")
HTTP_SERVERS = ("aiohttp", "fastapi")
Engine = Literal["transformers", "synthetic", "vllm"]
HttpServer = Literal["aiohttp", "fastapi"]

#: field -> environment variable read when the flag is not given (empty counts as unset)
ENV: dict[str, str] = environment.SERVE_OPTIONS

#: the largest request body (HTTP) / message (gRPC) accepted by default: 4 MiB
DEFAULT_MAX_BODY = 4 * 1024 * 1024

Value = str | int | float | bool | None


def _at_least(n: int) -> Callable[[Value], str | None]:
    def check(v: Value) -> str | None:
        return None if v is None or (isinstance(v, int) and v >= n) else f"must be at least {n}"

    return check


def _non_negative(v: Value) -> str | None:
    # `not >= 0` also rejects nan
    return None if isinstance(v, int | float) and not isinstance(v, bool) and v >= 0 else f"must be >= 0, got {v}"


def _finite_non_negative(v: Value) -> str | None:
    bad = _non_negative(v)
    return bad or (None if isinstance(v, int | float) and not math.isinf(v) else f"must be finite, got {v}")


def _port(v: Value) -> str | None:
    ok = isinstance(v, int) and 0 <= v <= 65535
    return None if ok else "must be a TCP port, 0..65535 (0 picks a free one)"


def _one_of(allowed: tuple[str, ...]) -> Callable[[Value], str | None]:
    def check(v: Value) -> str | None:
        return None if v in allowed else f"expected one of {', '.join(allowed)}, got {v!r}"

    return check


#: key -> its one check (a message when the value is bad); keys not here take any value of their type
CHECKS: dict[str, Callable[[Value], str | None]] = {
    "engine": _one_of(ENGINES),
    "http_server": _one_of(HTTP_SERVERS),
    "grpc_port": _port,
    "http_port": _port,
    "max_batch_size": _at_least(1),
    "max_queue": _at_least(1),
    "max_body_bytes": _at_least(1),
    "max_context": _at_least(1),
    "max_wait_ms": _finite_non_negative,
    "prefill_ms_per_token": _finite_non_negative,
    "decode_ms_per_token": _finite_non_negative,
    "drain_delay_s": _finite_non_negative,
    "drain_grace_s": _finite_non_negative,
}


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def check(name: str, value: Value) -> None:
    """The one check of serve option ``name`` (a :class:`ConfigError` naming its flag)."""
    test = CHECKS.get(name)
    bad = test(value) if test is not None else None
    if bad:
        raise ConfigError(f"{flag(name)}: {bad}")


def parse_extra_http(items: Sequence[str]) -> tuple[tuple[HttpServer, int], ...]:
    """``["fastapi:8001", ...]`` -> (("fastapi", 8001), ...)."""
    out: list[tuple[HttpServer, int]] = []
    for item in items:
        kind, sep, port = item.partition(":")
        if not sep or kind not in HTTP_SERVERS or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"--extra-http-server: expected aiohttp:PORT or fastapi:PORT, got {item!r}")
        out.append((cast(HttpServer, kind), int(port)))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class ServeConfig:
    engine: Engine = "transformers"
    model: str = "tiny"  # "tiny" | a local model folder | "preset:NAME"
    model_name: str | None = None  # name served to clients (default: derived from the model)
    host: str = "127.0.0.1"
    grpc_port: int = 50051
    http_port: int = 8000
    http_server: HttpServer = "aiohttp"  # the HTTP front end: aiohttp or FastAPI on uvicorn
    #: more HTTP front ends over the same engine: (kind, port), e.g. (("fastapi", 8001),)
    extra_http_server: tuple[tuple[HttpServer, int], ...] = ()
    device: str = "auto"  # cpu | cuda | cuda:N | auto
    dtype: str = "auto"  # float32 | bfloat16 | float16 | auto
    max_batch_size: int = 8
    max_wait_ms: float = 2.0  # how long the batcher waits to fill a batch
    max_queue: int = 256  # requests waiting beyond this are refused (429 / RESOURCE_EXHAUSTED)
    max_context: int | None = None  # default: the model's max_position_embeddings
    max_body_bytes: int = DEFAULT_MAX_BODY
    prefill_ms_per_token: float = 0.0  # synthetic engine
    decode_ms_per_token: float = 0.0  # synthetic engine
    #: the engine's typed options (``--engine-option KEY=VALUE``); default: the engine's defaults
    engine_options: EngineOptions | None = None
    engine_process: bool = False  # the engine in a process of its own
    traces_file: str | None = None
    api_key: str | None = None  # KEY[,KEY...] clients must send; none: no authentication
    #: on SIGTERM: seconds health says NOT_SERVING while new requests are still taken (so balancers
    #: take the server out first), then seconds in-flight requests get to finish before they are cut
    drain_delay_s: float = 0.0
    drain_grace_s: float = 30.0
    tls_cert: str | None = None  # TLS (and mTLS with a CA) on every port
    tls_key: str | None = None
    tls_ca: str | None = None
    # derived in __post_init__
    tls: TlsFiles | None = field(init=False, default=None, compare=False)
    api_keys: tuple[bytes, ...] = field(init=False, default=(), compare=False)

    def __post_init__(self) -> None:
        from pathprobe.auth import parse_keys

        for f in fields(self):
            if f.init:
                check(f.name, getattr(self, f.name))
        set_ = object.__setattr__  # frozen: the derived fields are set once, here
        set_(self, "engine_options", engineoptions.parse(self.engine, self.engine_options))
        if self.tls_cert or self.tls_key or self.tls_ca:
            tls = TlsFiles(self.tls_cert, self.tls_key, self.tls_ca, flag="--tls")
            set_(self, "tls", tls if tls.serving else None)
        set_(self, "api_keys", parse_keys(self.api_key, "--api-key"))

    def __repr__(self) -> str:  # never print keys
        return f"ServeConfig(engine={self.engine!r}, model={self.model!r}, grpc_port={self.grpc_port})"

    @property
    def options(self) -> EngineOptions:
        """The engine's typed options (set in ``__post_init__``)."""
        assert self.engine_options is not None
        return self.engine_options

    @classmethod
    def from_values(cls, given: Mapping[str, object], environ: Mapping[str, str] | None = None) -> ServeConfig:
        """``given`` (flags; None = not given) > ``environ`` (default ``os.environ``) > defaults."""
        env = os.environ if environ is None else environ
        kwargs: dict[str, object] = {}
        for f in fields(cls):
            if not f.init:
                continue
            value = given.get(f.name)
            if value is None and f.name in ENV and env.get(ENV[f.name]):
                value = env[ENV[f.name]]
            if value is not None:
                kwargs[f.name] = value
        return cls(**kwargs)  # type: ignore[arg-type]  # checked field by field in __post_init__

    def to_argv(self) -> list[str]:
        """The ``pathprobe serve`` flags that give this configuration (after ``serve``): every
        key not at its default, and every key an environment variable could set otherwise."""
        argv: list[str] = []
        for f in fields(self):
            if not f.init or f.name == "engine_options":
                continue
            value = getattr(self, f.name)
            if value is None or (value == f.default and f.name not in ENV):
                continue
            if f.name == "extra_http_server":
                for kind, port in value:
                    argv += [flag(f.name), f"{kind}:{port}"]
            elif isinstance(value, bool):
                argv += [flag(f.name)] if value else []
            else:
                argv += [flag(f.name), str(value)]
        for item in self.options.items():
            argv += ["--engine-option", item]
        return argv


#: every key at its default: the one place other configs take a serve default from
DEFAULTS = ServeConfig()
