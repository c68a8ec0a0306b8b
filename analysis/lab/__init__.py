"""The lab: what runs an experiment (config, stack, processes, placement, probes, load runs, rounds,
accounting, witness, compare). It may import :mod:`pathprobe.analysis.report`, never the reverse."""
