"""The latency study on a GPU, through ``pathprobe serve``: one command per part.

    PYTHONPATH=$(bench/pkgtree.sh /tmp/pp) python3 bench/gpu_study.py table   --out DIR
    PYTHONPATH=... python3 bench/gpu_study.py streams --out DIR   # TTFT / TPOT at 1, 8, 32 streams
    PYTHONPATH=... python3 bench/gpu_study.py seqlen  --out DIR   # prompt 256 -> 4096: latency, memory
    PYTHONPATH=... python3 bench/gpu_study.py ablate  --out DIR   # graphs, batching, padding

Every part starts real ``pathprobe serve`` processes (free loopback ports), talks to them
over gRPC (unary / streaming) and HTTP (keep-alive, stdlib client), samples the GPU with
NVML during the part, and writes ``DIR/<part>.json`` (raw figures, server startup tables,
GPU telemetry, versions). ``--small`` runs the same code at test scale (``@tiny`` presets,
few runs) so it can be checked on a CPU.

- ``table``: the study's seven presets; a 64-token text prompt, one new token, ``--runs``
  calls per protocol (interleaved), P95 end to end, and the tokenizer's share
  (``srv.tokenize`` / end to end) with the fast tokenizer and, on a second server, the slow one.
- ``streams``: Llama-3-8B shape with CUDA graphs; 64-token prompt, 64 new tokens, 1 / 8 / 32
  concurrent gRPC streams; TTFT (client) and TPOT ((last - first token) / (n - 1)).
- ``seqlen``: one request at a time, prompt 256 … 4096 tokens, 16 new tokens: TTFT, TPOT,
  the server's prefill time, and GPU memory (NVML, the whole device) at its highest.
- ``ablate``: eager vs CUDA graphs (TTFT, TPOT, tok/s at 1 and 8 streams); continuous vs
  dynamic vs static batching under a mixed-length workload at 32 concurrent clients; padding
  to the longest prompt vs power-of-two buckets vs a fixed 512 tokens under mixed prompts.
"""

from __future__ import annotations

import argparse
import datetime as dt
import http.client
import json
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
from pathprobe import gputelemetry, timing
from pathprobe.v1 import llm_pb2, llm_pb2_grpc

STUDY = ("phi-3-mini", "qwen2-1.5b", "olmo-1b", "stablelm-3b", "qwen2-7b", "deepseek-v2-lite", "llama-3-8b-instruct")
#: the study's own figures (its Chapter 1 table: A100-80GB, transformers 4.41, generate(), P95 of 100 runs)
ARTICLE = {
    "phi-3-mini": (127, 18),
    "qwen2-1.5b": (298, 32),
    "olmo-1b": (412, 25),
    "stablelm-3b": (685, 41),
    "qwen2-7b": (1120, 22),
    "deepseek-v2-lite": (1890, 15),
    "llama-3-8b-instruct": (2300, 37),
}
SENTENCES = (
    "The capital of France is Paris, and the river runs through the old city. "
    "A request leaves the client, crosses the network and reaches the model server. "
)


# --- building blocks ---------------------------------------------------------------------------------
def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(values: list[float], q: float) -> float:
    v = sorted(values)
    if not v:
        return float("nan")
    k = (len(v) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def stats(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50": pct(values, 0.5),
        "p95": pct(values, 0.95),
        "p99": pct(values, 0.99),
        "mean": statistics.fmean(values) if values else float("nan"),
    }


def versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version(),
        "cpu": f"{os.cpu_count()} cores",
    }
    for n in ("torch", "transformers", "tokenizers", "sentencepiece", "grpcio", "protobuf", "aiohttp", "nvidia-ml-py"):
        try:
            out[n] = md.version(n)
        except md.PackageNotFoundError:
            out[n] = "missing"
    try:
        q = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        out["gpu"] = q.stdout.strip() if q.returncode == 0 else "none"
    except (OSError, subprocess.TimeoutExpired):
        out["gpu"] = "none"
    return out


class Serve:
    """``pathprobe serve`` in a child process; its startup table is parsed from its output."""

    def __init__(self, model: str, *extra: str, device: str, log_dir: Path, timeout: float = 600) -> None:
        self.grpc_port, self.http_port = free_port(), free_port()
        self.log_path = log_dir / f"serve-{model.replace(':', '_').replace('@', '_')}-{self.grpc_port}.log"
        args = [
            sys.executable,
            "-m",
            "pathprobe",
            "serve",
            "--model",
            model,
            "--device",
            device,
            "--grpc-port",
            str(self.grpc_port),
            "--http-port",
            str(self.http_port),
            *extra,
        ]
        self.args = args
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - held for the child's lifetime, closed in stop()
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            args, stdout=self._log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"}
        )
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited ({self.proc.returncode}):\n{self.log()[-4000:]}")
            if time.monotonic() - t0 > timeout:
                self.stop()
                raise RuntimeError(f"server not ready after {timeout}s:\n{self.log()[-4000:]}")
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=2)
                c.request("GET", "/healthz")
                if c.getresponse().status == 200:
                    break
            except OSError:
                pass
            time.sleep(0.2)
        self.ready_s = time.monotonic() - t0
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.grpc_port}")
        self.stub = llm_pb2_grpc.LLMStub(self.channel)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def startup(self) -> dict[str, float]:
        return {
            m.group(1): float(m.group(2))
            for m in re.finditer(r"^([a-z_]+|total \(to ready\))\s+([\d.]+)\s*", self.log(), re.M)
        }

    def metrics(self) -> str:
        c = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=10)
        c.request("GET", "/metrics")
        return c.getresponse().read().decode()

    def stop(self) -> None:
        try:
            self.channel.close()
        except Exception:
            pass
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


class HttpClient:
    """One keep-alive HTTP/1.1 connection (stdlib), POST /v1/generate."""

    def __init__(self, port: int) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)

    def generate(self, **fields: Any) -> tuple[float, dict[str, float], dict]:
        body = json.dumps(fields).encode()
        t0 = time.perf_counter()
        self.conn.request("POST", "/v1/generate", body, {"Content-Type": "application/json"})
        resp = self.conn.getresponse()
        data = resp.read()
        ms = (time.perf_counter() - t0) * 1000
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {data[:300]!r}")
        return ms, timing.parse(resp.getheader("Server-Timing")), json.loads(data)


def grpc_unary(srv: Serve, **fields: Any) -> tuple[float, dict[str, float], Any]:
    t0 = time.perf_counter()
    resp, call = srv.stub.Generate.with_call(llm_pb2.GenerateRequest(**fields), timeout=120)
    ms = (time.perf_counter() - t0) * 1000
    return ms, timing.from_metadata(call.trailing_metadata()), resp


def grpc_stream(srv: Serve, **fields: Any) -> dict[str, Any]:
    t0 = time.perf_counter()
    call = srv.stub.GenerateStream(llm_pb2.GenerateRequest(**fields), timeout=300)
    times, n = [], 0
    for chunk in call:
        if chunk.token_ids or chunk.text:
            times.append((time.perf_counter() - t0) * 1000)
            n += max(1, len(chunk.token_ids))
    entries = timing.from_metadata(call.trailing_metadata())
    ttft = times[0] if times else float("nan")
    tpot = (times[-1] - times[0]) / (n - 1) if n > 1 else float("nan")
    return {"ttft": ttft, "tpot": tpot, "e2e": times[-1] if times else float("nan"), "tokens": n, "entries": entries}


def text_prompt(tokenizer_encode: Callable[[str], list[int]], n_tokens: int) -> str:
    """A text whose encoding (BOS included) is exactly ``n_tokens`` long, or as close as words allow."""
    words = (SENTENCES * (n_tokens // 8 + 4)).split(" ")
    lo, hi = 1, len(words)
    while lo < hi:  # the longest prefix of words within n_tokens
        mid = (lo + hi + 1) // 2
        if len(tokenizer_encode(" ".join(words[:mid]))) <= n_tokens:
            lo = mid
        else:
            hi = mid - 1
    return " ".join(words[:lo])


def token_prompt(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(10, 1000) for _ in range(n)]


class Part:
    """One bench part: versions, GPU telemetry across it, servers' startup tables."""

    def __init__(self, name: str, args: argparse.Namespace) -> None:
        self.name, self.args = name, args
        self.res: dict[str, Any] = {"part": name, "info": versions(), "small": args.small, "servers": []}
        self.gpu = gputelemetry.GpuSampler(interval_s=0.1)
        self.logs = Path(tempfile.mkdtemp(prefix=f"pp-{name}-"))

    def __enter__(self) -> Part:
        self.gpu.start()
        return self

    def serve(self, model: str, *extra: str) -> Serve:
        srv = Serve(model, *extra, device=self.args.device, log_dir=self.logs)
        self.res["servers"].append({"model": model, "args": list(extra), "ready_s": srv.ready_s})
        print(f"[{self.name}] {model} {' '.join(extra)} ready in {srv.ready_s:.1f}s", flush=True)
        return srv

    def done(self, srv: Serve) -> dict[str, float]:
        startup = srv.startup()
        self.res["servers"][-1]["startup_ms"] = startup
        srv.stop()
        return startup

    def window(self) -> int:
        return len(self.gpu.samples)

    def gpu_since(self, start: int) -> dict[str, Any]:
        if not self.gpu.available:
            return self.gpu.summary()
        return gputelemetry.summarize(self.gpu.samples[start:], self.gpu.device)

    def save(self) -> Path:
        """Write what there is so far (a part cut short still leaves its finished rows)."""
        out = self.args.out / f"{self.name}{'-' + self.args.name if self.args.name else ''}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(self.res, indent=1, default=str))
        return out

    def __exit__(self, *exc: Any) -> None:
        self.res["gpu"] = self.gpu.stop()
        warn = gputelemetry.warning(self.res["gpu"]) if self.res["gpu"].get("gpu") else None
        if warn:
            print("WARNING:", warn, flush=True)
        self.res["gpu_samples"] = gputelemetry.samples_as_dicts(self.gpu.samples)
        print(f"wrote {self.save()}", flush=True)


# --- parts -------------------------------------------------------------------------------------
def preset(args: argparse.Namespace, name: str) -> str:
    return f"preset:{name}@tiny" if args.small else f"preset:{name}"


def build_presets(args: argparse.Namespace, names: list[str]) -> dict[str, float]:
    """Build the presets' folders (tokenizer training) in parallel, before anything is timed."""
    t0 = time.monotonic()
    procs = {
        n: subprocess.Popen(
            [sys.executable, "-m", "pathprobe", "make-model", "--preset", preset(args, n).split(":", 1)[1]],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for n in names
    }
    out = {}
    for n, p in procs.items():
        log = p.communicate()[0].decode(errors="replace")
        if p.returncode != 0:
            raise RuntimeError(f"make-model {n} failed:\n{log[-2000:]}")
        out[n] = time.monotonic() - t0
    return out


def part_table(args: argparse.Namespace) -> None:
    names = [n for n in STUDY if not args.only or n in args.only.split(",")]
    with Part("table", args) as part:
        part.res["build_s"] = build_presets(args, names)
        part.res["runs"] = args.runs
        rows = {}
        for name in names:
            row: dict[str, Any] = {
                "article_p95_ms": ARTICLE[name][0],
                "article_tokenizer_share": ARTICLE[name][1] / 100,
            }
            for tok in ("fast", "slow"):
                w = part.window()
                extra = ["--engine-option", f"tokenizer={tok}", "--max-batch-size", "8", "--max-wait-ms", "0"]
                try:
                    srv = part.serve(preset(args, name), *extra)
                except RuntimeError as exc:
                    row[tok] = {"error": str(exc)[-1500:]}
                    continue
                try:
                    row[tok] = table_runs(srv, args, name)
                finally:
                    row[tok]["startup_ms"] = part.done(srv)
                    row[tok]["gpu"] = part.gpu_since(w)
                print(
                    name,
                    tok,
                    json.dumps(
                        {k: v for k, v in row[tok].items() if k in ("grpc", "http", "tokenize_ms")}, default=str
                    )[:600],
                    flush=True,
                )
            rows[name] = row
            part.res["rows"] = rows
            part.save()


def table_runs(srv: Serve, args: argparse.Namespace, name: str) -> dict[str, Any]:
    from pathprobe import models

    tok = models.load_tokenizer(preset(args, name))
    prompt = text_prompt(tok.encode, 64)
    fields = {"prompt": prompt, "max_tokens": 1, "ignore_eos": True}
    http_c = HttpClient(srv.http_port)
    for _ in range(5):  # warm-up (first request is reported by the server's startup table)
        grpc_unary(srv, **fields)
        http_c.generate(**fields)
    rec: dict[str, list[dict[str, float]]] = {"grpc": [], "http": []}
    for i in range(args.runs):  # interleaved, alternating which goes first
        order = ("grpc", "http") if i % 2 == 0 else ("http", "grpc")
        for proto in order:
            if proto == "grpc":
                ms, entries, resp = grpc_unary(srv, **fields)
                assert resp.usage.completion_tokens == 1
            else:
                ms, entries, _ = http_c.generate(**fields)
            rec[proto].append({"e2e": ms, **entries})
    out: dict[str, Any] = {"prompt_tokens": len(tok.encode(prompt))}
    for proto, rs in rec.items():
        e2e = [r["e2e"] for r in rs]
        share = [r.get("srv.tokenize", 0.0) / r["e2e"] for r in rs]
        out[proto] = {
            "e2e": stats(e2e),
            "tokenize": stats([r.get("srv.tokenize", 0.0) for r in rs]),
            "prefill": stats([r.get("srv.prefill", 0.0) for r in rs]),
            "queue": stats([r.get("srv.queue", 0.0) for r in rs]),
            "srv_total": stats([r.get("srv.total", 0.0) for r in rs]),
            "tokenizer_share_median": statistics.median(share),
        }
    return out


def streams_run(srv: Serve, prompt_ids: list[int], concurrency: int, tokens: int, reps: int) -> dict[str, Any]:
    rows = []
    walls = []
    with ThreadPoolExecutor(concurrency) as pool:
        for _ in range(reps):
            t0 = time.perf_counter()
            futs = [
                pool.submit(grpc_stream, srv, prompt_token_ids=prompt_ids, max_tokens=tokens, ignore_eos=True)
                for _ in range(concurrency)
            ]
            got = [f.result() for f in futs]
            walls.append(time.perf_counter() - t0)
            rows.extend(got)
    server_ttft = [
        r["entries"].get("srv.queue", 0) + r["entries"].get("srv.tokenize", 0) + r["entries"].get("srv.prefill", 0)
        for r in rows
    ]
    decode = [r["entries"].get("srv.decode_steps", 0) / (r["tokens"] - 1) for r in rows if r["tokens"] > 1]
    return {
        "concurrency": concurrency,
        "tokens": tokens,
        "ttft": stats([r["ttft"] for r in rows]),
        "tpot": stats([r["tpot"] for r in rows]),
        "server_ttft": stats(server_ttft),
        "server_decode_ms_per_token": stats(decode),
        "prefill": stats([r["entries"].get("srv.prefill", 0) for r in rows]),
        "tokens_per_s": statistics.median(concurrency * tokens / w for w in walls),
    }


def llama(args: argparse.Namespace) -> str:
    return preset(args, "llama-3-8b-instruct")


#: streams --variants: engine options on top of CUDA graphs (prefill graphs are on by default there)
VARIANTS = {
    "graphs": [],
    "graphs-eager-prefill": ["--engine-option", "prefill_max_len=0"],
    "graphs-compile": ["--engine-option", "compile=1"],
    "graphs-nowarm": ["--engine-option", "graph_warm=0"],
    "graphs-int8": ["--engine-option", "quant=int8"],
    "graphs-int4": ["--engine-option", "quant=int4"],
    "graphs-cudnn": ["--engine-option", "cudnn_sdp=1"],
    "eager": None,
}


def part_streams(args: argparse.Namespace) -> None:
    with Part("streams", args) as part:
        build_presets(args, ["llama-3-8b-instruct"])
        conc = [1, 8, 32] if not args.small else [1, 4]
        part.res["rows"], part.res["one_token_grpc"] = [], {}
        for variant in args.variants.split(","):
            extra = VARIANTS[variant]
            extra = ["--max-batch-size", str(max(conc))] if extra is None else [*graphs_args(args, max(conc)), *extra]
            try:
                srv = part.serve(llama(args), *extra)
            except RuntimeError as exc:
                part.res["one_token_grpc"][variant] = {"error": str(exc)[-2000:]}
                part.save()
                continue
            try:
                ids = token_prompt(64)
                streams_run(srv, ids, max(conc), 8, 1)  # warm every bucket
                for c in conc:
                    w = part.window()
                    row = streams_run(srv, ids, c, 64 if not args.small else 8, args.reps)
                    row.update(variant=variant, gpu=part.gpu_since(w))
                    part.res["rows"].append(row)
                    print(
                        "streams",
                        variant,
                        c,
                        row["ttft"]["p50"],
                        row["server_ttft"]["p50"],
                        row["tpot"]["p50"],
                        row["server_decode_ms_per_token"]["p50"],
                        row["tokens_per_s"],
                        flush=True,
                    )
                # one new token through gRPC, 64-token prompt, batch 1 (the engine-speed goal)
                one = [grpc_unary(srv, prompt_token_ids=ids, max_tokens=1, ignore_eos=True) for _ in range(args.runs)]
                part.res["one_token_grpc"][variant] = {
                    "e2e": stats([o[0] for o in one]),
                    "prefill": stats([o[1].get("srv.prefill", 0) for o in one]),
                    "srv_total": stats([o[1].get("srv.total", 0) for o in one]),
                }
                print("one token", variant, json.dumps(part.res["one_token_grpc"][variant]["e2e"]), flush=True)
                part.save()
            finally:
                part.done(srv)


def graphs_args(args: argparse.Namespace, batch: int, max_len: int = 2048) -> list[str]:
    if args.device == "cpu":
        return [
            "--max-batch-size",
            str(batch),
            "--engine-option",
            "static_cache=1",
            "--engine-option",
            f"static_max_len={max_len}",
        ]
    return [
        "--max-batch-size",
        str(batch),
        "--engine-option",
        "cuda_graphs=1",
        "--engine-option",
        f"static_max_len={max_len}",
    ]


def part_seqlen(args: argparse.Namespace) -> None:
    lengths = [256, 512, 1024, 2048, 4096] if not args.small else [32, 64, 128]
    with Part("seqlen", args) as part:
        build_presets(args, ["llama-3-8b-instruct"])
        part.res["rows"] = []
        for mode in ("graphs", "eager"):
            extra = graphs_args(args, 1, max(lengths) + 64) if mode == "graphs" else ["--max-batch-size", "1"]
            srv = part.serve(llama(args), *extra)
            try:
                for n in lengths:
                    w = part.window()
                    ids = token_prompt(n, seed=n)
                    grpc_stream(srv, prompt_token_ids=ids, max_tokens=4, ignore_eos=True)  # warm this width
                    rs = [
                        grpc_stream(srv, prompt_token_ids=ids, max_tokens=16, ignore_eos=True) for _ in range(args.reps)
                    ]
                    g = part.gpu_since(w)
                    row = {
                        "mode": mode,
                        "prompt_tokens": n,
                        "ttft": stats([r["ttft"] for r in rs]),
                        "tpot": stats([r["tpot"] for r in rs]),
                        "prefill": stats([r["entries"].get("srv.prefill", 0) for r in rs]),
                        "gpu_memory_used_max_mib": (g.get("memory_used_mib") or {}).get("max"),
                        "gpu": g,
                    }
                    part.res["rows"].append(row)
                    part.save()
                    print(
                        "seqlen",
                        mode,
                        n,
                        row["ttft"]["p50"],
                        row["tpot"]["p50"],
                        row["gpu_memory_used_max_mib"],
                        flush=True,
                    )
            finally:
                part.done(srv)


def mixed_load(
    srv: Serve,
    clients: int,
    requests: int,
    prompt_len: Callable[[random.Random], int],
    max_tokens: Callable[[random.Random], int],
    seed: int = 1,
) -> dict[str, Any]:
    """Closed loop: ``clients`` threads send ``requests`` requests in all (streaming gRPC)."""
    rng = random.Random(seed)
    jobs = [(token_prompt(prompt_len(rng), seed=i), max_tokens(rng)) for i in range(requests)]
    lock = threading.Lock()
    out: list[dict[str, Any]] = []

    def worker(k: int) -> None:
        for j in range(k, requests, clients):
            ids, n = jobs[j]
            r = grpc_stream(srv, prompt_token_ids=ids, max_tokens=n, ignore_eos=True)
            with lock:
                out.append(r)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(worker, range(clients)))
    wall = time.perf_counter() - t0
    toks = sum(r["tokens"] for r in out)
    return {
        "clients": clients,
        "requests": requests,
        "tokens_per_s": toks / wall,
        "wall_s": wall,
        "e2e": stats([r["e2e"] for r in out]),
        "ttft": stats([r["ttft"] for r in out]),
        "tpot": stats([r["tpot"] for r in out if r["tpot"] == r["tpot"]]),
        "queue": stats([r["entries"].get("srv.queue", 0) for r in out]),
        "prefill": stats([r["entries"].get("srv.prefill", 0) for r in out]),
    }


def part_ablate(args: argparse.Namespace) -> None:
    small = args.small
    with Part("ablate", args) as part:
        build_presets(args, ["llama-3-8b-instruct"])
        res = part.res
        sections = args.sections.split(",")
        # 1. eager vs CUDA graphs
        res["graphs"] = []
        for mode in ("eager", "graphs") if "graphs" in sections else ():
            extra = graphs_args(args, 8) if mode == "graphs" else ["--max-batch-size", "8"]
            srv = part.serve(llama(args), *extra)
            try:
                ids = token_prompt(64)
                streams_run(srv, ids, 8, 4, 1)
                for c in (1, 8):
                    w = part.window()
                    row = streams_run(srv, ids, c, 32 if not small else 6, max(1, args.reps // 2))
                    row.update(mode=mode, gpu=part.gpu_since(w))
                    res["graphs"].append(row)
                    part.save()
                    print(
                        "ablate graphs",
                        mode,
                        c,
                        row["ttft"]["p50"],
                        row["tpot"]["p50"],
                        row["tokens_per_s"],
                        flush=True,
                    )
            finally:
                res["graphs"][-1]["startup_ms"] = part.done(srv)
        # 2. batching: continuous vs dynamic vs static, mixed output lengths, 32 clients
        clients, reqs = (32, 192) if not small else (4, 12)
        res["batching"] = []
        for mode in ("continuous", "dynamic", "static") if "batching" in sections else ():
            extra = [*graphs_args(args, clients), "--engine-option", f"batching={mode}", "--max-wait-ms", "5"]
            srv = part.serve(llama(args), *extra)
            try:
                mixed_load(srv, clients, clients, lambda r: 64, lambda r: 8)  # warm-up
                w = part.window()
                row = mixed_load(
                    srv,
                    clients,
                    reqs,
                    lambda r: r.randint(32, 256),
                    lambda r: r.randint(8, 128) if not small else r.randint(2, 12),
                )
                row.update(mode=mode, gpu=part.gpu_since(w))
                res["batching"].append(row)
                part.save()
                print("ablate batching", mode, row["tokens_per_s"], row["e2e"]["p50"], row["e2e"]["p95"], flush=True)
            finally:
                part.done(srv)
        # 3. padding: longest vs bucket vs fixed 512, mixed prompt lengths, 16 clients, eager (DynamicCache)
        clients, reqs = (16, 128) if not small else (4, 12)
        res["padding"] = []
        for mode in ("longest", "bucket", "fixed:512") if "padding" in sections else ():
            extra = ["--max-batch-size", str(clients), "--engine-option", f"pad={mode}", "--max-wait-ms", "5"]
            if args.padding_engine == "graphs":  # graph decode, batched (padded) eager prefill
                extra = [
                    *graphs_args(args, clients),
                    "--engine-option",
                    "prefill_max_len=0",
                    "--engine-option",
                    f"pad={mode}",
                    "--max-wait-ms",
                    "5",
                ]
            srv = part.serve(llama(args), *extra)
            try:
                mixed_load(srv, clients, clients, lambda r: 64, lambda r: 4)
                w = part.window()
                row = mixed_load(srv, clients, reqs, lambda r: r.randint(16, 480), lambda r: 16 if not small else 4)
                row.update(mode=mode, engine=args.padding_engine, gpu=part.gpu_since(w))
                res["padding"].append(row)
                part.save()
                print(
                    "ablate padding",
                    mode,
                    row["tokens_per_s"],
                    row["e2e"]["p50"],
                    row["e2e"]["p95"],
                    (row["gpu"].get("memory_used_mib") or {}).get("max"),
                    flush=True,
                )
            finally:
                part.done(srv)


PARTS = {"table": part_table, "streams": part_streams, "seqlen": part_seqlen, "ablate": part_ablate}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("part", choices=[*PARTS, "all"])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--runs", type=int, default=100, help="table: calls per protocol")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--only", default="", help="table: comma-separated presets")
    ap.add_argument("--variants", default="graphs", help=f"streams: comma-separated, of {', '.join(VARIANTS)}")
    ap.add_argument("--sections", default="graphs,batching,padding", help="ablate: which ablations")
    ap.add_argument(
        "--padding-engine",
        default="eager",
        choices=("eager", "graphs"),
        help="ablate padding: eager engine, or graph decode with a batched (padded) eager prefill",
    )
    ap.add_argument("--name", default="", help="result file name suffix (PART-NAME.json)")
    ap.add_argument("--small", action="store_true", help="test scale (@tiny presets), for a CPU check")
    args = ap.parse_args()
    for name in PARTS if args.part == "all" else [args.part]:
        PARTS[name](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
