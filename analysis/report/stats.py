"""Statistics for side-by-side comparisons: percentiles with bootstrap confidence
intervals, Welch's t-test, effect sizes (Cohen's d, Cliff's delta) and verdicts.

Everything here works on plain sequences of milliseconds; numpy and scipy are
imported lazily so the CLI stays fast to start.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

PERCENTILES = (50.0, 95.0, 99.0)
#: Cliff's delta magnitude thresholds (Romano et al. 2006).
CLIFF_THRESHOLDS = ((0.147, "negligible"), (0.33, "small"), (0.474, "medium"))


@dataclass(slots=True)
class Estimate:
    """A point estimate with a (lo, hi) confidence interval."""

    value: float
    lo: float
    hi: float

    def as_dict(self) -> dict[str, float]:
        return {"value": self.value, "lo": self.lo, "hi": self.hi}


def percentile(values: Sequence[float], q: float) -> float:
    import numpy as np

    if len(values) == 0:
        return math.nan
    return float(np.percentile(np.asarray(values, dtype=float), q))


def bootstrap_percentiles(
    values: Sequence[float] | npt.NDArray[np.float64],
    qs: Sequence[float] = PERCENTILES,
    *,
    n_boot: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
) -> dict[float, Estimate]:
    """Percentile-bootstrap confidence intervals for several percentiles at once.

    Deterministic for a given ``seed``. With fewer than 2 values the interval is
    the point itself (nothing to resample).
    """
    import numpy as np

    x = np.asarray(values, dtype=float)
    out: dict[float, Estimate] = {}
    if x.size == 0:
        return {q: Estimate(math.nan, math.nan, math.nan) for q in qs}
    points = np.percentile(x, qs)
    if x.size < 2:
        return {q: Estimate(float(p), float(p), float(p)) for q, p in zip(qs, points)}
    rng = np.random.default_rng(seed)
    # resample in chunks so memory stays bounded for large runs
    chunk = max(1, min(n_boot, 4_000_000 // max(1, x.size)))
    stats = []
    done = 0
    while done < n_boot:
        k = min(chunk, n_boot - done)
        idx = rng.integers(0, x.size, size=(k, x.size))
        stats.append(np.percentile(x[idx], qs, axis=1).T)
        done += k
    boot = np.concatenate(stats, axis=0)  # (n_boot, len(qs))
    alpha = (1.0 - confidence) / 2.0
    lo = np.quantile(boot, alpha, axis=0)
    hi = np.quantile(boot, 1.0 - alpha, axis=0)
    for i, q in enumerate(qs):
        out[q] = Estimate(float(points[i]), float(lo[i]), float(hi[i]))
    return out


def cohens_d(a: Sequence[float], b: Sequence[float]) -> float:
    """(mean(a) - mean(b)) / pooled standard deviation."""
    import numpy as np

    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.size < 2 or y.size < 2:
        return math.nan
    vx, vy = x.var(ddof=1), y.var(ddof=1)
    pooled = math.sqrt(((x.size - 1) * vx + (y.size - 1) * vy) / (x.size + y.size - 2))
    if pooled == 0:
        return 0.0 if x.mean() == y.mean() else math.copysign(math.inf, x.mean() - y.mean())
    return float((x.mean() - y.mean()) / pooled)


def cliffs_delta(a: Sequence[float], b: Sequence[float]) -> float:
    """P(a > b) - P(a < b), computed exactly in O(n log n) with sorting."""
    import numpy as np

    x = np.asarray(a, dtype=float)
    y = np.sort(np.asarray(b, dtype=float))
    if x.size == 0 or y.size == 0:
        return math.nan
    less = np.searchsorted(y, x, side="left")  # number of y strictly below each x
    greater = y.size - np.searchsorted(y, x, side="right")  # number of y strictly above
    return float((less.sum() - greater.sum()) / (x.size * y.size))


def cliffs_magnitude(delta: float) -> str:
    if math.isnan(delta):
        return "n/a"
    d = abs(delta)
    for limit, name in CLIFF_THRESHOLDS:
        if d < limit:
            return name
    return "large"


@dataclass(slots=True)
class Comparison:
    """One configuration against the baseline on one metric."""

    metric: str
    n: int
    n_baseline: int
    mean_diff_ms: float
    p50_diff_ms: float
    p50_ratio: float
    t: float
    p_value: float
    p_adjusted: float
    cohens_d: float
    cliffs_delta: float
    magnitude: str
    significant: bool
    verdict: str | None = None
    extra: dict[str, object] = field(default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def welch(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """Welch's t-test (scipy.stats.ttest_ind, equal_var=False): (t, two-sided p)."""
    from scipy import stats as sps

    if len(a) < 2 or len(b) < 2:
        return math.nan, math.nan
    res = sps.ttest_ind(a, b, equal_var=False)
    t, p = float(res.statistic), float(res.pvalue)
    if math.isnan(p):  # both constant: identical -> no evidence, different -> certain
        import numpy as np

        same = float(np.mean(a)) == float(np.mean(b))
        return (0.0, 1.0) if same else (math.copysign(math.inf, float(np.mean(a)) - float(np.mean(b))), 0.0)
    return t, p


def compare(
    values: Sequence[float],
    baseline: Sequence[float],
    *,
    metric: str = "e2e",
) -> Comparison:
    """Compare a configuration's samples with the baseline's (no verdict yet)."""
    import numpy as np

    t, p = welch(values, baseline)
    d = cohens_d(values, baseline)
    cd = cliffs_delta(values, baseline)
    p50 = percentile(values, 50)
    b50 = percentile(baseline, 50)
    return Comparison(
        metric=metric,
        n=len(values),
        n_baseline=len(baseline),
        mean_diff_ms=float(np.mean(values) - np.mean(baseline)) if len(values) and len(baseline) else math.nan,
        p50_diff_ms=p50 - b50,
        p50_ratio=(p50 / b50) if b50 else math.nan,
        t=t,
        p_value=p,
        p_adjusted=p,
        cohens_d=d,
        cliffs_delta=cd,
        magnitude=cliffs_magnitude(cd),
        significant=False,
    )


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values (NaN stays NaN and is not counted)."""
    idx = [i for i, p in enumerate(p_values) if not math.isnan(p)]
    m = len(idx)
    order = sorted(idx, key=lambda i: p_values[i])
    adjusted = [math.nan] * len(p_values)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def judge(
    comparisons: Sequence[Comparison],
    names: Sequence[str],
    baseline_name: str,
    *,
    alpha: float = 0.05,
    min_effect: float = 0.147,
) -> None:
    """Adjust p-values (Holm) across ``comparisons`` and write verdicts in place.

    A verdict is written only where the adjusted p is below ``alpha`` AND Cliff's
    delta is at least ``min_effect`` (not negligible): with thousands of requests a
    t-test finds microsecond differences nobody should act on.
    """
    adjusted = holm([c.p_value for c in comparisons])
    for comp, name, p_adj in zip(comparisons, names, adjusted):
        comp.p_adjusted = p_adj
        comp.significant = (
            not math.isnan(p_adj)
            and p_adj < alpha
            and not math.isnan(comp.cliffs_delta)
            and abs(comp.cliffs_delta) >= min_effect
        )
        if comp.significant:
            slower = comp.cliffs_delta > 0
            ratio = f"{comp.p50_ratio:.2f}x" if not math.isnan(comp.p50_ratio) else "n/a"
            comp.verdict = (
                f"{name} is {'slower' if slower else 'faster'} than {baseline_name} on {comp.metric}: "
                f"p50 {comp.p50_diff_ms:+.3f} ms ({ratio}), mean {comp.mean_diff_ms:+.3f} ms; "
                f"Welch p={comp.p_adjusted:.2g} (Holm), Cliff's delta={comp.cliffs_delta:+.2f} "
                f"({comp.magnitude}), Cohen's d={comp.cohens_d:+.2f}"
            )
        else:
            comp.verdict = None


def summarize(values: Sequence[float], *, n_boot: int = 1000, seed: int = 0) -> dict[str, object]:
    """n, mean, min, max and p50/p95/p99 with 95% bootstrap intervals."""
    import numpy as np

    x = np.asarray(values, dtype=float)
    if x.size == 0:
        return {"n": 0}
    ests = bootstrap_percentiles(x, PERCENTILES, n_boot=n_boot, seed=seed)
    return {
        "n": int(x.size),
        "mean": float(x.mean()),
        "std": float(x.std(ddof=1)) if x.size > 1 else 0.0,
        "min": float(x.min()),
        "max": float(x.max()),
        **{f"p{int(q)}": ests[q].as_dict() for q in PERCENTILES},
    }
