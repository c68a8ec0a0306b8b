"""``pathprobe compare`` configuration: YAML, ``${ENV}`` substitution, pydantic validation.

Errors name the key (``targets[2].mode: ...``) and the problem, and are raised as
:class:`pathprobe.errors.ConfigError` so the CLI prints one line and exits 2.
"""

from __future__ import annotations

import os
import re
from itertools import pairwise
from pathlib import Path
from typing import Annotated, Literal, NamedTuple

from pathprobe import serveconfig
from pathprobe.errors import ConfigError
from pathprobe.serveconfig import DEFAULTS as SERVE
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

GATEWAY_MODES = ("passthrough", "transcode", "reencode", "http-proxy")
#: what a client speaks to each kind of target, and what the gateway speaks upstream
#: what a load generator speaks to a target (openai-sdk: the OpenAI routes through the official SDK)
ClientProtocol = Literal["grpc", "http", "openai", "openai-sdk"]
CLIENT_PROTOCOL: dict[str, ClientProtocol] = {
    "passthrough": "grpc",
    "transcode": "http",
    "reencode": "grpc",
    "http-proxy": "http",
}
UPSTREAM_PROTOCOL = {"passthrough": "grpc", "transcode": "grpc", "reencode": "http", "http-proxy": "http"}
#: gateways we did not write, started from pathprobe.proxies' configs, and what clients speak to them
THIRD_PARTY: dict[str, tuple[ClientProtocol, ...]] = {
    "nginx": ("grpc", "http"),
    "haproxy": ("grpc", "http"),
    "caddy": ("grpc", "http"),
    "litellm": ("openai",),
}


def _yaml_switch(value: object) -> object:
    """YAML 1.1 reads an unquoted ``on`` / ``off`` as true / false: take them back."""
    if value is True:
        return "on"
    if value is False:
        return "off"
    return value


#: auto | on | off, written quoted or not
Switch = Annotated[Literal["auto", "on", "off"], BeforeValidator(_yaml_switch)]

_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-(.*?))?\}")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class NetworkConfig(_Strict):
    """A WAN-like condition on one hop, applied by a delaying TCP relay.

    ``delay_ms`` is ONE-WAY and applies to each direction, like ``tc netem delay``
    on both ends of a link: a unary request crosses the hop once each way, so its
    latency (and its network segment) grows by 2 x ``delay_ms``.
    """

    hop: Literal["client", "upstream"] = Field(
        "upstream",
        description="client: client<->first hop (gateway, or server when direct); "
        "upstream: gateway<->server (direct paths: the client<->server link)",
    )
    delay_ms: float = Field(0.0, ge=0, le=60_000)
    jitter_ms: float = Field(0.0, ge=0, le=60_000)
    loss: float = Field(0.0, ge=0, lt=1, description="probability a chunk is 'lost' (held one retransmission timeout)")
    rto_ms: float = Field(200.0, gt=0, description="what a lost chunk costs (Linux' minimum RTO is 200 ms)")
    rate_mbit: float | None = Field(None, gt=0, description="bandwidth limit per direction")

    @property
    def active(self) -> bool:
        return bool(self.delay_ms or self.jitter_ms or self.loss or self.rate_mbit)


class ServerConfig(_Strict):
    """Our server's keys are ``serve``'s own: same defaults (None: serve's), same checks."""

    engine: Literal["synthetic", "transformers", "vllm"] = SERVE.engine
    model: str = SERVE.model
    max_batch_size: int = SERVE.max_batch_size
    max_wait_ms: float | None = None
    max_queue: int | None = None
    prefill_ms_per_token: float | None = None
    decode_ms_per_token: float | None = None
    extra_args: list[str] = Field(default_factory=list)
    #: local mode: our server runs its engine in a process of its own (``serve --engine-process``),
    #: so the engine's time does not depend on which front end serves the request
    engine_process: bool = True
    #: local mode: pin the server's ports (default: free ports); taken ports fail early
    grpc_port: int | None = Field(None, ge=1, le=65535)
    http_port: int | None = Field(None, ge=1, le=65535)
    startup_timeout_s: float = Field(180.0, gt=0)
    #: the HTTP front end of the server's own port; a direct target may ask for the other
    #: one (``front_end``), which the same server process then serves on a port of its own
    http_server: Literal["aiohttp", "fastapi"] = SERVE.http_server

    @field_validator("max_batch_size", "max_wait_ms", "max_queue", "prefill_ms_per_token", "decode_ms_per_token")
    @classmethod
    def _serve_check(cls, value: float | None, info: ValidationInfo) -> float | None:
        """``serve``'s own check of the key (one check per key); None: serve's default."""
        try:
            if value is not None:
                serveconfig.check(str(info.field_name), value)
        except ConfigError as exc:
            raise ValueError(str(exc).partition(": ")[2]) from None
        return value


class VllmServerConfig(_Strict):
    """vLLM's own OpenAI server, started on loopback in local mode for targets that use it
    (``kind: vllm``, or a gateway with ``upstream: vllm``); needs the vLLM extra (make vllm)."""

    model: str | None = Field(None, description="default: server.model")
    max_num_seqs: int | None = Field(None, ge=1, description="default: server.max_batch_size")
    max_model_len: int = Field(512, ge=16)
    dtype: str = "bfloat16"
    port: int | None = Field(None, ge=1, le=65535)
    startup_timeout_s: float = Field(600.0, gt=0)
    extra_args: list[str] = Field(default_factory=list)


class Payload(NamedTuple):
    """One point of a payload sweep."""

    prompt_tokens: int
    max_tokens: int

    @property
    def key(self) -> str:
        """The point in folder names and report keys: ``p64-m16``."""
        return f"p{self.prompt_tokens}-m{self.max_tokens}"


class LoadConfig(_Strict):
    duration_s: float = Field(3.0, gt=0, description="measured seconds per configuration, round and concurrency")
    warmup_s: float = Field(2.0, ge=0, description="per configuration, before any measurement")
    rounds: int = Field(3, ge=1)
    interleave: Literal["call", "run"] = Field(
        "call",
        description="call: one load process per round and concurrency sends each call to a configuration "
        "chosen in a shuffled order (paired per-call differences; used when every configuration asks for the "
        "same model); run: one load run per configuration, in rotated order",
    )
    concurrency: list[int] = Field(default_factory=lambda: [1, 4], min_length=1)
    arrival: Literal["closed", "constant", "poisson"] = "closed"
    rate: float | None = Field(None, gt=0, description="req/s for open-loop arrival")
    prompt_set: Literal["fixed", "sweep", "mixed", "file"] = "fixed"
    #: one size, or a payload sweep swept like concurrency (e.g. [64, 4096, 32768, 131072]): every
    #: (prompt_tokens, max_tokens) point runs for every configuration, round and concurrency
    prompt_tokens: int | list[int] = Field(64, description="prompt tokens, or a list: a payload sweep")
    prompt_file: str | None = None
    max_tokens: int | list[int] = Field(16, description="completion tokens, or a list: a payload sweep")
    stream: bool = True
    timeout_s: float = Field(60.0, gt=0, description="per request")
    extra_args: list[str] = Field(default_factory=list)

    @field_validator("concurrency")
    @classmethod
    def _positive(cls, v: list[int]) -> list[int]:
        for i, c in enumerate(v):
            if c < 1:
                raise ValueError(f"entry {i} is {c}; every concurrency must be >= 1")
        return v

    @field_validator("prompt_tokens", "max_tokens")
    @classmethod
    def _sizes(cls, v: int | list[int]) -> int | list[int]:
        sizes = v if isinstance(v, list) else [v]
        if not sizes:
            raise ValueError("an empty list; give one size or several")
        for i, n in enumerate(sizes):
            if n < 1:
                raise ValueError(f"entry {i} is {n}; every size must be >= 1")
        if len(set(sizes)) != len(sizes):
            raise ValueError(f"{sizes} repeats a size")
        return v

    @property
    def prompt_sizes(self) -> list[int]:
        """The prompt sizes swept (one when ``prompt_tokens`` is a number)."""
        return self.prompt_tokens if isinstance(self.prompt_tokens, list) else [self.prompt_tokens]

    @property
    def max_sizes(self) -> list[int]:
        return self.max_tokens if isinstance(self.max_tokens, list) else [self.max_tokens]

    @property
    def payloads(self) -> list[Payload]:
        """Every (prompt_tokens, max_tokens) point, in the order given (prompt sizes outer); the first is
        the primary point, the one the per-concurrency figures, verdicts and scorecard are made of."""
        return [Payload(p, m) for p in self.prompt_sizes for m in self.max_sizes]

    @property
    def swept(self) -> bool:
        """More than one payload point: runs are kept apart per point (``runs/NAME/c1-p64-m16/r0``)."""
        return len(self.payloads) > 1

    @model_validator(mode="after")
    def _rate(self) -> LoadConfig:
        if self.arrival != "closed" and self.rate is None:
            raise ValueError(f"arrival '{self.arrival}' needs 'rate' (requests per second)")
        if len(self.prompt_sizes) > 1 and self.prompt_set != "fixed":
            raise ValueError(f"a prompt_tokens sweep needs prompt_set 'fixed', not '{self.prompt_set}'")
        if self.prompt_set == "file" and not self.prompt_file:
            raise ValueError("prompt_set 'file' needs 'prompt_file'")
        if self.prompt_file and not os.path.isfile(self.prompt_file):  # found before any process starts
            raise ValueError(f"prompt_file: no such file: {self.prompt_file}")
        return self


class FrontierStreamConfig(_Strict):
    """The streams frontier: how many concurrent streams of ``chunks`` chunks, paced by the server
    (``gap_ms`` apart: the synthetic engine's ``decode_ms_per_token``), a path sustains before its
    added inter-chunk gap p99 crosses ``bound_ms``."""

    chunks: int = Field(64, ge=2, description="chunks (max_tokens) per stream")
    gap_ms: float | None = Field(
        None, gt=0, description="the pacing; must equal server.decode_ms_per_token (default: the server's)"
    )
    bound_ms: float = Field(5.0, gt=0, description="the added gap p99 that ends the search")
    start: int = Field(1, ge=1, description="concurrent streams of the first step")
    max_streams: int = Field(64, ge=1)
    duration_s: float = Field(5.0, gt=0, description="measured seconds per step")


class FrontierConfig(_Strict):
    """The throughput frontier (opt-in): per configuration, open-loop rate steps (the path and the
    direct path of its client protocol at the same time, at every step) up to where the added p99
    crosses each bound or errors appear; the knee found by bisection (analysis/lab/frontier.py)."""

    bounds_ms: list[float] = Field(default_factory=lambda: [1.0, 5.0, 10.0, 50.0], min_length=1)
    start_rps: float = Field(10.0, gt=0, description="requests/s of the first step")
    max_rps: float = Field(400.0, gt=0, description="the highest rate offered")
    growth: float = Field(2.0, gt=1, description="the step up: each rate is the last x growth")
    tolerance: float = Field(0.1, gt=0, lt=1, description="bisection ends when held and crossed are this close")
    duration_s: float = Field(3.0, gt=0, description="measured seconds per step")
    warmup_s: float = Field(1.0, ge=0, description="each step's first seconds, not counted")
    users: int = Field(64, ge=1, description="users of each open-loop load process (requests in flight at most)")
    max_tokens: int = Field(1, ge=1, description="unary steps: max_tokens per request")
    targets: list[str] | None = Field(
        None, description="configurations to search (default: every one with a direct path)"
    )
    unary: bool = Field(True, description="search the request rate (unary calls)")
    stream: FrontierStreamConfig | None = None

    @field_validator("bounds_ms")
    @classmethod
    def _bounds(cls, v: list[float]) -> list[float]:
        for i, b in enumerate(v):
            if b <= 0:
                raise ValueError(f"entry {i} is {b}; every bound must be > 0 ms")
        return sorted(set(v))

    @model_validator(mode="after")
    def _range(self) -> FrontierConfig:
        if self.start_rps > self.max_rps:
            raise ValueError(f"start_rps {self.start_rps:g} is above max_rps {self.max_rps:g}")
        if self.stream is not None and self.stream.start > self.stream.max_streams:
            raise ValueError(f"stream.start {self.stream.start} is above stream.max_streams {self.stream.max_streams}")
        return self


class HopConfig(_Strict):
    """One hop of a ``chain`` target: a pathprobe gateway or a third-party proxy."""

    kind: Literal["gateway", "nginx", "haproxy", "caddy"]
    mode: Literal["passthrough", "transcode", "reencode", "http-proxy"] | None = None
    #: third-party proxies: what they proxy (grpc or http); gateways: fixed by the mode
    protocol: Literal["grpc", "http"] | None = None
    gateway_args: list[str] = Field(default_factory=list)
    #: a condition on the link from this hop to its upstream (the next hop, or the server)
    network: NetworkConfig | None = None

    @model_validator(mode="after")
    def _check(self) -> HopConfig:
        if (self.kind == "gateway") != (self.mode is not None):
            raise ValueError("'mode' is needed by kind 'gateway' and only by it")
        if self.kind == "gateway" and self.protocol is not None:
            raise ValueError("a gateway hop's protocols follow from its mode; leave 'protocol' out")
        if self.kind != "gateway" and self.protocol is None:
            self.protocol = "grpc"
        return self

    @property
    def client_protocol(self) -> str:
        return CLIENT_PROTOCOL[self.mode] if self.kind == "gateway" else self.protocol  # type: ignore[index,return-value]

    @property
    def upstream_protocol(self) -> str:
        return UPSTREAM_PROTOCOL[self.mode] if self.kind == "gateway" else self.protocol  # type: ignore[index,return-value]


class TargetConfig(_Strict):
    """One configuration of the matrix."""

    name: str = Field(..., min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    kind: Literal["direct", "gateway", "nginx", "haproxy", "caddy", "litellm", "chain", "external", "vllm"]
    #: openai-sdk: the OpenAI-compatible routes through the official openai SDK (what an
    #: application's SDK adds shows as client serialization)
    protocol: ClientProtocol | None = None
    mode: Literal["passthrough", "transcode", "reencode", "http-proxy"] | None = None
    #: remote mode (any kind) or external: the address the load generator hits,
    #: as a URL (grpc://H:P, http://H:P, openai+http://H:P) or H:P
    address: str | None = None
    #: local mode: pin the port this configuration listens on (gateway, nginx, haproxy, caddy, litellm)
    port: int | None = Field(None, ge=1, le=65535)
    #: external OpenAI-compatible targets and litellm: the model name to ask for (litellm: default
    #: the one our server serves)
    model: str | None = None
    gateway_args: list[str] = Field(default_factory=list)
    #: local mode, kind direct or gateway: which of our servers (its engine; default server.engine;
    #: another engine starts a second server of ours)
    engine: Literal["synthetic", "transformers", "vllm"] | None = None
    #: local mode, kind gateway: what it forwards to (server: ours; vllm: vLLM's own server)
    upstream: Literal["server", "vllm"] = "server"
    #: kind 'chain': the hops from the client inwards (client -> chain[0] -> ... -> server)
    chain: list[HopConfig] | None = None
    #: direct HTTP/OpenAI targets: which of the server's HTTP front ends to call
    #: (default: server.http_server), so both frameworks run side by side over one engine
    front_end: Literal["aiohttp", "fastapi"] | None = None
    #: a network condition for this configuration only (overrides the top-level one), so the
    #: same path with and without a WAN-like hop can run side by side in one interleaved run
    network: NetworkConfig | None = None
    #: local mode, gateway kind: serve the client hop over TLS (a throw-away CA made for the run), so
    #: its cost shows side by side with the same gateway in plaintext; the handshake is measured apart
    tls: bool = False
    enabled: bool = True

    @model_validator(mode="after")
    def _check(self) -> TargetConfig:
        if (self.kind == "chain") != (self.chain is not None):
            raise ValueError("'chain' (a list of hops) is needed by kind 'chain' and only by it")
        if self.tls and self.kind != "gateway":
            raise ValueError(
                "'tls' applies to kind 'gateway' (external targets: give a grpcs:// or https:// "
                "address and the CA in PATHPROBE_LOAD_TLS_CA)"
            )
        if self.kind == "gateway" and self.mode is None:
            raise ValueError(f"kind 'gateway' needs 'mode' (one of {', '.join(GATEWAY_MODES)})")
        if self.kind != "gateway" and self.mode is not None:
            raise ValueError(f"'mode' only applies to kind 'gateway', not '{self.kind}'")
        if self.front_end is not None and (self.kind != "direct" or (self.protocol or "grpc") == "grpc"):
            raise ValueError("'front_end' only applies to kind 'direct' with protocol http or openai")
        if self.chain is not None:
            return self._check_chain(self.chain)
        if self.kind == "external" and not self.address:
            raise ValueError("kind 'external' needs 'address'")
        if self.kind == "vllm":
            if self.protocol not in (None, "openai", "openai-sdk"):
                raise ValueError(
                    f"vLLM's server speaks the OpenAI API (protocol openai or openai-sdk), not '{self.protocol}'"
                )
            if self.protocol is None:
                self.protocol = "openai"
        if self.engine is not None and self.kind not in ("direct", "gateway"):
            raise ValueError(f"'engine' picks one of our servers (kind direct or gateway), not kind '{self.kind}'")
        if self.upstream == "vllm":
            if self.kind != "gateway" or self.mode != "http-proxy":
                raise ValueError(
                    "upstream 'vllm' needs kind 'gateway' with mode 'http-proxy' "
                    "(vLLM's server speaks the OpenAI API over HTTP)"
                )
            if self.engine is not None:
                raise ValueError("'engine' and upstream 'vllm' exclude each other")
            if self.protocol is None:
                self.protocol = "openai"
        if self.kind == "direct" and self.protocol is None:
            self.protocol = "grpc"
        if self.kind == "gateway" and self.protocol is None:
            self.protocol = CLIENT_PROTOCOL[self.mode]  # type: ignore[index]
        if (
            self.kind == "gateway"
            and self.protocol not in (CLIENT_PROTOCOL[self.mode], "openai", "openai-sdk")  # type: ignore[index]
            and not (self.mode in ("transcode", "http-proxy") and self.protocol == "http")
        ):
            raise ValueError(
                f"gateway mode '{self.mode}' accepts {CLIENT_PROTOCOL[self.mode]} clients, not '{self.protocol}'"  # type: ignore[index]
            )
        if self.kind in THIRD_PARTY:
            allowed = THIRD_PARTY[self.kind]
            if self.protocol is None:
                self.protocol = allowed[0]
            elif self.protocol not in allowed:
                raise ValueError(f"kind '{self.kind}' proxies {' and '.join(allowed)} clients, not '{self.protocol}'")
        if self.kind == "external" and self.protocol is None:
            self.protocol = _protocol_of(self.address or "") or "openai"
        return self

    def _check_chain(self, chain: list[HopConfig]) -> TargetConfig:
        if not chain:
            raise ValueError("'chain' needs at least one hop")
        for i, (outer, inner) in enumerate(pairwise(chain)):
            if outer.upstream_protocol != inner.client_protocol:
                raise ValueError(
                    f"chain[{i}] sends {outer.upstream_protocol} upstream but chain[{i + 1}] "
                    f"accepts {inner.client_protocol}"
                )
        first = chain[0].client_protocol
        if self.protocol is None:
            self.protocol = first  # type: ignore[assignment]
        elif self.protocol != first:
            raise ValueError(f"the chain's first hop accepts {first} clients, not '{self.protocol}'")
        if self.network is not None and self.network.active and self.network.hop != "client":
            raise ValueError(
                "a chain's own 'network' is on its client link (hop: client); "
                "put a condition on an inner link under that hop's 'network'"
            )
        return self


def _protocol_of(address: str) -> ClientProtocol | None:
    if address.startswith(("grpc://", "grpcs://")):
        return "grpc"
    if address.startswith("openai+"):
        return "openai"
    if address.startswith(("http://", "https://")):
        return "http"
    return None


def _default_targets() -> list[TargetConfig]:
    return [
        TargetConfig(name="direct-grpc", kind="direct", protocol="grpc"),
        TargetConfig(name="direct-http", kind="direct", protocol="http"),
        TargetConfig(name="direct-http-fastapi", kind="direct", protocol="http", front_end="fastapi"),
        TargetConfig(name="passthrough", kind="gateway", mode="passthrough"),
        TargetConfig(name="transcode", kind="gateway", mode="transcode"),
        TargetConfig(name="reencode", kind="gateway", mode="reencode"),
        TargetConfig(name="http-proxy", kind="gateway", mode="http-proxy"),
        TargetConfig(name="nginx", kind="nginx"),
    ]


class CompareConfig(_Strict):
    mode: Literal["local", "remote"] = "local"
    out: str = "pathprobe-compare"
    baseline: str | None = Field(None, description="target name every other is tested against (default: the first)")
    alpha: float = Field(0.05, gt=0, lt=1)
    min_effect_ms: float = Field(
        0.2,
        ge=0,
        description="interleaved runs: a paired path-tax difference whose median is below max(min_effect_ms, "
        "min_effect_rel x the baseline's path tax) is 'no clear difference', however small its p-value",
    )
    min_effect_rel: float = Field(0.05, ge=0, lt=1, description="see min_effect_ms")
    bootstrap: int = Field(1000, ge=100)
    slowest: int = Field(5, ge=0, description="slowest requests per configuration whose traces are listed")
    tracing: bool = True
    placement: Switch = Field(
        "auto",
        description="local mode: pin the engine, the proxies and the load generator to separate cores "
        "(auto: from 3 cores; on: also on 2; env PATHPROBE_CPU_PLACEMENT overrides)",
    )
    witness: Literal["none", "pcap"] = Field(
        "none",
        description="pcap: capture the run's loopback packets (tcpdump) and split each link's network "
        "into wire and stack time per request at concurrency 1 (local mode)",
    )
    server: ServerConfig = Field(default_factory=ServerConfig)
    vllm: VllmServerConfig = Field(default_factory=VllmServerConfig)
    load: LoadConfig = Field(default_factory=LoadConfig)
    network: NetworkConfig | None = None
    targets: list[TargetConfig] = Field(default_factory=_default_targets, min_length=1)
    #: opt-in: the throughput frontier of each configuration, after the measured rounds
    frontier: FrontierConfig | None = None

    @model_validator(mode="after")
    def _check(self) -> CompareConfig:
        seen: set[str] = set()
        for t in self.targets:
            if t.name in seen:
                raise ValueError(f"target name '{t.name}' appears twice")
            seen.add(t.name)
        enabled = [t.name for t in self.targets if t.enabled]
        if not enabled:
            raise ValueError("no enabled target")
        if self.baseline is not None and self.baseline not in enabled:
            raise ValueError(f"baseline '{self.baseline}' is not an enabled target ({', '.join(enabled)})")
        if self.mode == "remote":
            for t in self.targets:
                if t.enabled and not t.address:
                    raise ValueError(f"remote mode: target '{t.name}' needs 'address'")
        if self.frontier is not None:
            self._check_frontier(self.frontier, enabled)
        return self

    def _check_frontier(self, fr: FrontierConfig, enabled: list[str]) -> None:
        for name in fr.targets or ():
            if name not in enabled:
                raise ValueError(f"frontier.targets: '{name}' is not an enabled target ({', '.join(enabled)})")
        stream = fr.stream
        if stream is None or stream.gap_ms is None or self.mode != "local" or self.server.engine != "synthetic":
            return
        pacing = self.server.decode_ms_per_token or SERVE.decode_ms_per_token
        if abs(stream.gap_ms - pacing) > 1e-9:
            raise ValueError(
                f"frontier.stream.gap_ms: {stream.gap_ms:g} ms is not the server's pacing "
                f"(server.decode_ms_per_token: {pacing:g} ms); set both to the same value"
            )

    @property
    def enabled_targets(self) -> list[TargetConfig]:
        return [t for t in self.targets if t.enabled]

    @property
    def baseline_name(self) -> str:
        return self.baseline or self.enabled_targets[0].name

    def network_for(self, target: TargetConfig) -> NetworkConfig | None:
        """The condition on ``target``'s path. A target's own ``network`` block always inserts the relay,
        even with nothing to apply (delay 0: the relay's own cost, the baseline of a delayed twin);
        the top-level block only when it applies something."""
        if target.network is not None:
            return target.network
        net = self.network
        return net if net is not None and net.active else None


# ---------------------------------------------------------------- loading


def substitute_env(node: object, env: dict[str, str] | None = None, path: str = "") -> object:
    """Replace ``${VAR}`` / ``${VAR:-default}`` in every string value; a missing
    variable without default is an error naming the key."""
    env = dict(os.environ) if env is None else env
    if isinstance(node, dict):
        return {k: substitute_env(v, env, f"{path}.{k}" if path else str(k)) for k, v in node.items()}
    if isinstance(node, list):
        return [substitute_env(v, env, f"{path}[{i}]") for i, v in enumerate(node)]
    if isinstance(node, str):

        def repl(m: re.Match[str]) -> str:
            name, default = m.group(1), m.group(2)
            if name in env:
                return env[name]
            if default is not None:
                return default
            raise ConfigError(
                f"{path or '<root>'}: environment variable ${{{name}}} is not set (use ${{{name}:-default}})"
            )

        whole = _ENV.fullmatch(node)
        out = _ENV.sub(repl, node)
        if whole is not None:
            # a value that is exactly ${VAR} may be a number or bool: let YAML type it
            import yaml

            try:
                typed = yaml.safe_load(out)
            except yaml.YAMLError:
                return out
            return typed if isinstance(typed, (int, float, bool)) or typed is None else out
        return out
    return node


def _loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "<root>"


def format_validation_error(exc: ValidationError, source: str = "") -> str:
    lines = []
    for err in exc.errors():
        loc = _loc(tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-"))))
        typ = err.get("type", "")
        msg = err.get("msg", "invalid")
        if typ == "extra_forbidden":
            msg = "unknown key"
        elif msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        given = err.get("input")
        if typ not in ("extra_forbidden", "missing") and not isinstance(given, (dict, list)):
            msg += f" (got {given!r})"
        lines.append(f"{loc}: {msg}")
    prefix = f"{source}: " if source else ""
    return prefix + "; ".join(lines)


def parse_config(data: object, source: str = "", env: dict[str, str] | None = None) -> CompareConfig:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source or 'config'}: the top level must be a mapping of keys, not {type(data).__name__}")
    data = substitute_env(data, env)
    try:
        return CompareConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, source)) from None


def load_config(path: str | os.PathLike[str] | None, env: dict[str, str] | None = None) -> CompareConfig:
    """Read and validate a YAML file (None -> the built-in defaults)."""
    if path is None:
        return CompareConfig()
    import yaml

    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read config: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML: {exc}") from None
    return parse_config(data, str(p), env)
