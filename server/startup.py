"""Where a server's cold start goes: timed startup phases.

``pathprobe serve`` records each phase of its startup (model folder, tokenizer, weights
read vs init, device transfer, warm-up, CUDA-graph capture, front ends, and the first
request), then prints a table, exports one ``server.startup`` span with a child span per
phase, and sets ``pathprobe_server_startup_ms{phase=...}`` in ``/metrics``.

A phase the configuration does not have (no weight files for a preset, no CUDA graphs)
is not recorded, rather than shown as zero.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from pathprobe.timing import now_ms

#: phase -> what it covers (the table's order)
PHASES: dict[str, str] = {
    "imports": "import torch and transformers",
    "model_folder": "resolve the model folder (a preset's config + tokenizer are built on first use)",
    "tokenizer": "load the fast tokenizer",
    "tokenizer_slow": "load the slow (Python) tokenizer",
    "weights_read": "read the weight files from disk (bytes only)",
    "weights_init": "build the model: deserialize weights, or random init for a preset",
    "device_transfer": "copy the weights to the device",
    "fuse": "concatenate QKV and gate/up weights into one GEMM each, --engine-option fuse=1",
    "quantize": "weight-only quantization of the linear layers (torchao), --engine-option quant=",
    "warmup": "one prefill + one decode step, so the first request pays no lazy init",
    "cuda_graphs": "static KV cache + CUDA-graph capture (and torch.compile of the decode step with compile=1)",
    "graph_warm": "replay each captured graph once (a graph's first launch is slower)",
    "warm_request": "one short request through the static (graph) path before serving",
    "engine_other": "the rest of the engine's start (not in a phase above)",
    "frontends": "bind HTTP and gRPC, start serving",
    "first_request": "the first request's server time (srv.total)",
}


@dataclass(slots=True)
class Phase:
    name: str
    start: float  # monotonic ms
    ms: float
    note: str = ""


@dataclass
class StartupTimer:
    """Collects phases; ``sync`` (e.g. ``torch.cuda.synchronize``) runs before a phase ends."""

    t0: float = field(default_factory=now_ms)
    phases: dict[str, Phase] = field(default_factory=dict)
    sync: Callable[[], None] | None = None

    @contextlib.contextmanager
    def phase(self, name: str, note: str = "") -> Iterator[Phase]:
        if name not in PHASES:
            raise ValueError(f"unknown startup phase {name!r}")
        start = now_ms()
        ph = Phase(name, start, 0.0, note)
        try:
            yield ph
        finally:
            if self.sync is not None:
                self.sync()
            ph.ms = now_ms() - start
            self.add(ph)

    def add(self, ph: Phase) -> None:
        old = self.phases.get(ph.name)
        if old is not None:  # a phase entered twice (e.g. two tokenizers): one interval, summed
            ph = Phase(ph.name, old.start, old.ms + ph.ms, old.note or ph.note)
        self.phases[ph.name] = ph

    def record(self, name: str, start: float, ms: float, note: str = "") -> None:
        if name not in PHASES:
            raise ValueError(f"unknown startup phase {name!r}")
        self.add(Phase(name, start, ms, note))

    def ordered(self) -> list[Phase]:
        return [self.phases[n] for n in PHASES if n in self.phases]

    def as_dict(self) -> dict[str, float]:
        return {p.name: p.ms for p in self.ordered()}

    def table(self, total_ms: float | None = None) -> str:
        rows = self.ordered()
        total = total_ms if total_ms is not None else sum(p.ms for p in rows if p.name != "first_request")
        lines = ["startup phase        ms        share  what", "-" * 78]
        for p in rows:
            share = f"{100 * p.ms / total:5.1f}%" if total > 0 and p.name != "first_request" else "     -"
            what = PHASES[p.name] + (f" [{p.note}]" if p.note else "")
            lines.append(f"{p.name:<16} {p.ms:>10.1f}  {share}  {what}")
        lines.append(f"{'total (to ready)':<16} {total:>10.1f}")
        return "\n".join(lines)
