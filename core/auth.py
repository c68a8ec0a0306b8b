"""API-key / bearer-token checks, the same for the server and the gateway.

A caller presents its key as ``authorization: Bearer KEY`` (HTTP header or gRPC metadata,
as vLLM and OpenAI clients send it) or as ``x-api-key: KEY``. Keys are compared in
constant time (:func:`hmac.compare_digest`); a missing or wrong key is
:class:`~pathprobe.errors.Unauthenticated` (HTTP 401 / gRPC UNAUTHENTICATED), and the
message never echoes what was sent. Health and metrics endpoints stay open.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable, Mapping

from pathprobe.errors import ConfigError, Unauthenticated

AUTHORIZATION = "authorization"
X_API_KEY = "x-api-key"


def bearer(key: str) -> str:
    return f"Bearer {key}"


def parse_keys(value: str | None, flag: str) -> tuple[bytes, ...]:
    """``KEY[,KEY...]`` -> the accepted keys (several allow rotation without downtime)."""
    keys = tuple(k.strip().encode() for k in (value or "").split(",") if k.strip())
    if value and not keys:
        raise ConfigError(f"{flag}: empty key")
    return keys


class ApiKeys:
    """The keys a listener accepts; empty = no authentication."""

    __slots__ = ("keys",)

    def __init__(self, keys: Iterable[bytes] = ()) -> None:
        self.keys = tuple(keys)

    def __bool__(self) -> bool:
        return bool(self.keys)

    def matches(self, presented: str | bytes | None) -> bool:
        if not presented:
            return False
        got = presented.encode() if isinstance(presented, str) else presented
        ok = False
        for key in self.keys:  # every key compared, so the time does not say which one matched
            ok |= hmac.compare_digest(got, key)
        return ok

    def check(self, authorization: str | bytes | None, api_key: str | bytes | None = None) -> None:
        """Raise Unauthenticated unless ``authorization`` (``Bearer KEY``) or ``api_key`` matches."""
        if not self.keys:
            return
        token = None
        if authorization:
            auth = authorization.decode(errors="replace") if isinstance(authorization, bytes) else authorization
            scheme, _, rest = auth.strip().partition(" ")
            if scheme.lower() == "bearer":
                token = rest.strip()
        if self.matches(token) or self.matches(api_key):
            return
        if not authorization and not api_key:
            raise Unauthenticated("authorization: missing; send 'authorization: Bearer KEY' or 'x-api-key: KEY'")
        raise Unauthenticated("authorization: the key is not valid")

    def check_mapping(self, headers: Mapping[str, str]) -> None:
        """Headers or metadata with lower- or mixed-case names."""
        if not self.keys:
            return
        get = headers.get
        self.check(get(AUTHORIZATION) or get("Authorization"), get(X_API_KEY) or get("X-Api-Key") or get("X-API-Key"))
