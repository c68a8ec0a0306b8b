"""The measured HTTP client under every HTTP target (native, OpenAI-compatible, Ollama).

A lean HTTP/1.1 client (:mod:`pathprobe.loadgen.http1`), one keep-alive connection per user:
``client.encode`` / ``client.decode`` time ``json.dumps`` / ``json.loads``; timing entries
come from the ``Server-Timing`` header (and known gateways' own headers) or, for streams,
the last event's ``server_timing``; each TCP connect is timed as the link's network estimate.
"""

from __future__ import annotations

import json
import ssl
from typing import Any, Protocol
from urllib.parse import urlsplit

import orjson
from pathprobe import environment, reporters, rtt, timing
from pathprobe.errors import ConfigError
from pathprobe.loadgen import http1, nullrtt
from pathprobe.loadgen.call import HANDSHAKE_PROBES, Outcome, Target, pc
from pathprobe.serverreports import TGI_HEADERS, ReportError
from pathprobe.serverreports import read as read_report
from pathprobe.tls import TlsFiles

#: a JSON object of headers sent with every request (e.g. a gateway's API key); kept in the
#: environment so a secret never shows on a command line
ENV_HEADERS = environment.PATHPROBE_LOAD_HEADERS


def extra_headers() -> dict[str, str]:
    """The headers of :data:`ENV_HEADERS` (empty when unset); bad JSON is a ConfigError."""
    raw = environment.get(ENV_HEADERS)
    if not raw:
        return {}
    try:
        obj = json.loads(raw)
    except ValueError as exc:
        raise ConfigError(f"{ENV_HEADERS}: not a JSON object of headers ({exc})") from None
    if not isinstance(obj, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in obj.items()):
        raise ConfigError(f"{ENV_HEADERS}: expected a JSON object of string header values")
    return obj


def _first(value: str | list[str] | None) -> str | None:
    if isinstance(value, list):
        return value[0] if value else None
    return value


class HttpTarget(Target):
    """A target behind one HTTP/1.1 keep-alive connection (subclasses add the API's routes)."""

    #: the null round trip's request: answered by the server without model work
    null_path = "/v1/models"

    def __init__(self, base_url: str, timeout_s: float = 60.0, tls: TlsFiles | None = None, api_key: str = "") -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ConfigError(f"host: expected http(s)://HOST:PORT, got {base_url!r}")
        self.address = base_url
        self.prefix = parts.path.rstrip("/")
        self.timeout_s = timeout_s
        host = parts.hostname or "127.0.0.1"
        port = parts.port or (443 if parts.scheme == "https" else 80)
        ctx: ssl.SSLContext | None = None
        if parts.scheme == "https":
            ctx = tls.client_context() if tls is not None else ssl.create_default_context()
        self.connect_ms: float | None = None
        # every new connection's TCP connect is timed (the kernel's handshake: one round trip)
        self.client = http1.Connection(
            host,
            port,
            timeout_s,
            ssl_context=ctx,
            server_hostname=tls.server_name if tls is not None and tls.server_name else None,
            on_connect=self._saw_connect,
        )
        self._auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._null = nullrtt.NullRoundTrip(self._null_request)
        # the request body: compact UTF-8 JSON, the bytes json.dumps(separators=(",", ":"),
        # ensure_ascii=False) gives for these bodies, in a twentieth of its time
        self._dumps = orjson.dumps
        self._loads = json.loads
        self._base_headers = {
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            **extra_headers(),
        }
        self._post_lines: bytes | None = None  # the requests' fixed header lines, made on first use
        # a few TCP handshakes before any request: the estimate is the shortest of several round
        # trips, not one that a busy scheduler stretched (each later connect can only lower it)
        hs = rtt.tcp_handshake_ms(host, port, HANDSHAKE_PROBES)
        if hs is not None:
            self._saw_connect(hs)

    def _saw_connect(self, ms: float) -> None:
        self.connect_ms = ms if self.connect_ms is None else min(self.connect_ms, ms)

    def _post(self, path: str, body_obj: dict[str, Any], headers: dict[str, str], out: Outcome) -> http1.Response:
        out.t0 = t0 = out.t0 or pc()  # preset when a client span started the request
        body = self._dumps(body_obj)
        out.encode_ns = pc() - t0
        out.request_bytes = len(body)
        lines = self._post_lines
        if lines is None:  # made once (a subclass may add to _auth in its __init__)
            lines = self._post_lines = http1.header_lines({**self._base_headers, **self._auth})
        if headers:  # a request's own (a client span's traceparent): they replace fixed ones of the same name
            lines = http1.header_lines({**self._base_headers, **self._auth, **headers})
        resp = self.client.post(self.prefix + path, body, lines)
        nullrtt.floor(out, self.connect_ms)
        return resp

    def read_age_ms(self) -> float | None:
        return self.client.reads.age_ms

    def after_call(self, out: Outcome) -> None:
        self._null.apply(out)

    def _null_request(self) -> bool:
        """One cheap request on the requests' own connection (``null_path``); any HTTP answer counts."""
        try:
            resp = self.client.get(self.prefix + self.null_path, headers={**extra_headers(), **self._auth})
            resp.read()
        except Exception:
            return False
        return True

    def _entries_from_header(self, resp: http1.Response) -> timing.Chain:
        """``Server-Timing`` header(s) hop by hop, then what known gateways say in headers of
        their own (LiteLLM, Envoy: :mod:`pathprobe.reporters`) as the outer hops."""
        if not hasattr(resp, "get"):
            return timing.Chain()
        value = resp.get("server-timing")
        values = list(value) if isinstance(value, list) else [value] if value is not None else []
        values += reporters.gateway_values(lambda name: _first(resp.get(name)))
        return timing.parse_chain(values)

    def _error(self, resp: http1.Response, out: Outcome) -> None:
        body = resp.read()
        out.t_end = pc()
        out.response_bytes = len(body)
        out.ok = False
        out.status = str(resp.status_code)
        out.entries = self._entries_from_header(resp)
        msg = body.decode(errors="replace")[:500]
        try:
            obj = self._loads(body)
            err = obj.get("error") if isinstance(obj, dict) else None
            if isinstance(err, dict) and err.get("message"):
                msg = str(err["message"])
            elif isinstance(err, str):
                msg = err
        except ValueError:
            pass
        out.error = msg

    def _unary(self, resp: http1.Response, out: Outcome) -> dict[str, Any]:
        body = resp.read()
        t2 = pc()
        obj = self._loads(body)
        out.t_end = t3 = pc()
        out.decode_ns = t3 - t2
        out.response_bytes = len(body)
        out.entries = self._entries_from_header(resp)
        return obj

    def _sse(self, resp: http1.Response, out: Outcome, on_event: Any) -> bool:
        """Reads ``data:`` events until ``[DONE]`` or the end of the body; whether ``[DONE]`` came
        (a stream whose body ends without it was cut short somewhere on the path)."""
        dec = 0
        done = False
        loads = self._loads
        while True:
            line = resp.readline(b"\n")
            if not line:
                break
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            out.response_bytes += len(line)
            if payload == b"[DONE]":
                done = True
                break
            ta = pc()
            obj = loads(payload)
            t = pc()
            dec += t - ta
            out.decodes.append((ta, t))
            n = len(out.token_times)
            on_event(ta, obj)
            if len(out.token_times) > n and self.client.reads.arrived_at is not None:
                out.token_rx.append(self.client.reads.arrived_at)
        resp.read()  # drain the end of the chunked body so the connection is reused
        out.t_end = pc()
        out.decode_ns = dec
        if not out.entries:
            out.entries = self._entries_from_header(resp)
        return done

    def close(self) -> None:
        self.client.close()


class HeaderSource(Protocol):
    """Response headers by name: :class:`~pathprobe.loadgen.http1.Response`, httpx's ``Headers``."""

    def get(self, name: str, /) -> object: ...


def take_report(resp: HeaderSource | None, obj: object, out: Outcome) -> None:
    """A third-party server's own report of the request (body fields or TGI's headers)."""
    headers = {k: v for k in TGI_HEADERS if isinstance(v := resp.get(k), str)} if resp is not None else None
    try:
        rep = read_report(headers, obj if isinstance(obj, dict) else None)
    except ReportError as exc:
        out.error = f"server report ignored: {exc.message}"
        return
    if rep is not None:
        out.server_report = rep


def take_usage_and_timing(obj: dict[str, Any], out: Outcome) -> None:
    """An SSE event's ``usage`` and ``server_timing`` (the last event carries them)."""
    usage = obj.get("usage")
    if usage:
        out.tokens_out = usage.get("completion_tokens")
        out.tokens_in = usage.get("prompt_tokens")
    st = obj.get("server_timing")
    if st:
        out.entries = timing.parse_chain(st)


#: the error of an SSE stream whose body ended without ``data: [DONE]``
CUT_SHORT = "the event stream ended before data: [DONE]"


def finish_stream(out: Outcome, err: object) -> None:
    if err:
        out.ok = False
        if isinstance(err, dict):
            out.status = str(err.get("status") or err.get("code") or "STREAM_ERROR")
            out.error = str(err.get("message") or err)
        else:
            out.status, out.error = "STREAM_ERROR", str(err)
    else:
        out.ok, out.status = True, "OK"
