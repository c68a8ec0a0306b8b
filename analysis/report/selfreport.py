"""What a gateway says about itself, beside what was measured — never instead of it.

Some gateways report their own overhead (LiteLLM's ``x-litellm-overhead-duration-ms``, kept
in the records as ``litellm.overhead``; see :mod:`pathprobe.reporters`). compare shows it
next to two measurements:

- **its hop's own time** from the timing it reports (``<hop>.total - <hop>.upstream``): what
  the split books as that hop's own time;
- **measured tax**: the mean of ``e2e - client (de)serialization - srv.total`` (everything
  that is not the server; on a stream ``srv.send``, the server's waits for its transport, counts
  as not the server, as in the split) on this path, minus the same on a direct path to the same server
  with the same client protocol (or the baseline) in the same run. It comes from the client's
  clock and the server's, not from the gateway, and includes all the gateway's work, also
  what its own timer misses (its HTTP server, auth, JSON) and both links.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pathprobe.reporters import SELF_REPORTED

Record = Mapping[str, Any]


def entries_of(rec: Record) -> dict[str, float]:
    """A record's timing entries as one dict (from its hop list when it has one)."""
    hops = rec.get("hops")
    if hops:
        out: dict[str, float] = {}
        for hop in hops:
            out.update(hop.get("entries") or {})
        return out
    return dict(rec.get("entries") or {})


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def outside_server_ms(records: Sequence[Record]) -> float | None:
    """Mean of e2e - client (de)serialization - (srv.total - srv.send) over OK records that carry srv.total."""
    vals = []
    for r in records:
        e = entries_of(r)
        if r.get("ok") and "srv.total" in e:
            vals.append(
                float(r["e2e_ms"])
                - float(r.get("client_encode_ms") or 0.0)
                - float(r.get("client_decode_ms") or 0.0)
                - (e["srv.total"] - e.get("srv.send", 0.0))  # a stream's hand-offs are the link's
            )
    return _mean(vals)


def claims(records: Sequence[Record]) -> dict[str, dict[str, Any]]:
    """Per self-reported entry (e.g. ``litellm.overhead``): what the gateway says, and its hop's
    own time from the durations it reports, over the OK records that carry it."""
    out: dict[str, dict[str, Any]] = {}
    ok = [r for r in records if r.get("ok")]
    for name, who in SELF_REPORTED.items():
        prefix = name.split(".", 1)[0]
        says, own = [], []
        for r in ok:
            e = entries_of(r)
            if name in e:
                says.append(e[name])
                if f"{prefix}.total" in e and f"{prefix}.upstream" in e:
                    own.append(e[f"{prefix}.total"] - e[f"{prefix}.upstream"])
        if says:
            out[name] = {
                "who": who,
                "n": len(says),
                "says_mean_ms": _mean(says),
                "hop_own_mean_ms": _mean(own),
                "of_requests": len(says) / len(ok),
            }
    return out


def reference_for(name: str, targets: Mapping[str, Any], baseline: str) -> str | None:
    """The direct path to compare ``name`` with: same client protocol family, else the baseline."""
    proto = targets[name].get("protocol")
    family = {"openai": "http", "http": "http", "grpc": "grpc"}
    for other, t in targets.items():
        if (
            other != name
            and t.get("kind") == "direct"
            and t.get("status") == "ok"
            and family.get(t.get("protocol")) == family.get(proto)
        ):
            return other
    return baseline if baseline != name else None


def add_self_reports(
    report_targets: dict[str, Any], records: Mapping[str, Mapping[int, Sequence[Record]]], baseline: str
) -> list[dict[str, Any]]:
    """Attach ``self_report`` to every concurrency group whose records carry a self-report;
    returns one line per (target, concurrency, claim) for the tables."""
    lines: list[dict[str, Any]] = []
    for name, per_conc in records.items():
        for conc, recs in per_conc.items():
            said = claims(recs)
            if not said:
                continue
            ref = reference_for(name, report_targets, baseline)
            mine = outside_server_ms(recs)
            theirs = outside_server_ms(records.get(ref, {}).get(conc, ())) if ref else None
            tax = mine - theirs if mine is not None and theirs is not None else None
            group = report_targets[name]["by_concurrency"].get(str(conc))
            if group is None:
                continue
            group["self_report"] = {
                "claims": said,
                "reference": ref,
                "outside_server_mean_ms": mine,
                "reference_outside_server_mean_ms": theirs,
                "measured_tax_mean_ms": tax,
            }
            for entry, c in said.items():
                text = f"{c['who']} says {c['says_mean_ms']:.1f} ms ({entry}, mean of {c['n']})"
                if tax is not None:
                    text += f", measured {tax:.1f} ms (e2e − client − server, mean, vs {ref})"
                elif mine is not None:
                    text += f", measured {mine:.1f} ms outside the server (both links included)"
                if c["hop_own_mean_ms"] is not None:
                    text += f"; its hop's own time from what it reports: {c['hop_own_mean_ms']:.1f} ms"
                lines.append({"target": name, "concurrency": conc, "entry": entry, "text": text})
    return lines
