"""Aggregate compare results into ``report.json`` figures: per configuration and concurrency, the
segments, client health, the path-tax rows and the comparisons with the baseline (the Markdown
rendering of them is :mod:`pathprobe.analysis.report.markdown`, the HTML page :mod:`pathprobe.analysis.report.html`)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pathprobe.analysis.report import stats
from pathprobe.analysis.report.model import ClientHealth, ClientWarning, Estimate, Json, Report, TaxPart, Verdict
from pathprobe.segments import SEGMENTS

SEG_COLS = (*SEGMENTS, "network_hop1", "network_hop2")


CLIENT_SATURATED_FLAG = "client saturated — not a path difference"


CLIENT_ADVICE = (
    "network hop 1 includes the load generator's own waiting, not the path; spread the load "
    "over more Locust processes (load.extra_args: [--processes, N]) or workers and rerun"
)


def _r(v: float | None, d: int = 1) -> str:
    return "–" if v is None else f"{v:.{d}f}"


def _round_block(b: Mapping[str, Any]) -> Json:
    """One round's client block, as the report keeps it."""

    def pick(key: str, parts: tuple[str, ...]) -> Json:
        got = b.get(key) or {}
        return {x: got.get(x) for x in parts}

    return {
        "saturated": bool(b.get("saturated")),
        "contended": bool(b.get("contended")),
        "reason": b.get("reason"),
        "contended_reason": b.get("contended_reason"),
        "loop_lag_ms": pick("loop_lag_ms", ("p50", "p99", "max")),
        "loop_busy_lag_ms": pick("loop_busy_lag_ms", ("p50", "p99", "max")),
        "loop_wait_lag_ms": pick("loop_wait_lag_ms", ("p50", "p99", "max")),
        "cpu_percent": pick("cpu_percent", ("mean", "max")),
        "processes": len(b.get("processes") or []) or 1,
    }


def client_summary(by_round: Mapping[int, Mapping[str, Any] | None]) -> ClientHealth | None:
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

    sat = [k for k, b in sorted(rounds.items()) if b.get("saturated")]
    con = [k for k, b in sorted(rounds.items()) if b.get("contended")]
    return ClientHealth(
        saturated=bool(sat),
        saturated_rounds=[k + 1 for k in sat],
        contended=bool(con) and not sat,
        contended_rounds=[k + 1 for k in con],
        reason=next((rounds[k].get("reason") for k in sat), None),
        loop_lag_ms={"p99": worst(("loop_lag_ms", "p99")), "max": worst(("loop_lag_ms", "max"))},
        loop_busy_lag_ms={"p99": worst(("loop_busy_lag_ms", "p99"))},
        loop_wait_lag_ms={"p99": worst(("loop_wait_lag_ms", "p99"))},
        cpu_percent={"mean": worst(("cpu_percent", "mean")), "max": worst(("cpu_percent", "max"))},
        processes=max(len(b.get("processes") or []) or 1 for b in rounds.values()),
        rounds={str(k): _round_block(b) for k, b in sorted(rounds.items())},
    )


def _client_at(report_targets: Mapping[str, Any], name: str, conc: int) -> ClientHealth | None:
    g = (report_targets.get(name) or {}).get("by_concurrency", {}).get(str(conc)) or {}
    got = g.get("client")
    return got if isinstance(got, ClientHealth) else None


def saturated_at(report_targets: Mapping[str, Any], conc: int) -> list[str]:
    """Configurations whose load generator was saturated in any round at this concurrency."""
    return [n for n in report_targets if (c := _client_at(report_targets, n, conc)) is not None and c.saturated]


def _describe_client(name: str, c: ClientHealth | None, rounds_key: str) -> str:
    if c is None:
        return name
    listed = c.saturated_rounds if rounds_key == "saturated_rounds" else c.contended_rounds
    rounds = ", ".join(map(str, listed))
    return (
        f"{name} (round{'s' if len(listed) > 1 else ''} {rounds}: event-loop lag p99 "
        f"{_r(c.loop_lag_ms.get('p99'))} ms, loop CPU {_r(c.cpu_percent.get('mean'), 0)}% of one core, "
        f"{c.processes} load process{'es' if c.processes > 1 else ''})"
    )


def client_warnings(report_targets: Mapping[str, Any], concurrency: Sequence[int]) -> list[ClientWarning]:
    """One warning per concurrency where a load generator was saturated (or starved of CPU)."""
    out: list[ClientWarning] = []
    for conc in concurrency:
        sat = saturated_at(report_targets, conc)
        if sat:
            text = (
                f"client saturated at concurrency {conc} in "
                + ", ".join(_describe_client(n, _client_at(report_targets, n, conc), "saturated_rounds") for n in sat)
                + f": {CLIENT_ADVICE}"
            )
            out.append(ClientWarning(concurrency=conc, kind="saturated", targets=sat, text=text))
        con = [n for n in report_targets if (c := _client_at(report_targets, n, conc)) is not None and c.contended]
        if con:
            text = (
                f"client contended at concurrency {conc} in "
                + ", ".join(_describe_client(n, _client_at(report_targets, n, conc), "contended_rounds") for n in con)
                + ": the load generator's event loop waited for a CPU (other processes on the machine); "
                "network hop 1 includes that waiting"
            )
            out.append(ClientWarning(concurrency=conc, kind="contended", targets=con, text=text))
    return out


def percentiles(values: Sequence[float]) -> dict[str, float]:
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


def _counts(records: Sequence[Mapping[str, Any]], ok: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Requests, ok, errors (by status, and the first error's text), ok answers without server timing."""
    errors: dict[str, int] = {}
    for r in records:
        if not r.get("ok"):
            key = str(r.get("status") or "ERROR")
            errors[key] = errors.get(key, 0) + 1
    first_error = next((r.get("error") for r in records if not r.get("ok") and r.get("error")), None)
    # an ok answer without the server's entries (a lost trailer/header): its server time would silently
    # count as network; counted here and named in the report
    no_srv = sum(1 for r in ok if not any(k.startswith("srv.") for k in (r.get("entries") or {})))
    return {
        "requests": len(records),
        "ok": len(ok),
        "errors": len(records) - len(ok),
        "errors_by_status": errors,
        "first_error": first_error,
        "ok_without_server_timing": no_srv,
    }


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
    out: dict[str, Any] = {
        **_counts(records, ok),
        "stopped": len(stopped),
        "client_wait": percentiles([float(r.get("client_wait_ms") or 0.0) for r in ok]),
        "duration_s": duration_s,
        "rps": len(ok) / duration_s if duration_s > 0 else math.nan,
        primary: stats.summarize(metric_values(ok, primary), n_boot=n_boot),
        "segments": {c: percentiles(metric_values(ok, c)) for c in SEG_COLS},
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
        out["e2e"] = percentiles(metric_values(ok, "e2e"))
    from pathprobe.analysis.report.chunks import summarize as chunk_summary

    chunks = chunk_summary(ok)
    if chunks is not None:
        out["chunks"] = chunks
    for m in ("ttft", "itl", "tpot", "schedule_lag"):
        vals = metric_values(ok, m)
        if vals and any(vals):
            out[m] = percentiles(vals)
    if rounds:
        out["rounds"] = {
            str(k): percentiles(metric_values([r for r in v if r.get("ok") and r.get("split")], primary))
            for k, v in sorted(rounds.items())
        }
    return out


@dataclass(frozen=True, slots=True)
class PathTaxRow:
    """One configuration's row of the path-tax table (p50 ms), and its paired difference to the baseline."""

    config: str
    baseline: bool
    path_tax: float | None
    network_hop1: float | None
    network_hop2: float | None
    serialization: float | None
    other: float | None
    engine: float | None
    diff: Estimate | None
    against: str | None
    pairs: int | None
    verdict: str | None
    why: str


def path_tax_rows(report: Report, conc: int) -> list[PathTaxRow]:
    """The path-tax table of one concurrency as data (the pages lead with it): per configuration its
    path tax and parts (p50 ms), the engine beside it, and the paired difference to the baseline with
    its 95% CI, pairs and verdict (None for the baseline)."""
    rows = []
    for name, t in report.targets.items():
        g = t.at(conc)
        tx = g.path_tax if g is not None else None
        if g is None or tx is None or not tx.n:
            continue
        pr = g.paired

        def p50(part: TaxPart | None) -> float | None:
            return part.p50 if part is not None else None

        rows.append(
            PathTaxRow(
                config=name,
                baseline=name == report.baseline,
                path_tax=p50(tx.path_tax),
                network_hop1=p50(tx.network_hop1),
                network_hop2=p50(tx.network_hop2),
                serialization=p50(tx.serialization),
                other=p50(tx.other),
                engine=p50(tx.engine),
                diff=pr.path_tax.median if pr is not None and pr.path_tax is not None else None,
                against=(pr.against or report.baseline) if pr is not None else None,
                pairs=pr.n if pr is not None else None,
                verdict=pr.verdict if pr is not None else None,
                why=(pr.why if pr is not None else None) or "",
            )
        )
    return rows


def _verdict(
    conc: int,
    name: str,
    baseline: str,
    verdict: str,
    diffs: Mapping[str, float],
    hop1: float,
    saturated: set[str],
) -> Verdict:
    """A significant difference in words, with its top segments; flagged when a load generator involved
    was saturated (its waiting is in network hop 1)."""
    top = sorted(diffs.items(), key=lambda kv: -abs(kv[1]))[:2]
    text = f"c={conc}: {verdict}; by segment (mean): " + ", ".join(f"{k} {v:+.3f} ms" for k, v in top)
    sat = sorted({name, baseline} & saturated)
    flag = None
    if sat:
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
    return Verdict(
        concurrency=conc,
        target=name,
        text=text,
        segment_mean_diff_ms=dict(diffs),
        client_flag=flag,
        client_saturated=sat,
    )


def add_comparisons(
    report_targets: dict[str, Any],
    samples: Mapping[str, Mapping[int, Sequence[float]]],
    baseline: str,
    concurrency: Sequence[int],
    primary: str,
    alpha: float,
) -> list[Verdict]:
    """Welch's t-test + effect sizes vs the baseline per concurrency; returns verdicts."""
    verdicts: list[Verdict] = []
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
                hop1 = seg["network_hop1"].get("mean", 0.0) - base_seg["network_hop1"].get("mean", 0.0)
                verdicts.append(_verdict(conc, name, baseline, comp.verdict, diffs, hop1, saturated))
    return verdicts
