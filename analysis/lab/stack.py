"""The processes of a local compare (the ``Stack``): the model server (and any second server:
ours with another engine, vLLM's own), delaying relays, and every gateway or proxy a path needs
(started through :mod:`~pathprobe.analysis.lab.paths`), each on a free loopback port, on the cores
placement gives its role; ``close()`` ends them all."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from pathprobe import vllmcpu
from pathprobe.analysis.lab.config import CompareConfig, NetworkConfig, ServerConfig, TargetConfig
from pathprobe.analysis.lab.limits import Limits, server_keys
from pathprobe.analysis.lab.paths import Path_, PathBuilder
from pathprobe.analysis.lab.placement import Placement, plan
from pathprobe.analysis.lab.probes import parse_startup, url_for, wait_ready
from pathprobe.analysis.lab.procs import (
    LOOPBACK,
    Managed,
    Skipped,
    free_port,
    pathprobe_cmd,
    port_in_use,
    reachable,
)
from pathprobe.errors import ConfigError, PathprobeError
from pathprobe.otlpsink import OtlpFileSink
from pathprobe.serveconfig import Engine, HttpServer, ServeConfig

if TYPE_CHECKING:
    from pathprobe.pki import Pki
    from pathprobe.tls import TlsFiles


#: vLLM's OpenTelemetry batch exporter every 0.5 s, as our processes export (its default is 5 s:
#: the last spans of a run would still be in its buffer when compare reads the traces)
VLLM_TRACES_ENV = {"OTEL_BSP_SCHEDULE_DELAY": "500"}


def serve_config(s: ServerConfig, engine: str, gport: int, hport: int, apart: bool, **more: Any) -> ServeConfig:
    """One of our servers on loopback (``s``: the config's server block; ``apart``: the engine in a
    process of its own; ``more``: further serve keys); its command line is ``to_argv()``."""
    return ServeConfig(
        engine=cast(Engine, engine),  # checked by ServeConfig
        model=s.model,
        host=LOOPBACK,
        grpc_port=gport,
        http_port=hport,
        max_batch_size=s.max_batch_size,
        http_server=s.http_server,
        engine_process=apart and engine != "vllm",
        **more,
    )


def _serve_args(s: ServerConfig, engine: str, gport: int, hport: int, apart: bool, **more: Any) -> list[str]:
    """``pathprobe serve`` for one of our servers on loopback."""
    return pathprobe_cmd("serve", *serve_config(s, engine, gport, hport, apart, **more).to_argv())


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
        self._pki: Pki | None = None
        self.placement: Placement = (
            plan(cfg.placement) if cfg.mode == "local" else Placement(False, "remote mode: nothing local to place")
        )
        #: our servers run their engine in a process of its own (vLLM's is apart anyway)
        self.engine_process = cfg.server.engine_process and cfg.mode == "local"
        #: more servers, started when a target needs them: ours with another engine, vLLM's own
        self.others: dict[str, tuple[Managed, str, str]] = {}  # key -> (process, grpc H:P, http H:P)
        #: OTLP receivers for servers that export spans to an endpoint (vLLM), stopped after them
        self.sinks: list[OtlpFileSink] = []
        #: the size limits every process of the run gets (set by compare before it starts any)
        self.limits: Limits | None = None

    def _limit_keys(self, s: ServerConfig) -> dict[str, int]:
        """``serve`` keys for the run's limits, except those the server's own ``extra_args`` set."""
        keys = server_keys(self.limits) if self.limits is not None else {}
        return {k: v for k, v in keys.items() if f"--{k.replace('_', '-')}" not in s.extra_args}

    def pki(self) -> Pki:
        """The run's throw-away CA and loopback certificates (made on first use, in the output folder)."""
        if self._pki is None:
            from pathprobe.pki import make_pki

            self._pki = make_pki(self.out / "tls", "compare")
        return self._pki

    def client_tls(self) -> TlsFiles:
        from pathprobe.tls import TlsFiles

        return TlsFiles(ca=str(self.pki().ca))

    def start(self, m: Managed, role: str = "proxies") -> Managed:
        """Start ``m`` on the cores of its role (server | proxies) when placement is on."""
        m.cpus = self.placement.cpus(role)
        m.env = {**self.placement.env(role), **m.env}
        self.procs.append(m.start())
        self._write_pids()
        return m

    def _write_pids(self) -> None:
        info = {m.name: m.pid for m in self.procs}
        (self.out / "processes.json").write_text(json.dumps(info, indent=1), encoding="utf-8")

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
        self.front_ends = {s.http_server: f"{LOOPBACK}:{hport}"}
        extra: list[tuple[HttpServer, int]] = []
        for fe in sorted({t.front_end for t in self.cfg.targets if t.enabled and t.front_end} - {s.http_server}):
            port = free_port()
            extra.append((fe, port))
            self.front_ends[fe] = f"{LOOPBACK}:{port}"
        more = {
            k: v
            for k in ("max_wait_ms", "max_queue", "prefill_ms_per_token", "decode_ms_per_token")
            if (v := getattr(s, k)) is not None
        }
        more.update(self._limit_keys(s))
        traces = str(self.traces_dir / "server.jsonl") if self.cfg.tracing else None
        args = _serve_args(
            s, s.engine, gport, hport, self.engine_process, extra_http_server=tuple(extra), traces_file=traces, **more
        )
        args += s.extra_args
        self.log(f"starting server ({s.engine}, {s.model}) on grpc {gport} / http {hport}")
        self.server = self.start(Managed("server", args, self.out / "logs" / "server.log"), "server")
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
            limits = self._limit_keys(s)
            if engine != "synthetic":  # the context sized for the synthetic engine; a model keeps its own
                limits.pop("max_context", None)
            args = [*_serve_args(s, engine, gport, hport, self.engine_process, **limits), *s.extra_args]
            self.log(f"starting a second server of ours ({engine}, {s.model}) on grpc {gport} / http {hport}")
            m = self.start(Managed(key, args, self.out / "logs" / f"{key}.log"), "server")
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
            from pathprobe import models

            v, s = self.cfg.vllm, self.cfg.server
            spec = v.model or s.model
            folder = models.resolve_model(spec)
            port = v.port or free_port()
            env = vllmcpu.cpu_env() if vllmcpu.is_cpu_build() else {}
            endpoint = None
            if self.cfg.tracing:  # its llm_request spans, into this run's traces beside ours
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
            m = self.start(
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
        m = self.start(Managed(f"{name}-relay", args, self.out / "logs" / f"{name}-relay.log"))
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
        return PathBuilder(self).build(t)

    def close(self) -> None:
        for m in reversed(self.procs):
            m.stop()
        for sink in self.sinks:  # after the servers that export to them: their last batch is in
            sink.stop()
