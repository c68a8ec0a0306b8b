"""Gateway overhead: every proxy path side by side in one run, interleaved call by call.

One synthetic server (0 ms inference), one client process. Each iteration calls every
target once, in a freshly shuffled order (round-level interleaving was too noisy on a
shared 2-core box), so slow spells of the machine hit all targets alike:

- gRPC client: ``direct`` (the server's gRPC port), ``direct-again`` (a second channel to
  the same port: the noise floor), ``passthrough`` (HTTP/2 frame relay, the default),
  ``passthrough-grpc`` (the grpcio relay, ``--impl grpc``), ``passthrough-nodecode`` (the
  frame relay without HPACK decoding for metrics labels), ``passthrough-asyncio`` (the frame
  relay on the stdlib event loop instead of uvloop, when uvloop is installed), ``nginx`` (grpc_pass with an
  upstream keep-alive pool, deploy/nginx), ``reencode`` (gRPC in, server's HTTP out);
- HTTP client (stdlib ``http.client``, keep-alive): ``direct-http``, ``transcode`` (HTTP in,
  gRPC out), ``http-proxy`` (HTTP in, HTTP out).

Added latency = percentile(target) − percentile(its direct baseline) at p50 and p99, with
a 95 % bootstrap interval (iterations resampled, pairs kept). Max throughput on one core
= 1 / (proxy CPU seconds per call), the proxy's own CPU time (utime + stime, children
included for nginx) over the measured calls. Results: docs/results/<date>-gateway.{md,json}.

    python bench/gateway_bench.py [--calls 3000] [--max-tokens 8] [--no-write]
"""

from __future__ import annotations

import argparse
import datetime as dt
import http.client
import json
import os
import platform
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pathprobe.v1 import llm_pb2, llm_pb2_grpc  # noqa: E402  (after the path set-up above)

from tests.support.procs import Proc, Server, free_port  # noqa: E402

PROMPT = "The capital of France is"
try:
    import uvloop  # noqa: F401

    HAVE_UVLOOP = True
except ImportError:  # optional: pip install uvloop
    HAVE_UVLOOP = False
CLK_TCK = os.sysconf("SC_CLK_TCK")


# ------------------------------------------------------------------------------ processes
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


def gateway(tmp: Path, mode: str, upstream: str, *extra: str) -> tuple[Proc, int]:
    port = free_port()
    p = Proc(
        [
            sys.executable,
            "-m",
            "pathprobe",
            "gateway",
            "--mode",
            mode,
            "--listen",
            f"127.0.0.1:{port}",
            "--upstream",
            upstream,
            "--health-interval",
            "5",
            *extra,
        ],
        tmp / f"gw-{mode}-{port}.log",
    )
    wait_port(port, p.popen)
    return p, port


def nginx(tmp: Path, upstream: str) -> tuple[subprocess.Popen, int]:
    sys.path.insert(0, str(ROOT / "deploy" / "nginx"))
    from render import render  # type: ignore[import-not-found]

    port = free_port()
    prefix = tmp / "nginx"
    conf = render(prefix, f"127.0.0.1:{port}", [upstream])
    p = subprocess.Popen(
        ["nginx", "-p", str(prefix), "-e", str(prefix / "error.log"), "-c", str(conf), "-g", "daemon off;"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_port(port, p)
    return p, port


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process and its live children (nginx: master + worker)."""
    total = 0.0
    pids = [pid]
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            children = Path(f"/proc/{pid}/task/{tid}/children").read_text().split()
            pids += [int(c) for c in children]
    except OSError:
        pass
    for p in pids:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / CLK_TCK
        except (OSError, IndexError, ValueError):
            pass
    return total


# ------------------------------------------------------------------------------ clients
class GrpcTarget:
    def __init__(self, name: str, target: str, baseline: str) -> None:
        self.name = name
        self.baseline = baseline
        # a channel of its own (no subchannel shared with another target)
        self.channel = grpc.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])
        self.stub = llm_pb2_grpc.LLMStub(self.channel)

    def call(self, req: dict) -> bytes:
        return self.stub.Generate(llm_pb2.GenerateRequest(**req), timeout=30).SerializeToString()


class HttpTarget:
    def __init__(self, name: str, port: int, baseline: str) -> None:
        self.name = name
        self.baseline = baseline
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def call(self, req: dict) -> bytes:
        self.conn.request("POST", "/v1/generate", json.dumps(req), {"Content-Type": "application/json"})
        resp = self.conn.getresponse()
        body = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"{self.name}: HTTP {resp.status} {body[:200]!r}")
        return json.dumps(json.loads(body), sort_keys=True).encode()


# ------------------------------------------------------------------------------ statistics
def pct(a: np.ndarray, q: float) -> float:
    return float(np.percentile(a, q))


def added_with_ci(
    target: np.ndarray, base: np.ndarray, q: float, rng: np.random.Generator, n_boot: int = 1000
) -> tuple[float, float, float]:
    point = pct(target, q) - pct(base, q)
    n = len(target)
    idx = rng.integers(0, n, size=(n_boot, n))
    boots = np.percentile(target[idx], q, axis=1) - np.percentile(base[idx], q, axis=1)
    lo, hi = np.percentile(boots, [2.5, 97.5])
    return point, float(lo), float(hi)


def ratio_with_ci(
    a: np.ndarray,
    a_base: np.ndarray,
    b: np.ndarray,
    b_base: np.ndarray,
    q: float,
    rng: np.random.Generator,
    n_boot: int = 1000,
) -> tuple[float, float, float]:
    """(added of a) / (added of b) at percentile q, resampling iterations jointly."""
    point = (pct(a, q) - pct(a_base, q)) / (pct(b, q) - pct(b_base, q))
    n = len(a)
    idx = rng.integers(0, n, size=(n_boot, n))
    num = np.percentile(a[idx], q, axis=1) - np.percentile(a_base[idx], q, axis=1)
    den = np.percentile(b[idx], q, axis=1) - np.percentile(b_base[idx], q, axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = num / den
    r = r[np.isfinite(r)]
    lo, hi = np.percentile(r, [2.5, 97.5])
    return point, float(lo), float(hi)


# ------------------------------------------------------------------------------ environment
def environment() -> dict:
    import aiohttp
    import hpack

    model = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        ),
        platform.processor(),
    )
    ngx = (
        subprocess.run(["nginx", "-v"], capture_output=True, text=True, check=False).stderr.strip()
        if shutil.which("nginx")
        else "absent"
    )
    return {
        "date_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "cpu_model": model,
        "cpu_cores": os.cpu_count(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "grpcio": grpc.__version__,
        "aiohttp": aiohttp.__version__,
        "hpack": getattr(hpack, "__version__", "?"),
        "nginx": ngx,
        "numpy": np.__version__,
        "loadavg_start": os.getloadavg(),
    }


# ------------------------------------------------------------------------------ main
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=3000, help="iterations (each calls every target once)")
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--no-write", action="store_true", help="print only; write nothing under docs/results")
    ap.add_argument("--out", default=str(ROOT / "docs" / "results"))
    args = ap.parse_args()
    env = environment()
    req = {"prompt": PROMPT, "max_tokens": args.max_tokens, "ignore_eos": True}
    tmp = Path(tempfile.mkdtemp(prefix="gwbench-"))
    procs: list = []
    try:
        srv = Server(
            tmp,
            "--engine",
            "synthetic",
            "--prefill-ms-per-token",
            "0",
            "--decode-ms-per-token",
            "0",
            "--max-batch-size",
            "64",
            "--max-wait-ms",
            "0",
        )
        procs.append(srv)
        http_up = f"127.0.0.1:{srv.http_port}"
        pt, pt_port = gateway(tmp, "passthrough", srv.grpc_target)
        ptg, ptg_port = gateway(tmp, "passthrough", srv.grpc_target, "--impl", "grpc")
        ptn, ptn_port = gateway(tmp, "passthrough", srv.grpc_target, "--no-decode-metadata")
        if HAVE_UVLOOP:  # the default loop is uvloop when installed: also measure plain asyncio
            ptu, ptu_port = gateway(tmp, "passthrough", srv.grpc_target, "--loop", "asyncio")
            procs.append(ptu)
        tc, tc_port = gateway(tmp, "transcode", srv.grpc_target)
        re_, re_port = gateway(tmp, "reencode", http_up)
        hp, hp_port = gateway(tmp, "http-proxy", http_up)
        procs += [pt, ptg, ptn, tc, re_, hp]
        pids = {
            "passthrough": pt.popen.pid,
            "passthrough-grpc": ptg.popen.pid,
            "passthrough-nodecode": ptn.popen.pid,
            "transcode": tc.popen.pid,
            "reencode": re_.popen.pid,
            "http-proxy": hp.popen.pid,
        }
        if HAVE_UVLOOP:
            pids["passthrough-asyncio"] = ptu.popen.pid
        targets: list = [
            GrpcTarget("direct", srv.grpc_target, "direct"),
            GrpcTarget("direct-again", srv.grpc_target, "direct"),
            GrpcTarget("passthrough", f"127.0.0.1:{pt_port}", "direct"),
            GrpcTarget("passthrough-grpc", f"127.0.0.1:{ptg_port}", "direct"),
            GrpcTarget("passthrough-nodecode", f"127.0.0.1:{ptn_port}", "direct"),
            *([GrpcTarget("passthrough-asyncio", f"127.0.0.1:{ptu_port}", "direct")] if HAVE_UVLOOP else []),
            GrpcTarget("reencode", f"127.0.0.1:{re_port}", "direct"),
            HttpTarget("direct-http", srv.http_port, "direct-http"),
            HttpTarget("transcode", tc_port, "direct-http"),
            HttpTarget("http-proxy", hp_port, "direct-http"),
        ]
        if shutil.which("nginx"):
            ngx, ngx_port = nginx(tmp, srv.grpc_target)
            procs.append(ngx)
            pids["nginx"] = ngx.pid
            targets.insert(4, GrpcTarget("nginx", f"127.0.0.1:{ngx_port}", "direct"))
        else:
            print("nginx not installed: the nginx column is skipped", file=sys.stderr)

        # warm-up, and every path must answer exactly what its direct path answers
        answers: dict[str, bytes] = {}
        for t in targets:
            for _ in range(args.warmup):
                answers[t.name] = t.call(req)
        for t in targets:
            assert answers[t.name] == answers[t.baseline], f"{t.name} answers differently from {t.baseline}"

        names = [t.name for t in targets]
        lat = {n: np.empty(args.calls) for n in names}
        cpu0 = {n: cpu_seconds(p) for n, p in pids.items()}
        order = list(targets)
        rnd = random.Random(1)
        t_start = time.monotonic()
        for i in range(args.calls):
            rnd.shuffle(order)
            for t in order:
                t0 = time.perf_counter_ns()
                t.call(req)
                lat[t.name][i] = (time.perf_counter_ns() - t0) / 1e3  # µs
        wall = time.monotonic() - t_start
        cpu = {n: (cpu_seconds(p) - cpu0[n]) / args.calls * 1e6 for n, p in pids.items()}  # µs per call
        env["loadavg_end"] = os.getloadavg()
    finally:
        for p in reversed(procs):
            if isinstance(p, subprocess.Popen):
                p.terminate()
                p.wait(10)
            else:
                p.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    rng = np.random.default_rng(7)
    rows = []
    for t in targets:
        a, base = lat[t.name], lat[t.baseline]
        row = {"path": t.name, "baseline": t.baseline, "p50_us": pct(a, 50), "p90_us": pct(a, 90), "p99_us": pct(a, 99)}
        if t.name != t.baseline:
            row["added_p50_us"], row["added_p50_lo"], row["added_p50_hi"] = added_with_ci(a, base, 50, rng)
            row["added_p90_us"], row["added_p90_lo"], row["added_p90_hi"] = added_with_ci(a, base, 90, rng)
            row["added_p99_us"], row["added_p99_lo"], row["added_p99_hi"] = added_with_ci(a, base, 99, rng)
        if t.name in cpu:
            row["proxy_cpu_us_per_call"] = cpu[t.name]
            row["max_calls_per_s_one_core"] = 1e6 / cpu[t.name] if cpu[t.name] > 0 else None
        rows.append(row)
    ratios = {}
    if "nginx" in lat:
        for name in (
            "direct-again",
            "passthrough",
            "passthrough-nodecode",
            "passthrough-asyncio",
            "passthrough-grpc",
            "reencode",
        ):
            if name in lat:
                ratios[name] = {
                    f"p{q}": ratio_with_ci(lat[name], lat["direct"], lat["nginx"], lat["direct"], q, rng)
                    for q in (50, 90, 99)
                }
    result = {
        "environment": env,
        "calls_per_path": args.calls,
        "max_tokens": args.max_tokens,
        "wall_s": wall,
        "rows": rows,
        "ratio_to_nginx_added": ratios,
    }
    md = markdown(result)
    print(md)
    if not args.no_write:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        day = env["date_utc"][:10]
        (out / f"{day}-gateway.json").write_text(json.dumps(result, indent=2) + "\n")
        (out / f"{day}-gateway.md").write_text(md)
        print(f"wrote {out / (day + '-gateway.md')} and .json", file=sys.stderr)
    return 0


def markdown(r: dict) -> str:
    env = r["environment"]
    lines = [
        f"# Gateway overhead, {env['date_utc'][:10]}",
        "",
        f"Machine: {env['cpu_model']}, {env['cpu_cores']} cores, Linux {env['kernel']}; load average "
        f"{env['loadavg_start'][0]:.2f} at start, {env.get('loadavg_end', (0,))[0]:.2f} at end (a shared box).",
        f"Versions: Python {env['python']}, grpcio {env['grpcio']}, aiohttp {env['aiohttp']}, hpack {env['hpack']}, "
        f"{env['nginx']}.",
        f"Run: `python bench/gateway_bench.py --calls {r['calls_per_path']} --max-tokens {r['max_tokens']}` — "
        f"one synthetic server (0 ms inference, {r['max_tokens']} output tokens), one client process, "
        f"{r['calls_per_path']} iterations each calling every path once in shuffled order "
        f"({r['wall_s']:.0f} s). Added = percentile(path) − percentile(baseline), 95 % bootstrap interval in "
        f"brackets. CPU/call = the proxy process's own CPU time over the measured calls; "
        f"max calls/s on one core = 1 / that.",
        "",
        "| path | baseline | p50 µs | p99 µs | added p50 µs | added p90 µs | added p99 µs | proxy CPU µs/call "
        "| max calls/s, one core |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in r["rows"]:

        def ci(key: str, row: dict = row) -> str:
            if key + "_us" not in row:
                return "–"
            return f"{row[key + '_us']:.0f} [{row[key + '_lo']:.0f}, {row[key + '_hi']:.0f}]"

        cpu = row.get("proxy_cpu_us_per_call")
        lines.append(
            f"| {row['path']} | {row['baseline']} | {row['p50_us']:.0f} | {row['p99_us']:.0f} | "
            f"{ci('added_p50')} | {ci('added_p90')} | {ci('added_p99')} | {'–' if cpu is None else f'{cpu:.0f}'} | "
            f"{'–' if cpu is None else f'{1e6 / cpu:,.0f}'} |"
        )
    if r["ratio_to_nginx_added"]:
        lines += [
            "",
            "Added latency relative to nginx's added latency (goal for passthrough: ≤ 2×):",
            "",
            "| path | × nginx at p50 | × nginx at p90 | × nginx at p99 |",
            "|---|---:|---:|---:|",
        ]
        for name, qs in r["ratio_to_nginx_added"].items():
            cells = [f"{v[0]:.2f} [{v[1]:.2f}, {v[2]:.2f}]" for v in (qs["p50"], qs["p90"], qs["p99"])]
            lines.append(f"| {name} | {cells[0]} | {cells[1]} | {cells[2]} |")
    lines += ["", DESIGN_NOTES]
    return "\n".join(lines)


DESIGN_NOTES = """## The paths and what each design costs

- **passthrough** (default, `--impl h2`): an HTTP/2 *frame relay*. Each client connection
  is paired with one upstream connection; SETTINGS, PING, WINDOW_UPDATE, DATA, RST_STREAM,
  GOAWAY and header blocks are relayed as bytes, so flow control, `grpc-timeout`, metadata
  and cancellation work end to end. The one change: the header block that ends a stream
  (the trailers) gets a `server-timing` field with `gw.*`, appended as an HPACK literal
  without indexing (neither side's header table moves). After forwarding, header blocks
  are HPACK-decoded for the metrics labels (method, grpc-status): that is the CPU gap
  between `passthrough` and `passthrough-nodecode` (`--no-decode-metadata`). It runs on
  uvloop when installed (`--loop auto`); `passthrough-asyncio` is the stdlib loop.
- **passthrough-grpc** (`--impl grpc`): grpcio terminates the call: a sync `grpc.server`
  with a generic raw-bytes handler, one sync channel per upstream whose calls poll their
  own completion queue on the handler thread (`SingleThreadedUnaryStream`), grpcio's older
  poller (`GRPC_EXPERIMENTS=-event_engine_*`, set by the gateway). It balances per call.
  Its cost is grpcio's thread hand-offs and Python-level call machinery, not byte copies.
- Rejected after measuring: the obvious grpc.aio proxy (4–5.6× nginx's added latency in
  earlier runs here) and a relay that terminates HTTP/2 on both sides with the pure-Python
  `h2` library and multiplexes one upstream connection (≈ 3.3× nginx at p50 in a prototype
  run: six pure-Python HPACK encodes/decodes per call, 50–90 µs each).
- **transcode**: aiohttp in, JSON → protobuf (`pathprobe.jsoncodec`), grpc.aio out.
  **reencode**: grpc.aio in, protobuf → JSON, aiohttp keep-alive pool to the server's
  HTTP port. **http-proxy**: aiohttp in and out, bytes forwarded (only the last SSE event
  is re-written for `server_timing`).

Trade-offs of the frame relay: balancing is per client connection (an L4-style choice at
connect time), so one client channel sticks to one upstream until its connection ends;
use `--impl grpc` for per-call balancing. The trailers carry two `server-timing` fields
(the server's and the gateway's); gRPC clients see both in trailing metadata and
`pathprobe.timing.from_metadata` merges them. When an upstream dies, calls in flight on it
end `UNAVAILABLE` naming it and the client connection gets GOAWAY; the client's next
calls reconnect and go to a healthy upstream.

p99 on this 2-core box is dominated by the other processes running on it (see the load
average above and the `direct-again` control row, which measures the same server twice):
read the p99 columns through their intervals; p50 and p90 are the stable comparison.
"""


if __name__ == "__main__":
    sys.exit(main())
