"""Engines: one small interface, three implementations (synthetic, transformers, vllm)."""

from pathprobe.server.engine.base import (
    Engine,
    EngineConfig,
    EngineTiming,
    Generation,
    GenParams,
    TokenEvent,
)

__all__ = ["Engine", "EngineConfig", "EngineTiming", "GenParams", "Generation", "TokenEvent", "create_engine"]


def create_engine(config: EngineConfig) -> Engine:
    """Build the engine named by ``config.kind`` (imports heavy deps lazily), in a process of
    its own when ``config.process``."""
    if config.process:
        from pathprobe.server.engine.process import ProcessEngine

        return ProcessEngine(config)
    if config.kind == "synthetic":
        from pathprobe.server.engine.synthetic import SyntheticEngine

        return SyntheticEngine(config)
    if config.kind == "transformers":
        from pathprobe.server.engine.hf import TransformersEngine

        return TransformersEngine(config)
    if config.kind == "vllm":
        from pathprobe.server.engine.vllm_engine import VLLMEngine

        return VLLMEngine(config)
    from pathprobe.errors import ConfigError

    raise ConfigError(f"--engine: unknown engine {config.kind!r} (transformers, synthetic, vllm)")
