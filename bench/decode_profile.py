"""What limits one decode step and one prefill of a model on the GPU (batch 1), measured.

For a preset (default: the Llama-3-8B shape, bf16, random weights), in one process:

- bytes a decode step must read (every weight once; the KV cache is small at these lengths)
  and the floor that gives at the measured copy bandwidth (a device-to-device copy);
- the eager decode step and the eager 64-token prefill: wall time per call, and from
  ``torch.profiler`` the number of GPU kernels and the sum of their GPU time — when the
  kernels' sum is far under the wall time, the step is bound by launching them (CPU), not
  by the GPU;
- the same decode step captured as a CUDA graph (transformers' StaticCache) and replayed:
  no launch cost left, so what remains over the floor is the kernels themselves; the
  profile's top kernels say which.

    PYTHONPATH=$(bench/pkgtree.sh /tmp/pp) python3 bench/decode_profile.py --out DIR
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
import sys
import time
from pathlib import Path


def timed(fn, reps: int) -> float:
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) * 1000)
    return statistics.median(out)


def kernels(fn) -> dict:
    """Kernel count, summed GPU time (ms) and the top kernels of one call of ``fn``."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        fn()
        torch.cuda.synchronize()
    ev = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    total_us = sum(e.device_time for e in ev)
    by: dict[str, list[float]] = {}
    for e in ev:
        by.setdefault(e.name, []).append(e.device_time)
    top = sorted(by.items(), key=lambda kv: -sum(kv[1]))[:12]
    return {
        "kernels": len(ev),
        "gpu_ms": total_us / 1000,
        "top": [{"name": k[:120], "count": len(v), "ms": sum(v) / 1000} for k, v in top],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="preset:llama-3-8b-instruct")
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    import torch
    from pathprobe import models
    from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache, StaticCache

    res: dict = {
        "model": args.model,
        "prompt_tokens": args.prompt,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0),
    }
    folder = models.resolve_model(args.model)
    cfg = AutoConfig.from_pretrained(str(folder))
    with torch.device("cuda"):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    n_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    emb = model.get_input_embeddings().weight
    read_bytes = n_bytes - emb.numel() * emb.element_size()  # the embedding is gathered, not read whole
    x = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    copy_ms = timed(lambda: y.copy_(x), 10)
    bw = 2 * x.numel() / (copy_ms / 1000)
    x = y = None  # free the 4 GiB
    res.update(
        param_bytes=n_bytes,
        decode_read_bytes=read_bytes,
        copy_bandwidth_gbs=bw / 1e9,
        decode_floor_ms=read_bytes / bw * 1000,
    )
    ids = torch.randint(10, 1000, (1, args.prompt), device="cuda")
    with torch.inference_mode():

        def prefill():
            c = DynamicCache(config=model.config)
            return model(input_ids=ids, use_cache=True, logits_to_keep=1, **{kw: c})

        res["prefill_eager_ms"] = timed(prefill, 10)
        res["prefill_eager_profile"] = kernels(prefill)
        c = DynamicCache(config=model.config)
        model(input_ids=ids, use_cache=True, logits_to_keep=1, **{kw: c})
        nxt = torch.tensor([[11]], device="cuda")

        def step_eager():
            out = model(input_ids=nxt, use_cache=True, logits_to_keep=1, **{kw: c})
            for layer in c.layers:  # keep the cache at the prompt's length
                layer.keys, layer.values = layer.keys[:, :, : args.prompt], layer.values[:, :, : args.prompt]
            return out

        res["decode_eager_ms"] = timed(step_eager, 20)
        res["decode_eager_profile"] = kernels(step_eager)
        sc = StaticCache(config=model.config, max_cache_len=args.prompt + 64)
        model(
            input_ids=ids,
            cache_position=torch.arange(args.prompt, device="cuda"),
            use_cache=True,
            logits_to_keep=1,
            **{kw: sc},
        )
        s_ids = torch.full((1, 1), 11, dtype=torch.long, device="cuda")
        s_cp = torch.tensor([args.prompt], device="cuda")

        def step_static():
            return model(
                input_ids=s_ids,
                position_ids=s_cp[None],
                cache_position=s_cp,
                use_cache=True,
                logits_to_keep=1,
                **{kw: sc},
            ).logits

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                step_static()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step_static()
        res["decode_graph_ms"] = timed(graph.replay, 50)
        res["decode_static_eager_profile"] = kernels(step_static)
        res["decode_graph_bandwidth_gbs"] = read_bytes / (res["decode_graph_ms"] / 1000) / 1e9
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "decode_profile.json").write_text(json.dumps(res, indent=1))
    short = {k: v for k, v in res.items() if not k.endswith("_profile")}
    print(json.dumps(short, indent=1))
    for k in ("prefill_eager_profile", "decode_eager_profile", "decode_static_eager_profile"):
        p = res[k]
        print(k, "kernels", p["kernels"], "gpu_ms", round(p["gpu_ms"], 2))
        for t in p["top"][:8]:
            print(f"   {t['ms']:8.3f} ms  x{t['count']:<4} {t['name'][:90]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
