"""pathprobe server."""
