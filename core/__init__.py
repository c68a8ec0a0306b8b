"""pathprobe: where every millisecond of an LLM request goes on its network path."""

__version__ = "0.1.0"
