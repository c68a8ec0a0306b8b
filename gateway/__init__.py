"""pathprobe gateway."""
