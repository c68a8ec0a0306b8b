"""pathprobe loadgen."""
