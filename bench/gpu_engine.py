"""The transformers engine on a GPU: TTFT and per-token decode time at several batch sizes.

Measures, in one run, side by side:

- the engine (``TransformersEngine``: worker thread, continuous batching, streaming):
  time to first token for one request, and per-token decode time / tokens per second
  with 1, 8 and 32 concurrent requests;
- the bare model's decode step at the same batch sizes, eager (DynamicCache), so the
  engine's own overhead per step shows as a ratio;
- the engine again with ``--engine-option cuda_graphs=1`` (static KV cache, one CUDA
  graph per batch bucket, still continuous batching), measured interleaved with the
  eager engine (both loaded at once, batch size by batch size);
- a transformers StaticCache decode step captured as a CUDA graph outside any engine
  (the floor the engine's graph path can approach).

Random weights (``preset:NAME`` builds the published architecture), so only the
timings mean anything. Writes ``docs/results/<date>-gpu-engine.md`` (or ``--out``).

    PYTHONPATH=$(bench/pkgtree.sh /tmp/pathprobe-tree) \
        python3 bench/gpu_engine.py --model preset:llama-3-8b --dtype bf16
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from pathprobe.server.engine.base import EngineConfig, GenParams
from pathprobe.server.engine.hf import TransformersEngine
from pathprobe.timing import now_ms

PROMPT = "The capital of France is"


def fixed_prompt_ids(tok, n: int) -> list[int]:
    base = tok.encode(PROMPT)
    filler = tok.encode(" and the river runs through the old city", add_special_tokens=False)
    ids = list(base)
    while len(ids) < n:
        ids.extend(filler)
    return ids[:n]


def device_info() -> dict[str, str]:
    import tokenizers
    import torch
    import transformers

    info = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "cuda": str(torch.version.cuda),
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else platform.processor() or "cpu",
    }
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        if out.returncode == 0:
            info["nvidia-smi"] = out.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        pass
    return info


async def engine_ttft(eng: TransformersEngine, ids: list[int], reps: int) -> dict[str, float]:
    ttft, prefill, queue = [], [], []
    for _ in range(reps):
        t0 = now_ms()
        g = eng.generate(GenParams(prompt_token_ids=ids, max_tokens=2, ignore_eos=True))
        first = None
        async for _ev in g:
            if first is None:
                first = now_ms() - t0
        ttft.append(first)
        prefill.append(g.timing.prefill)
        queue.append(g.timing.queue)
    return {
        "ttft_ms": statistics.median(ttft),
        "prefill_ms": statistics.median(prefill),
        "queue_ms": statistics.median(queue),
    }


async def engine_batch(eng: TransformersEngine, ids: list[int], batch: int, tokens: int, reps: int) -> dict[str, float]:
    per_tok, tps, queue = [], [], []
    for _ in range(reps):
        t0 = now_ms()
        gens = [eng.generate(GenParams(prompt_token_ids=ids, max_tokens=tokens, ignore_eos=True)) for _ in range(batch)]
        await asyncio.gather(*(g.collect() for g in gens))
        wall = now_ms() - t0
        per_tok.append(statistics.median(g.timing.decode_steps / (tokens - 1) for g in gens))
        tps.append(batch * tokens / (wall / 1000.0))
        queue.append(max(g.timing.queue for g in gens))
        assert max(g.timing.batch_size for g in gens) == batch, [g.timing.batch_size for g in gens]
    return {
        "decode_ms_per_token": statistics.median(per_tok),
        "tokens_per_s": statistics.median(tps),
        "max_queue_ms": statistics.median(queue),
    }


def raw_eager_step(model, batch: int, prompt_len: int, steps: int, device: str) -> float:
    """Median ms of one bare decode step (DynamicCache), no engine around it."""
    import torch
    from transformers import DynamicCache

    kw = "cache" if "cache" in __import__("inspect").signature(model.forward).parameters else "past_key_values"
    ids = torch.randint(10, 1000, (batch, prompt_len), device=device)
    cache = DynamicCache(config=model.config)
    mask = torch.ones((batch, prompt_len), dtype=torch.long, device=device)  # as the engine passes one
    with torch.inference_mode():
        out = model(input_ids=ids, attention_mask=mask, use_cache=True, logits_to_keep=1, **{kw: cache})
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        times = []
        for _ in range(steps):
            mask = torch.cat([mask, mask.new_ones((batch, 1))], dim=1)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = model(input_ids=nxt, attention_mask=mask, use_cache=True, logits_to_keep=1, **{kw: cache})
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            nxt.tolist()
            times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times[2:])


def graph_step(model, batch: int, prompt_len: int, steps: int, device: str) -> float:
    """Median ms of one decode step with a StaticCache, captured as a CUDA graph and replayed."""
    import inspect

    import torch
    from transformers import StaticCache

    kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    max_len = prompt_len + steps + 8
    cache = StaticCache(config=model.config, max_cache_len=max_len)
    ids = torch.randint(10, 1000, (batch, prompt_len), device=device)
    with torch.inference_mode():
        model(
            input_ids=ids,
            cache_position=torch.arange(prompt_len, device=device),
            use_cache=True,
            logits_to_keep=1,
            **{kw: cache},
        )
        s_ids = torch.full((batch, 1), 11, dtype=torch.long, device=device)
        s_cp = torch.tensor([prompt_len], device=device)
        s_pos = torch.full((batch, 1), prompt_len, dtype=torch.long, device=device)

        def step():
            return model(
                input_ids=s_ids,
                position_ids=s_pos,
                cache_position=s_cp,
                use_cache=True,
                logits_to_keep=1,
                **{kw: cache},
            ).logits

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            s_logits = step()
        times = []
        for k in range(steps):
            s_cp.fill_(prompt_len + k)
            s_pos.fill_(prompt_len + k)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            graph.replay()
            nxt = s_logits[:, -1].argmax(-1, keepdim=True)
            s_ids.copy_(nxt)
            nxt.tolist()
            times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times[2:])


async def main_async(args: argparse.Namespace) -> dict:
    batches = [int(b) for b in args.batches.split(",")]

    async def start(options: dict) -> tuple[TransformersEngine, float]:
        cfg = EngineConfig(
            model=args.model,
            device=args.device,
            dtype=args.dtype,
            max_batch_size=max(batches),
            max_wait_ms=args.max_wait_ms,
            max_queue=4 * max(batches),
            options=options,
        )
        t0 = time.perf_counter()
        eng = TransformersEngine(cfg)
        await eng.start()
        return eng, time.perf_counter() - t0

    eager, load_s = await start({})
    print(f"eager engine up in {load_s:.1f}s on {eager.device} {eager.dtype}", flush=True)
    cuda = eager.device.startswith("cuda")
    engines = {"eager": eager}
    res: dict = {
        "info": device_info(),
        "model": args.model,
        "dtype": str(eager.dtype),
        "load_s": load_s,
        "max_wait_ms": args.max_wait_ms,
        "batches": {},
        "ttft": {},
    }
    if cuda and not args.no_graphs:
        try:
            graphs, gload = await start({"cuda_graphs": "1"})
            engines["graphs"] = graphs
            res["graphs_load_s"] = gload
            print(f"cuda-graph engine up in {gload:.1f}s", flush=True)
        except Exception as exc:
            res["graphs_error"] = f"{type(exc).__name__}: {exc}"[:500]
            print("graphs engine failed:", res["graphs_error"], flush=True)
    ids = fixed_prompt_ids(eager.tokenizer, args.prompt_tokens)
    res["prompt_tokens"], res["new_tokens"] = len(ids), args.tokens
    # same tokens from both paths (greedy), and warm-up at every batch size
    texts = {}
    for name, eng in engines.items():
        g = eng.generate(GenParams(prompt_token_ids=ids, max_tokens=16, ignore_eos=True))
        texts[name] = (await g.collect())[1]
        for b in batches:
            await engine_batch(eng, ids, b, 4, 1)
    if "graphs" in texts:
        res["graphs_same_tokens_as_eager"] = texts["graphs"] == texts["eager"]
        res["tokens_eager_vs_graphs"] = [texts["eager"], texts["graphs"]]
    for name, eng in engines.items():
        res["ttft"][name] = await engine_ttft(eng, ids, args.reps * 3)
        print("ttft", name, res["ttft"][name], flush=True)
    for b in batches:
        row: dict = {}
        for name, eng in engines.items():  # interleaved: same conditions for both
            row[name] = await engine_batch(eng, ids, b, args.tokens, args.reps)
        if cuda:
            row["raw_eager_step_ms"] = raw_eager_step(eager.model, b, len(ids), 20, eager.device)
            try:
                row["cuda_graph_step_ms"] = graph_step(eager.model, b, len(ids), 20, eager.device)
            except Exception as exc:
                row["cuda_graph_error"] = f"{type(exc).__name__}: {exc}"[:300]
        res["batches"][b] = row
        print(b, row, flush=True)
    for eng in engines.values():
        await eng.stop()
    return res


def _f(x, fmt=".2f") -> str:
    return "–" if x is None else format(x, fmt)


def to_markdown(res: dict) -> str:
    info = res["info"]
    tt = res["ttft"]
    lines = [
        f"# Transformers engine on GPU — {res['model']} ({res['dtype']}, random weights)",
        "",
        f"Date: {info['date']}. Device: {info['device']}"
        + (f" ({info['nvidia-smi']})" if "nvidia-smi" in info else "")
        + ".",
        f"Versions: python {info['python']}, torch {info['torch']} (CUDA {info['cuda']}), "
        f"transformers {info['transformers']}, tokenizers {info['tokenizers']}.",
        f"Prompt {res['prompt_tokens']} tokens, {res['new_tokens']} new tokens per request (ignore_eos), greedy. "
        f"Engine load (random init on the device): {res['load_s']:.1f} s"
        + (
            f"; with CUDA graphs (static KV cache + captures): {res['graphs_load_s']:.1f} s"
            if "graphs_load_s" in res
            else ""
        )
        + ".",
        "Command: `PYTHONPATH=$(bench/pkgtree.sh /tmp/pathprobe-tree) python3 bench/gpu_engine.py --model "
        + res["model"]
        + "`",
        "",
    ]
    if "graphs_error" in res:
        lines += [f"CUDA-graph engine failed to start: `{res['graphs_error']}`", ""]
    if "graphs_same_tokens_as_eager" in res:
        lines += [f"Greedy tokens identical on both paths (16 tokens): {res['graphs_same_tokens_as_eager']}.", ""]
    lines += ["Time to first token, one request alone (generate() → first token in the consumer), median:", ""]
    lines += ["| engine | TTFT ms | prefill ms | queue ms (incl. batching window) |", "|---|---|---|---|"]
    for name, t in tt.items():
        lines.append(f"| {name} | {t['ttft_ms']:.1f} | {t['prefill_ms']:.1f} | {t['queue_ms']:.1f} |")
    lines += [
        "",
        "| concurrent requests | eager engine ms/token | eager tok/s | CUDA-graph engine ms/token | graph tok/s "
        "| graph speed-up | bare eager step ms | bare StaticCache graph step ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for b, row in res["batches"].items():
        e, g = row["eager"], row.get("graphs")
        lines.append(
            f"| {b} | {e['decode_ms_per_token']:.2f} | {e['tokens_per_s']:.0f} | "
            f"{_f(g and g['decode_ms_per_token'])} | {_f(g and g['tokens_per_s'], '.0f')} | "
            + (f"{e['decode_ms_per_token'] / g['decode_ms_per_token']:.2f}× | " if g else "– | ")
            + f"{_f(row.get('raw_eager_step_ms'))} | {_f(row.get('cuda_graph_step_ms'))}"
            + (f" ({row['cuda_graph_error']})" if "cuda_graph_error" in row else "")
            + " |"
        )
    lines += [
        "",
        "Engine ms/token: each request's `srv.decode_steps` / (tokens − 1), median over the requests and reps "
        "(the batched decode forward + sampling per step, as each request saw it). tok/s: all tokens of the "
        "burst / its wall time (prefill included). The two engines were loaded side by side and measured "
        "interleaved, batch size by batch size. Bare eager step: the model alone, one decode forward with "
        "an attention mask + argmax + host sync. Bare graph step: transformers' StaticCache decode forward "
        "captured once with `torch.cuda.graph` and replayed, no engine.",
        "",
        "Raw figures:",
        "",
        "```json",
        json.dumps(res, indent=1, default=str),
        "```",
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="preset:llama-3-8b")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument(
        "--max-wait-ms",
        type=float,
        default=2.0,
        help="batching window (a burst submitted at once lands in one prefill anyway)",
    )
    ap.add_argument("--no-graphs", action="store_true", help="skip the CUDA-graph engine")
    ap.add_argument("--out", type=Path, default=Path("docs/results"))
    args = ap.parse_args()
    res = asyncio.run(main_async(args))
    md = to_markdown(res)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{dt.date.today().isoformat()}-gpu-engine.md"
    path.write_text(md)
    print(md)
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
