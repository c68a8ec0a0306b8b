"""Accounting: the load generator's counts by status set against the server's and gateway's."""

from __future__ import annotations

from collections import Counter

from pathprobe.analysis.lab.accounting import canonical, merge, reconcile


def recs(**by_status: int) -> list[dict]:
    return [{"status": s.replace("_", "") if s.startswith("_") else s} for s, n in by_status.items() for _ in range(n)]


def test_canonical_statuses() -> None:
    assert [canonical(s) for s in ("200", "OK", "429", "504", "401", "UNAVAILABLE", "")] == [
        "OK",
        "OK",
        "RESOURCE_EXHAUSTED",
        "DEADLINE_EXCEEDED",
        "UNAUTHENTICATED",
        "UNAVAILABLE",
        "UNKNOWN",
    ]


def test_everything_counted_is_clean() -> None:
    a = reconcile(recs(OK=10, _429=3), Counter(OK=10, RESOURCE_EXHAUSTED=3))
    assert a["lost"] == 0 and a["unexplained"] == 0 and a["differences"] == []


def test_stopped_in_flight_explains_at_most_as_many_differences() -> None:
    a = reconcile(recs(OK=10, STOPPED=2), Counter(OK=11, CANCELLED=1))
    assert a["unexplained"] == 0 and len(a["differences"]) == 2 and all(d["explained"] for d in a["differences"])
    a = reconcile(recs(OK=10, STOPPED=1), Counter(OK=12))  # one more than can be explained
    assert a["unexplained"] == 1


def test_lost_and_mismatched_requests_are_reported() -> None:
    a = reconcile(recs(OK=10, UNAVAILABLE=2), Counter(OK=10))
    assert a["lost"] == 2 and a["unexplained"] == 1
    d = a["differences"][0]
    assert d["status"] == "UNAVAILABLE" and d["client"] == 2 and d["server"] == 0 and not d["explained"]


def test_gateway_refusals_never_reach_the_server() -> None:
    a = reconcile(
        recs(OK=5, _429=3, UNAUTHENTICATED=1), Counter(OK=5), Counter(OK=5, RESOURCE_EXHAUSTED=3, UNAUTHENTICATED=1)
    )
    assert a["unexplained"] == 0 and a["lost"] == 0
    # but a server that counts fewer OK than the gateway relayed is a difference
    a = reconcile(recs(OK=5), Counter(OK=4), Counter(OK=5))
    assert a["unexplained"] == 1
    m = merge([a, reconcile(recs(OK=1), Counter(OK=1))])
    assert m["runs"] == 2 and m["client"] == {"OK": 6} and m["unexplained"] == 1


def test_cancelled_before_the_next_hop_is_explained_by_stopped() -> None:
    a = reconcile(recs(OK=5, STOPPED=3), Counter(OK=6, CANCELLED=1), Counter(OK=6, CANCELLED=2))
    assert a["unexplained"] == 0, a["differences"]
