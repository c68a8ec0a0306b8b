"""The engine of ``config.kind`` in this process: what :func:`pathprobe.server.engine.create_engine`
builds, and what the engine process (:mod:`pathprobe.server.engine.process`) runs in its child,
without importing the package that imports it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pathprobe.errors import ConfigError
from pathprobe.server.engine.base import Engine, EngineConfig

if TYPE_CHECKING:  # pragma: no cover
    from pathprobe.models import ResolvedModel


def create_local_engine(config: EngineConfig, model: ResolvedModel | None = None) -> Engine:
    """Build the engine named by ``config.kind`` (imports heavy deps lazily)."""
    if config.kind == "synthetic":
        from pathprobe.server.engine.synthetic import SyntheticEngine

        return SyntheticEngine(config, model)
    if config.kind == "transformers":
        from pathprobe.server.engine.hf import TransformersEngine

        return TransformersEngine(config, model)
    if config.kind == "vllm":
        from pathprobe.server.engine.vllm_engine import VLLMEngine

        return VLLMEngine(config, model)
    raise ConfigError(f"--engine: unknown engine {config.kind!r} (transformers, synthetic, vllm)")
