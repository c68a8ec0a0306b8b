"""The payload sweep's figure: path tax and each hop's serialization against the payload's bytes."""

from __future__ import annotations

from pathprobe.analysis.report.model import PayloadRow, Report
from pathprobe.analysis.report.plots import _plain_log_axis, _png


def _series(rows: list[PayloadRow]) -> dict[str, list[PayloadRow]]:
    """Each configuration's rows at its lowest concurrency, by payload size (bytes measured)."""
    out: dict[str, list[PayloadRow]] = {}
    for name in sorted({r.target for r in rows}):
        mine = [r for r in rows if r.target == name and r.n and r.request_bytes]
        if not mine:
            continue
        conc = min(r.concurrency for r in mine)
        out[name] = sorted((r for r in mine if r.concurrency == conc), key=lambda r: _size(r))
    return out


def _size(r: PayloadRow) -> float:
    return (r.request_bytes or 0.0) + (r.response_bytes or 0.0)


def plot_payload(report: Report) -> str | None:
    """Left: path tax p50 against request + response bytes; right: each hop's serialization (mean)."""
    sweep = report.payload
    series = _series(sweep.rows) if sweep is not None else {}
    if not series:
        return None
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2))
    for name, rows in series.items():
        x = [_size(r) / 1e3 for r in rows]
        left.plot(x, [r.path_tax_p50 or 0.0 for r in rows], marker="o", label=name)
        for i, label in enumerate(h.label for h in rows[0].hops):
            y = [r.hops[i].serialization_mean_ms or 0.0 if i < len(r.hops) else 0.0 for r in rows]
            right.plot(x, y, marker=".", label=f"{name}: {label}")
    left.set_ylabel("path tax p50 (ms)")
    right.set_ylabel("hop serialization, mean (ms)")
    for ax in (left, right):
        ax.set_xlabel("request + response (KB, measured at the client)")
        _plain_log_axis(ax)
        ax.grid(alpha=0.3)
    left.legend(fontsize=7)
    right.legend(fontsize=6)
    return _png(fig)
