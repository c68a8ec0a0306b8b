"""Weight-only quantization of the transformers engine's linear layers with torchao
(``--engine-option quant=int8|int4``): weights stored in 8 or 4 bits, activations and the KV cache
stay in the model's dtype. torchao is optional (not a dependency); asking for it without it fails
at start-up."""

from __future__ import annotations

from typing import Any

from pathprobe.engineoptions import QUANT as ENGINE_QUANT
from pathprobe.errors import ConfigError
from pathprobe.server.engine.torchtypes import Model

#: ``--engine-option quant=``: none (default), int8 (per-channel), int4 (groups of 128, CUDA only)
QUANT = ENGINE_QUANT  # the option's one list of choices
#: int4 weights: one scale and zero point per group of this many input features
INT4_GROUP = 128


def _weight_bytes(model: Model) -> int:
    """Bytes held by the model's parameters as stored (a quantized tensor counts its packed data)."""
    total = 0
    for p in model.parameters():
        inner = getattr(p, "__tensor_flatten__", None)
        if inner is not None:  # a torchao tensor subclass: sum its inner tensors
            names, _ = p.__tensor_flatten__()
            total += sum(getattr(p, n).numel() * getattr(p, n).element_size() for n in names)
        else:
            total += p.numel() * p.element_size()
    return total


def quantize(model: Model, kind: str, device: str) -> str:
    """Quantize ``model``'s ``nn.Linear`` weights in place; returns a note for the start-up table."""
    try:
        from torchao.quantization import Int4WeightOnlyConfig, Int8WeightOnlyConfig, quantize_
    except ImportError as exc:
        raise ConfigError(f"--engine-option quant={kind}: needs torchao ({exc})") from None
    if kind == "int4" and not device.startswith("cuda"):
        raise ConfigError("--engine-option quant=int4: needs a CUDA device (torch's int4 matmul kernel)")
    before = _weight_bytes(model)
    if kind == "int8":
        config: Any = Int8WeightOnlyConfig()
    else:  # torch's own tinygemm int4 kernel (no extra kernel library)
        config = Int4WeightOnlyConfig(group_size=INT4_GROUP, int4_packing_format="tile_packed_to_4d")
    quantize_(model, config)
    after = _weight_bytes(model)
    return f"{kind} weight-only (torchao): parameters {before / 2**30:.2f} -> {after / 2**30:.2f} GiB"
