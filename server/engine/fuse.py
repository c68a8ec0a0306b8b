"""Fused projections (``--engine-option fuse=1``): one GEMM where the model runs several on the
same input. An attention block's ``q_proj``, ``k_proj`` and ``v_proj`` become one ``qkv_proj``, an
MLP's ``gate_proj`` and ``up_proj`` one ``gate_up_proj``; their weights are concatenated once at
load. At batch 1 a decode step is a row of small matrix-vector products that read their weights
once each: fewer, larger ones launch fewer kernels and keep the memory busier.

How, without copying a model's attention code: the fused block's forward computes the fused
projection once and hands its output to the model's own forward in place of the hidden states;
``q_proj``, ``k_proj`` and ``v_proj`` become slices of that output (the forward only reads the
hidden states' shape and passes them to the three projections). The MLP's forward is replaced
whole (it is three lines). Only blocks whose projections are plain ``nn.Linear`` layers on the
same input size, dtype and device, all with or all without bias, are fused; the rest stay as
they are. The numbers are the same up to the GEMM's summation order.
"""

from __future__ import annotations

from collections.abc import Callable

from pathprobe.server.engine.torchtypes import Model, Tensor

#: an attention block's projections of one input, in the order the fused weight holds them
QKV = ("q_proj", "k_proj", "v_proj")
#: an MLP's projections of one input
GATE_UP = ("gate_proj", "up_proj")


def _plain_linears(module: Model, names: tuple[str, ...]) -> list[Model] | None:
    """The named children when all are plain ``nn.Linear`` layers that can share one weight."""
    import torch

    parts = [getattr(module, n, None) for n in names]
    if not all(type(p) is torch.nn.Linear for p in parts):
        return None
    w = [p.weight for p in parts]
    if len({(x.shape[1], x.dtype, x.device) for x in w}) != 1 or len({p.bias is None for p in parts}) != 1:
        return None
    return parts


def _concat(parts: list[Model]) -> Model:
    """One ``nn.Linear`` whose output is the parts' outputs side by side (the parts' weights freed)."""
    import torch

    w = [p.weight for p in parts]
    bias = parts[0].bias is not None
    fused = torch.nn.Linear(w[0].shape[1], sum(x.shape[0] for x in w), bias=bias, device="meta", dtype=w[0].dtype)
    with torch.no_grad():
        fused.weight = torch.nn.Parameter(torch.cat([x.detach() for x in w], dim=0), requires_grad=False)
        if bias:
            fused.bias = torch.nn.Parameter(torch.cat([p.bias.detach() for p in parts]), requires_grad=False)
    return fused


def _slice_module() -> type:
    import torch

    class Slice(torch.nn.Module):
        """Columns ``[lo, hi)`` of a fused projection's output (takes the place of one projection)."""

        def __init__(self, lo: int, hi: int) -> None:
            super().__init__()
            self.lo, self.hi = lo, hi

        def forward(self, x: Tensor) -> Tensor:
            return x[..., self.lo : self.hi]

        def extra_repr(self) -> str:
            return f"columns {self.lo}:{self.hi} of qkv_proj"

    return Slice


def _fused_attention_forward(self: Model, *args: object, **kwargs: object) -> object:
    """The model's own attention forward, given ``qkv_proj(hidden_states)`` as its hidden states."""
    if "hidden_states" in kwargs:
        kwargs["hidden_states"] = self.qkv_proj(kwargs["hidden_states"])
    else:
        args = (self.qkv_proj(args[0]), *args[1:])
    return self._pathprobe_unfused_cls.forward(self, *args, **kwargs)


def _fused_mlp_forward(self: Model, x: Tensor) -> Tensor:
    gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
    return self.down_proj(self.act_fn(gate) * up)


def _swap_class(module: Model, forward: Callable[..., object]) -> None:
    """Give ``module`` a subclass of its class with ``forward`` (one subclass per class)."""
    cls = type(module)
    sub = _SUBCLASSES.get((cls, forward))
    if sub is None:
        sub = type(f"Fused{cls.__name__}", (cls,), {"forward": forward, "_pathprobe_unfused_cls": cls})
        _SUBCLASSES[(cls, forward)] = sub
    module.__class__ = sub


_SUBCLASSES: dict[tuple[type, Callable[..., object]], type] = {}


def fuse_projections(model: Model) -> str:
    """Fuse every attention block's QKV and every MLP's gate/up projections in place; a note for
    the start-up table (how many of each were fused)."""
    slice_cls = _slice_module()
    n_attn = n_mlp = 0
    for module in list(model.modules()):
        if getattr(module, "_pathprobe_unfused_cls", None) is not None:
            continue  # fused already
        qkv = _plain_linears(module, QKV)
        if qkv is not None and hasattr(module, "o_proj"):
            module.qkv_proj = _concat(qkv)
            lo = 0
            for name, part in zip(QKV, qkv):
                hi = lo + part.weight.shape[0]
                setattr(module, name, slice_cls(lo, hi))
                lo = hi
            _swap_class(module, _fused_attention_forward)
            n_attn += 1
            continue
        gate_up = _plain_linears(module, GATE_UP)
        if gate_up is not None and hasattr(module, "down_proj") and hasattr(module, "act_fn"):
            if gate_up[0].weight.shape != gate_up[1].weight.shape:
                continue
            module.gate_up_proj = _concat(gate_up)
            del module.gate_proj, module.up_proj
            _swap_class(module, _fused_mlp_forward)
            n_mlp += 1
    return f"fused QKV in {n_attn} attention blocks, gate/up in {n_mlp} MLPs"
