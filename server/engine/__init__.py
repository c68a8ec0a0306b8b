"""Engines: one small interface, three implementations (synthetic, transformers, vllm)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pathprobe.server.engine.base import (
    Engine,
    EngineConfig,
    EngineTiming,
    Generation,
    GenParams,
    TokenEvent,
)

if TYPE_CHECKING:  # pragma: no cover
    from pathprobe.models import ResolvedModel

__all__ = ["Engine", "EngineConfig", "EngineTiming", "GenParams", "Generation", "TokenEvent", "create_engine"]


def create_engine(config: EngineConfig, model: ResolvedModel | None = None) -> Engine:
    """Build the engine named by ``config.kind`` (imports heavy deps lazily), in a process of
    its own when ``config.process``. ``model``: ``config.model`` resolved by the caller (the
    server resolves it once per start); resolved here when not given."""
    if config.process:
        from pathprobe.server.engine.process import ProcessEngine

        return ProcessEngine(config, model)
    if config.kind == "synthetic":
        from pathprobe.server.engine.synthetic import SyntheticEngine

        return SyntheticEngine(config, model)
    if config.kind == "transformers":
        from pathprobe.server.engine.hf import TransformersEngine

        return TransformersEngine(config, model)
    if config.kind == "vllm":
        from pathprobe.server.engine.vllm_engine import VLLMEngine

        return VLLMEngine(config, model)
    from pathprobe.errors import ConfigError

    raise ConfigError(f"--engine: unknown engine {config.kind!r} (transformers, synthetic, vllm)")
