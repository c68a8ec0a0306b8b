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
    from pathprobe.server.engine.local import create_local_engine

    return create_local_engine(config, model)
