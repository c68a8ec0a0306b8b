"""Network conditions on one hop: a delaying TCP relay (netem is often absent)."""

from pathprobe.netem.relay import DelayRelay, LinkSpec

__all__ = ["DelayRelay", "LinkSpec"]
