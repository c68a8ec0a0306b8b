"""The compare report's plots (matplotlib, rendered to inline PNG): segments, CDFs, waterfalls,
streaming, hops, sweep."""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Mapping, Sequence
from typing import Any

from pathprobe.analysis.report.figures import metric_values
from pathprobe.analysis.report.model import Frontier, Group, HopPath, Report
from pathprobe.records import RequestRecord
from pathprobe.segments import SEGMENTS

SEG_COLORS = {
    "network": "#4e79a7",
    "serialization": "#f28e2b",
    "queueing": "#e15759",
    "inference": "#59a14f",
    "other": "#9c755f",
    "unsplit": "#bab0ac",
}


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=96, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _plain_log_axis(ax: Any) -> None:
    """Log scale with plain numbers (2, 5, 10) instead of 2x10^0; call after plotting."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_xscale("log")
    lo, hi = ax.get_xlim()
    decades = math.log10(hi / lo) if lo > 0 and hi > lo else 1.0
    subs = (1.0, 2.0, 5.0) if decades <= 2.5 else (1.0,)
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=subs))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())


def _groups(report: Report, conc: int) -> dict[str, Group]:
    """The configurations with an ok request at this concurrency, and their figures."""
    return {n: g for n, t in report.targets.items() if (g := t.at(conc)) is not None and g.ok > 0}


def _names(report: Report, conc: int) -> list[str]:
    return list(_groups(report, conc))


def plot_segments(report: Report) -> str | None:
    import matplotlib.pyplot as plt

    concs = report.concurrency
    if not any(_names(report, c) for c in concs):
        return None
    fig, axes = plt.subplots(
        1, len(concs), figsize=(5.5 * len(concs), 0.5 + 0.45 * len(report.targets) + 1), squeeze=False
    )
    for ax, conc in zip(axes[0], concs):
        names, groups = list(_groups(report, conc)), list(_groups(report, conc).values())
        left = [0.0] * len(names)
        for seg in SEGMENTS:
            vals = [max(0.0, g.segment_mean(seg) or 0.0) for g in groups]
            ax.barh(names, vals, left=left, color=SEG_COLORS[seg], label=seg)
            if seg == "network" and any(g.network_estimated for g in groups):
                # an estimated network (a transport round trip, not the request's own) is hatched
                est = [v if g.network_estimated else 0.0 for v, g in zip(vals, groups)]
                ax.barh(
                    names,
                    est,
                    left=left,
                    color=SEG_COLORS[seg],
                    hatch="///",
                    edgecolor="white",
                    label="network (estimated)",
                )
            left = [a + b for a, b in zip(left, vals)]
        ax.invert_yaxis()
        ax.set_xlabel("ms per request (mean)")
        ax.set_title(f"where the time goes, concurrency {conc}")
        ax.grid(axis="x", alpha=0.3)
    axes[0][-1].legend(loc="lower right", fontsize=8)
    return _png(fig)


def plot_cdfs(report: Report) -> str | None:
    """Each configuration's primary metric as an empirical CDF, per concurrency (the report's samples)."""
    import matplotlib.pyplot as plt
    import numpy as np

    concs, samples = report.concurrency, report.samples
    fig, axes = plt.subplots(1, len(concs), figsize=(5.5 * len(concs), 4), squeeze=False)
    drawn = False
    for ax, conc in zip(axes[0], concs):
        for name in _names(report, conc):
            x = np.sort(np.asarray(samples.get(name, {}).get(conc, []), dtype=float))
            if x.size == 0:
                continue
            y = np.arange(1, x.size + 1) / x.size
            ax.step(x, y, where="post", label=name, lw=1.4)
            drawn = True
        _plain_log_axis(ax)
        ax.set_xlabel(f"{report.primary} ms (log)")
        ax.set_ylabel("fraction of requests")
        ax.set_title(f"latency CDF, concurrency {conc}")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    if not drawn:
        plt.close(fig)
        return None
    return _png(fig)


def plot_waterfalls(report: Report, records: Mapping[str, Mapping[int, Sequence[RequestRecord]]]) -> str | None:
    """One typical request (median e2e, highest concurrency) per configuration as a waterfall."""
    import matplotlib.pyplot as plt
    from pathprobe.analysis.report.waterfall import bars, representative

    conc = max(report.concurrency)
    reps = [(n, representative(records.get(n, {}).get(conc, []))) for n in _names(report, conc)]
    picked = [(n, r) for n, r in reps if r is not None]
    if not picked:
        return None
    heights = [len({b.row for b in bars(r)}) for _, r in picked]
    fig, axes = plt.subplots(
        len(picked),
        1,
        figsize=(10, sum(0.45 * h + 0.9 for h in heights)),
        squeeze=False,
        gridspec_kw={"height_ratios": heights},
    )
    for ax, (name, rec) in zip(axes[:, 0], picked):
        _draw_waterfall(ax, name, rec)
    axes[-1][0].set_xlabel(
        "ms from the client's send (a component is drawn centred in its caller: only durations are measured)"
    )
    handles = [plt.Rectangle((0, 0), 1, 1, color=SEG_COLORS[s]) for s in ("serialization", "queueing", "inference")]
    handles.append(plt.Rectangle((0, 0), 1, 1, color=SEG_COLORS["unsplit"], hatch="xx"))
    axes[0][0].legend(
        handles, ["serialization", "queueing", "inference", "unsplit (reports nothing)"], fontsize=7, loc="lower right"
    )
    fig.tight_layout(h_pad=1.5)
    return _png(fig)


def _draw_waterfall(ax: Any, name: str, rec: Mapping[str, Any]) -> None:
    """One request's bars on one axis, titled with its e2e and which network is estimated."""
    from pathprobe.analysis.report.waterfall import bars

    bs = bars(rec)
    rows = list(dict.fromkeys(b.row for b in bs))
    for b in bs:
        y = rows.index(b.row)
        if b.part == "span":
            ax.barh(y, b.dur, left=b.start, color="#e8e8e8", edgecolor="#888888", height=0.7)
        elif b.part == "unsplit":
            ax.barh(
                y,
                b.dur,
                left=b.start,
                color=SEG_COLORS["unsplit"],
                hatch="xx",
                edgecolor="white",
                height=0.7,
                label="unsplit (reports nothing)",
            )
        else:
            ax.barh(y, b.dur, left=b.start, color=SEG_COLORS.get(b.part, "#999999"), height=0.45)
    ax.set_yticks(range(len(rows)), rows, fontsize=8)
    ax.invert_yaxis()
    flags = rec["split"].get("links_estimated") or ()
    est_links = [str(j + 1) for j, f in enumerate(flags) if f]
    est = (
        f" (network of link {', '.join(est_links)} estimated)"
        if est_links
        else " (network estimated)"
        if rec["split"].get("network_estimated")
        else ""
    )
    ax.set_title(f"{name}: one request of {rec['e2e_ms']:.2f} ms (median){est}", fontsize=9)
    ax.grid(axis="x", alpha=0.3)


def plot_streaming(report: Report, records: Mapping[str, Mapping[int, Sequence[RequestRecord]]]) -> str | None:
    import matplotlib.pyplot as plt
    import numpy as np

    conc = max(report.concurrency)
    data = {}
    for name in _names(report, conc):
        recs = records.get(name, {}).get(conc, [])
        ok = [r for r in recs if r.get("ok")]
        ttft, itl = metric_values(ok, "ttft"), metric_values(ok, "itl")
        if ttft or itl:
            data[name] = (ttft, itl)
    if not data:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name, (ttft, itl) in data.items():
        for ax, vals in zip(axes, (ttft, itl)):
            if vals:
                x = np.sort(np.asarray(vals, dtype=float))
                ax.step(x, np.arange(1, x.size + 1) / x.size, where="post", label=name, lw=1.4)
    axes[0].set_title(f"time to first token, concurrency {conc}")
    axes[1].set_title(f"inter-token latency, concurrency {conc}")
    for ax in axes:
        _plain_log_axis(ax)
        ax.set_xlabel("ms (log)")
        ax.set_ylabel("fraction")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    return _png(fig)


_LINK_COLORS = ("#4e79a7", "#a0cbe8")  # alternating, link by link
_HOP_COLORS = {"serialization": "#f28e2b", "own": "#9c755f", "server": "#59a14f", "unsplit": "#bab0ac"}


def _hop_pieces(path: HopPath) -> list[tuple[float, str, str | None]]:
    """A path's bar, left to right: (width ms, colour, label) for every link and hop."""
    pieces: list[tuple[float, str, str | None]] = []
    for j, link in enumerate(path.links):
        # an estimated link (a round trip measured apart, not the request's own) is labelled
        pieces.append((link.mean_ms or 0.0, _LINK_COLORS[j % 2], f"{j + 1} est." if link.estimated else f"{j + 1}"))
        if j < len(path.hops):
            h = path.hops[j]
            ser, own = h.serialization_mean_ms or 0.0, h.own_mean_ms or 0.0
            pieces.append((ser, _HOP_COLORS["serialization"], None))
            pieces.append((own, _HOP_COLORS["own"], None))
            if j == len(path.hops) - 1 and j == len(path.links) - 1:  # the server's own work
                pieces.append(((h.total_mean_ms or 0.0) - ser - own, _HOP_COLORS["server"], None))
        else:
            pieces.append((path.unsplit_mean_ms or 0.0, _HOP_COLORS["unsplit"], None))
    return pieces


def plot_hops(report: Report) -> str | None:
    """Each path laid out hop by hop (highest concurrency): every link's network, then each
    reporting hop's serialization and own time, the server's queue + inference last."""
    import matplotlib.pyplot as plt

    conc = max(report.concurrency)
    rows = [(n, g.path) for n, t in report.targets.items() if (g := t.at(conc)) is not None and g.path]
    if not rows:
        return None
    colors, link_colors = _HOP_COLORS, _LINK_COLORS
    fig, ax = plt.subplots(figsize=(11, 0.6 + 0.45 * len(rows) + 1))
    for y, (_name, path) in enumerate(rows):
        left = 0.0
        for width, color, text in _hop_pieces(path):
            width = max(0.0, width)
            ax.barh(y, width, left=left, color=color, edgecolor="white", linewidth=0.5)
            if text and width > 0:
                ax.text(left + width / 2, y, text, ha="center", va="center", fontsize=7, color="white")
            left += width
    ax.set_yticks(range(len(rows)), [n for n, _ in rows])
    ax.invert_yaxis()
    from matplotlib.patches import Patch

    ax.legend(
        handles=[
            Patch(color=link_colors[0], label="network, link by link (numbered from the client)"),
            Patch(color=colors["serialization"], label="a hop's serialization"),
            Patch(color=colors["own"], label="a hop's own time"),
            Patch(color=colors["server"], label="server: queue + inference"),
            Patch(color=colors["unsplit"], label="unsplit"),
        ],
        fontsize=7,
        loc="lower right",
    )
    ax.set_xlabel("ms per request (mean)")
    ax.set_title(f"hop by hop, concurrency {conc}")
    ax.grid(axis="x", alpha=0.3)
    return _png(fig)


def _sweep_point(g: Group | None, primary: str) -> tuple[float, float, float, float, float] | None:
    """(p50, p50 - lo, hi - p50, p99, req/s) of one group, None where it has none."""
    p = g.metric(primary) if g is not None and g.ok else None
    if g is None or p is None or p.p50 is None or p.p99 is None:
        return None
    est = p.p50
    value, lo, hi = est.value or math.nan, est.lo or math.nan, est.hi or math.nan
    return value, value - lo, hi - value, p.p99.value or math.nan, g.rps or math.nan


def plot_sweep(report: Report) -> str | None:
    import matplotlib.pyplot as plt

    concs, primary = report.concurrency, report.primary
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    drawn = False
    for name, t in report.targets.items():
        points = [(c, pt) for c in concs if (pt := _sweep_point(t.at(c), primary)) is not None]
        if not points:
            continue
        drawn = True
        xs = [c for c, _ in points]
        p50, lo, hi, p99, rps = (list(col) for col in zip(*(pt for _, pt in points)))
        line = axes[0].errorbar(xs, p50, yerr=[lo, hi], marker="o", capsize=3, label=f"{name} p50")
        axes[0].plot(xs, p99, ls="--", marker="x", color=line[0].get_color(), alpha=0.6)
        axes[1].plot(xs, rps, marker="o", label=name)
    if not drawn:
        plt.close(fig)
        return None
    axes[0].set_title(f"{primary} vs concurrency (solid p50 with 95% CI, dashed p99)")
    axes[0].set_ylabel("ms")
    axes[1].set_title("throughput vs concurrency")
    axes[1].set_ylabel("successful requests / s")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xticks(concs, [str(c) for c in concs])
        ax.set_xlabel("concurrency (users)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return _png(fig)


def plot_scorecard(report: Report) -> str | None:
    """The lead figure: what each configuration adds over the direct path of its client protocol,
    split by segment (mean paired differences, stacked; a segment that got cheaper goes left), with
    the added p50 and its 95 % interval as a bar across."""
    import matplotlib.pyplot as plt

    card = report.scorecard
    if card is None or not card.rows:
        return None
    rows = card.rows
    fig, ax = plt.subplots(figsize=(8.5, 0.8 + 0.5 * len(rows)))
    labels = [f"{r.target} (vs {r.against})" for r in rows]
    pos = [0.0] * len(rows)
    neg = [0.0] * len(rows)
    for seg in SEGMENTS:
        vals = [r.segments.get(seg) or 0.0 for r in rows]
        lefts = [p if v >= 0 else n for v, p, n in zip(vals, pos, neg)]
        ax.barh(labels, vals, left=lefts, color=SEG_COLORS[seg], label=seg, height=0.55)
        pos = [p + max(v, 0.0) for v, p in zip(vals, pos)]
        neg = [n + min(v, 0.0) for v, n in zip(vals, neg)]
    for i, r in enumerate(rows):
        est = r.added_p50
        if est is not None and est.value is not None and est.lo is not None and est.hi is not None:
            ax.errorbar(
                est.value,
                i,
                xerr=[[est.value - est.lo], [est.hi - est.value]],
                fmt="D",
                color="black",
                markersize=4,
                capsize=3,
                label="added p50 [95% CI]" if i == 0 else None,
            )
    ax.axvline(0, color="#555", linewidth=0.8)
    ax.invert_yaxis()
    ax.set_xlabel(f"ms added per request over the direct path (concurrency {card.concurrency})")
    ax.set_title("what each configuration adds, and where")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(loc="lower right", fontsize=7)
    return _png(fig)


def plot_frontier(fr: Frontier) -> str | None:
    """Added p99 over the direct path against the offered rate, one line per configuration (log-log),
    the bounds as horizontal lines; refused steps (client saturated) as crosses."""
    import matplotlib.pyplot as plt

    searches = {n: t.unary for n, t in fr.targets.items() if t.unary is not None and t.unary.points}
    if not searches:
        return None
    fig, ax = plt.subplots(figsize=(8.5, 4.5))
    for name, s in searches.items():
        pts = [(p.load, p.added_p99_ms) for p in s.points if p.added_p99_ms is not None]
        line = ax.plot([x for x, _ in pts], [max(y, 0.01) for _, y in pts], marker="o", markersize=3, label=name)
        color = line[0].get_color()
        for p in s.refused:
            ax.axvline(p.load, color=color, linestyle=":", linewidth=0.8)
    for b in fr.bounds_ms:
        ax.axhline(b, color="#888", linewidth=0.6, linestyle="--")
    ax.set_yscale("log")
    ax.set_ylabel("added p99 ms (floor 0.01)")
    ax.set_xlabel("offered requests/s (dotted: refused, load generator saturated)")
    _plain_log_axis(ax)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _png(fig)
