"""The processes of a local compare (the ``Stack``) and each configuration's live path.

Local mode starts one model server and, per configuration, the gateway / proxy / delay relay it
needs, each on a free loopback port, and probes every path with a real request before any load.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pathprobe import vllmcpu
from pathprobe.analysis.config import UPSTREAM_PROTOCOL, CompareConfig, NetworkConfig, ServerConfig, TargetConfig
from pathprobe.analysis.placement import Placement, plan
from pathprobe.analysis.probes import handshake_ms, parse_startup, served_model, url_for, wait_ready
from pathprobe.analysis.procs import (
    LOOPBACK,
    Managed,
    Skipped,
    free_port,
    pathprobe_cmd,
    port_in_use,
    port_of,
    reachable,
    split_hostport,
)
from pathprobe.errors import ConfigError, PathprobeError


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


def _serve_args(s: ServerConfig, engine: str, gport: int, hport: int) -> list[str]:
    """``pathprobe serve`` for one of our servers on loopback (``s``: the config's server block)."""
    return pathprobe_cmd(
        "serve",
        "--engine",
        engine,
        "--model",
        s.model,
        "--host",
        LOOPBACK,
        "--grpc-port",
        str(gport),
        "--http-port",
        str(hport),
        "--max-batch-size",
        str(s.max_batch_size),
        "--http-server",
        s.http_server,
    )


class Stack:
    """Every process of a local compare; ``close()`` ends them all."""

    def __init__(self, cfg: CompareConfig, out: Path, log: Callable[[str], None]) -> None:
        self.cfg = cfg
        self.out = out
        self.log = log
        self.procs: list[Managed] = []
        self.server_grpc = ""
        self.server_http = ""
        self.front_ends: dict[str, str] = {}  # HTTP front end -> the server's address for it
        self.server: Managed | None = None
        self.traces_dir = out / "traces"
        self._pki: Any = None
        self.placement: Placement = (
            plan(cfg.placement) if cfg.mode == "local" else Placement(False, "remote mode: nothing local to place")
        )
        #: more servers, started when a target needs them: ours with another engine, vLLM's own
        self.others: dict[str, tuple[Managed, str, str]] = {}  # key -> (process, grpc H:P, http H:P)

    def pki(self) -> Any:
        """The run's throw-away CA and loopback certificates (made on first use, in the output folder)."""
        if self._pki is None:
            from pathprobe.pki import make_pki

            self._pki = make_pki(self.out / "tls", "compare")
        return self._pki

    def client_tls(self) -> Any:
        from pathprobe.tls import TlsFiles

        return TlsFiles(ca=str(self.pki().ca))

    def _start(self, m: Managed, role: str = "proxies") -> Managed:
        """Start ``m`` on the cores of its role (server | proxies) when placement is on."""
        m.cpus = self.placement.cpus(role)
        m.env = {**self.placement.env(role), **m.env}
        self.procs.append(m.start())
        self._write_pids()
        return m

    def _write_pids(self) -> None:
        info = {m.name: m.pid for m in self.procs}
        (self.out / "processes.json").write_text(json.dumps(info, indent=1), encoding="utf-8")

    def _traces_env(self, name: str) -> dict[str, str]:
        return {}

    def check_ports(self) -> None:
        """Early failure when a port the config pins is taken."""
        s = self.cfg.server
        pinned = [("server.grpc_port", s.grpc_port), ("server.http_port", s.http_port)]
        pinned += [(f"targets[{i}].port", t.port) for i, t in enumerate(self.cfg.targets) if t.enabled]
        for key, port in pinned:
            if port and port_in_use(LOOPBACK, port):
                raise ConfigError(f"{key}: {LOOPBACK}:{port} is already in use")

    def start_server(self) -> None:
        s = self.cfg.server
        gport, hport = s.grpc_port or free_port(), s.http_port or free_port()
        args = _serve_args(s, s.engine, gport, hport)
        self.front_ends = {s.http_server: f"{LOOPBACK}:{hport}"}
        for fe in sorted({t.front_end for t in self.cfg.targets if t.enabled and t.front_end} - {s.http_server}):
            port = free_port()
            args += ["--extra-http-server", f"{fe}:{port}"]
            self.front_ends[fe] = f"{LOOPBACK}:{port}"
        for flag, value in (
            ("--max-wait-ms", s.max_wait_ms),
            ("--max-queue", s.max_queue),
            ("--prefill-ms-per-token", s.prefill_ms_per_token),
            ("--decode-ms-per-token", s.decode_ms_per_token),
        ):
            if value is not None:
                args += [flag, str(value)]
        if self.cfg.tracing:
            args += ["--traces-file", str(self.traces_dir / "server.jsonl")]
        args += s.extra_args
        self.log(f"starting server ({s.engine}, {s.model}) on grpc {gport} / http {hport}")
        self.server = self._start(Managed("server", args, self.out / "logs" / "server.log"), "server")
        self.server_grpc, self.server_http = f"{LOOPBACK}:{gport}", f"{LOOPBACK}:{hport}"
        t0 = time.monotonic()
        wait_ready(url_for("http", self.server_http), s.startup_timeout_s, [self.server])
        wait_ready(url_for("grpc", self.server_grpc), 30, [self.server])
        for addr in self.front_ends.values():
            wait_ready(url_for("http", addr), 30, [self.server])
        self.log(f"server ready after {time.monotonic() - t0:.1f} s")

    def server_startup_ms(self) -> dict[str, float] | None:
        """The local server's startup phases (its ``/metrics`` gauges), or None."""
        if self.server is None:
            return None
        try:
            with urllib.request.urlopen(f"http://{self.server_http}/metrics", timeout=5) as resp:
                return parse_startup(resp.read().decode())
        except OSError:
            return None

    def our_server(self, engine: str | None) -> tuple[str, str, Managed | None]:
        """(grpc H:P, http H:P, process) of our server with ``engine`` (the default one, or a
        second server of ours started now with the same settings and another engine)."""
        s = self.cfg.server
        if engine is None or engine == s.engine:
            return self.server_grpc, self.server_http, self.server
        if engine == "vllm" and not vllmcpu.available():
            raise Skipped(f"engine vllm: {vllmcpu.unavailable_reason()}")
        key = f"server-{engine}"
        if key not in self.others:
            gport, hport = free_port(), free_port()
            args = [*_serve_args(s, engine, gport, hport), *s.extra_args]
            self.log(f"starting a second server of ours ({engine}, {s.model}) on grpc {gport} / http {hport}")
            m = self._start(Managed(key, args, self.out / "logs" / f"{key}.log"), "server")
            t0 = time.monotonic()
            wait_ready(url_for("http", f"{LOOPBACK}:{hport}"), s.startup_timeout_s, [m])
            self.log(f"{key} ready after {time.monotonic() - t0:.1f} s")
            self.others[key] = (m, f"{LOOPBACK}:{gport}", f"{LOOPBACK}:{hport}")
        m, g, h = self.others[key]
        return g, h, m

    def vllm_server(self) -> tuple[str, Managed]:
        """(H:P, process) of vLLM's own OpenAI server on loopback, started on first use."""
        if not vllmcpu.available():
            raise Skipped(vllmcpu.unavailable_reason())
        if "vllm-server" not in self.others:
            from pathprobe.server import models

            v, s = self.cfg.vllm, self.cfg.server
            spec = v.model or s.model
            folder = models.resolve_model(spec)
            port = v.port or free_port()
            args = vllmcpu.server_command(
                folder,
                port,
                served_name=models.model_display_name(spec, folder),
                host=LOOPBACK,
                max_model_len=v.max_model_len,
                dtype=v.dtype,
                max_num_seqs=v.max_num_seqs or s.max_batch_size,
                load_dummy=not models.has_weights(folder),
                extra=v.extra_args,
            )
            self.log(f"starting vLLM's server ({spec}) on {LOOPBACK}:{port}")
            m = self._start(
                Managed(
                    "vllm-server",
                    args,
                    self.out / "logs" / "vllm-server.log",
                    env=vllmcpu.cpu_env() if vllmcpu.is_cpu_build() else {},
                ),
                "server",
            )
            t0 = time.monotonic()
            wait_ready(url_for("openai", f"{LOOPBACK}:{port}"), v.startup_timeout_s, [m])
            self.log(f"vLLM's server ready after {time.monotonic() - t0:.1f} s")
            self.others["vllm-server"] = (m, "", f"{LOOPBACK}:{port}")
        m, _, h = self.others["vllm-server"]
        return h, m

    def relay(self, name: str, upstream: str, net: NetworkConfig) -> tuple[str, Managed]:
        port = free_port()
        args = pathprobe_cmd(
            "netem",
            "--listen",
            f"{LOOPBACK}:{port}",
            "--upstream",
            upstream,
            "--delay-ms",
            str(net.delay_ms),
            "--jitter-ms",
            str(net.jitter_ms),
            "--loss",
            str(net.loss),
            "--rto-ms",
            str(net.rto_ms),
        )
        if net.rate_mbit:
            args += ["--rate-mbit", str(net.rate_mbit)]
        m = self._start(Managed(f"{name}-relay", args, self.out / "logs" / f"{name}-relay.log"))
        deadline = time.monotonic() + 20
        while reachable(f"{LOOPBACK}:{port}", 0.5) is not None:
            if m.exit_code() is not None:
                raise PathprobeError(f"delay relay exited with code {m.exit_code()}: {m.tail()}")
            if time.monotonic() > deadline:
                raise PathprobeError(f"delay relay on port {port} not listening after 20 s")
            time.sleep(0.1)
        return f"{LOOPBACK}:{port}", m

    def build(self, t: TargetConfig) -> Path_:
        """Start what target ``t`` needs; returns its path (status ok/failed/skipped)."""
        p = Path_(t)
        net = self.cfg.network_for(t)
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
            front, m = self.relay(t.name, front, net)
            p.procs.append(m)
        p.url = url_for(t.protocol or "openai", front)

    def _vllm_direct(self, p: Path_, t: TargetConfig, net: NetworkConfig | None) -> None:
        """vLLM's own OpenAI server, no gateway."""
        upstream, m = self.vllm_server()
        p.procs.append(m)
        if net:
            if net.hop == "upstream":
                p.notes.append("vLLM's server, no gateway: the condition is on the client <-> server link")
            upstream, r = self.relay(t.name, upstream, net)
            p.procs.append(r)
        p.url = url_for(t.protocol or "openai", upstream)

    def _direct(self, p: Path_, t: TargetConfig, net: NetworkConfig | None) -> None:
        """Our server, no gateway (over the front end the target names)."""
        grpc_up, http_up, srv = self.our_server(t.engine)
        if srv is not None and srv is not self.server:  # a second server of ours (its own engine)
            p.procs.append(srv)
            upstream = grpc_up if t.protocol == "grpc" else http_up
        else:
            upstream = (
                self.server_grpc
                if t.protocol == "grpc"
                else self.front_ends.get(t.front_end or self.cfg.server.http_server, self.server_http)
            )
        ports = [port_of(upstream)]
        if net:
            if net.hop == "upstream":
                p.notes.append("direct path: no gateway, the condition is on the client <-> server link")
            upstream, m = self.relay(t.name, upstream, net)
            p.procs.append(m)
            ports.insert(0, port_of(upstream))
        p.chain = [(ports, "srv")]
        p.url = url_for(t.protocol or "grpc", upstream)

    def _proxied(self, p: Path_, t: TargetConfig, net: NetworkConfig | None) -> None:
        """One gateway of ours or a third-party proxy in front of a server (ours, or vLLM's own)."""
        proto = UPSTREAM_PROTOCOL[t.mode] if t.kind == "gateway" else t.protocol  # type: ignore[index]
        srv: Managed | None
        if t.upstream == "vllm":
            upstream, srv = self.vllm_server()
        else:
            grpc_up, http_up, srv = self.our_server(t.engine)
            upstream = grpc_up if proto == "grpc" else http_up
        if srv is not None and srv is not self.server:
            p.procs.append(srv)
        up_ports = [port_of(upstream)]
        if net and net.hop == "upstream":
            upstream, m = self.relay(f"{t.name}-up", upstream, net)
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
        client_tls = self.client_tls() if t.tls else None
        p.probe_ms = wait_ready(
            p.url, ready_s, [*p.procs, *([self.server] if self.server else [])], t.model, p.headers, client_tls
        )
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
            front, m = self.relay(f"{t.name}-client", front, net)
            p.procs.append(m)
        return url_for(t.protocol or "grpc", front, t.tls)

    def _chain(self, p: Path_, t: TargetConfig, net: NetworkConfig | None) -> None:
        """client -> chain[0] -> ... -> chain[-1] -> server, each hop started with the next as its
        upstream; a hop's ``network`` delays its link to its upstream (the top-level condition
        with ``hop: upstream`` goes on the innermost link unless that hop has its own)."""
        hops = t.chain or []
        upstream = self.server_grpc if hops[-1].upstream_protocol == "grpc" else self.server_http
        for i in range(len(hops) - 1, -1, -1):
            hop = hops[i]
            link = hop.network if hop.network is not None and hop.network.active else None
            if link is None and i == len(hops) - 1 and net and net.hop == "upstream":
                link = net
            if link is not None:
                upstream, m = self.relay(f"{t.name}-{i}-up", upstream, link)
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
        log = self.out / "logs" / f"{name}.log"
        if kind == "gateway":
            args = pathprobe_cmd("gateway", "--mode", mode or "passthrough", "--listen", listen, "--upstream", upstream)
            if self.cfg.tracing:
                args += ["--traces-file", str(self.traces_dir / f"gateway-{name}.jsonl")]
            if "--admin-port" not in gateway_args:  # its /metrics, for accounting (a chain: the outermost)
                admin = free_port()
                args += ["--admin-port", str(admin), "--admin-host", LOOPBACK]
                p.gateway_metrics = f"http://{LOOPBACK}:{admin}/metrics"
            if tls:  # the client hop over TLS, with the run's throw-away CA
                pki = self.pki()
                args += ["--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key)]
            p.procs.append(self._start(Managed(name, [*args, *gateway_args], log)))
            return listen
        from pathprobe import proxies

        exe = proxies.executable(kind)
        if exe is None:
            raise Skipped(proxies.missing_reason(kind))
        kw: dict[str, Any] = {"exe": exe}
        if kind == "litellm":
            model = model or served_model(self.server_http)
            kw["model"] = model
            p.load_args += ["--openai-api", "chat", "--model", model]
        launch = getattr(proxies, kind)(self.out / "proxies" / name, listen, [upstream], protocol, **kw)
        p.headers.update(launch.headers)
        p.procs.append(self._start(Managed(name, launch.args, log, env=launch.env)))
        out = self.out.resolve()
        p.notes.append(
            f"{kind} config: "
            + str(launch.config.relative_to(out) if launch.config.is_relative_to(out) else launch.config)
        )
        return listen

    def close(self) -> None:
        for m in reversed(self.procs):
            m.stop()
