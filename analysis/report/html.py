"""The HTML report: one self-contained page that leads with the path-tax tables, then the plots
(:mod:`pathprobe.analysis.report.plots`) and the side-by-side tables."""

from __future__ import annotations

import html
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pathprobe.analysis.report.figures import SEG_COLS, path_tax_rows
from pathprobe.analysis.report.hops import format_path
from pathprobe.analysis.report.markdown import PATH_TAX_CAPTION, estimated_note, fmt_ms, seg_cell
from pathprobe.analysis.report.model import Report
from pathprobe.analysis.report.plots import (
    plot_cdfs,
    plot_hops,
    plot_segments,
    plot_streaming,
    plot_sweep,
    plot_waterfalls,
)
from pathprobe.segments import SEGMENTS

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:24px;color:#222;max-width:1400px}
h1{font-size:22px}h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:13px;margin:8px 0}td,th{border:1px solid #ccc;padding:3px 7px;text-align:right}
td:first-child,th:first-child{text-align:left}th{background:#f3f3f3}
.verdict{background:#fff6d6;padding:6px 10px;margin:4px 0}
.self-report{background:#eef4ff;padding:6px 10px;margin:4px 0}
.verdict.flagged{background:#f4f4f4;color:#555;border-left:4px solid #c00}
.client-warning{background:#fde2e1;border-left:4px solid #c00;padding:6px 10px;margin:4px 0}
.client-note{background:#eef3fb;border-left:4px solid #4e79a7;padding:6px 10px;margin:4px 0}
.failed{color:#b00}.skipped{color:#888}img.plot{max-width:100%;border:1px solid #eee;margin:8px 0}
code{background:#f4f4f4;padding:1px 3px}.meta{color:#555;font-size:13px}
"""


_JS = """
window.addEventListener('load', function () {
  var imgs = document.querySelectorAll('img.plot');
  var ok = 0;
  imgs.forEach(function (im) { if (im.complete && im.naturalWidth > 0) ok++; });
  document.body.setAttribute('data-plots-total', String(imgs.length));
  document.body.setAttribute('data-plots-loaded', String(ok));
});
"""


def _table(report: Mapping[str, Any], conc: int) -> str:
    primary = report["method"]["primary_metric"]
    head = [
        "config",
        "ok",
        "err",
        "req/s",
        f"{primary} p50",
        "95% CI",
        "p95",
        "p99",
        *SEGMENTS,
        "hop1",
        "hop2",
        "Δp50",
        "p (Holm)",
        "Cliff's δ",
        "Cohen's d",
    ]
    rows = ["<tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>"]
    for name, t in report["targets"].items():
        g = t.get("by_concurrency", {}).get(str(conc))
        if g is None:
            rows.append(
                f"<tr class='{t['status']}'><td>{html.escape(name)}</td>"
                f"<td colspan='{len(head) - 1}' style='text-align:left'>{t['status']}: "
                f"{html.escape(str(t.get('reason', '')))}</td></tr>"
            )
            continue
        p = g.get(primary, {})
        seg = g["segments"]
        c = g.get("comparison") or {}
        cells = [
            name
            + (" (base)" if name == report["baseline"] else "")
            + (" FAILED" if t["status"] == "failed" else "")
            + (" [client saturated]" if (g.get("client") or {}).get("saturated") else ""),
            str(g["ok"]),
            str(g["errors"]),
            fmt_ms(g["rps"], 1),
            fmt_ms(p.get("p50", {}).get("value")),
            f"{fmt_ms(p.get('p50', {}).get('lo'))} – {fmt_ms(p.get('p50', {}).get('hi'))}",
            fmt_ms(p.get("p95", {}).get("value")),
            fmt_ms(p.get("p99", {}).get("value")),
            *[seg_cell(g, s) for s in SEGMENTS],
            *[fmt_ms(seg[s].get("mean")) for s in ("network_hop1", "network_hop2")],
            f"{c['p50_diff_ms']:+.3f}" if c else "–",
            f"{c['p_adjusted']:.2g}" if c else "–",
            f"{c['cliffs_delta']:+.2f} ({c['magnitude']})" if c else "–",
            f"{c['cohens_d']:+.2f}" if c else "–",
        ]
        rows.append(f"<tr class='{t['status']}'>" + "".join(f"<td>{html.escape(x)}</td>" for x in cells) + "</tr>")
    return "<table>" + "".join(rows) + "</table>"


_PATH_TAX_HEAD = (
    "config",
    "path tax",
    "network hop 1",
    "network hop 2+",
    "serialization",
    "other",
    "engine",
    "Δ path tax vs base",
    "95% CI",
    "pairs",
    "verdict",
)


def _path_tax_table(report: Mapping[str, Any], conc: int) -> str:
    """The page's lead: each configuration's path tax (its cost beside the engine) at one concurrency,
    the same rows as the Markdown report's first table (``report.path_tax_rows``)."""
    rows = path_tax_rows(report, str(conc))
    if not rows:
        return ""
    out = ["<tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in _PATH_TAX_HEAD) + "</tr>"]
    for r in rows:
        d = r["diff"]
        cells = [
            r["config"] + (" (base)" if r["baseline"] else ""),
            fmt_ms(r["path_tax"]),
            fmt_ms(r["network_hop1"]),
            fmt_ms(r["network_hop2"]),
            fmt_ms(r["serialization"]),
            fmt_ms(r["other"]),
            fmt_ms(r["engine"]),
            f"{d['value']:+.3f}" if d else "–",
            f"{d['lo']:+.3f} – {d['hi']:+.3f}" if d else "–",
            "–" if r["pairs"] is None else str(r["pairs"]),
            r["verdict"] or "–",
        ]
        title = f" title='{html.escape(r['why'], quote=True)}'" if r["why"] else ""
        out.append(
            f"<tr data-config='{html.escape(r['config'], quote=True)}'{title}>"
            + "".join(f"<td>{html.escape(x)}</td>" for x in cells)
            + "</tr>"
        )
    return (
        f"<p>{html.escape(PATH_TAX_CAPTION)}, concurrency {conc}:</p>"
        f"<table class='path-tax' data-concurrency='{conc}'>" + "".join(out) + "</table>"
    )


def render(
    typed: Report,
    records: Mapping[str, Mapping[int, Sequence[Mapping[str, Any]]]],
    out_path: str | Path,
) -> Path:
    import matplotlib

    samples = typed.samples
    report: dict[str, Any] = dict(typed.to_dict())

    matplotlib.use("Agg")
    plots = [
        (
            "Where the time goes",
            "Mean milliseconds per request in each segment; the bar's length is the mean end-to-end time.",
            plot_segments(report),
        ),
        (
            "Hop by hop",
            "Each path from the client inwards: the network of every link (numbered), each reporting "
            "hop's serialization and own time, the server's queue and inference (means).",
            plot_hops(report),
        ),
        (
            "Latency distribution",
            "Empirical CDF of every measured request (rounds pooled).",
            plot_cdfs(report, samples),
        ),
        (
            "One request, hop by hop",
            "A typical request (median end-to-end, highest concurrency) of each "
            "configuration: client, each reporting hop, the server and its engine phases; a part inside a "
            "component that reports nothing is hatched (unsplit), with the phases its engine reported drawn "
            "inside it.",
            plot_waterfalls(report, records),
        ),
        (
            "Streaming: TTFT and inter-token latency",
            "Client-observed, highest concurrency.",
            plot_streaming(report, records),
        ),
        (
            "Concurrency sweep",
            "p50 with its 95% bootstrap interval, p99 dashed; throughput on the right.",
            plot_sweep(report),
        ),
    ]
    meta = report["meta"]
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>pathprobe compare</title>"
        f"<style>{_CSS}</style><script>{_JS}</script></head><body>"
    ]
    parts.append("<h1>pathprobe compare</h1>")
    parts.append(
        "<p class='meta'>"
        + html.escape(
            f"{meta.get('started', '')} · engine {meta.get('engine', '')} · {meta.get('host', '')} · "
            f"{meta.get('cpus', '')} CPUs · pathprobe {meta.get('versions', {}).get('pathprobe', '')}"
        )
        + "</p>"
    )
    if meta.get("placement"):
        from pathprobe.analysis.report.markdown import placement_line

        parts.append("<p class='meta'>" + html.escape(placement_line(meta["placement"])) + "</p>")
    parts.append(
        f"<p>baseline <b>{html.escape(report['baseline'])}</b>. {html.escape(report['method']['summary'])}</p>"
    )
    net = report.get("network")
    if net:
        parts.append(
            f"<p>Network condition on hop <b>{html.escape(net['hop'])}</b>: {html.escape(net['describe'])}; "
            f"expected +{net['expected_request_ms']:g} ms per request.</p>"
        )
    lead = [t for t in (_path_tax_table(report, c) for c in report["concurrency"]) if t]
    if lead:
        parts.append("<h2>Path tax: what each configuration costs beside the engine</h2>")
        parts += lead
    parts.append("<h2>Verdicts</h2>")
    if report["verdicts"]:
        for v in report["verdicts"]:
            if v.get("client_flag"):
                parts.append(
                    f"<div class='verdict flagged'><b>flagged: {html.escape(v['client_flag'])}</b> · "
                    f"{html.escape(v['text'])}</div>"
                )
            else:
                parts.append(f"<div class='verdict'>{html.escape(v['text'])}</div>")
    else:
        parts.append("<p>No configuration differs significantly from the baseline.</p>")
    for conc in report["concurrency"]:
        parts.append(f"<h2>Concurrency {conc}</h2>")
        parts.append(_table(report, conc))
        est_groups = [
            g
            for t in report["targets"].values()
            if (g := t.get("by_concurrency", {}).get(str(conc), {})).get("network_estimated")
        ]
        if est_groups:
            parts.append(f"<p class='estimated'>{html.escape(estimated_note(est_groups))}.</p>")
        for w in report.get("client_warnings") or []:
            if w["concurrency"] == conc:
                cls, label = ("client-warning", "WARNING") if w["kind"] == "saturated" else ("client-note", "note")
                parts.append(f"<div class='{cls}'><b>{label}:</b> {html.escape(w['text'])}</div>")
        paths = [
            (n, t["by_concurrency"][str(conc)]["path"])
            for n, t in report["targets"].items()
            if (t.get("by_concurrency", {}).get(str(conc)) or {}).get("path")
        ]
        if paths:
            parts.append(
                "<p>Hop by hop (means, ms: the network of each link, and each reporting hop's own "
                "time and serialization):</p><ul class='hops'>"
                + "".join(f"<li><b>{html.escape(n)}</b>: {html.escape(format_path(pth))}</li>" for n, pth in paths)
                + "</ul>"
            )
        for sr in report.get("self_reports") or []:
            if sr["concurrency"] == conc:
                parts.append(
                    f"<div class='self-report'><b>self-report</b> {html.escape(sr['target'])}: "
                    f"{html.escape(sr['text'])}</div>"
                )
        cpu = [
            (n, t["by_concurrency"][str(conc)]["path_cpu"])
            for n, t in report["targets"].items()
            if (t.get("by_concurrency", {}).get(str(conc)) or {}).get("path_cpu")
        ]
        if cpu:
            parts.append(
                "<p>CPU per request of each path's own processes (gateway / proxy, not the server): "
                + html.escape(", ".join(f"{n} {c['ms_per_request']:.3f} ms" for n, c in cpu))
                + "</p>"
            )
    for title, caption, png in plots:
        if png is None:
            continue
        parts.append(f"<h2>{html.escape(title)}</h2><p>{html.escape(caption)}</p>")
        parts.append(f"<img class='plot' alt='{html.escape(title)}' src='data:image/png;base64,{png}'>")
    parts.append("<h2>Slowest requests' traces</h2>")
    any_slow = False
    for name, t in report["targets"].items():
        slow = t.get("slowest") or []
        if not slow:
            continue
        any_slow = True
        parts.append(f"<h3>{html.escape(name)}</h3><ul>")
        for s in slow:
            link = s.get("file")
            label = f"{s['e2e_ms']:.3f} ms · c={s['concurrency']} round {s['round']} · trace {s.get('trace_id') or '–'}"
            if link:
                parts.append(f"<li><a href='{html.escape(link)}'>{html.escape(label)}</a></li>")
            else:
                parts.append(f"<li>{html.escape(label)}</li>")
        parts.append("</ul>")
    if any_slow:
        parts.append(
            "<p>Open a trace file in Jaeger's UI (Search → Upload / JSON File), or run "
            "<code>pathprobe analyze FILE</code>.</p>"
        )
    else:
        parts.append("<p>No traces were recorded (tracing off).</p>")
    problems = [(n, t) for n, t in report["targets"].items() if t["status"] in ("failed", "skipped")]
    if problems:
        parts.append("<h2>Failed and skipped</h2><ul>")
        parts.extend(
            f"<li class='{t['status']}'><b>{html.escape(n)}</b>: {t['status']}: "
            f"{html.escape(str(t.get('reason', '')))}</li>"
            for n, t in problems
        )
        parts.append("</ul>")
    cold = [(n, t["cold_start"]) for n, t in report["targets"].items() if t.get("cold_start")]
    if cold:
        parts.append(
            "<h2>Cold start</h2><p>First request after each path came up (not in the figures above), "
            "and the warm-up's median.</p><table><tr><th>config</th><th>first request ms</th>"
            "<th>warm-up p50 ms</th><th>warm-up requests</th></tr>"
        )
        for n, c in cold:
            parts.append(
                f"<tr><td>{html.escape(n)}</td><td>{fmt_ms(c['first_ms'])}</td>"
                f"<td>{fmt_ms(c.get('warmup_p50_ms'))}</td><td>{c.get('n', 0)}</td></tr>"
            )
        parts.append("</table>")
    parts.append("<h2>Method</h2><pre>" + html.escape(json.dumps(report["method"], indent=1)) + "</pre>")
    parts.append("</body></html>")
    out = Path(out_path)
    out.write_text("\n".join(parts), encoding="utf-8")
    return out


def _nan_to_none(x: Any) -> Any:
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return None
    if isinstance(x, dict):
        return {k: _nan_to_none(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_nan_to_none(v) for v in x]
    return x


def json_safe(report: Any) -> Any:
    """NaN/inf -> null so report.json is strict JSON."""
    return _nan_to_none(report)


__all__ = ["SEG_COLS", "json_safe", "render"]
