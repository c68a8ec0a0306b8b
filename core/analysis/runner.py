"""``pathprobe compare``'s engine room: start the paths, run the load, collect records.

Local mode starts one model server and, per configuration, the gateway / nginx /
delay relay it needs, each on a free loopback port, and probes every path with a
real request before any load. Remote mode only probes the given addresses.

Method: every configuration is warmed up first (its first request is reported as
the cold start and nothing from the warm-up enters the figures); then, for each
round and each concurrency, every configuration runs one ``pathprobe load`` of
the same duration, in an order rotated per round, so drift on a shared machine
hits all configurations alike.
"""

from __future__ import annotations

import json
import math
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pathprobe import environment, vllmcpu
from pathprobe.address import parse_hostport
from pathprobe.analysis.config import UPSTREAM_PROTOCOL, CompareConfig, NetworkConfig, TargetConfig
from pathprobe.analysis.placement import Placement, plan
from pathprobe.errors import ConfigError, PathprobeError

LOOPBACK = "127.0.0.1"
#: vLLM's OpenTelemetry batch exporter every 0.5 s, as our processes export (its default is 5 s:
#: the last spans of a run would still be in its buffer when compare reads the traces)
VLLM_TRACES_ENV = {"OTEL_BSP_SCHEDULE_DELAY": "500"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def port_in_use(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def reachable(address: str, timeout: float = 3.0) -> str | None:
    """None when a TCP connection to HOST:PORT succeeds, else the reason."""
    host, port = split_hostport(address)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as exc:
        return exc.strerror or str(exc)


def parse_startup(metrics_text: str) -> dict[str, float]:
    """``pathprobe_server_startup_ms{phase=...}`` gauges from a Prometheus text page."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        if family.name == "pathprobe_server_startup_ms":
            for sample in family.samples:
                out[sample.labels["phase"]] = sample.value
    return out


def split_hostport(address: str) -> tuple[str, int]:
    return parse_hostport(address, f"address {address!r}", default_host=LOOPBACK)


def _port(hostport: str) -> int:
    return split_hostport(hostport)[1]


def url_for(protocol: str, hostport: str, tls: bool = False) -> str:
    scheme = {"grpc": "grpc", "http": "http", "openai": "openai+http", "openai-sdk": "openai-sdk+http"}[protocol]
    return f"{scheme}{'s' if tls else ''}://{hostport}"


def normalize_address(address: str, protocol: str) -> str:
    """A load-generator URL from an address that may lack its scheme."""
    if "://" in address:
        return address
    return url_for(protocol, address)


def served_model(http_address: str, timeout: float = 10.0) -> str:
    """The first model id a server lists on ``GET /v1/models`` (what LiteLLM is told to ask for)."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://{http_address}/v1/models", timeout=timeout) as resp:
            data = json.loads(resp.read()).get("data") or [{}]
        return str(data[0].get("id") or "default")
    except (OSError, ValueError) as exc:
        raise PathprobeError(f"GET http://{http_address}/v1/models failed: {exc}") from None


# ------------------------------------------------------------------ processes


class Skipped(PathprobeError):
    """A configuration that cannot run here (a component is not installed); the reason is shown."""


@dataclass
class Managed:
    """A child process compare started; its output goes to a log file."""

    name: str
    args: list[str]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    popen: subprocess.Popen | None = None
    cpus: tuple[int, ...] = ()  # pinned to these cores (inherited by its threads and children); () = any

    def start(self) -> Managed:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - the child's output until stop() closes it
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        cpus = self.cpus
        self.popen = subprocess.Popen(
            self.args,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
        )
        return self

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen else None

    def exit_code(self) -> int | None:
        return None if self.popen is None else self.popen.poll()

    def tail(self, n: int = 6) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return " / ".join(lines[-n:])

    def stop(self, timeout: float = 10.0) -> None:
        if self.popen is None:
            return
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.popen.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.popen.wait()
        try:
            self._log.close()
        except Exception:
            pass


def _serve_args(s: Any, engine: str, gport: int, hport: int) -> list[str]:
    """``pathprobe serve`` for one of our servers on loopback (``s``: the config's server block)."""
    return _py(
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


def _py(*args: str) -> list[str]:
    return [sys.executable, "-m", "pathprobe", *args]


# ------------------------------------------------------------------ probes


def probe_once(
    url: str, model: str | None = None, timeout: float = 10.0, headers: dict[str, str] | None = None, tls: Any = None
) -> float:
    """One real 1-token request over ``url``; returns its latency in ms or raises.
    ``tls``: the client's TlsFiles for grpcs:// / https:// (None: the environment's, else system CAs)."""
    from pathprobe.tls import TlsFiles, grpc_channel

    secure = url.split("://", 1)[0].endswith("s")
    if secure and tls is None:
        tls = TlsFiles.from_env(environment.PATHPROBE_LOAD_TLS, flag="--target")
    ssl_ctx = tls.client_context() if secure else None
    t0 = time.perf_counter()
    if url.startswith(("grpc://", "grpcs://")):
        from pathprobe.v1 import llm_pb2, llm_pb2_grpc

        with grpc_channel(url.split("://", 1)[1], tls if secure else None) as ch:
            stub = llm_pb2_grpc.LLMStub(ch)
            stub.Generate(llm_pb2.GenerateRequest(prompt="Hello", max_tokens=1, model=model or ""), timeout=timeout)
    else:
        import urllib.request

        if url.startswith("openai+"):
            base = url[len("openai+") :].rstrip("/")
            path, body = "/v1/completions", {"prompt": "Hello", "max_tokens": 1, "model": model or ""}
            if not model:
                with urllib.request.urlopen(
                    urllib.request.Request(base + "/v1/models", headers=headers or {}), timeout=timeout, context=ssl_ctx
                ) as resp:
                    models = json.loads(resp.read()).get("data") or [{}]
                body["model"] = models[0].get("id", "")
        else:
            base = url.rstrip("/")
            path, body = "/v1/generate", {"prompt": "Hello", "max_tokens": 1}
        req = urllib.request.Request(
            base + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", **(headers or {})},
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=timeout, context=ssl_ctx) as resp:
            resp.read()
    return (time.perf_counter() - t0) * 1e3


def handshake_ms(hostport: str, tls: Any, n: int = 20) -> tuple[float, float]:
    """Median TCP connect and TCP connect + TLS handshake times (ms) over ``n`` fresh connections:
    what a new connection costs, apart from the measured (keep-alive, steady state) requests."""
    import socket
    import statistics

    host, port = split_hostport(hostport)
    ctx = tls.client_context(alpn=("h2", "http/1.1"))
    tcp, both = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        with socket.create_connection((host, port), timeout=5) as sock:
            t1 = time.perf_counter()
            with ctx.wrap_socket(sock, server_hostname=host):
                t2 = time.perf_counter()
        tcp.append((t1 - t0) * 1e3)
        both.append((t2 - t0) * 1e3)
    return statistics.median(tcp), statistics.median(both)


def wait_ready(
    url: str,
    timeout: float,
    procs: list[Managed],
    model: str | None = None,
    headers: dict[str, str] | None = None,
    tls: Any = None,
) -> float:
    """Probe until the path answers a real request; raise with the reason on timeout or exit."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        for p in procs:
            code = p.exit_code()
            if code is not None:
                raise PathprobeError(f"{p.name} exited with code {code} while starting: {p.tail()}")
        try:
            return probe_once(
                url, model, timeout=min(10.0, max(1.0, deadline - time.monotonic())), headers=headers, tls=tls
            )
        except Exception as exc:  # any failure means: not ready yet
            details = exc.details() if callable(getattr(exc, "details", None)) else None
            text = str(details or exc).strip()
            last = text.splitlines()[0][:300] if text else type(exc).__name__
        time.sleep(0.2)
    raise PathprobeError(f"{url} not ready after {timeout:.0f} s: {last}")


# ------------------------------------------------------------------ paths


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
        #: OTLP receivers for servers that export spans to an endpoint (vLLM), stopped after them
        self.sinks: list[Any] = []

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
            env = vllmcpu.cpu_env() if vllmcpu.is_cpu_build() else {}
            endpoint = None
            if self.cfg.tracing:  # its llm_request spans, into this run's traces beside ours
                from pathprobe.otlpsink import OtlpFileSink

                sink = OtlpFileSink(self.traces_dir / "vllm-server.jsonl").start()
                self.sinks.append(sink)
                endpoint = sink.endpoint
                env = {**env, **VLLM_TRACES_ENV}
            args = vllmcpu.server_command(
                folder,
                port,
                served_name=models.model_display_name(spec, folder),
                host=LOOPBACK,
                max_model_len=v.max_model_len,
                dtype=v.dtype,
                max_num_seqs=v.max_num_seqs or s.max_batch_size,
                otlp_traces_endpoint=endpoint,
                load_dummy=not models.has_weights(folder),
                extra=v.extra_args,
            )
            self.log(f"starting vLLM's server ({spec}) on {LOOPBACK}:{port}")
            m = self._start(
                Managed("vllm-server", args, self.out / "logs" / "vllm-server.log", env=env),
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
        args = _py(
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
                addr = split_hostport(t.address or "")
                why = reachable(f"{addr[0]}:{addr[1]}")
                if why:
                    raise ConfigError(f"target '{t.name}': {t.address} is unreachable: {why}")
                front = f"{addr[0]}:{addr[1]}"
                if net:
                    if net.hop == "upstream":
                        p.notes.append(
                            "external target: the condition is put on the only hop pathprobe controls "
                            "(client <-> target)"
                        )
                    front, m = self.relay(t.name, front, net)
                    p.procs.append(m)
                p.url = url_for(t.protocol or "openai", front)
            elif t.kind == "vllm":
                upstream, m = self.vllm_server()
                p.procs.append(m)
                if net:
                    if net.hop == "upstream":
                        p.notes.append("vLLM's server, no gateway: the condition is on the client <-> server link")
                    upstream, r = self.relay(t.name, upstream, net)
                    p.procs.append(r)
                p.url = url_for(t.protocol or "openai", upstream)
            elif t.kind == "direct":
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
                ports = [_port(upstream)]
                if net:
                    if net.hop == "upstream":
                        p.notes.append("direct path: no gateway, the condition is on the client <-> server link")
                    upstream, m = self.relay(t.name, upstream, net)
                    p.procs.append(m)
                    ports.insert(0, _port(upstream))
                p.chain = [(ports, "srv")]
                p.url = url_for(t.protocol or "grpc", upstream)
            elif t.kind == "chain":
                self._chain(p, t, net)
            else:  # one gateway or third-party proxy in front of a server (ours, or vLLM's own)
                proto = UPSTREAM_PROTOCOL[t.mode] if t.kind == "gateway" else t.protocol  # type: ignore[index]
                if t.upstream == "vllm":
                    upstream, srv = self.vllm_server()
                else:
                    grpc_up, http_up, srv = self.our_server(t.engine)
                    upstream = grpc_up if proto == "grpc" else http_up
                if srv is not None and srv is not self.server:
                    p.procs.append(srv)
                up_ports = [_port(upstream)]
                if net and net.hop == "upstream":
                    upstream, m = self.relay(f"{t.name}-up", upstream, net)
                    p.procs.append(m)
                    up_ports.insert(0, _port(upstream))
                front = self._hop(
                    p, t.name, t.kind, t.mode, t.protocol or "grpc", upstream, t.gateway_args, t.port, t.model, t.tls
                )
                p.url = self._front(p, t, front, net)
                front_ports = [_port(front)]
                if net and net.hop == "client":
                    front_ports.insert(0, _port(p.url))
                # the wire witness follows these ports; a third-party proxy counts as silent there
                p.chain = [(front_ports, "gw" if t.kind == "gateway" else "silent"), (up_ports, "srv")]
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
            p.status = "ok"
        except Skipped as exc:
            p.status, p.reason = "skipped", exc.message
        except ConfigError:
            raise
        except PathprobeError as exc:
            p.status, p.reason = "failed", f"did not start: {exc.message}"
        return p

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
            args = _py("gateway", "--mode", mode or "passthrough", "--listen", listen, "--upstream", upstream)
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
        for sink in self.sinks:  # after the servers that export to them: their last batch is in
            sink.stop()


# ------------------------------------------------------------------ load


@dataclass
class RunResult:
    target: str
    concurrency: int
    round: int  # -1 = warm-up
    out_dir: Path
    records: list[dict[str, Any]]
    duration_s: float
    error: str | None = None
    traces_file: str | None = None
    #: the load generator's own health in this run (summary.json's ``client`` block): event-loop
    #: lag, CPU, saturated; None for runs written before it existed
    client: dict[str, Any] | None = None
    #: the run's requests counted at the client, the gateway and the server (accounting.json)
    accounting: dict[str, Any] | None = None
    #: CPU seconds (user + system) the path's own processes (gateway, proxy, relays; not the
    #: shared server) spent during this run; None for a path with none
    path_cpu_s: float | None = None


def read_accounting(out_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((out_dir / "accounting.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def cpu_seconds(procs: list[Managed]) -> float | None:
    """User + system CPU seconds of these processes and their children (nginx workers, LiteLLM's
    workers); None when there is no live process to read."""
    import psutil

    total, seen = 0.0, False
    for m in procs:
        if m.pid is None or m.exit_code() is not None:
            continue
        try:
            proc = psutil.Process(m.pid)
            family = [proc, *proc.children(recursive=True)]
        except psutil.Error:
            continue
        for q in family:
            try:
                t = q.cpu_times()
            except psutil.Error:
                continue
            total += t.user + t.system
            seen = True
    return total if seen else None


def read_client(out_dir: Path) -> dict[str, Any] | None:
    """The ``client`` block of a load run's summary.json (None when absent or unreadable)."""
    try:
        block = json.loads((out_dir / "summary.json").read_text(encoding="utf-8")).get("client")
    except (OSError, ValueError, AttributeError):
        return None
    return block if isinstance(block, dict) else None


def prepare_prompts(cfg: CompareConfig, out: Path, log: Callable[[str], None]) -> Path | None:
    """Cut the fixed/sweep prompts to exact token counts ONCE, into a prompt file.

    Every ``pathprobe load`` would otherwise load the tokenizer (and import transformers:
    seconds per run on a busy 2-core box); with the file it starts with ``--tokenizer none``.
    Returns None (each run then cuts its own prompts) when the tokenizer cannot be loaded here.
    """
    L = cfg.load
    if L.prompt_set not in ("fixed", "sweep") or any(a.startswith(("--tokenizer", "--prompt")) for a in L.extra_args):
        return None
    spec = cfg.server.model if cfg.mode == "local" else "tiny"
    try:
        from pathprobe.loadgen import prompts

        if L.prompt_set == "fixed":
            pset = prompts.build("fixed", tokens=L.prompt_tokens, tokenizer=spec)
        else:
            pset = prompts.build("sweep", tokenizer=spec)
    except Exception as exc:  # fall back to letting each run cut its prompts
        log(f"prompts: cutting them once failed ({type(exc).__name__}: {exc}); each load run will")
        return None
    path = out / "prompts.jsonl"
    with open(path, "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps({"prompt": pr.text}) + "\n" for pr in pset.prompts)
    log(f"prompts: {len(pset.prompts)} {L.prompt_set} prompt(s) cut with the {spec!r} tokenizer -> {path}")
    return path


def run_load(
    cfg: CompareConfig,
    p: Path_,
    concurrency: int,
    rnd: int,
    duration_s: float,
    out_dir: Path,
    traces_file: Path | None,
    prompt_file: Path | None = None,
    placement: Placement | None = None,
    extra: list[str] | None = None,
    label: str | None = None,
) -> RunResult:
    from pathprobe.analysis.records import read_records

    L = cfg.load
    secs = max(1, math.ceil(duration_s))
    if prompt_file is not None:
        prompt_args = ["--prompt-set", "file", "--prompt-file", str(prompt_file), "--tokenizer", "none"]
    else:
        prompt_args = ["--prompt-set", L.prompt_set, "--prompt-tokens", str(L.prompt_tokens)]
        if L.prompt_file:
            prompt_args += ["--prompt-file", L.prompt_file]
    args = _py(
        "load",
        "--headless",
        "-H",
        p.url,
        "-u",
        str(concurrency),
        "-r",
        str(concurrency),
        "-t",
        f"{secs}s",
        "--out",
        str(out_dir),
        "--max-tokens",
        str(L.max_tokens),
        *prompt_args,
        "--timeout-s",
        str(L.timeout_s),
        "--only-summary",
        "--loglevel",
        "WARNING",
        "--exit-code-on-error",
        "0",
        "--stop-timeout",
        str(int(L.timeout_s)),
        "--label",
        label or f"{p.name} c={concurrency} round={rnd}",
    )
    if L.stream:
        args.append("--stream")
    if L.arrival != "closed":
        args += ["--arrival", L.arrival, "--rate", str(L.rate)]
    if p.target.model and "--model" not in p.load_args:
        args += ["--model", p.target.model]
    if p.tls_ca:
        args += ["--target-ca", p.tls_ca]
    args += p.load_args
    if traces_file is not None:
        args += ["--traces-file", str(traces_file)]
    args += extra or []
    args += L.extra_args
    out_dir.mkdir(parents=True, exist_ok=True)
    log = out_dir / "load.log"
    with open(log, "wb") as fh:
        # its own process group: on timeout or interruption the load AND its Locust child are ended
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if p.headers:
            from pathprobe.loadgen.targets import ENV_HEADERS

            env[ENV_HEADERS] = json.dumps(p.headers)
        proc = subprocess.Popen(
            args,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
            preexec_fn=placement.preexec("load") if placement else None,
        )
        try:
            code = proc.wait(timeout=secs + L.timeout_s + 90)
        except BaseException:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
            code = -1
            if not isinstance(sys.exc_info()[1], subprocess.TimeoutExpired):
                raise
    rec_path = out_dir / "records.jsonl"
    if not rec_path.exists():
        tail = " / ".join(log.read_text(errors="replace").strip().splitlines()[-5:])
        return RunResult(
            p.name,
            concurrency,
            rnd,
            out_dir,
            [],
            secs,
            f"pathprobe load exited with code {code} and wrote no records: {tail}",
        )
    records = read_records(rec_path)
    for r in records:
        r["_round"] = rnd
        r["_concurrency"] = concurrency
    summary = out_dir / "summary.json"
    dur = float(secs)
    if summary.exists():
        try:
            dur = float(json.loads(summary.read_text())["meta"].get("duration_s") or secs)
        except (ValueError, KeyError, TypeError):
            pass
    return RunResult(
        p.name,
        concurrency,
        rnd,
        out_dir,
        records,
        dur,
        traces_file=str(traces_file) if traces_file else None,
        client=read_client(out_dir),
    )


MIXED = "_interleaved"  # runs/ folder of the call-by-call interleaved load runs


def interleavable(cfg: CompareConfig, paths: list[Path_]) -> bool:
    """Call-by-call interleaving applies when asked for and every configuration takes the same
    request (the same model name: one prompt stream serves them all)."""
    return (
        cfg.load.interleave == "call"
        and len(paths) > 1
        and len({p.target.model for p in paths}) == 1
        and not any(p.headers or p.load_args for p in paths)
    )  # e.g. LiteLLM: its own route and key


def run_load_mixed(
    cfg: CompareConfig,
    paths: list[Path_],
    concurrency: int,
    rnd: int,
    duration_s: float,
    out_root: Path,
    traces_file: Path | None,
    prompt_file: Path | None = None,
    placement: Placement | None = None,
) -> dict[str, RunResult]:
    """One load process for every configuration of ``paths``: each user sends each call to the next
    configuration of a freshly shuffled order (``pathprobe load --mix``), so drift and CPU contention hit
    every configuration alike and calls pair up per cycle. Runs ``duration_s`` per configuration; the
    records are split per configuration into ``runs/NAME/c{C}/r{R}`` (``warmup`` for round -1) as a
    per-configuration run would have written them, with the shared run's summary.json."""
    sub = "warmup" if rnd < 0 else f"c{concurrency}/r{rnd}"
    mixed_dir = out_root / MIXED / sub
    mix = ",".join(f"{p.name}={p.url}" for p in paths)
    extra = ["--mix", mix]
    ca = next((p.tls_ca for p in paths if p.tls_ca), "")  # one throw-away CA per run signs every TLS path
    if ca and not paths[0].tls_ca:
        extra += ["--target-ca", ca]
    res = run_load(
        cfg,
        paths[0],
        concurrency,
        rnd,
        duration_s * len(paths),
        mixed_dir,
        traces_file,
        prompt_file,
        placement,
        extra=extra,
        label=f"interleaved c={concurrency} round={rnd}",
    )
    out: dict[str, RunResult] = {}
    by_name: dict[str, list[dict[str, Any]]] = {p.name: [] for p in paths}
    for r in res.records:
        if r.get("config") in by_name:
            by_name[r["config"]].append(r)
    for p in paths:
        d = out_root / p.name / sub
        d.mkdir(parents=True, exist_ok=True)
        recs = by_name[p.name]
        with open(d / "records.jsonl", "w", encoding="utf-8") as fh:
            fh.writelines(json.dumps({k: v for k, v in r.items() if not k.startswith("_")}) + "\n" for r in recs)
        if (mixed_dir / "summary.json").exists():
            shutil.copyfile(mixed_dir / "summary.json", d / "summary.json")
        out[p.name] = RunResult(
            p.name,
            concurrency,
            rnd,
            d,
            recs,
            res.duration_s / len(paths),
            error=res.error,
            traces_file=res.traces_file,
            client=res.client,
        )
    return out


def versions() -> dict[str, str]:
    from importlib import metadata

    out = {"python": platform.python_version()}
    for pkg in ("pathprobe", "grpcio", "locust", "aiohttp", "torch", "transformers"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    return out


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
