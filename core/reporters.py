"""Timing that gateways we did not write report in headers of their own, as Server-Timing hops.

A gateway that reports nothing is a silent hop; some report a little in their own
headers. Each reader here turns one gateway's headers into Server-Timing values in the
hop contract (``<prefix>.upstream``, ``<prefix>.total``), appended after the values the
response already carries, so the chain stays innermost first:

- **LiteLLM** proxy: ``x-litellm-response-duration-ms`` (its whole handling: ``litellm.total``),
  ``x-litellm-timing-llm-api-ms`` (its call to the model server, sent with
  ``LITELLM_DETAILED_TIMING=true``: ``litellm.upstream``), and the server's own
  ``Server-Timing`` passed back as ``llm_provider-server-timing`` (with
  ``return_response_headers: true``), which becomes the inner hop. Its self-reported
  ``x-litellm-overhead-duration-ms`` and ``x-litellm-callback-duration-ms`` are kept as
  ``litellm.overhead`` / ``litellm.callback``: what LiteLLM *says*, shown beside what was
  measured, never used in the split.
- **Envoy**: ``x-envoy-upstream-service-time`` (whole milliseconds: the upstream's processing
  plus the Envoy <-> upstream network, from Envoy's router) becomes ``envoy.upstream``.
  Envoy sends no total, so the client <-> Envoy link and Envoy's own time stay unsplit.

A header whose value is not a number is ignored (never guessed).
"""

from __future__ import annotations

import math
from collections.abc import Callable

#: a response's header lookup: lower-case name -> first value, or None
HeaderGetter = Callable[[str], "str | None"]

LITELLM_TOTAL = "x-litellm-response-duration-ms"
LITELLM_UPSTREAM = "x-litellm-timing-llm-api-ms"
LITELLM_OVERHEAD = "x-litellm-overhead-duration-ms"
LITELLM_CALLBACK = "x-litellm-callback-duration-ms"
LITELLM_PROVIDER_TIMING = "llm_provider-server-timing"
ENVOY_UPSTREAM = "x-envoy-upstream-service-time"

#: entry names that are a gateway's own claim about itself (shown beside the measurement)
SELF_REPORTED = {"litellm.overhead": "LiteLLM"}


def _ms(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        ms = float(str(value).strip())
    except ValueError:
        return None
    return ms if math.isfinite(ms) and ms >= 0 else None


def _hop(prefix: str, parts: list[tuple[str, float | None]]) -> str | None:
    items = [f"{prefix}.{name};dur={ms:.3f}" for name, ms in parts if ms is not None]
    if not items:
        return None
    return ", ".join(items) + f";desc={prefix}"


def litellm(get: HeaderGetter) -> list[str]:
    """LiteLLM's hop (and the server's entries it passed back), innermost first.

    On a stream LiteLLM writes these headers before the first chunk, so its "response duration"
    is a time to first byte, not a total: a stream gets no LiteLLM entries (a silent hop) rather
    than wrong ones."""
    total = _ms(get(LITELLM_TOTAL))
    if total is None or (get("content-type") or "").startswith("text/event-stream"):
        return []
    out: list[str] = []
    inner = get(LITELLM_PROVIDER_TIMING)
    if inner:
        out.append(inner)
    hop = _hop(
        "litellm",
        [
            ("upstream", _ms(get(LITELLM_UPSTREAM))),
            ("overhead", _ms(get(LITELLM_OVERHEAD))),
            ("callback", _ms(get(LITELLM_CALLBACK))),
            ("total", total),
        ],
    )
    if hop:
        out.append(hop)
    return out


def envoy(get: HeaderGetter) -> list[str]:
    """Envoy's router: the upstream's time as Envoy saw it (no total)."""
    hop = _hop("envoy", [("upstream", _ms(get(ENVOY_UPSTREAM)))])
    return [hop] if hop else []


READERS: tuple[Callable[[HeaderGetter], list[str]], ...] = (litellm, envoy)


def gateway_values(get: HeaderGetter) -> list[str]:
    """Server-Timing values read from known gateways' own headers, to append after the
    response's Server-Timing values (each reader returns [] when its headers are absent)."""
    out: list[str] = []
    for read in READERS:
        out.extend(read(get))
    return out
