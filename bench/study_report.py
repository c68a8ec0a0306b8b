"""Markdown tables from bench/gpu_study.py's JSON results (and decode_profile.py's).

    python3 bench/study_report.py docs/results/2026-12-01-gpu-study > tables.md

Every figure printed is read from the JSON files; nothing is typed in except the study's own
figures, which gpu_study.py carries in each table row (``article_*``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

PARAMS = {
    "phi-3-mini": "3.8B",
    "qwen2-1.5b": "1.5B",
    "olmo-1b": "1.2B",
    "stablelm-3b": "2.8B",
    "qwen2-7b": "7.6B",
    "deepseek-v2-lite": "15.7B (2.4B active)",
    "llama-3-8b-instruct": "8.0B",
}


def f(x: Any, fmt: str = ".1f") -> str:
    return "–" if x is None else format(x, fmt)


def table(d: dict) -> list[str]:
    out = [
        "| model | params | study P95 ms | study tok. share | gRPC P95 ms | HTTP P95 ms | prefill p50 ms "
        "| tokenize p50 fast / slow ms | tok. share fast / slow | ready s | GPU mem used max MiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row in d["rows"].items():
        fa, sl = row.get("fast", {}), row.get("slow", {})
        if "error" in fa:
            out.append(
                f"| {name} | {PARAMS.get(name, '')} | {row['article_p95_ms']} | – | failed: {fa['error'][-120:]} |"
            )
            continue
        g, h = fa["grpc"], fa["http"]
        st = fa.get("startup_ms", {})
        mem = ((fa.get("gpu") or {}).get("memory_used_mib") or {}).get("max")
        slow_share = 100 * sl["grpc"]["tokenizer_share_median"] if "grpc" in sl else None
        out.append(
            f"| {name} | {PARAMS.get(name, '')} | {row['article_p95_ms']} "
            f"| {100 * row['article_tokenizer_share']:.0f}% "
            f"| {g['e2e']['p95']:.1f} | {h['e2e']['p95']:.1f} | {g['prefill']['p50']:.1f} "
            f"| {g['tokenize']['p50']:.2f} / {f(sl.get('grpc', {}).get('tokenize', {}).get('p50'), '.2f')} "
            f"| {100 * g['tokenizer_share_median']:.1f}% / {f(slow_share)}% "
            f"| {st.get('total (to ready)', 0) / 1000:.1f} | {f(mem, '.0f')} |"
        )
    return out


def startup(d: dict) -> list[str]:
    phases = [
        "imports",
        "model_folder",
        "tokenizer",
        "weights_read",
        "weights_init",
        "device_transfer",
        "warmup",
        "cuda_graphs",
        "engine_other",
        "frontends",
        "total (to ready)",
        "first_request",
    ]
    rows = [
        (name, row["fast"].get("startup_ms", {}))
        for name, row in d["rows"].items()
        if "startup_ms" in row.get("fast", {})
    ]
    used = [p for p in phases if any(p in st for _, st in rows)]
    out = ["| model | " + " | ".join(used) + " |", "|---|" + "---|" * len(used)]
    for name, st in rows:
        out.append(f"| {name} | " + " | ".join(f(st.get(p), ".0f") for p in used) + " |")
    return out


def streams(d: dict) -> list[str]:
    out = [
        "| variant | streams | TTFT p50 / p95 ms (client) | TTFT p50 ms (server: queue+tokenize+prefill) "
        "| TPOT p50 / p95 ms (client) | decode ms/token p50 (server) | tok/s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in d["rows"]:
        out.append(
            f"| {r.get('variant', '')} | {r['concurrency']} | {r['ttft']['p50']:.1f} / {r['ttft']['p95']:.1f} "
            f"| {r['server_ttft']['p50']:.1f} | {r['tpot']['p50']:.2f} / {r['tpot']['p95']:.2f} "
            f"| {r['server_decode_ms_per_token']['p50']:.2f} | {r['tokens_per_s']:.0f} |"
        )
    out += [
        "",
        "| variant | one new token, gRPC unary, e2e p50 / p95 / p99 ms | srv.prefill p50 ms | srv.total p50 ms |",
        "|---|---|---|---|",
    ]
    for v, o in d.get("one_token_grpc", {}).items():
        if "error" in o:
            out.append(f"| {v} | failed | | |")
            continue
        out.append(
            f"| {v} | {o['e2e']['p50']:.1f} / {o['e2e']['p95']:.1f} / {o['e2e']['p99']:.1f} "
            f"| {o['prefill']['p50']:.1f} | {o['srv_total']['p50']:.1f} |"
        )
    return out


def seqlen(d: dict) -> list[str]:
    out = [
        "| engine | prompt tokens | TTFT p50 ms | srv.prefill p50 ms | TPOT p50 ms | GPU memory used, max MiB |",
        "|---|---|---|---|---|---|",
    ]
    for r in d["rows"]:
        out.append(
            f"| {r['mode']} | {r['prompt_tokens']} | {r['ttft']['p50']:.1f} | {r['prefill']['p50']:.1f} "
            f"| {r['tpot']['p50']:.2f} | {f(r['gpu_memory_used_max_mib'], '.0f')} |"
        )
    return out


def ablate(d: dict) -> list[str]:
    out = [
        "Eager vs CUDA graphs (64-token prompt, 32 new tokens):",
        "",
        "| engine | streams | TTFT p50 ms | TPOT p50 ms | decode ms/token (server) | tok/s |",
        "|---|---|---|---|---|---|",
    ]
    if not d.get("graphs"):
        out = []
    for r in d.get("graphs", []):
        out.append(
            f"| {r['mode']} | {r['concurrency']} | {r['ttft']['p50']:.1f} | {r['tpot']['p50']:.2f} "
            f"| {r['server_decode_ms_per_token']['p50']:.2f} | {r['tokens_per_s']:.0f} |"
        )
    for key, title in (
        ("batching", "Batching (CUDA graphs, 32 clients, prompts 32–256, 8–128 new tokens)"),
        ("padding", "Prefill padding (16 clients, prompts 16–480 tokens, 16 new tokens)"),
    ):
        if not d.get(key):
            continue
        engine = d[key][0].get("engine", "eager")
        title += f"; engine: {engine}" if key == "padding" else ""
        out += [
            "",
            title + ":",
            "",
            "| mode | tok/s | e2e p50 / p95 ms | TTFT p50 / p95 ms | queue p50 ms | prefill p50 ms | GPU mem max MiB |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in d[key]:
            mem = ((r.get("gpu") or {}).get("memory_used_mib") or {}).get("max")
            out.append(
                f"| {r['mode']} | {r['tokens_per_s']:.0f} | {r['e2e']['p50']:.0f} / {r['e2e']['p95']:.0f} "
                f"| {r['ttft']['p50']:.0f} / {r['ttft']['p95']:.0f} | {r['queue']['p50']:.0f} "
                f"| {r['prefill']['p50']:.1f} | {f(mem, '.0f')} |"
            )
    return out


def profile(d: dict) -> list[str]:
    out = [
        f"Weights read per decode step: {d['decode_read_bytes'] / 1e9:.2f} GB; copy bandwidth measured "
        f"{d['copy_bandwidth_gbs']:.0f} GB/s; floor {d['decode_floor_ms']:.2f} ms/token.",
        "",
        "| call | wall ms | GPU kernels | sum of kernel time ms |",
        "|---|---|---|---|",
    ]
    out.append(
        f"| prefill 64 tokens, eager | {d['prefill_eager_ms']:.1f} | {d['prefill_eager_profile']['kernels']} "
        f"| {d['prefill_eager_profile']['gpu_ms']:.2f} |"
    )
    out.append(
        f"| decode step, eager (DynamicCache) | {d['decode_eager_ms']:.1f} | {d['decode_eager_profile']['kernels']} "
        f"| {d['decode_eager_profile']['gpu_ms']:.2f} |"
    )
    out.append(
        f"| decode step, StaticCache, CUDA graph replay | {d['decode_graph_ms']:.2f} "
        f"| {d['decode_static_eager_profile']['kernels']} | {d['decode_static_eager_profile']['gpu_ms']:.2f} |"
    )
    out += [
        "",
        "Top kernels of the captured decode step (same kernels, profiled eagerly):",
        "",
        "| ms | count | kernel |",
        "|---|---|---|",
    ]
    for t in d["decode_static_eager_profile"]["top"][:10]:
        out.append(f"| {t['ms']:.3f} | {t['count']} | `{t['name'][:80]}` |")
    return out


def main() -> int:
    folder = Path(sys.argv[1])
    parts = [
        ("table", "The study's table", table),
        ("table", "Startup phases (ms), fast-tokenizer servers", startup),
        ("streams", "TTFT / TPOT", streams),
        ("seqlen", "Sequence length", seqlen),
        ("ablate", "Ablations", ablate),
        ("ablate-rerun", "Ablations re-run (prefill graphs on; padding with graph decode)", ablate),
        ("decode_profile", "Decode profile", profile),
    ]
    for name, title, fn in parts:
        p = folder / f"{name}.json"
        if not p.exists():
            continue
        print(f"### {title}\n")
        print("\n".join(fn(json.loads(p.read_text()))))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
