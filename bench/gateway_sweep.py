"""Gateway sweep: added latency and CPU per call at concurrency 1, 8, 32, 128, and the most
calls per second each gateway carries on one core.

Paths: ``direct`` (no gateway), ``direct-again`` (the same, measured twice: the noise floor),
``passthrough`` (pathprobe's HTTP/2 frame relay), ``passthrough-nodecode`` (the same without
HPACK decoding for metrics labels), ``nginx`` (``grpc_pass``), ``haproxy`` (``proto h2`` on both
sides) and ``caddy`` (``reverse_proxy h2c://``), each present only when its binary is.

Placement: every gateway is pinned to one core (``--proxy-cpus``, default core 0) with
``sched_setaffinity`` before it starts (its threads and child processes inherit it) and is
single-threaded where it has a knob (nginx ``worker_processes 1``, HAProxy ``nbthread 1``,
Caddy ``GOMAXPROCS=1``); the upstream and the load client run on the other cores. The load
client is ``h2load`` (nghttp2; C, so it stays out of the way at 128 streams) sending gRPC
``Generate`` calls on one HTTP/2 connection with ``c`` concurrent streams.

Upstream: ``stub`` (default) is nginx answering every call with a fixed gRPC response and
``grpc-status``/``server-timing`` trailers: tens of thousands of calls/s, so the gateway is
what saturates. ``server`` is ``pathprobe serve --engine synthetic`` (0 ms inference), a
Python server that saturates first (~2k calls/s here), usable for the latency levels.

Method (a shared machine): for each concurrency and round, every path runs one short slice
(``--slice`` calls per stream, the first wave of each slice dropped), in a freshly shuffled
order, so slow spells of the machine hit every path alike. Added latency = percentile(path) −
percentile(direct) over the pooled calls; the spread is the range of the same figure computed
per round (adjacent slices). CPU per call = the gateway's own CPU time (utime + stime, all
threads and children, from /proc) over its calls. Max calls/s on one core: each gateway,
pinned, is driven by ``h2load`` with ``--max-conns`` connections x ``--max-streams`` streams for
``--max-seconds``; calls/s and CPU/call over that run (rounds rotated), with how busy each core
was (``/proc/stat``, every process on it) and what the load client and the upstream spent, so
a run says which side was the limit.

On a machine with too few cores to let one gateway saturate its core while the load client
and the upstream keep up (two cores: the client and the upstream cost about what the relay
costs per call), ``--cpu-quota PCT`` puts each gateway in a cgroup capped at PCT % of one core
(cgroup v1 ``cpu.cfs_quota_us`` or v2 ``cpu.max``; needs root): the gateway is then the limit,
and calls/s ÷ (PCT / 100) is its rate per core-second. ``--baseline REV[,REV]`` adds a
path ``passthrough@REV`` per revision, the relay as of it, for a before/after in one run.

    python bench/gateway_sweep.py [--concurrency 1,8,32,128] [--rounds 8] [--no-write]
    python bench/gateway_sweep.py --concurrency '' --paths passthrough,nginx --cpu-quota 5 --baseline main
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import random
import re
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pathprobe.v1 import llm_pb2  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")
USER = "user root;\n" if os.geteuid() == 0 else ""  # as root, nginx's workers would run as nobody
METHOD = "/pathprobe.v1.LLM/Generate"


# ------------------------------------------------------------------------------ processes
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"port {port} not listening")


def start(
    args: list[str],
    cpus: set[int] | None,
    log: Path,
    env: dict[str, str] | None = None,
    cgroup: Path | None = None,
) -> subprocess.Popen:
    """Start a process pinned to ``cpus`` and in ``cgroup`` (inherited by its threads and children)."""

    def pin() -> None:
        if cpus:
            os.sched_setaffinity(0, cpus)
        if cgroup is not None:
            (cgroup / "cgroup.procs").write_text(str(os.getpid()))

    return subprocess.Popen(
        args,
        stdout=open(log, "wb"),
        stderr=subprocess.STDOUT,
        preexec_fn=pin,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads) and its live children (nginx's workers)."""
    pids = [pid]
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            pids += [int(c) for c in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
    except OSError:
        pass
    total = 0.0
    for p in pids:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / CLK_TCK
        except (OSError, IndexError, ValueError):
            pass
    return total


def cpu_quota_group(name: str, pct: float) -> Path:
    """A cgroup capped at ``pct`` % of one core (v2 ``cpu.max`` or v1 ``cpu.cfs_quota_us``)."""
    period = 100_000
    quota = int(period * pct / 100)
    v2 = Path("/sys/fs/cgroup")
    if (v2 / "cgroup.controllers").exists():
        g = v2 / name
        g.mkdir(exist_ok=True)
        (g / "cpu.max").write_text(f"{quota} {period}")
        return g
    g = v2 / "cpu" / name
    g.mkdir(exist_ok=True)
    (g / "cpu.cfs_period_us").write_text(str(period))
    (g / "cpu.cfs_quota_us").write_text(str(quota))
    return g


def throttled_s(group: Path | None) -> float:
    """Seconds the cgroup's tasks were held back by its quota so far."""
    if group is None:
        return 0.0
    for line in (group / "cpu.stat").read_text().splitlines():
        k, _, v = line.partition(" ")
        if k == "throttled_usec":
            return int(v) / 1e6
        if k == "throttled_time":  # v1: nanoseconds
            return int(v) / 1e9
    return 0.0


def core_ticks() -> dict[int, tuple[int, int]]:
    """Per core: (busy, total) clock ticks so far, every process on it (``/proc/stat``)."""
    out = {}
    for ln in Path("/proc/stat").read_text().splitlines():
        if ln.startswith("cpu") and ln[3:4].isdigit():
            name, *vals = ln.split()
            v = [int(x) for x in vals]
            idle = v[3] + v[4]  # idle + iowait
            out[int(name[3:])] = (sum(v[:8]) - idle, sum(v[:8]))
    return out


def core_busy(t0: dict[int, tuple[int, int]], t1: dict[int, tuple[int, int]]) -> dict[int, float]:
    return {c: (t1[c][0] - t0[c][0]) / max(1, t1[c][1] - t0[c][1]) for c in t1 if c in t0}


def grpc_frame(msg: bytes) -> bytes:
    return b"\x00" + len(msg).to_bytes(4, "big") + msg


NGINX_STUB = """{user}worker_processes 1;
pid {d}/nginx.pid;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {d}/body;
  keepalive_requests 1000000;
  server {{
    listen 127.0.0.1:{port} http2;
    # POST to a static file is a 405; error_page turns it into the file. The mirror makes nginx
    # read the request body first (answering before it confuses a proxy's reused connection).
    location / {{ mirror /m; mirror_request_body on; root {d}; try_files /resp.bin =404;
                 error_page 405 =200 /resp.bin; }}
    location = /m {{ internal; return 204; }}
    location = /resp.bin {{
      internal;
      root {d};
      default_type application/grpc;
      add_trailer grpc-status 0;
      add_trailer server-timing "{timing}";
    }}
  }}
  server {{
    listen 127.0.0.1:{http_port};
    location / {{ mirror /m; mirror_request_body on; root {d}; try_files /resp.json =404;
                 error_page 405 =200 /resp.json; }}
    location = /m {{ internal; return 204; }}
    location = /resp.json {{
      internal;
      root {d};
      default_type application/json;
      add_header server-timing "{timing}";
    }}
  }}
}}
"""
STUB_TIMING = (
    "srv.decode;dur=0.010, srv.queue;dur=0.005, srv.tokenize;dur=0.050, srv.prefill;dur=0.100, "
    "srv.decode_steps;dur=0.000, srv.detokenize;dur=0.010, srv.encode;dur=0.010, srv.total;dur=0.200"
)


def nginx_stub(d: Path, cpus: set[int] | None, max_tokens: int = 8) -> tuple[subprocess.Popen, int, int]:
    """nginx answering every gRPC ``Generate`` (h2c port) and ``POST /v1/generate`` (HTTP/1.1 port)
    with a fixed response and the server's timing entries: tens of thousands of calls/s."""
    d.mkdir(parents=True, exist_ok=True)
    resp = llm_pb2.GenerateResponse(text=" Paris" * max_tokens, token_ids=list(range(max_tokens)))
    resp.usage.prompt_tokens, resp.usage.completion_tokens = 5, max_tokens
    (d / "resp.bin").write_bytes(grpc_frame(resp.SerializeToString()))
    (d / "resp.json").write_text(
        json.dumps(
            {
                "text": resp.text,
                "token_ids": list(resp.token_ids),
                "finish_reason": "length",
                "usage": {"prompt_tokens": 5, "completion_tokens": max_tokens},
            }
        )
    )
    port, http_port = free_port(), free_port()
    (d / "nginx.conf").write_text(NGINX_STUB.format(d=d, port=port, http_port=http_port, timing=STUB_TIMING, user=USER))
    p = start(
        ["nginx", "-p", str(d), "-e", str(d / "error.log"), "-c", str(d / "nginx.conf"), "-g", "daemon off;"],
        cpus,
        d / "out.log",
    )
    wait_port(port, p)
    wait_port(http_port, p)
    return p, port, http_port


NGINX_PROXY = """{user}worker_processes 1;
pid {d}/nginx.pid;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {d}/body; proxy_temp_path {d}/proxy;
  keepalive_requests 1000000;
  upstream llm {{ server {upstream}; keepalive 256; keepalive_requests 1000000; }}
  server {{
    listen 127.0.0.1:{port} http2;
    location / {{ grpc_pass grpc://llm; grpc_read_timeout 600s; grpc_send_timeout 600s; }}
  }}
}}
"""

HAPROXY = """global
  nbthread 1
  maxconn 4000
defaults
  mode http
  timeout connect 5s
  timeout client 600s
  timeout server 600s
frontend fe
  bind 127.0.0.1:{port} proto h2
  default_backend be
backend be
  http-reuse always
  server s1 {upstream} proto h2
"""

CADDY = """{{
  admin off
  auto_https off
  servers {{
    protocols h1 h2 h2c
  }}
}}
http://127.0.0.1:{port} {{
  reverse_proxy h2c://{upstream}
}}
"""


@dataclass
class PathProc:
    name: str
    port: int
    proc: subprocess.Popen | None = None  # None: no gateway (direct)
    calls: int = 0
    cpu_s: float = 0.0
    lat: dict[int, list[np.ndarray]] = field(default_factory=dict)  # concurrency -> per-round arrays


class Stack:
    def __init__(
        self,
        tmp: Path,
        upstream_kind: str,
        proxy_cpus: set[int],
        other_cpus: set[int],
        cgroup: Path | None = None,
    ) -> None:
        self.tmp = tmp
        self.proxy_cpus = proxy_cpus
        self.other_cpus = other_cpus
        self.cgroup = cgroup  # every gateway's, when capped (--cpu-quota)
        self.procs: list[subprocess.Popen] = []
        self.upstream_proc: subprocess.Popen | None = None
        self.upstream = self._upstream(upstream_kind)

    def _upstream(self, kind: str) -> str:
        if kind == "stub":
            p, port, _ = nginx_stub(self.tmp / "stub", self.other_cpus)
        else:
            port = free_port()
            p = start(
                [
                    sys.executable,
                    "-m",
                    "pathprobe",
                    "serve",
                    "--engine",
                    "synthetic",
                    "--grpc-port",
                    str(port),
                    "--http-port",
                    str(free_port()),
                    "--prefill-ms-per-token",
                    "0",
                    "--decode-ms-per-token",
                    "0",
                    "--max-batch-size",
                    "256",
                    "--max-wait-ms",
                    "0",
                ],
                self.other_cpus,
                self.tmp / "server.log",
            )
        self.procs.append(p)
        self.upstream_proc = p
        wait_port(port, p, 120)
        return f"127.0.0.1:{port}"

    def direct(self, name: str) -> PathProc:
        return PathProc(name, int(self.upstream.rpartition(":")[2]))

    def gateway(self, name: str, *extra: str, pythonpath: str | None = None) -> PathProc:
        """pathprobe's relay; ``pythonpath``: run the package found there (another revision)."""
        port = free_port()
        p = start(
            [
                sys.executable,
                "-m",
                "pathprobe",
                "gateway",
                "--mode",
                "passthrough",
                "--listen",
                f"127.0.0.1:{port}",
                "--upstream",
                self.upstream,
                "--health-interval",
                "5",
                *extra,
            ],
            self.proxy_cpus,
            self.tmp / f"{name}.log",
            env={"PYTHONPATH": pythonpath} if pythonpath else None,
            cgroup=self.cgroup,
        )
        return self._ready(name, port, p)

    def nginx(self) -> PathProc:
        d = self.tmp / "nginx"
        d.mkdir()
        port = free_port()
        (d / "nginx.conf").write_text(NGINX_PROXY.format(d=d, port=port, upstream=self.upstream, user=USER))
        p = start(
            ["nginx", "-p", str(d), "-e", str(d / "error.log"), "-c", str(d / "nginx.conf"), "-g", "daemon off;"],
            self.proxy_cpus,
            d / "out.log",
            cgroup=self.cgroup,
        )
        return self._ready("nginx", port, p)

    def haproxy(self) -> PathProc:
        port = free_port()
        cfg = self.tmp / "haproxy.cfg"
        cfg.write_text(HAPROXY.format(port=port, upstream=self.upstream))
        p = start(["haproxy", "-db", "-f", str(cfg)], self.proxy_cpus, self.tmp / "haproxy.log", cgroup=self.cgroup)
        return self._ready("haproxy", port, p)

    def caddy(self) -> PathProc:
        port = free_port()
        cfg = self.tmp / "Caddyfile"
        cfg.write_text(CADDY.format(port=port, upstream=self.upstream))
        p = start(
            ["caddy", "run", "--config", str(cfg), "--adapter", "caddyfile"],
            self.proxy_cpus,
            self.tmp / "caddy.log",
            env={
                "GOMAXPROCS": "1",
                "HOME": str(self.tmp),
                "XDG_DATA_HOME": str(self.tmp),
                "XDG_CONFIG_HOME": str(self.tmp),
            },
            cgroup=self.cgroup,
        )
        return self._ready("caddy", port, p)

    def _ready(self, name: str, port: int, p: subprocess.Popen) -> PathProc:
        self.procs.append(p)
        wait_port(port, p)
        return PathProc(name, port, p)

    def close(self) -> None:
        for p in reversed(self.procs):
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


# ------------------------------------------------------------------------------ the client
def check_paths(paths: list[PathProc], req: bytes) -> None:
    """Every path answers a real gRPC call with status OK and the same bytes as direct."""
    import grpc

    answers = {}
    for p in paths:
        with grpc.insecure_channel(f"127.0.0.1:{p.port}") as ch:
            call = ch.unary_unary(METHOD)
            deadline = time.monotonic() + 10
            while True:
                try:
                    answers[p.name] = call(req[5:], timeout=5)
                    break
                except grpc.RpcError as exc:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"{p.name}: {exc.code()} {exc.details()}") from None
                    time.sleep(0.2)
    first = answers[paths[0].name]
    for name, a in answers.items():
        if a != first:
            raise RuntimeError(f"{name} answers differently from {paths[0].name}")


def h2load(
    name: str,
    port: int,
    n: int,
    conns: int,
    streams: int,
    body: Path,
    cpus: set[int],
    log: Path | None = None,
    seconds: float | None = None,
) -> str:
    args = [
        "h2load",
        "-c",
        str(conns),
        "-m",
        str(streams),
        "-t",
        "1",
        "-d",
        str(body),
        "-H",
        "content-type: application/grpc",
        "-H",
        "te: trailers",
    ]
    args += ["-D", str(int(seconds)), "--warm-up-time", "1"] if seconds else ["-n", str(n)]
    if log is not None:
        args += ["--log-file", str(log)]
    args.append(f"http://127.0.0.1:{port}{METHOD}")
    r = subprocess.run(
        args, capture_output=True, text=True, check=False, preexec_fn=lambda: os.sched_setaffinity(0, cpus)
    )
    if r.returncode != 0 or not re.search(r" 0 failed, 0 errored", r.stdout):
        raise RuntimeError(f"h2load against {name} (port {port}) failed: {r.stdout[-600:]} {r.stderr[-300:]}")
    return r.stdout


def slice_latencies(log: Path, drop: int) -> np.ndarray:
    rows = [ln.split("\t") for ln in log.read_text().splitlines() if ln.strip()]
    rows.sort(key=lambda r: int(r[0]))
    return np.array([int(r[2]) for r in rows[drop:] if r[1] == "200"], dtype=float)


# ------------------------------------------------------------------------------ statistics
def pct(a: np.ndarray, q: float) -> float:
    return float(np.percentile(a, q))


def versions() -> dict:
    import grpc

    def out(cmd: list[str]) -> str:
        if not shutil.which(cmd[0]):
            return "absent"
        r = subprocess.run(cmd, capture_output=True, text=True, check=False)
        return (r.stdout + r.stderr).strip().splitlines()[0]

    try:
        import uvloop

        uv = uvloop.__version__
    except ImportError:
        uv = "absent"
    import hpack

    return {
        "python": platform.python_version(),
        "grpcio": grpc.__version__,
        "uvloop": uv,
        "hpack": getattr(hpack, "__version__", "?"),
        "nginx": out(["nginx", "-v"]),
        "haproxy": out(["haproxy", "-v"]),
        "caddy": out(["caddy", "version"]),
        "h2load": out(["h2load", "--version"]),
    }


def environment(proxy_cpus: set[int], other_cpus: set[int]) -> dict:
    model = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        ),
        platform.processor(),
    )
    return {
        "date_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "cpu_model": model,
        "cpu_cores": os.cpu_count(),
        "kernel": platform.release(),
        "versions": versions(),
        "proxy_cpus": sorted(proxy_cpus),
        "client_and_upstream_cpus": sorted(other_cpus),
        "loadavg_start": os.getloadavg(),
    }


# ------------------------------------------------------------------------------ main
def sweep(
    paths: list[PathProc], conc: list[int], rounds: int, per_stream: int, body: Path, cpus: set[int], tmp: Path
) -> dict:
    rnd = random.Random(1)
    result: dict = {}
    for c in conc:
        for p in paths:
            p.lat[c] = []
        cpu: dict[str, float] = {p.name: 0.0 for p in paths}
        calls: dict[str, int] = {p.name: 0 for p in paths}
        n = c * per_stream + c
        for r in range(rounds):
            order = list(paths)
            rnd.shuffle(order)
            for p in order:
                log = tmp / f"h2-{p.name}-{c}-{r}.log"
                c0 = cpu_seconds(p.proc.pid) if p.proc else 0.0
                h2load(p.name, p.port, n, 1, c, body, cpus, log)
                if p.proc:
                    cpu[p.name] += cpu_seconds(p.proc.pid) - c0
                calls[p.name] += n
                p.lat[c].append(slice_latencies(log, c))
                log.unlink()
        rows = []
        base = paths[0]
        for p in paths:
            pooled, bpooled = np.concatenate(p.lat[c]), np.concatenate(base.lat[c])
            row = {"path": p.name, "calls": len(pooled), "p50_us": pct(pooled, 50), "p99_us": pct(pooled, 99)}
            if p is not base:
                for q in (50, 99):
                    per_round = [pct(a, q) - pct(b, q) for a, b in zip(p.lat[c], base.lat[c])]
                    row[f"added_p{q}_us"] = pct(pooled, q) - pct(bpooled, q)
                    row[f"added_p{q}_rounds"] = [min(per_round), float(np.median(per_round)), max(per_round)]
            if p.proc:
                row["cpu_us_per_call"] = cpu[p.name] / calls[p.name] * 1e6
            rows.append(row)
        by = {p.name: p for p in paths}
        if "nginx" in by:
            for row in rows:
                if row["path"] in ("direct", "nginx"):
                    continue
                for q in (50, 99):
                    per_round = []
                    for a, g, b in zip(by[row["path"]].lat[c], by["nginx"].lat[c], base.lat[c]):
                        den = pct(g, q) - pct(b, q)
                        if den > 0:
                            per_round.append((pct(a, q) - pct(b, q)) / den)
                    if row.get(f"added_p{q}_us") is not None:
                        nrow = next(x for x in rows if x["path"] == "nginx")
                        row[f"x_nginx_p{q}"] = (
                            row[f"added_p{q}_us"] / nrow[f"added_p{q}_us"] if nrow[f"added_p{q}_us"] > 0 else None
                        )
                        row[f"x_nginx_p{q}_rounds"] = (
                            [min(per_round), float(np.median(per_round)), max(per_round)] if per_round else None
                        )
        result[str(c)] = {"requests_per_slice": n, "rows": rows}
        print(
            f"c={c}: "
            + ", ".join(
                f"{r['path']} +{r.get('added_p50_us', 0):.0f}/{r.get('added_p99_us', 0):.0f} us "
                f"cpu {r.get('cpu_us_per_call', 0):.0f}"
                for r in rows
            ),
            flush=True,
        )
    return result


def max_throughput(
    stack: Stack, paths: list[PathProc], rounds: int, seconds: float, body: Path, conns: int, streams: int
) -> dict:
    """Each gateway driven flat out for ``seconds`` per run, runs rotated over ``rounds``."""
    cpus = stack.other_cpus
    out: dict[str, list[dict]] = {p.name: [] for p in paths if p.proc}
    for r in range(rounds):
        order = [p for p in paths if p.proc]
        order = order[r % len(order) :] + order[: r % len(order)]
        for p in order:
            assert p.proc is not None
            up = stack.upstream_proc.pid if stack.upstream_proc else None
            k0, c0, u0, th0 = (
                core_ticks(),
                cpu_seconds(p.proc.pid),
                cpu_seconds(up) if up else 0.0,
                throttled_s(stack.cgroup),
            )
            ru0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
            text = h2load(p.name, p.port, 0, conns, streams, body, cpus, seconds=seconds)
            ru1, t1 = resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
            k1, c1, u1, th1 = (
                core_ticks(),
                cpu_seconds(p.proc.pid),
                cpu_seconds(up) if up else 0.0,
                throttled_s(stack.cgroup),
            )
            m = re.search(r"finished in [\d.]+m?s, ([\d.]+) req/s", text)
            done = re.search(r"requests: \d+ total, \d+ started, (\d+) done", text)
            rps = float(m.group(1)) if m else 0.0
            # CPU over h2load's whole run (warm-up included) per call done in it: calls = rps x (seconds + warm-up)
            n_all = rps * (seconds + 1)
            wall = t1 - t0
            client_s = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
            out[p.name].append(
                {
                    "rps": rps,
                    "done": int(done.group(1)) if done else None,
                    "cpu_us_per_call": (c1 - c0) / n_all * 1e6 if n_all else None,
                    "core_busy": (c1 - c0) / wall,
                    "throttled_share": (th1 - th0) / wall,
                    "client_busy": client_s / wall,
                    "upstream_busy": (u1 - u0) / wall,
                    "cores_busy": {str(c): v for c, v in core_busy(k0, k1).items()},
                }
            )
            x = out[p.name][-1]
            print(
                f"max {p.name}: {rps:.0f} calls/s, gateway {x['core_busy']:.2f} core "
                f"(throttled {x['throttled_share']:.2f}), h2load {x['client_busy']:.2f}, upstream "
                f"{x['upstream_busy']:.2f}, cores {' '.join(f'{c}:{v:.2f}' for c, v in x['cores_busy'].items())}",
                flush=True,
            )
    summary = {}
    for name, runs in out.items():
        rps = [x["rps"] for x in runs]

        def med(key: str, runs: list[dict] = runs) -> float:
            return float(np.median([x[key] for x in runs]))

        summary[name] = {
            "rps_median": float(np.median(rps)),
            "rps_min": min(rps),
            "rps_max": max(rps),
            "cpu_us_per_call_median": med("cpu_us_per_call"),
            "core_busy_median": med("core_busy"),
            "throttled_share_median": med("throttled_share"),
            "client_busy_median": med("client_busy"),
            "upstream_busy_median": med("upstream_busy"),
            "cores_busy_median": {
                c: float(np.median([x["cores_busy"][c] for x in runs])) for c in runs[0]["cores_busy"]
            },
            "runs": runs,
        }
    return summary


def baseline_tree(rev: str, tmp: Path) -> str:
    """The package as of git revision ``rev``, laid out under ``tmp``; returns its PYTHONPATH."""
    src = tmp / f"src-{rev}"
    src.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    tree = tmp / f"tree-{rev}"
    subprocess.run(["bash", str(src / "bench" / "pkgtree.sh"), str(tree)], capture_output=True, check=True)
    return str(tree)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", default="1,8,32,128")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument(
        "--slice",
        type=int,
        default=0,
        help="calls per stream in one slice (default: 300 at c=1, 60 at c=8, 20 at c=32, 8 at c=128)",
    )
    ap.add_argument("--upstream", choices=("stub", "server"), default="stub")
    ap.add_argument("--paths", default="direct,direct-again,passthrough,passthrough-nodecode,nginx,haproxy,caddy")
    ap.add_argument("--proxy-cpus", default="0", help="cores the gateways are pinned to")
    ap.add_argument("--max-seconds", type=float, default=4.0, help="0: skip the max-throughput part")
    ap.add_argument("--max-rounds", type=int, default=3)
    ap.add_argument("--max-conns", type=int, default=4, help="h2load connections in the max-throughput part")
    ap.add_argument("--max-streams", type=int, default=64, help="concurrent streams per connection there")
    ap.add_argument(
        "--cpu-quota", type=float, default=0, help="cap each gateway at this %% of one core (a cgroup; root)"
    )
    ap.add_argument(
        "--baseline",
        default="",
        help="git revisions (comma-separated): also run the relay as of each (passthrough@REV)",
    )
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "docs" / "results"))
    ap.add_argument("--tag", default="gateway-sweep")
    args = ap.parse_args()
    if not shutil.which("h2load"):
        print("h2load is required (Debian/Ubuntu: apt-get install nghttp2-client)", file=sys.stderr)
        return 2
    allc = set(os.sched_getaffinity(0))
    proxy_cpus = {int(x) for x in args.proxy_cpus.split(",")}
    other = (allc - proxy_cpus) or allc
    conc = [int(x) for x in args.concurrency.split(",") if x.strip()]
    env = environment(proxy_cpus, other)
    tmp = Path(tempfile.mkdtemp(prefix="gwsweep-"))
    tmp.chmod(0o755)  # nginx workers run as an unprivileged user when started as root
    body = tmp / "req.bin"
    req = grpc_frame(
        llm_pb2.GenerateRequest(
            prompt="The capital of France is", max_tokens=args.max_tokens, ignore_eos=True
        ).SerializeToString()
    )
    body.write_bytes(req)
    try:
        cgroup = cpu_quota_group(f"pathprobe-bench-{os.getpid()}", args.cpu_quota) if args.cpu_quota else None
    except OSError as exc:
        print(f"--cpu-quota: cannot make a cgroup with a CPU quota (root and a cpu controller needed): {exc}")
        return 2
    stack = Stack(tmp, args.upstream, proxy_cpus, other, cgroup)
    try:
        makers = {
            "direct": lambda: stack.direct("direct"),
            "direct-again": lambda: stack.direct("direct-again"),
            "passthrough": lambda: stack.gateway("passthrough"),
            "passthrough-nodecode": lambda: stack.gateway("passthrough-nodecode", "--no-decode-metadata"),
            "nginx": stack.nginx,
            "haproxy": stack.haproxy,
            "caddy": stack.caddy,
        }
        for spec in filter(None, args.baseline.split(",")):
            rev = subprocess.run(
                ["git", "-C", str(ROOT), "rev-parse", "--short", spec],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
            tree = baseline_tree(rev, tmp)
            name = f"passthrough@{rev}"
            makers[name] = lambda name=name, tree=tree: stack.gateway(name, pythonpath=tree)
            args.paths += f",{name}"
        binary = {"nginx": "nginx", "haproxy": "haproxy", "caddy": "caddy"}
        paths = []
        for name in args.paths.split(","):
            if name in binary and not shutil.which(binary[name]):
                print(f"{name} not installed: skipped", file=sys.stderr)
                continue
            paths.append(makers[name]())
        check_paths(paths, req)
        for p in paths:  # warm-up: connections, HPACK tables, caches
            h2load(p.name, p.port, 2000, 1, 8, body, other)
        defaults = {1: 300, 8: 60, 32: 20, 128: 8}
        result = {}
        per_c = {}
        for c in conc:
            per_c[c] = sweep(paths, [c], args.rounds, args.slice or defaults.get(c, 10), body, other, tmp)[str(c)]
        result["sweep"] = {str(c): v for c, v in per_c.items()}
        if args.max_seconds > 0:
            result["max_one_core"] = max_throughput(
                stack, paths, args.max_rounds, args.max_seconds, body, args.max_conns, args.max_streams
            )
    finally:
        stack.close()
        shutil.rmtree(tmp, ignore_errors=True)
        if cgroup is not None:
            cgroup.rmdir()
    env["loadavg_end"] = os.getloadavg()
    result.update(
        {
            "environment": env,
            "upstream": args.upstream,
            "rounds": args.rounds,
            "max_tokens": args.max_tokens,
            "max_seconds": args.max_seconds,
            "max_conns": args.max_conns,
            "max_streams": args.max_streams,
            "cpu_quota_pct": args.cpu_quota,
            "commit": subprocess.run(
                ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
            ).stdout.strip(),
        }
    )
    md = markdown(result)
    print(md)
    if not args.no_write:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        day = env["date_utc"][:10]
        (out / f"{day}-{args.tag}.json").write_text(json.dumps(result, indent=1) + "\n")
        (out / f"{day}-{args.tag}.md").write_text(md)
        print(f"wrote {out / f'{day}-{args.tag}.md'} and .json", file=sys.stderr)
    return 0


def _rng(v: list[float] | None, fmt: str = "{:.0f}") -> str:
    return "–" if not v else f"{fmt.format(v[0])}…{fmt.format(v[2])}"


def markdown(r: dict) -> str:
    env = r["environment"]
    v = env["versions"]
    lines = [
        f"# Gateway sweep, {env['date_utc'][:10]}",
        "",
        f"Machine: {env['cpu_model']}, {env['cpu_cores']} cores, Linux {env['kernel']}; load average "
        f"{env['loadavg_start'][0]:.2f} at start, {env['loadavg_end'][0]:.2f} at end.",
        f"Versions: Python {v['python']}, uvloop {v['uvloop']}, hpack {v['hpack']}, {v['nginx']}, {v['haproxy']}, "
        f"Caddy {v['caddy']}, {v['h2load']}.",
        f"Placement: gateways pinned to core(s) {env['proxy_cpus']}; upstream and h2load on "
        f"{env['client_and_upstream_cpus']}. Upstream: `{r['upstream']}`."
        + (f" {r['rounds']} rounds per concurrency." if r["sweep"] else "")
        + (f" Commit {r['commit']}." if r.get("commit") else ""),
        "",
        "Added latency = percentile(path) − percentile(direct) over all calls of the level; in brackets the "
        "range of the same figure over rounds (min…max). × nginx = added ÷ nginx's added (per-round range in "
        "brackets). CPU/call = the gateway's own CPU time per call.",
        "",
    ]
    for c, lvl in r["sweep"].items():
        lines += [
            f"## Concurrency {c} ({lvl['requests_per_slice']} calls per slice)",
            "",
            "| path | calls | p50 µs | p99 µs | added p50 µs | added p99 µs | × nginx p50 | × nginx p99 "
            "| CPU µs/call |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for row in lvl["rows"]:

            def add(q: int, row: dict = row) -> str:
                if f"added_p{q}_us" not in row:
                    return "–"
                return f"{row[f'added_p{q}_us']:.0f} [{_rng(row[f'added_p{q}_rounds'])}]"

            def xn(q: int, row: dict = row) -> str:
                x = row.get(f"x_nginx_p{q}")
                return "–" if x is None else f"{x:.2f} [{_rng(row.get(f'x_nginx_p{q}_rounds'), '{:.2f}')}]"

            cpu = row.get("cpu_us_per_call")
            lines.append(
                f"| {row['path']} | {row['calls']} | {row['p50_us']:.0f} | {row['p99_us']:.0f} | {add(50)} | "
                f"{add(99)} | {xn(50)} | {xn(99)} | {'–' if cpu is None else f'{cpu:.0f}'} |"
            )
        lines.append("")
    if "max_one_core" in r:
        quota = r.get("cpu_quota_pct") or 0
        lines += [
            "## Most calls/s on one core",
            "",
            f"h2load, {r.get('max_conns', 4)} connections × {r.get('max_streams', 64)} streams, "
            f"{r['max_seconds']:.0f} s per run after 1 s warm-up, runs rotated; medians over runs. "
            "gateway/h2load/upstream = each one's CPU seconds per wall second; cores = how busy each core "
            "was (every process on it, this machine's other jobs included)."
            + (
                f" Each gateway capped at {quota:g} % of one core (cgroup); per core-second = calls/s ÷ "
                f"{quota / 100:g}; throttled = share of the run its cgroup was held at the cap."
                if quota
                else ""
            ),
            "",
            "| gateway | calls/s | range | × nginx | "
            + ("per core-second | throttled | " if quota else "")
            + "CPU µs/call | gateway | h2load | upstream | cores |",
            "|---|---:|---:|---:|" + ("---:|---:|" if quota else "") + "---:|---:|---:|---:|---|",
        ]
        mx = r["max_one_core"]
        ng = mx.get("nginx", {}).get("rps_median")
        for name, s in mx.items():
            xn = f"{s['rps_median'] / ng:.2f}" if ng else "–"
            capped = (
                f"{s['rps_median'] / (quota / 100):,.0f} | {s.get('throttled_share_median', 0):.2f} | " if quota else ""
            )
            cores = " ".join(f"{c}: {v:.2f}" for c, v in s.get("cores_busy_median", {}).items())
            lines.append(
                f"| {name} | {s['rps_median']:,.0f} | {s['rps_min']:,.0f}–{s['rps_max']:,.0f} | {xn} | {capped}"
                f"{s['cpu_us_per_call_median']:.0f} | {s['core_busy_median']:.2f} | "
                f"{s.get('client_busy_median', 0):.2f} | {s.get('upstream_busy_median', 0):.2f} | {cores} |"
            )
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
