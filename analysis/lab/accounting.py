"""Accounting: every request the load generator sent, counted again by the server and the gateway.

``compare`` scrapes each process's Prometheus ``/metrics`` right before and right after each
run; the differences of the request counters, by status, are set against the load
generator's records. Statuses are compared in one vocabulary, the gRPC code names (HTTP
statuses map as :data:`pathprobe.errors.HTTP_TO_GRPC`, 200 is ``OK``).

A request the load generator stopped in flight at the end of a run (``STOPPED``) may still
have got an answer at a hop (any status: it finished, was refused, was cancelled there), been
cancelled before it reached the next hop, or never have left the client: those are the only
differences that explain themselves, at most as many as were stopped. Anything else is listed
as unexplained, with the counts.
"""

from __future__ import annotations

import time
import urllib.request
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Literal, TypedDict

from pathprobe.errors import http_to_grpc

#: request counter of each kind of process
COUNTERS = {"server": "pathprobe_server_requests_total", "gateway": "pathprobe_gateway_requests_total"}
#: statuses a gateway answers by itself (the request never reaches the server)
#: one difference between two places' counts of a status: its ``hop`` and ``status``, each place's
#: count under the place's name, ``explained`` and ``why``
Difference = dict[str, str | int | bool | None]
Place = Literal["client", "gateway", "server"]
PLACES: tuple[Place, ...] = ("client", "gateway", "server")


class Accounting(TypedDict, total=False):
    """A run's (or several runs', :func:`merge`) requests counted by status at each place, and every
    difference between them (accounting.json)."""

    client: dict[str, int]
    gateway: dict[str, int]
    server: dict[str, int]
    stopped_in_flight: int
    lost: int | None
    differences: list[Difference]
    unexplained: int
    #: an interleaved run's server block (every configuration's calls); True once merged
    server_interleaved: Accounting | bool
    #: merged: how many runs
    runs: int
    #: why there is no accounting (a /metrics endpoint did not answer)
    error: str


GATEWAY_OWN = ("UNAUTHENTICATED", "RESOURCE_EXHAUSTED", "UNAVAILABLE", "INVALID_ARGUMENT", "UNIMPLEMENTED")


def canonical(status: str) -> str:
    s = (status or "").strip()
    if s.isdigit():
        return "OK" if s == "200" else http_to_grpc(int(s)).name
    return s.upper() or "UNKNOWN"


def scrape(url: str, kind: str, timeout: float = 5.0) -> Counter[str] | None:
    """The request counter at ``url`` (a /metrics endpoint) by canonical status; None if unreachable."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            text = resp.read().decode()
    except OSError:
        return None
    name = COUNTERS[kind]
    out: Counter[str] = Counter()
    for fam in text_string_to_metric_families(text):
        for sample in fam.samples:
            if sample.name == name:
                out[canonical(sample.labels.get("code", ""))] += int(sample.value)
    return out


def settle(url: str, gauges: Iterable[str], timeout: float = 3.0) -> None:
    """Wait (bounded) until the gauges at ``url`` read 0: requests stopped in flight have ended there."""
    from prometheus_client.parser import text_string_to_metric_families

    names = set(gauges)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                text = resp.read().decode()
        except OSError:
            return
        busy = sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples if s.name in names)
        if busy <= 0:
            return
        time.sleep(0.05)


def client_counts(records: Iterable[Mapping[str, object]]) -> Counter[str]:
    return Counter(canonical(str(r.get("status") or "")) for r in records)


def compare_hop(
    expected: Counter[str], got: Counter[str], stopped: int, hop: str, upstream_of: str, own: tuple[str, ...] = ()
) -> list[Difference]:
    """Differences between what ``upstream_of`` counted (``expected``) and what ``hop`` counted.

    ``stopped``: requests stopped in flight before ``hop``; ``own``: statuses the previous hop
    answers itself (fewer of those at ``hop`` is explained).
    """
    diffs: list[Difference] = []
    slack = stopped
    for status in sorted(set(expected) | set(got)):
        if status == "STOPPED":
            continue
        e, g = expected.get(status, 0), got.get(status, 0)
        if e == g:
            continue
        why = None
        if 0 < g - e <= slack:  # a call the client stopped waiting for still got an answer at the hop
            slack -= g - e
            why = f"{g - e} request(s) stopped in flight at the client ended as {status} at the {hop}"
        elif status == "CANCELLED" and 0 < e - g <= stopped:
            why = f"{e - g} request(s) stopped in flight were cancelled before they reached the {hop}"
        elif status in own and g < e:
            why = f"{e - g} answered by the {upstream_of} itself"
        diffs.append(
            {
                "hop": hop,
                "status": status,
                upstream_of: e,
                hop: g,
                "explained": why is not None,
                "why": why or f"{upstream_of} counted {e}, {hop} counted {g}",
            }
        )
    return diffs


def reconcile(
    records: Sequence[Mapping[str, object]], server: Counter[str] | None, gateway: Counter[str] | None = None
) -> Accounting:
    """One run's accounting: counts by status at each place, and every difference."""
    client = client_counts(records)
    stopped = client.get("STOPPED", 0)
    out: Accounting = {"client": dict(client), "stopped_in_flight": stopped}
    diffs: list[Difference] = []
    sent = sum(v for k, v in client.items() if k != "STOPPED")
    if gateway is not None:
        out["gateway"] = dict(gateway)
        diffs += compare_hop(client, gateway, stopped, "gateway", "client")
    if server is not None:
        out["server"] = dict(server)
        if gateway is not None:
            diffs += compare_hop(gateway, server, stopped, "server", "gateway", GATEWAY_OWN)
        else:
            diffs += compare_hop(client, server, stopped, "server", "client")
    first = gateway if gateway is not None else server
    out["lost"] = max(0, sent - sum(first.values())) if first is not None else None
    out["differences"] = diffs
    out["unexplained"] = sum(1 for d in diffs if not d["explained"])
    return out


def merge(runs: Iterable[Accounting | None]) -> Accounting | None:
    """Sum the accounting of several runs (rounds of one concurrency)."""
    blocks: list[Accounting] = [b for b in runs if b]
    if not blocks:
        return None
    out: Accounting = {"runs": len(blocks), "stopped_in_flight": 0, "lost": 0, "unexplained": 0, "differences": []}
    for b in blocks:
        for place in PLACES:
            counts = b.get(place)
            interleaved = b.get("server_interleaved")
            if counts is None and place == "server" and interleaved:
                # every interleaved configuration's calls (a block of one run: merged ones say True)
                counts = interleaved.get("server") if isinstance(interleaved, dict) else None
                out["server_interleaved"] = True
            if counts is not None:
                c = Counter(out.get(place, {}))
                c.update(counts)
                out[place] = dict(c)
        out["stopped_in_flight"] += b.get("stopped_in_flight", 0)
        out["lost"] = (out.get("lost") or 0) + (b.get("lost") or 0)
        out["unexplained"] += b.get("unexplained", 0)
        out["differences"] += b.get("differences", [])
    return out
