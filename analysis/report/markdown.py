"""The compare report as Markdown (printed on stdout and written to report.md), and analyze's
segment table: rendering only; every figure comes from :mod:`pathprobe.analysis.report.figures`."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pathprobe import rtt
from pathprobe.analysis.report.figures import path_tax_rows, percentiles
from pathprobe.analysis.report.model import Report
from pathprobe.segments import SEGMENTS


def accounting_lines(targets: Mapping[str, Any], conc: int) -> list[str]:
    """One WARNING per configuration whose hops did not count what the client sent; else one line."""
    out, clean, n = [], [], 0
    for name, t in targets.items():
        acct = ((t.get("by_concurrency") or {}).get(str(conc)) or {}).get("accounting")
        if not acct:
            continue
        if acct.get("error"):
            out.append(f"- **WARNING**: accounting for {name}: {acct['error']}")
            continue
        n += sum((acct.get("client") or {}).values())
        bad = [d for d in acct.get("differences", []) if not d["explained"]]
        if bad or acct.get("lost"):
            text = "; ".join(d["why"] + f" ({d['status']})" for d in bad[:4])
            out.append(
                f"- **WARNING**: accounting for {name}: {acct.get('lost') or 0} request(s) lost, "
                f"{len(bad)} unexplained difference(s): {text}"
            )
        else:
            clean.append(name)
    if clean:
        out.append(
            f"- accounting: every request of {', '.join(clean)} counted at each hop by status "
            f"({n} requests; in-flight-at-stop differences explained)"
        )
    return out


def segment_table(by_route: Mapping[str, Sequence[Mapping[str, float]]]) -> str:
    """A Markdown table of p50/p95/p99 per segment per route (analyze's output)."""
    cols = ("e2e", *SEGMENTS, "network_hop1", "network_hop2")
    heads = [c.replace("network_", "") for c in cols]
    lines = ["| route | n | metric | " + " | ".join(heads) + " |", "|---|---:|---|" + "---:|" * len(cols)]
    for route, splits in sorted(by_route.items()):
        per = {c: percentiles([s[c] for s in splits]) for c in cols}
        for metric in ("mean", "p50", "p95", "p99"):
            cells = " | ".join(f"{per[c][metric]:.3f}" for c in cols)
            lines.append(
                f"| {route if metric == 'mean' else ''} | {len(splits) if metric == 'mean' else ''} | "
                f"{metric} | {cells} |"
            )
    return "\n".join(lines)


ESTIMATED = "est."


ESTIMATED_NOTE = (
    "network marked est.: the link to a component that reports nothing (a server we did not "
    "write) holds its network and its work; only a round trip measured apart (an HTTP null "
    "round trip on the load generator's connection, else a TCP handshake or HTTP/2 PING) is "
    "booked as network of that link, the rest of that link is unsplit"
)


def estimated_note(groups: Iterable[Mapping[str, Any]]) -> str:
    """:data:`ESTIMATED_NOTE` with the estimators these groups used, in words."""
    kinds = sorted({k for g in groups for k in (g.get("network_estimate_kind") or {})})
    if not kinds:
        return ESTIMATED_NOTE
    return ESTIMATED_NOTE + " (estimated here by " + "; ".join(f"{k}: {rtt.describe(k)}" for k in kinds) + ")"


def seg_cell(group: Mapping[str, Any], seg: str) -> str:
    """A segment's mean for a table cell; network is marked when any of it is an estimate."""
    text = fmt_ms(group["segments"][seg].get("mean"))
    if seg == "network" and group.get("network_estimated"):
        text += f" {ESTIMATED}"
    return text


def fmt_ms(v: Any, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    return f"{v:.{digits}f}"


def _ci(est: Mapping[str, float] | None) -> str:
    if not est:
        return "–"
    return f"{est['value']:.3f} [{est['lo']:.3f}, {est['hi']:.3f}]"


def _cell(text: Any) -> str:
    """Text safe inside a Markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def placement_line(pl: Mapping[str, Any]) -> str:
    """Where the processes ran (report.json ``meta.placement``)."""
    engine = "; engine in a process of its own" if pl.get("engine_process") else ""
    if not pl.get("enabled"):
        return f"CPU placement: off ({pl.get('reason', '')}){engine}"
    cores = {k: ",".join(map(str, pl.get(k) or ())) for k in ("server", "proxies", "load")}
    return (
        f"CPU placement: engine/server on cores {cores['server']}, gateways/nginx/relays on {cores['proxies']}, "
        f"load generator on {cores['load']} ({pl.get('reason', '')}){engine}"
    )


PATH_TAX_CAPTION = (
    "path tax per call (everything but the engine; p50 ms; calls interleaved one by one, paired with "
    "the baseline's call of the same cycle)"
)


def _path_tax_table(report: Mapping[str, Any], key: str) -> list[str]:
    """Interleaved runs lead with each configuration's path tax (its cost beside the engine), p50 ms."""
    rows = path_tax_rows(report, key)
    if not rows:
        return []
    out = [
        PATH_TAX_CAPTION + ":",
        "",
        "| config | path tax | network hop 1 | network hop 2+ | serial. | other | engine | "
        "Δ path tax vs base [95% CI] | pairs | verdict |",
        "|---|---:|---:|---:|---:|---:|---:|---|---:|---|",
    ]
    for r in rows:
        d = r["diff"]
        dtxt = f"{d['value']:+.3f} [{d['lo']:+.3f}, {d['hi']:+.3f}]" if d else "–"
        out.append(
            f"| {r['config']}{' (base)' if r['baseline'] else ''} | {fmt_ms(r['path_tax'])} | "
            f"{fmt_ms(r['network_hop1'])} | {fmt_ms(r['network_hop2'])} | "
            f"{fmt_ms(r['serialization'])} | {fmt_ms(r['other'])} | "
            f"{fmt_ms(r['engine'])} | {dtxt} | {r['pairs'] if r['pairs'] is not None else '–'} | "
            f"{r['verdict'] or '–'} |"
        )
    out.append("")
    return out


def markdown(typed: Report) -> str:
    """The side-by-side tables printed on stdout."""
    report: dict[str, Any] = dict(typed.to_dict())
    from pathprobe.analysis.report.hops import format_path

    primary = report["method"]["primary_metric"]
    lines: list[str] = []
    net = report.get("network")
    title = f"## pathprobe compare — {report['meta'].get('engine', '')}"
    lines.append(title)
    lines.append("")
    lines.append(f"baseline: **{report['baseline']}**; {report['method']['summary']}")
    pl = report["meta"].get("placement")
    if pl:
        lines.append(placement_line(pl))
    if net:
        lines.append(
            f"network condition on hop '{net['hop']}': {net['describe']} "
            f"(expected: +{net['expected_request_ms']:g} ms per request: one-way delay x 2 traversals)"
        )
    targets = report["targets"]
    for name, t in targets.items():
        tn = t.get("network")
        if tn and tn != net:
            lines.append(
                f"- {name}: network condition on hop '{tn['hop']}': {tn['describe']} "
                f"(expected +{tn['expected_request_ms']:g} ms per request)"
            )
    lines.append("")
    for conc in report["concurrency"]:
        key = str(conc)
        lines.append(f"### concurrency {conc}")
        lines.append("")
        lines += _path_tax_table(report, key)
        stream = bool(report["method"].get("stream"))
        extra_h = " TTFT p50 | ITL p50 |" if stream else ""
        lines.append(
            f"| config | ok | err | req/s | {primary} p50 [95% CI] ms | p95 | p99 | network | serial. | "
            f"queue | infer. | other | unsplit | Δp50 vs base | p (Welch, Holm) | Cliff's δ |{extra_h}"
        )
        lines.append(
            "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
            + ("---:|---:|" if stream else "")
        )
        for name, t in targets.items():
            if t["status"] in ("skipped", "failed") and key not in t.get("by_concurrency", {}):
                lines.append(f"| {name} | {t['status']}: {_cell(t.get('reason', ''))} |" + " |" * 14)
                continue
            g = t["by_concurrency"].get(key)
            if g is None:
                lines.append(f"| {name} | (no run at this concurrency) |" + " |" * 14)
                continue
            p = g.get(primary, {})
            cmp_ = g.get("comparison")
            name_cell = name + (" (base)" if name == report["baseline"] else "")
            if t["status"] == "failed":
                name_cell += " FAILED"
            if (g.get("client") or {}).get("saturated"):
                name_cell += " [client saturated]"
            lines.append(
                f"| {name_cell} | {g['ok']} | {g['errors']} | {fmt_ms(g['rps'], 1)} | "
                f"{_ci(p.get('p50'))} | {fmt_ms(p.get('p95', {}).get('value'))} | "
                f"{fmt_ms(p.get('p99', {}).get('value'))} | "
                + " | ".join(seg_cell(g, s) for s in SEGMENTS)
                + " | "
                + (
                    f"{cmp_['p50_diff_ms']:+.3f} | {cmp_['p_adjusted']:.2g} | {cmp_['cliffs_delta']:+.2f} |"
                    if cmp_
                    else "– | – | – |"
                )
                + (
                    f" {fmt_ms((g.get('ttft') or {}).get('p50'))} | {fmt_ms((g.get('itl') or {}).get('p50'))} |"
                    if stream
                    else ""
                )
            )
        lines.append("")
        for w in report.get("client_warnings") or []:
            if w["concurrency"] == conc:
                label = "WARNING" if w["kind"] == "saturated" else "note"
                lines.append(f"- **{label}**: {w['text']}")
        lines += accounting_lines(targets, conc)
        for name, t in targets.items():
            g = t.get("by_concurrency", {}).get(key) or {}
            if g.get("path"):
                lines.append(f"- hop by hop, {name}: {format_path(g['path'])}")
            ch = g.get("chunks") or {}
            if ch.get("buffering"):
                lines.append(
                    f"- **warning**: {name} buffers or coalesces streamed chunks: in "
                    f"{ch['buffered_streams']} of {ch['streams']} streams, chunks the server emitted apart "
                    f"arrived together (inter-token gaps measure the proxy, not the engine)"
                )
            if g.get("ok_without_server_timing"):
                lines.append(
                    f"- **warning**: {name}: {g['ok_without_server_timing']} of {g['ok']} ok answers carried "
                    f"no srv.* timing (no server-timing trailer/header): their server time is in network"
                )
        for sr in report.get("self_reports") or []:
            if sr["concurrency"] == conc:
                lines.append(f"- **self-report** {sr['target']}: {sr['text']}")
        cpu = [
            (n, t["by_concurrency"][key]["path_cpu"])
            for n, t in targets.items()
            if (t.get("by_concurrency", {}).get(key) or {}).get("path_cpu")
        ]
        if cpu:
            lines.append(
                "- CPU per request of each path's own processes (gateway / proxy, not the server): "
                + ", ".join(f"{n} {c['ms_per_request']:.3f} ms" for n, c in cpu)
            )
        verdicts = [v for v in report["verdicts"] if v["concurrency"] == conc]
        for v in verdicts:
            flagged = " (flagged: " + v["client_flag"] + ")" if v.get("client_flag") else ""
            lines.append(f"- **verdict**{flagged}: {v['text']}")
        unclear = [r for r in path_tax_rows(report, key) if r["verdict"] == "no clear difference"]
        if unclear:
            lines.append(
                "- no clear difference in path tax from the baseline: "
                + "; ".join(f"{r['config']} ({r['why']})" for r in unclear)
            )
        if not verdicts:
            lines.append("- no configuration differs significantly from the baseline at this concurrency")
        lines.append("")
    lines.append(
        "Segments are means per request in ms "
        "(network + serialization + queue + inference + other + unsplit = mean e2e)."
    )
    est_groups = [
        g for t in targets.values() for g in t.get("by_concurrency", {}).values() if g.get("network_estimated")
    ]
    if est_groups:
        lines.append(estimated_note(est_groups) + ".")
    cold = [(n, t["cold_start"]) for n, t in targets.items() if t.get("cold_start")]
    if cold:
        lines.append("")
        lines.append(
            "cold start (first request after start, excluded from the figures above): "
            + ", ".join(f"{n} {c['first_ms']:.1f} ms" for n, c in cold)
        )
    checks = [(n, t["trace_agreement"]["attributes"]) for n, t in targets.items() if t.get("trace_agreement")]
    if checks:
        lines.append("")
        parts = []
        for n, a in checks:
            bad = {k: v for k, v in a["outside"].items() if v}
            parts.append(
                f"{n} {a['matched']} traces "
                + ("agree" if not bad else "differ on " + ", ".join(f"{k} ({v})" for k, v in bad.items()))
            )
        lines.append(
            "trace check (`pathprobe analyze` on this run's spans vs the in-band split, "
            "max(5%, 0.2 ms)): " + "; ".join(parts)
        )
    if report.get("server_startup_ms"):
        lines.append(
            "server startup (ms): " + ", ".join(f"{k} {v:.0f}" for k, v in report["server_startup_ms"].items())
        )
    comp = [
        (n, t["trace_completeness"]) for n, t in targets.items() if (t.get("trace_completeness") or {}).get("requests")
    ]
    if comp:
        lines.append("")
        lines.append(
            "trace completeness (ok requests whose trace has every expected span): "
            + "; ".join(
                f"{n} {c['share']:.1%}"
                + (" (missing: " + ", ".join(f"{k} {v}" for k, v in c["missing"].items()) + ")" if c["missing"] else "")
                for n, c in comp
            )
        )
    problems = [(n, t) for n, t in targets.items() if t["status"] in ("failed", "skipped")]
    for n, t in problems:
        lines.append(f"- {n}: {t['status']}: {_cell(t.get('reason', ''))}")
    if report.get("files"):
        lines.append("")
        lines.append("reports: " + ", ".join(f"{k}: {v}" for k, v in report["files"].items()))
    return "\n".join(lines)
