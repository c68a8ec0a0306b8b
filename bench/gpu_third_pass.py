"""The GPU engine's third pass (issue 25): decode toward the bandwidth floor, and TTFT by turn.

    PYTHONPATH=... python3 bench/gpu_third_pass.py decode --options cuda_graphs=1,fuse=1 --batch 1 --out FILE
    PYTHONPATH=... python3 bench/gpu_third_pass.py sessions --prefix-cache 1 --out FILE

- ``decode``: the transformers engine in process (Llama-3-8B shape, bf16, random weights) with the
  given ``--engine-option`` items, ``--batch`` requests at a time (64-token prompt, 64 new tokens):
  decode ms/token (the engine's ``decode_steps`` per token), its start-up phases (``fuse``, and
  ``cuda_graphs``, which holds the compile with ``compile=1``), then what is left between the step
  and the floor: the captured decode graph of the batch's bucket replayed alone (wall ms) and under
  ``torch.profiler`` (kernels per step, their summed GPU time, the top kernels), the parameter
  bytes and the device-to-device copy bandwidth measured here (floor = bytes / bandwidth).
- ``int4``: one layer quantized by ``quant=int4``: the weight's quantization error against the int4
  kernel's own error (its output against a bf16 matmul with the dequantized weight).
- ``sessions``: ``pathprobe serve`` on the GPU with the dynamic KV cache (prefix caching exists
  only there) and ``pathprobe load --sessions --turns 4`` over gRPC streams against it; by turn:
  n, p50 and p90 (nearest rank) of client TTFT and server prefill, median ``tokens_in`` and
  ``cached_tokens``, and each OK request's [TTFT, prefill] (``rows_ms``) for pooling runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pathprobe.server.engine.base import EngineConfig, GenParams
from pathprobe.server.engine.hf import TransformersEngine

MODEL = "preset:llama-3-8b-instruct"


def token_prompt(n: int, seed: int = 0) -> list[int]:
    import random

    rng = random.Random(seed)
    return [rng.randrange(10, 1000) for _ in range(n)]


async def _request(eng: TransformersEngine, seed: int, n: int) -> float:
    g = eng.generate(GenParams(prompt_token_ids=token_prompt(64, seed), max_tokens=n, ignore_eos=True))
    await g.collect()
    return g.timing.decode_steps / max(1, n - 1)


def copy_bandwidth() -> float:
    """Device-to-device copy, GB/s (read + write counted), median of 10 copies of 2 GiB."""
    import torch

    a = torch.empty(2**30, dtype=torch.bfloat16, device="cuda")
    b = torch.empty_like(a)
    times = []
    for _ in range(12):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        b.copy_(a)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    del a, b
    return 2 * 2**31 / statistics.median(times[2:]) / 1e9


def profile_replay(graph: Any, reps: int = 10) -> dict[str, Any]:
    """Wall ms of one replay (median of 50) and the kernels of ``reps`` replays under torch.profiler."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    walls = []
    for _ in range(50):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        graph.replay()
        torch.cuda.synchronize()
        walls.append((time.perf_counter() - t0) * 1000)
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(reps):
            graph.replay()
        torch.cuda.synchronize()
    ev = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    by: dict[str, list[float]] = {}
    for e in ev:
        by.setdefault(e.name, []).append(e.device_time)
    top = sorted(by.items(), key=lambda kv: -sum(kv[1]))[:15]
    return {
        "replay_wall_ms": round(statistics.median(walls), 4),
        "kernels_per_step": len(ev) / reps,
        "gpu_ms_per_step": round(sum(e.device_time for e in ev) / 1000 / reps, 4),
        "top": [
            {"name": k[:140], "per_step": len(v) / reps, "ms_per_step": round(sum(v) / 1000 / reps, 4)} for k, v in top
        ],
    }


def decode(args: argparse.Namespace) -> dict[str, Any]:
    """Each ``--options`` set in turn, in this one process (one engine at a time)."""
    import gc

    import torch

    runs = []
    for options in args.options or ["cuda_graphs=1,static_max_len=256"]:
        runs.append(decode_one(args, dict(item.split("=", 1) for item in options.split(",") if item)))
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return {"runs": runs}


def decode_one(args: argparse.Namespace, opts: dict[str, str]) -> dict[str, Any]:
    import torch

    eng = TransformersEngine(
        EngineConfig(model=args.model, device=args.device, max_batch_size=args.batch, max_wait_ms=20.0, options=opts)
    )
    asyncio.run(eng.start())
    res: dict[str, Any] = {
        "options": opts,
        "batch": args.batch,
        "startup_ms": {p.name: round(p.ms, 1) for p in eng.startup.ordered()},
        "startup_notes": {p.name: p.note for p in eng.startup.ordered() if p.note},
    }

    async def run() -> list[float]:
        per_token = []
        for i in range(args.rounds):
            per_token += await asyncio.gather(*(_request(eng, i * 100 + j, 64) for j in range(args.batch)))
        return per_token

    per_token = asyncio.run(run())
    res["decode_ms_per_token"] = {
        "median": round(statistics.median(per_token), 4),
        "min": round(min(per_token), 4),
        "max": round(max(per_token), 4),
        "n": len(per_token),
    }
    static = eng._static
    if static is not None and static.graphs:
        b = next(x for x in static.buckets if x >= args.batch)
        w = next(x for x in static.widths if x > 64 + 32)  # the width of the middle of a 64 + 64 request
        res["profile"] = {"graph": [b, w], **profile_replay(static.graphs[(b, w)][0])}
    params = sum(p.numel() * p.element_size() for p in eng.model.parameters())
    res["parameter_bytes"] = params
    if args.device == "cuda":
        bw = copy_bandwidth()
        res["copy_gb_s"] = round(bw, 1)
        res["floor_ms"] = round(params / (bw * 1e9) * 1000, 3)  # every weight read once per step
    asyncio.run(eng.stop())
    res["card"] = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    print("decode", json.dumps({k: v for k, v in res.items() if k != "profile"}), flush=True)
    if "profile" in res:
        p = res["profile"]
        print("profile", p["graph"], p["replay_wall_ms"], p["kernels_per_step"], p["gpu_ms_per_step"], flush=True)
        for row in p["top"][:8]:
            print("   ", row, flush=True)
    return res


def unique_message(i: int, words: int) -> str:
    """A user message of about ``words`` words that starts with its own number."""
    import random

    rng = random.Random(i)
    vocab = ("river", "stone", "light", "paper", "engine", "garden", "window", "number", "signal", "market")
    return f"Message {i}: " + " ".join(f"{rng.choice(vocab)}{rng.randrange(100)}" for _ in range(words))


def sessions(args: argparse.Namespace) -> dict[str, Any]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import gpu_study  # the study's server wrapper

    logs = Path(tempfile.mkdtemp(prefix="pp-sessions-"))
    serve_args = ["--max-batch-size", "8", "--engine-option", f"prefix_cache={args.prefix_cache}"]
    srv = gpu_study.Serve(args.model, *serve_args, device=args.device, log_dir=logs)
    out = logs / "load"
    prompts = logs / "prompts.jsonl"  # a new message per turn, none shared: turn 0 finds nothing cached
    prompts.write_text("".join(json.dumps({"prompt": unique_message(i, args.words)}) + "\n" for i in range(4000)))
    cmd = [sys.executable, "-m", "pathprobe", "load", "--headless", "--only-summary", "-L", "WARNING"]
    cmd += ["-H", f"grpc://127.0.0.1:{srv.grpc_port}", "--stream", "--out", str(out), "--tokenizer", "none"]
    cmd += ["--prompt-set", "file", "--prompt-file", str(prompts)]
    cmd += ["-u", str(args.users), "-r", str(args.users), "-t", f"{args.seconds}s", "--max-tokens", "32"]
    cmd += ["--sessions", "--turns", "4", "--think-time", "0.2"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.seconds + 120)
    finally:
        srv.stop()
    recs = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines() if line]
    ok = [r for r in recs if r["ok"]]
    by_turn: dict[int, list[dict[str, Any]]] = {}
    for r in ok:
        by_turn.setdefault(int(r["turn"]), []).append(r)

    def vals(rows: list[dict[str, Any]], get: Any) -> list[float]:
        return [v for v in (get(r) for r in rows) if v is not None]

    def med(rows: list[dict[str, Any]], get: Any) -> float | None:
        v = vals(rows, get)
        return round(statistics.median(v), 3) if v else None

    def ttft(r: dict[str, Any]) -> float | None:
        return r["ttft_ms"]

    def prefill(r: dict[str, Any]) -> float | None:
        return r["entries"].get("srv.prefill")

    table = {
        turn: {
            "n": len(rows),
            "ttft_ms": nearest_rank(vals(rows, ttft)),
            "srv_prefill_ms": nearest_rank(vals(rows, prefill)),
            "tokens_in": med(rows, lambda r: r["tokens_in"]),
            "cached_tokens": med(rows, lambda r: r.get("cached_tokens")),
        }
        for turn, rows in sorted(by_turn.items())
    }
    # Each OK request's [ttft, srv.prefill] in ms (to 0.01), by turn, in records.jsonl order: runs can be pooled.
    rows_ms = {turn: [[_r2(ttft(r)), _r2(prefill(r))] for r in rows] for turn, rows in sorted(by_turn.items())}
    print("sessions prefix_cache", args.prefix_cache, json.dumps(table), flush=True)
    return {
        "prefix_cache": args.prefix_cache,
        "quantiles": "nearest rank: sorted(values)[ceil(q * n) - 1], p50 and p90 (as the load tool's turn table)",
        "serve_args": serve_args,
        "load": cmd[3:],
        "load_rc": proc.returncode,
        # the load tool's summary (its turn table and totals) without Locust's tables, last 1500 characters
        "load_tail": (proc.stdout + proc.stderr).split("\nType     Name")[0][-1500:],
        "records": len(recs),
        "failed": len(recs) - len(ok),
        "by_turn": table,
        "rows_ms": rows_ms,
        "startup_ms": srv.startup(),
    }


def _r2(v: float | None) -> float | None:
    return None if v is None else round(v, 2)


def nearest_rank(values: list[float]) -> dict[str, float] | None:
    """p50 and p90 by nearest rank (a measured value: sorted[ceil(q * n) - 1]); None when empty."""
    if not values:
        return None
    s = sorted(values)
    return {f"p{int(q * 100)}": round(s[max(0, math.ceil(q * len(s)) - 1)], 3) for q in (0.5, 0.9)}


def int4(args: argparse.Namespace) -> dict[str, Any]:
    """Is int4's disagreement quantization error or the kernel path? One 4096 x 4096 layer with the
    preset's init (normal, std 0.02): the dequantized weight against bf16 (quantization error), and
    the int4 kernel's output against a bf16 matmul with the dequantized weight (kernel error)."""
    import torch
    from pathprobe.server.engine.quant import quantize

    torch.manual_seed(0)
    lin = torch.nn.Linear(4096, 4096, bias=False, dtype=torch.bfloat16, device="cuda")
    torch.nn.init.normal_(lin.weight, std=0.02)
    w = lin.weight.detach().clone()
    x = torch.randn(8, 4096, dtype=torch.bfloat16, device="cuda")
    ref = x @ w.t()
    model = torch.nn.Sequential(lin)
    note = quantize(model, "int4", "cuda")
    with torch.no_grad():
        wq = model[0].weight.dequantize().to(torch.bfloat16)
        got = model[0](x)
        via_dq = x @ wq.t()

    def rel(a: Any, b: Any) -> float:
        return round(float((a.float() - b.float()).norm() / b.float().norm()), 5)

    res = {
        "note": note,
        "weight_rel_error": rel(wq, w),
        "kernel_vs_dequantized_matmul_rel_error": rel(got, via_dq),
        "kernel_vs_bf16_rel_error": rel(got, ref),
        "dequantized_vs_bf16_output_rel_error": rel(via_dq, ref),
    }
    print("int4", json.dumps(res), flush=True)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("probe", choices=("decode", "sessions", "int4"))
    ap.add_argument("--options", action="append", help="decode: engine options k=v,... (repeat: one engine each)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5, help="decode: bursts of --batch requests")
    ap.add_argument("--prefix-cache", type=int, default=1)
    ap.add_argument("--users", type=int, default=4)
    ap.add_argument("--seconds", type=int, default=40)
    ap.add_argument("--words", type=int, default=60, help="sessions: words in each turn's new message")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--small", action="store_true", help="a check on the CPU with the @tiny preset")
    args = ap.parse_args()
    args.model, args.device = (MODEL + "@tiny", "cpu") if args.small else (MODEL, "cuda")
    t0 = time.monotonic()
    res = {"decode": decode, "sessions": sessions, "int4": int4}[args.probe](args)
    res["wall_s"] = round(time.monotonic() - t0, 1)
    import torch
    import transformers

    res["versions"] = {"torch": torch.__version__, "transformers": transformers.__version__}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1))
    print("wrote", args.out, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
