"""Per-call pairing and the path tax (call-by-call interleaved compare runs).

In an interleaved run (``pathprobe load --mix``) each user sends one call to every
configuration per *cycle*, in a shuffled order, so the calls of one cycle saw the same
moment of the machine. A configuration's call is paired with its *partner's* call of the
same cycle (same round, load process, user and cycle number); the differences of the
pairs cancel the drift and contention both saw.

The partner (:func:`partners`) is the direct path of the configuration's own client protocol
(an HTTP gateway against the server's HTTP front end, a gRPC one against its gRPC port): a
path's cost is what it adds to what its client would otherwise call. The first direct path
of a protocol (the reference itself) is paired with the baseline (what that protocol costs
against the other), and so is a configuration whose protocol has no direct path in the run.
A baseline named in the config (``baseline: NAME``) pairs every configuration with it.

**Path tax**: what a request spends outside the engine -- e2e minus queueing minus
inference, i.e. network + serialization + other (+ whatever the model cannot split).
It is the answer to "what does this path cost me": the engine's own noise (which
dominates e2e on a small CPU model) is not in it.

Verdicts on the path tax, one per configuration (``verdict`` in its paired result, with
``why`` when there is none): **costs more** / **costs less** when the direction is sure -- the
95% interval of the median paired difference (percentile bootstrap) excludes zero and the
Wilcoxon signed-rank test on the paired differences (scipy.stats.wilcoxon, Holm-adjusted
across the configurations of one concurrency) is below ``alpha`` -- *and* the median
difference is at least the **minimum effect** ``max(min_effect_ms, min_effect_rel x the
baseline's median path tax)`` (config keys; defaults :data:`MIN_EFFECT_MS` = 0.2 ms and
:data:`MIN_EFFECT_REL` = 5%). Otherwise **no clear difference**. Each round's paired median
is reported beside it.

Why this rule (docs/results/2026-12-01-verdict-repeat.md measured it against others on the
same back-to-back runs):

- a test alone calls any difference real once there are enough pairs, so a 0.05 ms
  difference (a few interpreter lines) would get a verdict in one run and not in the next.
  0.2 ms is the resolution the split itself promises per hop (the wire witness holds it to
  max(5%, 0.2 ms) per link): a smaller difference is below what the tool can
  attribute, and below what a model call's user would notice. 5% keeps the minimum in
  proportion where the path tax itself is large (a busy machine's, or a WAN's).
- the estimate, not the interval's far end, is held against the minimum, and rounds are not
  gates: on a shared machine the interval's width and a round's median move with the load from
  minute to minute, so "the whole interval beyond the minimum" or "every round beyond it" turn
  a real 1-3 ms difference into a verdict in a calmer run and none in a busier one. On six
  default runs (two sets of three back to back) those rules gave the same verdict in every run
  of a set for 16-19 of 28 (set, concurrency, configuration) cells, this one for 22.
- Holm keeps the chance of any false verdict among a concurrency's configurations at
  ``alpha``; without it each of the 7 comparisons would carry its own 5% chance of one. It
  cost no repeatability on those runs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from pathprobe.analysis.report import stats
from pathprobe.analysis.report.records import TaggedRecord
from pathprobe.records import SplitRecord

#: default minimum effect: a paired path-tax difference smaller than this many ms gets no verdict
MIN_EFFECT_MS = 0.2
#: ... nor one smaller than this share of the baseline's median path tax
MIN_EFFECT_REL = 0.05
MIN_ROUND_PAIRS = 5  # a round with fewer pairs gets no median of its own in ``rounds``
COSTS_MORE, COSTS_LESS, NO_CLEAR = "costs more", "costs less", "no clear difference"
#: paired metrics: path tax first, then its parts and e2e
PAIRED_METRICS = ("path_tax", "network", "network_hop1", "network_hop2", "serialization", "other", "unsplit", "e2e")


#: a record: typed (:class:`TaggedRecord`) or read-only
R = TypeVar("R", bound=Mapping[str, object])


def _split(rec: TaggedRecord) -> SplitRecord:
    sp = rec["split"]
    if sp is None:
        raise TypeError("a record without a split")
    return sp


def _number(v: object) -> float:
    if not isinstance(v, (int, float)):
        raise TypeError(f"not a number: {v!r}")
    return float(v)


def path_tax(rec: TaggedRecord) -> float:
    sp = _split(rec)
    return float(sp["e2e"]) - float(sp.get("queueing", 0.0)) - float(sp.get("inference", 0.0))


def _value(rec: TaggedRecord, metric: str) -> float:
    if metric == "path_tax":
        return path_tax(rec)
    if metric == "e2e":
        return float(rec["e2e_ms"])
    return _number(_split(rec).get(metric, 0.0))


def _key(rec: Mapping[str, object]) -> tuple[object, ...] | None:
    if rec.get("cycle") is None:
        return None
    return (rec.get("_round"), rec.get("_concurrency"), rec.get("worker"), rec.get("user"), rec["cycle"])


def pairs(records: Sequence[R], baseline: Sequence[R]) -> list[tuple[R, R]]:
    """(call, baseline call) of the same cycle, both ok with a split."""
    base = {_key(r): r for r in baseline if r.get("ok") and r.get("split") and _key(r) is not None}
    out: list[tuple[R, R]] = []
    for r in records:
        k = _key(r)
        if k is not None and r.get("ok") and r.get("split") and k in base:
            out.append((r, base[k]))
    return out


def partners(targets: Mapping[str, Mapping[str, object]], baseline: str, *, explicit: bool = False) -> dict[str, str]:
    """Each ok configuration (but the baseline) and the configuration its calls are paired with: the
    first direct target of its client protocol (``kind``/``protocol``/``status`` of report.json's
    targets), else the baseline; every one with the baseline when ``explicit``."""
    directs: dict[object, str] = {}
    for name, t in targets.items():
        if t.get("kind") == "direct" and t.get("status") == "ok" and t.get("protocol"):
            directs.setdefault(t.get("protocol"), name)
    out: dict[str, str] = {}
    for name, t in targets.items():
        if name == baseline or t.get("status") != "ok":
            continue
        own = directs.get(t.get("protocol"))
        out[name] = baseline if explicit or own is None or own == name else own
    return out


def is_interleaved(records: Sequence[Mapping[str, object]]) -> bool:
    return any(r.get("cycle") is not None for r in records)


def tax_summary(records: Sequence[TaggedRecord]) -> dict[str, Any]:
    """Median and mean path tax and its parts for one configuration (ok records)."""
    import numpy as np

    ok = [r for r in records if r.get("ok") and r.get("split")]
    if not ok:
        return {"n": 0}
    out: dict[str, Any] = {"n": len(ok)}
    for m in ("path_tax", "network", "network_hop1", "network_hop2", "serialization", "other", "unsplit"):
        x = np.asarray([_value(r, m) for r in ok], dtype=float)
        out[m] = {"p50": float(np.median(x)), "mean": float(x.mean())}
    engine = np.asarray([float(_split(r).get("queueing", 0.0)) + float(_split(r).get("inference", 0.0)) for r in ok])
    out["engine"] = {"p50": float(np.median(engine)), "mean": float(engine.mean())}
    return out


def paired(records: Sequence[TaggedRecord], baseline: Sequence[TaggedRecord], *, n_boot: int = 1000) -> dict[str, Any]:
    """Paired per-call differences (configuration - baseline) per metric: median with 95% CI, mean."""
    import numpy as np

    pr = pairs(records, baseline)
    out: dict[str, Any] = {"n": len(pr)}
    if len(pr) < 2:
        return out
    for m in PAIRED_METRICS:
        d = np.asarray([_value(a, m) - _value(b, m) for a, b in pr], dtype=float)
        est = stats.bootstrap_percentiles(d, (50.0,), n_boot=n_boot)[50.0]
        out[m] = {"median": est.as_dict(), "mean": float(d.mean())}
    from scipy.stats import wilcoxon

    d = np.asarray([path_tax(a) - path_tax(b) for a, b in pr], dtype=float)
    try:
        p = float(wilcoxon(d).pvalue) if np.any(d != 0) else 1.0
    except ValueError:
        p = math.nan
    out["wilcoxon_p"] = p
    out["baseline_path_tax_p50"] = float(np.median([path_tax(b) for _, b in pr]))
    by_round: dict[str, list[float]] = {}
    for a, b in pr:
        by_round.setdefault(str(a.get("_round", 0)), []).append(path_tax(a) - path_tax(b))
    out["rounds"] = {k: float(np.median(v)) for k, v in sorted(by_round.items()) if len(v) >= MIN_ROUND_PAIRS}
    return out


def min_effect(baseline_tax_ms: float, min_ms: float = MIN_EFFECT_MS, min_rel: float = MIN_EFFECT_REL) -> float:
    """The smallest paired path-tax difference (ms) that gets a verdict."""
    return max(min_ms, min_rel * abs(baseline_tax_ms))


def decide(median: Mapping[str, float], p_adjusted: float, alpha: float, floor: float) -> tuple[str, str]:
    """(verdict, why) for one paired median difference ``{value, lo, hi}`` (ms), its Holm-adjusted
    Wilcoxon p-value and the minimum effect ``floor`` (ms)."""
    if median["lo"] <= 0.0 <= median["hi"]:
        return NO_CLEAR, "the 95% interval includes 0"
    if math.isnan(p_adjusted) or p_adjusted >= alpha:
        return NO_CLEAR, f"Wilcoxon p (Holm) {p_adjusted:.2g} >= alpha {alpha:g}"
    if abs(median["value"]) < floor:
        return NO_CLEAR, f"|difference| {abs(median['value']):.3f} ms is below the minimum effect {floor:.3f} ms"
    return (COSTS_MORE if median["value"] > 0 else COSTS_LESS), ""


def judge(
    per_target: dict[str, dict[str, Any]],
    baseline: str,
    conc: int,
    alpha: float,
    *,
    min_ms: float = MIN_EFFECT_MS,
    min_rel: float = MIN_EFFECT_REL,
) -> list[dict[str, Any]]:
    """Holm-adjust the Wilcoxon p-values of ``per_target`` (name -> paired result, its partner in
    ``against``, else ``baseline``) and give each its ``verdict`` (and ``why`` when there is none), in
    place; returns the verdict lines."""
    names = [n for n, r in per_target.items() if "path_tax" in r]
    adjusted = stats.holm([per_target[n]["wilcoxon_p"] for n in names])
    verdicts = []
    for name, p_adj in zip(names, adjusted):
        r = per_target[name]
        r["p_adjusted"] = p_adj
        med = r["path_tax"]["median"]
        floor = min_effect(r["baseline_path_tax_p50"], min_ms, min_rel)
        r["min_effect_ms"] = floor
        r["verdict"], r["why"] = decide(med, p_adj, alpha, floor)
        r["significant"] = r["verdict"] != NO_CLEAR
        if not r["significant"]:
            continue
        parts = sorted(
            (
                (m, r[m]["median"]["value"])
                for m in ("network_hop1", "network_hop2", "serialization", "other", "unsplit")
            ),
            key=lambda kv: -abs(kv[1]),
        )
        text = (
            f"c={conc}: {name} {r['verdict']}: {med['value']:+.3f} ms of path tax per call vs "
            f"{r.get('against') or baseline} "
            f"(paired median [95% CI {med['lo']:+.3f}, {med['hi']:+.3f}], n={r['n']} pairs, Wilcoxon p="
            f"{p_adj:.2g} Holm, minimum effect {floor:.2f} ms); mostly "
            + ", ".join(f"{m} {v:+.3f} ms" for m, v in parts[:2])
        )
        verdicts.append(
            {
                "concurrency": conc,
                "target": name,
                "against": r.get("against") or baseline,
                "text": text,
                "kind": "path_tax",
                "verdict": r["verdict"],
                "path_tax_diff_ms": med["value"],
                "client_flag": None,
                "client_saturated": [],
            }
        )
    return verdicts
