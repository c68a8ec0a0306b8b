"""pathprobe analysis."""
