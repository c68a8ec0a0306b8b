"""Each configuration's live path: what a local compare starts for it (a gateway of ours, a
third-party proxy, a chain of them, delaying relays) on the shared processes (:class:`PathHost`),
and the real request that tells it answers."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pathprobe.analysis.lab.config import UPSTREAM_PROTOCOL, NetworkConfig, TargetConfig
from pathprobe.analysis.lab.limits import Limits
from pathprobe.analysis.lab.limits import gateway_args as limit_args
from pathprobe.analysis.lab.probes import handshake_ms, served_model, url_for, wait_ready
from pathprobe.analysis.lab.procs import (
    LOOPBACK,
    Managed,
    Skipped,
    free_port,
    pathprobe_cmd,
    port_of,
    reachable,
    split_hostport,
)
from pathprobe.errors import ConfigError, PathprobeError

if TYPE_CHECKING:
    from pathprobe.analysis.lab.config import CompareConfig
    from pathprobe.pki import Pki
    from pathprobe.tls import TlsFiles


@dataclass
class Path_:
    """One configuration's live path."""

    target: TargetConfig
    url: str = ""
    procs: list[Managed] = field(default_factory=list)
    status: str = "pending"  # pending, ok, failed, skipped
    reason: str = ""
    probe_ms: float | None = None
    notes: list[str] = field(default_factory=list)
    #: headers every request on this path needs (LiteLLM's master key), passed to the load
    #: generator in its environment, never on a command line
    headers: dict[str, str] = field(default_factory=dict)
    #: extra ``pathprobe load`` arguments this path needs (LiteLLM: the chat route, the model)
    load_args: list[str] = field(default_factory=list)
    #: the loopback ports a request passes, per link (client side first), for the wire witness
    chain: list[tuple[list[int], str]] = field(default_factory=list)
    tls_handshake: dict[str, float] | None = None
    tls_ca: str = ""  # the CA the load generator verifies this path's TLS with
    gateway_metrics: str = ""  # the gateway's /metrics URL (local mode), for accounting
    #: RSS (bytes) of the path's own processes: after start-up, before any load; and the most seen
    #: after a measured run (the plateau under load); None: no process of its own, or not read
    rss_rest: int | None = None
    rss_load: int | None = None
    #: for the trace propagation check: the path's hops, outermost first, each with the spans file it
    #: writes (None: a hop that exports no spans), and the spans file of the server behind them (None:
    #: not a server whose spans this run collects)
    trace_hops: list[tuple[str, Path | None]] = field(default_factory=list)
    server_spans: Path | None = None

    @property
    def name(self) -> str:
        return self.target.name

    def dead(self) -> Managed | None:
        return next((p for p in self.procs if p.exit_code() is not None), None)


def expected_shift_ms(net: NetworkConfig | None) -> float:
    """What the condition should add to one request: one-way delay x 2 traversals (+ mean jitter)."""
    if net is None:
        return 0.0
    return 2.0 * (net.delay_ms + net.jitter_ms / 2.0)


class PathHost(Protocol):
    """What a :class:`PathBuilder` needs of the shared processes it starts a path on (the lab's
    :class:`~pathprobe.analysis.lab.stack.Stack` is one): this module never imports its owner."""

    cfg: CompareConfig
    out: Path
    traces_dir: Path
    server: Managed | None
    server_grpc: str
    server_http: str
    front_ends: dict[str, str]
    limits: Limits | None

    def pki(self) -> Pki: ...
    def client_tls(self) -> TlsFiles: ...
    def start(self, m: Managed, role: str = ...) -> Managed: ...
    def our_server(self, engine: str | None) -> tuple[str, str, Managed | None]: ...
    def vllm_server(self) -> tuple[str, Managed]: ...
    def relay(self, name: str, upstream: str, net: NetworkConfig) -> tuple[str, Managed]: ...


class PathBuilder:
    """Starts what one configuration needs on ``stack`` and probes it."""

    def __init__(self, stack: PathHost) -> None:
        self.stack = stack

    def build(self, t: TargetConfig) -> Path_:
        """Start what target ``t`` needs; returns its path (status ok/failed/skipped)."""
        p = Path_(t)
        net = self.stack.cfg.network_for(t)
        try:
            if t.kind == "external":
                self._external(p, t, net)
            elif t.kind == "vllm":
                self._vllm_direct(p, t, net)
            elif t.kind == "direct":
                self._direct(p, t, net)
            elif t.kind == "chain":
                self._chain(p, t, net)
            else:  # one gateway or third-party proxy in front of a server (ours, or vLLM's own)
                self._proxied(p, t, net)
            self._probe(p, t)
            p.status = "ok"
        except Skipped as exc:
            p.status, p.reason = "skipped", exc.message
        except ConfigError:
            raise
        except PathprobeError as exc:
            p.status, p.reason = "failed", f"did not start: {exc.message}"
        return p

    def _external(self, p: Path_, t: TargetConfig, net: NetworkConfig | None) -> None:
        """A server someone else runs: checked reachable, behind a delaying relay when a condition is on."""
        addr = split_hostport(t.address or "")
        why = reachable(f"{addr[0]}:{addr[1]}")
        if why:
            raise ConfigError(f"target '{t.name}': {t.address} is unreachable: {why}")
        front = f"{addr[0]}:{addr[1]}"
        if net:
            if net.hop == "upstream":
                p.notes.append(
                    "external target: the condition is put on the only hop pathprobe controls (client <-> target)"
                )
            front, m = self.stack.relay(t.name, front, net)
            p.procs.append(m)
        p.url = url_for(t.protocol or "openai", front)

    def _vllm_direct(self, p: Path_, t: TargetConfig, net: NetworkConfig | None) -> None:
        """vLLM's own OpenAI server, no gateway."""
        upstream, m = self.stack.vllm_server()
        p.procs.append(m)
        if net:
            if net.hop == "upstream":
                p.notes.append("vLLM's server, no gateway: the condition is on the client <-> server link")
            upstream, r = self.stack.relay(t.name, upstream, net)
            p.procs.append(r)
        p.url = url_for(t.protocol or "openai", upstream)

    def _main_server_spans(self, p: Path_, srv: Managed | None) -> None:
        """The path ends at the run's server of ours: its spans are in this run's traces (when traced)."""
        if srv is not None and srv is self.stack.server and self.stack.cfg.tracing:
            p.server_spans = self.stack.traces_dir / "server.jsonl"

    def _direct(self, p: Path_, t: TargetConfig, net: NetworkConfig | None) -> None:
        """Our server, no gateway (over the front end the target names)."""
        grpc_up, http_up, srv = self.stack.our_server(t.engine)
        self._main_server_spans(p, srv)
        if srv is not None and srv is not self.stack.server:  # a second server of ours (its own engine)
            p.procs.append(srv)
            upstream = grpc_up if t.protocol == "grpc" else http_up
        else:
            upstream = (
                self.stack.server_grpc
                if t.protocol == "grpc"
                else self.stack.front_ends.get(t.front_end or self.stack.cfg.server.http_server, self.stack.server_http)
            )
        ports = [port_of(upstream)]
        if net:
            if net.hop == "upstream":
                p.notes.append("direct path: no gateway, the condition is on the client <-> server link")
            upstream, m = self.stack.relay(t.name, upstream, net)
            p.procs.append(m)
            ports.insert(0, port_of(upstream))
        p.chain = [(ports, "srv")]
        p.url = url_for(t.protocol or "grpc", upstream)

    def _proxied(self, p: Path_, t: TargetConfig, net: NetworkConfig | None) -> None:
        """One gateway of ours or a third-party proxy in front of a server (ours, or vLLM's own)."""
        proto = UPSTREAM_PROTOCOL[t.mode] if t.kind == "gateway" else t.protocol  # type: ignore[index]
        srv: Managed | None
        if t.upstream == "vllm":
            upstream, srv = self.stack.vllm_server()
        else:
            grpc_up, http_up, srv = self.stack.our_server(t.engine)
            upstream = grpc_up if proto == "grpc" else http_up
            self._main_server_spans(p, srv)
        if srv is not None and srv is not self.stack.server:
            p.procs.append(srv)
        up_ports = [port_of(upstream)]
        if net and net.hop == "upstream":
            upstream, m = self.stack.relay(f"{t.name}-up", upstream, net)
            p.procs.append(m)
            up_ports.insert(0, port_of(upstream))
        front = self._hop(
            p, t.name, t.kind, t.mode, t.protocol or "grpc", upstream, t.gateway_args, t.port, t.model, t.tls
        )
        p.url = self._front(p, t, front, net)
        front_ports = [port_of(front)]
        if net and net.hop == "client":
            front_ports.insert(0, port_of(p.url))
        # the wire witness follows these ports; a third-party proxy counts as silent there
        p.chain = [(front_ports, "gw" if t.kind == "gateway" else "silent"), (up_ports, "srv")]

    def _probe(self, p: Path_, t: TargetConfig) -> None:
        """One real request through the started path (and, over TLS, what a new connection costs)."""
        ready_s = 240 if t.kind == "litellm" else 60  # LiteLLM imports for seconds (tens on a busy box)
        client_tls = self.stack.client_tls() if t.tls else None
        server = [self.stack.server] if self.stack.server else []
        p.probe_ms = wait_ready(p.url, ready_s, [*p.procs, *server], t.model, p.headers, client_tls)
        if client_tls is not None:
            p.tls_ca = client_tls.ca or ""
            tcp, tls_ms = handshake_ms(p.url.split("://", 1)[1], client_tls)
            p.tls_handshake = {"tcp_connect_ms": tcp, "tcp_plus_tls_ms": tls_ms, "n": 20}
            p.notes.append(
                f"TLS on the client hop: a new connection costs {tls_ms:.2f} ms (TCP connect + "
                f"handshake, median of 20) vs {tcp:.2f} ms plaintext; measured requests reuse "
                "their connections (steady state)"
            )

    def _front(self, p: Path_, t: TargetConfig, front: str, net: NetworkConfig | None) -> str:
        """The URL clients use: ``front``, behind a delaying relay when the condition is on the client hop."""
        if net and net.hop == "client":
            front, m = self.stack.relay(f"{t.name}-client", front, net)
            p.procs.append(m)
        return url_for(t.protocol or "grpc", front, t.tls)

    def _chain(self, p: Path_, t: TargetConfig, net: NetworkConfig | None) -> None:
        """client -> chain[0] -> ... -> chain[-1] -> server, each hop started with the next as its
        upstream; a hop's ``network`` delays its link to its upstream (the top-level condition
        with ``hop: upstream`` goes on the innermost link unless that hop has its own)."""
        hops = t.chain or []
        upstream = self.stack.server_grpc if hops[-1].upstream_protocol == "grpc" else self.stack.server_http
        self._main_server_spans(p, self.stack.server)
        for i in range(len(hops) - 1, -1, -1):
            hop = hops[i]
            link = hop.network if hop.network is not None and hop.network.active else None
            if link is None and i == len(hops) - 1 and net and net.hop == "upstream":
                link = net
            if link is not None:
                upstream, m = self.stack.relay(f"{t.name}-{i}-up", upstream, link)
                p.procs.append(m)
            upstream = self._hop(
                p, f"{t.name}-{i}", hop.kind, hop.mode, hop.client_protocol, upstream, hop.gateway_args, None, None
            )
        p.notes.append(
            "chain: client -> " + " -> ".join(f"{h.kind}{'/' + h.mode if h.mode else ''}" for h in hops) + " -> server"
        )
        p.url = self._front(p, t, upstream, net)

    def _hop(
        self,
        p: Path_,
        name: str,
        kind: str,
        mode: str | None,
        protocol: str,
        upstream: str,
        gateway_args: list[str],
        port: int | None,
        model: str | None,
        tls: bool = False,
    ) -> str:
        """Start one gateway or third-party proxy in front of ``upstream``; its listen address.
        Raises _Skipped when the proxy is not installed."""
        port = port or free_port()
        listen = f"{LOOPBACK}:{port}"
        log = self.stack.out / "logs" / f"{name}.log"
        if kind == "gateway":
            args = pathprobe_cmd("gateway", "--mode", mode or "passthrough", "--listen", listen, "--upstream", upstream)
            spans = self.stack.traces_dir / f"gateway-{name}.jsonl" if self.stack.cfg.tracing else None
            if spans is not None:
                args += ["--traces-file", str(spans)]
            p.trace_hops.insert(0, (name, spans))  # hops are started from the server outwards
            if "--admin-port" not in gateway_args:  # its /metrics, for accounting (a chain: the outermost)
                admin = free_port()
                args += ["--admin-port", str(admin), "--admin-host", LOOPBACK]
                p.gateway_metrics = f"http://{LOOPBACK}:{admin}/metrics"
            if self.stack.limits is not None:  # sized for the run's largest payload, unless given
                args += limit_args(self.stack.limits, gateway_args)
            if tls:  # the client hop over TLS, with the run's throw-away CA
                pki = self.stack.pki()
                args += ["--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key)]
            p.procs.append(self.stack.start(Managed(name, [*args, *gateway_args], log)))
            return listen
        from pathprobe import proxies

        exe = proxies.executable(kind)
        if exe is None:
            raise Skipped(proxies.missing_reason(kind))
        kw: dict[str, Any] = {"exe": exe}
        if kind in ("nginx", "caddy") and self.stack.limits is not None:
            kw["max_body"] = self.stack.limits.body_bytes
        if kind == "litellm":
            model = model or served_model(self.stack.server_http)
            kw["model"] = model
            p.load_args += ["--openai-api", "chat", "--model", model]
        launch = getattr(proxies, kind)(self.stack.out / "proxies" / name, listen, [upstream], protocol, **kw)
        p.trace_hops.insert(0, (name, None))  # as configured here, a third-party proxy exports no spans
        p.headers.update(launch.headers)
        p.procs.append(self.stack.start(Managed(name, launch.args, log, env=launch.env)))
        out = self.stack.out.resolve()
        p.notes.append(
            f"{kind} config: "
            + str(launch.config.relative_to(out) if launch.config.is_relative_to(out) else launch.config)
        )
        return listen
