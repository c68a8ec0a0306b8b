"""The segment model: split one request's end-to-end time into five parts.

network + serialization + queueing + inference + other == e2e, exactly, for every
request. See docs/design.md (the segment model); this module is its only implementation,
used by the load generator and by trace analysis alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass

SEGMENTS = ("network", "serialization", "queueing", "inference", "other")
INFERENCE_PARTS = ("srv.tokenize", "srv.prefill", "srv.decode_steps", "srv.detokenize")


@dataclass(frozen=True, slots=True)
class Split:
    e2e: float
    network: float
    serialization: float
    queueing: float
    inference: float
    other: float
    network_hop1: float  # client <-> first hop (gateway, or server when direct)
    network_hop2: float  # gateway <-> server (0 when direct)

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def split(
    e2e_ms: float,
    entries: Mapping[str, float],
    client_encode_ms: float = 0.0,
    client_decode_ms: float = 0.0,
) -> Split:
    """Split ``e2e_ms`` using the hops' in-band entries (``srv.*``, ``gw.*``).

    Without ``gw.total`` the path is taken as direct (client -> server); a proxy that
    reports nothing (nginx) then counts as network, which is what it looks like
    from the client.
    """
    g = entries.get
    srv_total = g("srv.total", 0.0)
    srv_ser = g("srv.decode", 0.0) + g("srv.encode", 0.0)
    queue = g("srv.queue", 0.0)
    inference = sum(g(name, 0.0) for name in INFERENCE_PARTS)
    client_ser = client_encode_ms + client_decode_ms
    if "gw.total" in entries:
        gw_total = entries["gw.total"]
        gw_ser = g("gw.decode", 0.0) + g("gw.encode", 0.0)
        hop1 = e2e_ms - client_ser - gw_total
        hop2 = g("gw.upstream", 0.0) - srv_total
        gw_other = gw_total - g("gw.upstream", 0.0) - gw_ser
    else:
        gw_ser = 0.0
        hop1 = e2e_ms - client_ser - srv_total
        hop2 = 0.0
        gw_other = 0.0
    srv_other = srv_total - srv_ser - queue - inference
    return Split(
        e2e=e2e_ms,
        network=hop1 + hop2,
        serialization=client_ser + gw_ser + srv_ser,
        queueing=queue,
        inference=inference,
        other=gw_other + srv_other,
        network_hop1=hop1,
        network_hop2=hop2,
    )
