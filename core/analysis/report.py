"""Aggregate compare results into ``report.json`` figures and Markdown tables."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pathprobe import rtt
from pathprobe.analysis import stats
from pathprobe.segments import SEGMENTS

SEG_COLS = (*SEGMENTS, "network_hop1", "network_hop2")
CLIENT_SATURATED_FLAG = "client saturated — not a path difference"
CLIENT_ADVICE = (
    "network hop 1 includes the load generator's own waiting, not the path; spread the load "
    "over more Locust processes (load.extra_args: [--processes, N]) or workers and rerun"
)


def _r(v: Any, d: int = 1) -> str:
    return "–" if v is None else f"{v:.{d}f}"


def client_summary(by_round: Mapping[int, Mapping[str, Any] | None]) -> dict[str, Any] | None:
    """The load generator's health over one configuration's rounds at one concurrency.

    ``by_round``: each round's summary.json ``client`` block (None where the run had none).
    Saturated when any round was; figures are the worst round's.
    """
    rounds = {int(k): v for k, v in by_round.items() if v}
    if not rounds:
        return None

    def worst(path: tuple[str, str]) -> float | None:
        got = [(b.get(path[0]) or {}).get(path[1]) for b in rounds.values()]
        vals: list[float] = [v for v in got if v is not None]
        return max(vals) if vals else None

    per: dict[str, dict[str, Any]] = {}
    for k, b in sorted(rounds.items()):
        per[str(k)] = {
            "saturated": bool(b.get("saturated")),
            "contended": bool(b.get("contended")),
            "reason": b.get("reason"),
            "contended_reason": b.get("contended_reason"),
            "loop_lag_ms": {x: (b.get("loop_lag_ms") or {}).get(x) for x in ("p50", "p99", "max")},
            "loop_busy_lag_ms": {x: (b.get("loop_busy_lag_ms") or {}).get(x) for x in ("p50", "p99", "max")},
            "cpu_percent": {x: (b.get("cpu_percent") or {}).get(x) for x in ("mean", "max")},
            "processes": len(b.get("processes") or []) or 1,
        }
    sat = [int(k) for k, v in per.items() if v["saturated"]]
    con = [int(k) for k, v in per.items() if v["contended"]]
    return {
        "saturated": bool(sat),
        "saturated_rounds": [k + 1 for k in sat],
        "contended": bool(con) and not sat,
        "contended_rounds": [k + 1 for k in con],
        "reason": next((per[str(k)]["reason"] for k in sat), None),
        "loop_lag_ms": {"p99": worst(("loop_lag_ms", "p99")), "max": worst(("loop_lag_ms", "max"))},
        "loop_busy_lag_ms": {"p99": worst(("loop_busy_lag_ms", "p99"))},
        "cpu_percent": {"mean": worst(("cpu_percent", "mean")), "max": worst(("cpu_percent", "max"))},
        "processes": max(v["processes"] for v in per.values()),
        "rounds": per,
    }


def _client_at(report_targets: Mapping[str, Any], name: str, conc: int) -> dict[str, Any] | None:
    g = (report_targets.get(name) or {}).get("by_concurrency", {}).get(str(conc)) or {}
    return g.get("client")


def saturated_at(report_targets: Mapping[str, Any], conc: int) -> list[str]:
    """Configurations whose load generator was saturated in any round at this concurrency."""
    return [n for n in report_targets if (_client_at(report_targets, n, conc) or {}).get("saturated")]


def _describe_client(name: str, c: Mapping[str, Any], rounds_key: str) -> str:
    rounds = ", ".join(map(str, c.get(rounds_key) or []))
    return (
        f"{name} (round{'s' if len(c.get(rounds_key) or []) > 1 else ''} {rounds}: event-loop lag p99 "
        f"{_r(c['loop_lag_ms'].get('p99'))} ms, loop CPU {_r(c['cpu_percent'].get('mean'), 0)}% of one core, "
        f"{c.get('processes', 1)} load process{'es' if c.get('processes', 1) > 1 else ''})"
    )


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


def client_warnings(report_targets: Mapping[str, Any], concurrency: Sequence[int]) -> list[dict[str, Any]]:
    """One warning per concurrency where a load generator was saturated (or starved of CPU)."""
    out: list[dict[str, Any]] = []
    for conc in concurrency:
        sat = saturated_at(report_targets, conc)
        if sat:
            text = (
                f"client saturated at concurrency {conc} in "
                + ", ".join(
                    _describe_client(n, _client_at(report_targets, n, conc) or {}, "saturated_rounds") for n in sat
                )
                + f": {CLIENT_ADVICE}"
            )
            out.append({"concurrency": conc, "kind": "saturated", "targets": sat, "text": text})
        con = [n for n in report_targets if (_client_at(report_targets, n, conc) or {}).get("contended")]
        if con:
            text = (
                f"client contended at concurrency {conc} in "
                + ", ".join(
                    _describe_client(n, _client_at(report_targets, n, conc) or {}, "contended_rounds") for n in con
                )
                + ": the load generator's event loop waited for a CPU (other processes on the machine); "
                "network hop 1 includes that waiting"
            )
            out.append({"concurrency": conc, "kind": "contended", "targets": con, "text": text})
    return out


def _pcts(values: Sequence[float]) -> dict[str, float]:
    import numpy as np

    if not len(values):
        return {"n": 0}
    x = np.asarray(values, dtype=float)
    p50, p95, p99 = np.percentile(x, [50, 95, 99])
    return {
        "n": int(x.size),
        "mean": float(x.mean()),
        "p50": float(p50),
        "p95": float(p95),
        "p99": float(p99),
        "max": float(x.max()),
    }


def segment_table(by_route: Mapping[str, Sequence[Mapping[str, float]]]) -> str:
    """A Markdown table of p50/p95/p99 per segment per route (analyze's output)."""
    cols = ("e2e", *SEGMENTS, "network_hop1", "network_hop2")
    heads = [c.replace("network_", "") for c in cols]
    lines = ["| route | n | metric | " + " | ".join(heads) + " |", "|---|---:|---|" + "---:|" * len(cols)]
    for route, splits in sorted(by_route.items()):
        per = {c: _pcts([s[c] for s in splits]) for c in cols}
        for metric in ("mean", "p50", "p95", "p99"):
            cells = " | ".join(f"{per[c][metric]:.3f}" for c in cols)
            lines.append(
                f"| {route if metric == 'mean' else ''} | {len(splits) if metric == 'mean' else ''} | "
                f"{metric} | {cells} |"
            )
    return "\n".join(lines)


def metric_values(records: Sequence[Mapping[str, Any]], metric: str) -> list[float]:
    """Values of one metric from OK records: e2e/latency, a split key, ttft, itl (flattened), tpot."""
    out: list[float] = []
    for r in records:
        if metric == "e2e":
            out.append(float(r["e2e_ms"]))
        elif metric == "latency":
            out.append(float(r.get("latency_ms", r["e2e_ms"])))
        elif metric == "itl":
            out.extend(float(x) for x in r.get("itl_ms") or ())
        elif metric in ("ttft", "tpot"):
            v = r.get(f"{metric}_ms")
            if v is not None:
                out.append(float(v))
        elif metric == "schedule_lag":
            out.append(float(r.get("schedule_lag_ms") or 0.0))
        else:
            sp = r.get("split") or {}
            if metric in sp:
                out.append(float(sp[metric]))
    return out


def summarize_group(
    records: Sequence[Mapping[str, Any]],
    *,
    duration_s: float,
    primary: str = "e2e",
    n_boot: int = 1000,
    rounds: Mapping[int, Sequence[Mapping[str, Any]]] | None = None,
) -> dict[str, Any]:
    """Every figure for one configuration at one concurrency (records pooled over rounds)."""
    # requests still in flight when a run's clock ran out are "STOPPED": not the path's failure
    stopped = [r for r in records if r.get("status") == "STOPPED"]
    records = [r for r in records if r.get("status") != "STOPPED"]
    ok = [r for r in records if r.get("ok") and r.get("split")]
    errors: dict[str, int] = {}
    for r in records:
        if not r.get("ok"):
            key = str(r.get("status") or "ERROR")
            errors[key] = errors.get(key, 0) + 1
    first_error = next((r.get("error") for r in records if not r.get("ok") and r.get("error")), None)
    # an ok answer without the server's entries (a lost trailer/header): its server time would silently
    # count as network; counted here and named in the report
    no_srv = sum(1 for r in ok if not any(k.startswith("srv.") for k in (r.get("entries") or {})))
    out: dict[str, Any] = {
        "requests": len(records),
        "ok": len(ok),
        "errors": len(records) - len(ok),
        "errors_by_status": errors,
        "stopped": len(stopped),
        "first_error": first_error,
        "ok_without_server_timing": no_srv,
        "client_wait": _pcts([float(r.get("client_wait_ms") or 0.0) for r in ok]),
        "duration_s": duration_s,
        "rps": len(ok) / duration_s if duration_s > 0 else math.nan,
        primary: stats.summarize(metric_values(ok, primary), n_boot=n_boot),
        "segments": {c: _pcts(metric_values(ok, c)) for c in SEG_COLS},
        #: requests whose network includes an estimate (a transport round trip standing for the
        #: network of a link to a component that reports nothing; the rest of that link is unsplit)
        "network_estimated": sum(1 for r in ok if r["split"].get("network_estimated")),
        #: which estimator (pathprobe.rtt kinds, or a forwarder's <kind>.connect): requests per kind
        "network_estimate_kind": dict(
            sorted(
                Counter(
                    str(r.get("network_estimate_kind") or "unnamed") for r in ok if r["split"].get("network_estimated")
                ).items()
            )
        ),
    }
    if primary != "e2e":
        out["e2e"] = _pcts(metric_values(ok, "e2e"))
    from pathprobe.analysis.chunks import summarize as chunk_summary

    chunks = chunk_summary(ok)
    if chunks is not None:
        out["chunks"] = chunks
    for m in ("ttft", "itl", "tpot", "schedule_lag"):
        vals = metric_values(ok, m)
        if vals and any(vals):
            out[m] = _pcts(vals)
    if rounds:
        out["rounds"] = {
            str(k): _pcts(metric_values([r for r in v if r.get("ok") and r.get("split")], primary))
            for k, v in sorted(rounds.items())
        }
    return out


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
    if not pl.get("enabled"):
        return f"CPU placement: off ({pl.get('reason', '')})"
    cores = {k: ",".join(map(str, pl.get(k) or ())) for k in ("server", "proxies", "load")}
    return (
        f"CPU placement: engine/server on cores {cores['server']}, gateways/nginx/relays on {cores['proxies']}, "
        f"load generator on {cores['load']} ({pl.get('reason', '')})"
    )


def path_tax_rows(report: Mapping[str, Any], key: str) -> list[dict[str, Any]]:
    """The path-tax table of one concurrency as data (the Markdown and HTML reports both lead with it):
    per configuration its path tax and parts (p50 ms), the engine beside it, and the paired difference
    to the baseline with its 95% CI, pairs and verdict (None for the baseline)."""
    rows = []
    for name, t in report["targets"].items():
        g = (t.get("by_concurrency") or {}).get(key) or {}
        tx = g.get("path_tax") or {}
        if not tx.get("n"):
            continue
        pr = g.get("paired") or {}
        d = (pr.get("path_tax") or {}).get("median")
        rows.append(
            {
                "config": name,
                "baseline": name == report["baseline"],
                "path_tax": tx["path_tax"]["p50"],
                "network_hop1": tx["network_hop1"]["p50"],
                "network_hop2": tx["network_hop2"]["p50"],
                "serialization": tx["serialization"]["p50"],
                "other": tx["other"]["p50"],
                "engine": tx["engine"]["p50"],
                "diff": d,
                "pairs": pr.get("n"),
                "verdict": pr.get("verdict"),
                "why": pr.get("why") or "",
                "min_effect_ms": pr.get("min_effect_ms"),
            }
        )
    return rows


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


def markdown(report: Mapping[str, Any]) -> str:
    """The side-by-side tables printed on stdout."""
    from pathprobe.analysis.hops import format_path

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


def add_comparisons(
    report_targets: dict[str, Any],
    samples: Mapping[str, Mapping[int, Sequence[float]]],
    baseline: str,
    concurrency: Sequence[int],
    primary: str,
    alpha: float,
) -> list[dict[str, Any]]:
    """Welch's t-test + effect sizes vs the baseline per concurrency; returns verdicts."""
    verdicts: list[dict[str, Any]] = []
    for conc in concurrency:
        saturated = set(saturated_at(report_targets, conc))
        base = samples.get(baseline, {}).get(conc)
        if not base or len(base) < 2:
            continue
        names, comps = [], []
        for name, per in samples.items():
            if name == baseline or not per.get(conc) or len(per[conc]) < 2:
                continue
            names.append(name)
            comps.append(stats.compare(per[conc], base, metric=primary))
        stats.judge(comps, names, baseline, alpha=alpha)
        base_seg = report_targets[baseline]["by_concurrency"][str(conc)]["segments"]
        for name, comp in zip(names, comps):
            seg = report_targets[name]["by_concurrency"][str(conc)]["segments"]
            diffs = {
                k: seg[k].get("mean", 0.0) - base_seg[k].get("mean", 0.0)
                for k in SEGMENTS
                if "mean" in seg[k] and "mean" in base_seg[k]
            }
            comp.extra["segment_mean_diff_ms"] = diffs
            report_targets[name]["by_concurrency"][str(conc)]["comparison"] = comp.as_dict()
            if comp.verdict:
                top = sorted(diffs.items(), key=lambda kv: -abs(kv[1]))[:2]
                text = f"c={conc}: {comp.verdict}; by segment (mean): " + ", ".join(f"{k} {v:+.3f} ms" for k, v in top)
                sat = sorted({name, baseline} & saturated)
                flag = None
                if sat:
                    hop1 = seg["network_hop1"].get("mean", 0.0) - base_seg["network_hop1"].get("mean", 0.0)
                    net = diffs.get("network", 0.0)
                    from_hop1 = bool(top) and top[0][0] == "network" and abs(hop1) >= 0.5 * abs(net)
                    who = " and ".join(sat)
                    if from_hop1:
                        flag = CLIENT_SATURATED_FLAG
                        text += (
                            f" -- FLAGGED: the difference is on network hop 1 "
                            f"({hop1:+.3f} ms) and the load generator of {who} was saturated, so hop 1 "
                            f"holds its own waiting"
                        )
                    else:
                        flag = "client saturated"
                        text += (
                            f" -- FLAGGED: the load generator of {who} was saturated at this concurrency; "
                            f"its waiting is in network hop 1 and it changes the load the server sees"
                        )
                elif top and top[0][0] in ("inference", "queueing"):
                    text += (
                        " -- mostly the engine's own time: CPU contention (the proxy's CPU use on a "
                        "shared box, or other load), not the path's network or encoding"
                    )
                verdicts.append(
                    {
                        "concurrency": conc,
                        "target": name,
                        "text": text,
                        "segment_mean_diff_ms": diffs,
                        "client_flag": flag,
                        "client_saturated": sat,
                    }
                )
    return verdicts
