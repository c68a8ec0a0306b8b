"""Reports: what turns records and traces into figures and pages (stats, paired, hops, chunks,
waterfall, traces, Markdown, HTML, plots, analyze). It imports nothing from :mod:`pathprobe.analysis.lab`."""
