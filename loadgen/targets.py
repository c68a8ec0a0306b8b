"""Transports: one call to a target, measured with ``perf_counter_ns``.

Each target fills an :class:`Outcome` in place, so a call interrupted by Locust (the
test stops while it is in flight) still leaves what was measured so far. No Locust
import here: these are usable from any gevent (or plain threaded) program.

- gRPC: raw-bytes calls (no stub serializers) so ``client.encode`` / ``client.decode``
  time exactly the protobuf (de)serialization; ``server-timing`` from trailing metadata.
  Two transports give the same records: :class:`H2GrpcTarget` (default, ``--grpc-client h2``:
  pathprobe's own HTTP/2 client, :mod:`pathprobe.loadgen.h2grpc`) and :class:`GrpcTarget`
  (``--grpc-client grpcio``).
- native HTTP (``POST /v1/generate``) and OpenAI-compatible routes over
  geventhttpclient (the HTTP client under Locust's FastHttpUser): ``client.encode`` /
  ``client.decode`` time ``json.dumps`` / ``json.loads``; entries from the
  ``Server-Timing`` header or, for SSE streams, the last event's ``server_timing``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from pathprobe import environment, reporters, rtt, timing
from pathprobe.deadline import TIMEOUT_HEADER, format_timeout
from pathprobe.errors import ConfigError
from pathprobe.loadgen import nullrtt
from pathprobe.serverreports import TGI_HEADERS, ReportError, ServerReport
from pathprobe.serverreports import read as read_report
from pathprobe.tls import TlsFiles

pc = time.perf_counter_ns
#: round trips a target times for its network floor (the shortest): TCP handshakes before an HTTP
#: target's first request, HTTP/2 PINGs after a gRPC call without entries
HANDSHAKE_PROBES = 3

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


def _first(value: Any) -> str | None:
    if isinstance(value, list):
        return value[0] if value else None
    return value


def _timing_values(md: Any) -> list[str]:
    return [v.decode() if isinstance(v, bytes) else v for k, v in md or () if k == timing.METADATA_KEY]


def entries_from_call(call: Any) -> timing.Chain:
    """A finished gRPC call's chain: the ``server-timing`` trailers (the server and the hops that
    append to them), then what proxies wrote in the response headers (HAProxy, Caddy, Envoy:
    they cannot touch trailers, so they are taken as the outer hops)."""
    values = _timing_values(call.trailing_metadata())
    initial = call.initial_metadata() or ()
    if initial:
        values += _timing_values(initial)
        md = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in initial}
        values += reporters.gateway_values(md.get)
    return timing.parse_chain(values)


@dataclass(slots=True)
class CallSpec:
    prompt: str
    max_tokens: int
    stream: bool
    ignore_eos: bool = True
    model: str = ""
    request_id: str = ""
    tokens_in: int | None = None  # the prompt set's count, used when the server reports none


@dataclass(slots=True)
class Outcome:
    t0: int = 0  # perf_counter_ns at send (before client encode; the client span's start when tracing)
    t_end: int = 0
    encode_ns: int = 0
    decode_ns: int = 0
    token_times: list[int] = field(default_factory=list)  # arrival of each chunk carrying tokens
    emit_ms: list[float] = field(default_factory=list)  # the server's emit offset of each of those chunks
    tokens_in: int | None = None
    tokens_out: int | None = None
    ok: bool = False
    status: str = ""
    error: str | None = None
    entries: dict[str, float] = field(default_factory=timing.Chain)  # a timing.Chain once filled
    response_bytes: int = 0
    #: a round trip measured apart from the request, the network estimate of a link whose far end
    #: reports nothing: an HTTP null round trip's median on the same connection (HTTP), else the
    #: floor below; which one is ``network_estimate_kind`` (:mod:`pathprobe.rtt`)
    network_estimate_ms: float | None = None
    network_estimate_kind: str | None = None
    #: the transport floor: the shortest TCP handshake (HTTP/1.1) or HTTP/2 PING (gRPC)
    network_floor_ms: float | None = None
    #: what a third-party server reported about the request itself (vLLM, TGI, Ollama)
    server_report: ServerReport | None = None


class Target:
    kind = "?"
    address = ""

    def route(self, stream: bool) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    def call(self, spec: CallSpec, headers: dict[str, str], out: Outcome) -> None:  # pragma: no cover
        raise NotImplementedError

    def after_call(self, out: Outcome) -> None:
        """Called after the request is recorded as done (outside its e2e and its client wait):
        where a target times round trips for the network estimate of a silent server."""
        return None

    def close(self) -> None:
        return None


def _grpc_request(
    pb: Any, spec: CallSpec, headers: dict[str, str], auth: tuple[tuple[str, str], ...], out: Outcome
) -> tuple[bytes, tuple[tuple[str, str], ...] | None]:
    """The serialized request (its time is ``client.encode``) and the call's metadata."""
    out.t0 = t0 = out.t0 or pc()  # preset when a client span started the request
    data = pb.GenerateRequest(
        prompt=spec.prompt,
        max_tokens=spec.max_tokens,
        ignore_eos=spec.ignore_eos,
        request_id=spec.request_id,
        model=spec.model,
    ).SerializeToString()
    out.encode_ns = pc() - t0
    return data, (tuple(headers.items()) + auth if headers else auth) or None


# --- gRPC --------------------------------------------------------------------------------
class GrpcTarget(Target):
    kind = "grpc"

    def __init__(self, address: str, timeout_s: float = 60.0, tls: TlsFiles | None = None, api_key: str = "") -> None:
        """``tls``: a grpcs:// target (TlsFiles() verifies against the system CAs)."""
        import grpc
        from pathprobe.tls import grpc_channel
        from pathprobe.v1 import llm_pb2

        self._grpc = grpc
        self._pb = llm_pb2
        self.address = address
        self.timeout_s = timeout_s
        self._auth = (("authorization", f"Bearer {api_key}"),) if api_key else ()
        self.channel = grpc_channel(
            address, tls, [("grpc.max_receive_message_length", 64 << 20), ("grpc.enable_retries", 0)]
        )
        self._unary = self.channel.unary_unary("/pathprobe.v1.LLM/Generate")
        self._stream = self.channel.unary_stream("/pathprobe.v1.LLM/GenerateStream")
        self._ping = PingEstimate(address)

    def _estimate(self, out: Outcome) -> None:
        self._ping.apply(out)

    def route(self, stream: bool) -> str:
        return "grpc.GenerateStream" if stream else "grpc.Generate"

    def call(self, spec: CallSpec, headers: dict[str, str], out: Outcome) -> None:
        pb = self._pb
        data, md = _grpc_request(pb, spec, headers, self._auth, out)
        try:
            if spec.stream:
                self._call_stream(data, md, out)
            else:
                resp_bytes, call = self._unary.with_call(data, timeout=self.timeout_s, metadata=md)
                t2 = pc()
                resp = pb.GenerateResponse.FromString(resp_bytes)
                out.t_end = t3 = pc()
                out.decode_ns = t3 - t2
                out.response_bytes = len(resp_bytes)
                out.tokens_out = resp.usage.completion_tokens if resp.HasField("usage") else len(resp.token_ids)
                out.tokens_in = resp.usage.prompt_tokens if resp.HasField("usage") else None
                out.entries = entries_from_call(call)
                out.ok, out.status = True, "OK"
            self._estimate(out)
        except self._grpc.RpcError as exc:
            out.t_end = out.t_end or pc()
            code = exc.code() if hasattr(exc, "code") else None
            out.ok = False
            out.status = code.name if code is not None else "UNKNOWN"
            out.error = exc.details() if hasattr(exc, "details") else str(exc)
            try:
                out.entries = timing.from_metadata(exc.trailing_metadata())
            except Exception:
                pass

    def _call_stream(self, data: bytes, md: Any, out: Outcome) -> None:
        pb = self._pb
        it = self._stream(data, timeout=self.timeout_s, metadata=md)
        dec = 0
        n = 0
        usage = None
        times = out.token_times
        emits = out.emit_ms
        for raw in it:
            ta = pc()
            chunk = pb.GenerateChunk.FromString(raw)
            dec += pc() - ta
            out.response_bytes += len(raw)
            if chunk.token_ids or chunk.text:
                times.append(ta)
                emits.append(chunk.emit_ms)
                n += len(chunk.token_ids) or 1
            if chunk.HasField("usage"):
                usage = chunk.usage
        out.t_end = pc()
        out.decode_ns = dec
        out.tokens_out = usage.completion_tokens if usage is not None else n
        out.tokens_in = usage.prompt_tokens if usage is not None else None
        out.entries = entries_from_call(it)
        out.ok, out.status = True, "OK"

    def close(self) -> None:
        self.channel.close()


class PingEstimate:
    """A gRPC server that sent no timing entries reports nothing: its link's network estimate is
    an HTTP/2 PING round trip (the shortest of a few, on a connection of its own, measured once
    after the first such call; calls that brought entries need none)."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.ms: float | None = None
        self.done = False

    def apply(self, out: Outcome) -> None:
        if out.entries:
            return
        if not self.done:
            self.done = True
            host, _, port = self.address.rpartition(":")
            if port.isdigit():
                self.ms = rtt.h2_ping_ms(host.strip("[]") or "127.0.0.1", int(port), HANDSHAKE_PROBES)
        out.network_estimate_ms = out.network_floor_ms = self.ms
        out.network_estimate_kind = rtt.H2_PING if self.ms is not None else None


class H2GrpcTarget(Target):
    """The same calls as :class:`GrpcTarget` over :mod:`pathprobe.loadgen.h2grpc` (one HTTP/2
    connection per user, no grpcio): a fraction of the CPU per call under gevent, same outcome."""

    kind = "grpc"

    def __init__(self, address: str, timeout_s: float = 60.0, api_key: str = "") -> None:
        from pathprobe.loadgen.h2grpc import Channel
        from pathprobe.v1 import llm_pb2

        self._pb = llm_pb2
        self.address = address
        self.timeout_s = timeout_s
        self._auth = (("authorization", f"Bearer {api_key}"),) if api_key else ()
        self.channel = Channel(address)
        self._ping = PingEstimate(address)

    def route(self, stream: bool) -> str:
        return "grpc.GenerateStream" if stream else "grpc.Generate"

    def call(self, spec: CallSpec, headers: dict[str, str], out: Outcome) -> None:
        self._call(spec, headers, out)
        if out.ok:
            self._ping.apply(out)

    def _call(self, spec: CallSpec, headers: dict[str, str], out: Outcome) -> None:
        pb = self._pb
        data, md = _grpc_request(pb, spec, headers, self._auth, out)
        if spec.stream:
            self._stream(data, md, out)
            return
        got: list[bytes] = []
        res = self.channel.call("/pathprobe.v1.LLM/Generate", data, self.timeout_s, md, lambda m, _t: got.append(m))
        if res.code == 0 and len(got) == 1:
            t2 = pc()
            resp = pb.GenerateResponse.FromString(got[0])
            out.t_end = t3 = pc()
            out.decode_ns = t3 - t2
            out.response_bytes = len(got[0])
            out.tokens_out = resp.usage.completion_tokens if resp.HasField("usage") else len(resp.token_ids)
            out.tokens_in = resp.usage.prompt_tokens if resp.HasField("usage") else None
            out.ok, out.status = True, "OK"
        else:
            out.t_end = pc()
            out.ok = False
            if res.code == 0:  # OK without exactly one message: what grpcio reports for a unary call
                out.status, out.error = "INTERNAL", f"unary call answered with {len(got)} messages"
            else:
                out.status, out.error = res.status, res.details
        out.entries = timing.parse_chain(res.server_timing + res.header_timing)  # trailers, then headers

    def _stream(self, data: bytes, md: Any, out: Outcome) -> None:
        pb = self._pb
        st = {"dec": 0, "n": 0, "usage": None}
        times = out.token_times

        def on_message(raw: bytes, ta: int) -> None:
            t = pc()
            chunk = pb.GenerateChunk.FromString(raw)
            st["dec"] += pc() - t
            out.response_bytes += len(raw)
            if chunk.token_ids or chunk.text:
                times.append(ta)
                out.emit_ms.append(chunk.emit_ms)
                st["n"] += len(chunk.token_ids) or 1
            if chunk.HasField("usage"):
                st["usage"] = chunk.usage

        res = self.channel.call("/pathprobe.v1.LLM/GenerateStream", data, self.timeout_s, md, on_message)
        out.t_end = pc()
        out.decode_ns = st["dec"]
        usage = st["usage"]
        out.entries = timing.parse_chain(res.server_timing + res.header_timing)  # trailers, then headers
        if res.code != 0:
            out.ok, out.status, out.error = False, res.status, res.details
            return
        out.tokens_out = usage.completion_tokens if usage is not None else st["n"]
        out.tokens_in = usage.prompt_tokens if usage is not None else None
        out.ok, out.status = True, "OK"

    def close(self) -> None:
        self.channel.close()


# --- HTTP (native and OpenAI) --------------------------------------------------------------
class _HttpBase(Target):
    #: the null round trip's request: answered by the server without model work
    null_path = "/v1/models"

    def __init__(self, base_url: str, timeout_s: float = 60.0, tls: TlsFiles | None = None, api_key: str = "") -> None:
        from geventhttpclient import HTTPClient
        from geventhttpclient.url import URL

        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ConfigError(f"host: expected http(s)://HOST:PORT, got {base_url!r}")
        self.address = base_url
        self.prefix = parts.path.rstrip("/")
        self.timeout_s = timeout_s
        ssl_kw: dict[str, Any] = {}
        if parts.scheme == "https" and tls is not None:
            ssl_kw["ssl_options"] = tls.gevent_ssl_options()
        self.client = HTTPClient.from_url(
            URL(f"{parts.scheme}://{parts.netloc}/"),
            concurrency=1,
            connection_timeout=timeout_s,
            network_timeout=timeout_s,
            **ssl_kw,
        )
        self._auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._null = nullrtt.NullRoundTrip(self._null_request)
        self._dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
        self._loads = json.loads
        self.connect_ms: float | None = None
        self._base_headers = {
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            **extra_headers(),
        }
        _time_connects(self.client, self)
        # a few TCP handshakes before any request: the estimate is the shortest of several round
        # trips, not one that a busy scheduler stretched (each later pool connect can only lower it)
        hs = rtt.tcp_handshake_ms(
            parts.hostname or "127.0.0.1", parts.port or (443 if parts.scheme == "https" else 80), HANDSHAKE_PROBES
        )
        if hs is not None:
            self._saw_connect(hs)

    def _saw_connect(self, ms: float) -> None:
        self.connect_ms = ms if self.connect_ms is None else min(self.connect_ms, ms)

    def _post(self, path: str, body_obj: dict[str, Any], headers: dict[str, str], out: Outcome) -> Any:
        out.t0 = t0 = out.t0 or pc()  # preset when a client span started the request
        body = self._dumps(body_obj).encode()
        out.encode_ns = pc() - t0
        hdrs = {**self._base_headers, **self._auth}
        if headers:
            hdrs.update(headers)
        resp = self.client.post(self.prefix + path, body=body, headers=hdrs)
        nullrtt.floor(out, self.connect_ms)
        return resp

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

    def _entries_from_header(self, resp: Any) -> timing.Chain:
        """``Server-Timing`` header(s) hop by hop, then what known gateways say in headers of
        their own (LiteLLM, Envoy: :mod:`pathprobe.reporters`) as the outer hops."""
        if not hasattr(resp, "get"):
            return timing.Chain()
        value = resp.get("server-timing")
        values = list(value) if isinstance(value, list) else [value] if value is not None else []
        values += reporters.gateway_values(lambda name: _first(resp.get(name)))
        return timing.parse_chain(values)

    def _error(self, resp: Any, out: Outcome) -> None:
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

    def _unary(self, resp: Any, out: Outcome) -> dict[str, Any]:
        body = resp.read()
        t2 = pc()
        obj = self._loads(body)
        out.t_end = t3 = pc()
        out.decode_ns = t3 - t2
        out.response_bytes = len(body)
        out.entries = self._entries_from_header(resp)
        return obj

    def _sse(self, resp: Any, out: Outcome, on_event: Any) -> None:
        """Reads ``data:`` events until ``[DONE]`` or the end of the body."""
        dec = 0
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
                break
            ta = pc()
            obj = loads(payload)
            dec += pc() - ta
            on_event(ta, obj)
        resp.read()  # drain the end of the chunked body so the connection is reused
        out.t_end = pc()
        out.decode_ns = dec
        if not out.entries:
            out.entries = self._entries_from_header(resp)

    def close(self) -> None:
        self.client.close()


def _time_connects(client: Any, into: _HttpBase) -> None:
    """Time each TCP connect of ``client``'s pool (the kernel's handshake: one round trip)."""
    pool = client._connection_pool
    connect = pool._connect_socket

    def timed(sock: Any, address: Any) -> Any:
        t0 = pc()
        sock = connect(sock, address)
        into._saw_connect((pc() - t0) / 1e6)
        return sock

    pool._connect_socket = timed


def _take_report(resp: Any, obj: Any, out: Outcome) -> None:
    """A third-party server's own report of the request (body fields or TGI's headers)."""
    headers = {k: v for k in TGI_HEADERS if isinstance(v := resp.get(k), str)} if hasattr(resp, "get") else None
    try:
        rep = read_report(headers, obj if isinstance(obj, dict) else None)
    except ReportError as exc:
        out.error = f"server report ignored: {exc.message}"
        return
    if rep is not None:
        out.server_report = rep


class NativeHttpTarget(_HttpBase):
    """``POST /v1/generate`` (SSE when streaming)."""

    kind = "http"

    def __init__(self, base_url: str, timeout_s: float = 60.0, tls: TlsFiles | None = None, api_key: str = "") -> None:
        super().__init__(base_url, timeout_s, tls, api_key)
        # the request's deadline travels with it (as a gRPC client's would): gateway -> server -> engine
        self._auth = {**self._auth, TIMEOUT_HEADER: format_timeout(timeout_s)}

    def route(self, stream: bool) -> str:
        return "http.generate.stream" if stream else "http.generate"

    def call(self, spec: CallSpec, headers: dict[str, str], out: Outcome) -> None:
        body = {
            "prompt": spec.prompt,
            "max_tokens": spec.max_tokens,
            "ignore_eos": spec.ignore_eos,
            "request_id": spec.request_id,
            "stream": spec.stream,
        }
        if spec.model:
            body["model"] = spec.model
        resp = self._post("/v1/generate", body, headers, out)
        if resp.status_code != 200:
            self._error(resp, out)
            return
        if not spec.stream:
            obj = self._unary(resp, out)
            usage = obj.get("usage") or {}
            out.tokens_out = usage.get("completion_tokens", len(obj.get("token_ids") or ()))
            out.tokens_in = usage.get("prompt_tokens")
            out.ok, out.status = True, "OK"
            return
        state: dict[str, Any] = {"n": 0, "err": None}

        def on_event(ta: int, obj: dict[str, Any]) -> None:
            if "error" in obj:
                state["err"] = obj["error"]
            if obj.get("text") or obj.get("token_ids"):
                out.token_times.append(ta)
                out.emit_ms.append(float(obj.get("emit_ms") or 0.0))
                state["n"] += len(obj.get("token_ids") or ()) or 1
            _take_usage_and_timing(obj, out)

        self._sse(resp, out, on_event)
        if out.tokens_out is None:
            out.tokens_out = state["n"]
        _finish_stream(out, state["err"])


class OpenAITarget(_HttpBase):
    """OpenAI-compatible ``/v1/completions`` or ``/v1/chat/completions``; any such server.

    ``Server-Timing`` entries are used when present and are optional.
    """

    kind = "openai"

    def __init__(
        self,
        base_url: str,
        timeout_s: float = 60.0,
        api: str = "completions",
        tls: TlsFiles | None = None,
        api_key: str = "",
    ) -> None:
        super().__init__(base_url, timeout_s, tls, api_key)
        if api not in ("completions", "chat"):
            raise ConfigError(f"openai-api: expected completions or chat, got {api!r}")
        self.api = api
        self._model: str | None = None

    def route(self, stream: bool) -> str:
        base = "openai.chat" if self.api == "chat" else "openai.completions"
        return base + ".stream" if stream else base

    def default_model(self) -> str:
        """First id of ``GET /v1/models`` (OpenAI requires a model name)."""
        if self._model is None:
            self._model = "default"
            try:
                resp = self.client.get(self.prefix + "/v1/models", headers={**extra_headers(), **self._auth})
                body = resp.read()
                if resp.status_code == 200:
                    data = json.loads(body).get("data") or []
                    if data and data[0].get("id"):
                        self._model = str(data[0]["id"])
            except Exception:
                pass
        return self._model

    def call(self, spec: CallSpec, headers: dict[str, str], out: Outcome) -> None:
        model = spec.model or self.default_model()
        chat = self.api == "chat"
        body: dict[str, Any] = {
            "model": model,
            "max_tokens": spec.max_tokens,
            "temperature": 0.0,
            "stream": spec.stream,
        }
        if chat:
            body["messages"] = [{"role": "user", "content": spec.prompt}]
        else:
            body["prompt"] = spec.prompt
        if spec.ignore_eos:
            body["ignore_eos"] = True
        if spec.stream:
            body["stream_options"] = {"include_usage": True}
        path = "/v1/chat/completions" if chat else "/v1/completions"
        resp = self._post(path, body, headers, out)
        if resp.status_code != 200:
            self._error(resp, out)
            return
        if not spec.stream:
            obj = self._unary(resp, out)
            usage = obj.get("usage") or {}
            out.tokens_out = usage.get("completion_tokens")
            out.tokens_in = usage.get("prompt_tokens")
            _take_report(resp, obj, out)
            st = obj.get("server_timing")
            if st and not out.entries:
                out.entries = timing.parse_chain(st)
            out.ok, out.status = True, "OK"
            return
        state: dict[str, Any] = {"n": 0, "err": None}

        def on_event(ta: int, obj: dict[str, Any]) -> None:
            if "error" in obj:
                state["err"] = obj["error"]
            for choice in obj.get("choices") or ():
                piece = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
                if piece:
                    out.token_times.append(ta)
                    out.emit_ms.append(float(obj.get("emit_ms") or 0.0))
                    state["n"] += 1
            _take_usage_and_timing(obj, out)
            if "metrics" in obj:  # vLLM: the final usage chunk carries its per-request metrics
                _take_report(None, obj, out)

        self._sse(resp, out, on_event)
        if out.tokens_out is None:
            out.tokens_out = state["n"]
        _finish_stream(out, state["err"])


class OllamaTarget(_HttpBase):
    """Ollama's native ``POST /api/generate`` (newline-delimited JSON objects when streaming).

    Ollama's OpenAI-compatible routes carry no timing; its native route's final object has
    ``total_duration`` / ``load_duration`` / ``prompt_eval_duration`` / ``eval_duration``
    (ns), read as the server's own report (a server hop)."""

    kind = "ollama"
    null_path = "/api/version"

    def __init__(self, base_url: str, timeout_s: float = 60.0) -> None:
        super().__init__(base_url, timeout_s)
        self._model: str | None = None

    def route(self, stream: bool) -> str:
        return "ollama.generate.stream" if stream else "ollama.generate"

    def default_model(self) -> str:
        """First model of ``GET /api/tags`` (Ollama requires a model name)."""
        if self._model is None:
            self._model = "default"
            try:
                resp = self.client.get(self.prefix + "/api/tags")
                body = resp.read()
                if resp.status_code == 200:
                    models = json.loads(body).get("models") or []
                    if models and models[0].get("name"):
                        self._model = str(models[0]["name"])
            except Exception:
                pass
        return self._model

    def call(self, spec: CallSpec, headers: dict[str, str], out: Outcome) -> None:
        body = {
            "model": spec.model or self.default_model(),
            "prompt": spec.prompt,
            "stream": spec.stream,
            "raw": True,
            "options": {"num_predict": spec.max_tokens, "temperature": 0.0},
        }
        resp = self._post("/api/generate", body, headers, out)
        if resp.status_code != 200:
            self._error(resp, out)
            return
        if not spec.stream:
            obj = self._unary(resp, out)
            out.tokens_out, out.tokens_in = obj.get("eval_count"), obj.get("prompt_eval_count")
            _take_report(resp, obj, out)
            out.ok, out.status = True, "OK"
            return
        dec, n, err = 0, 0, None
        while True:
            line = resp.readline(b"\n")
            if not line:
                break
            if not line.strip():
                continue
            out.response_bytes += len(line)
            ta = pc()
            obj = self._loads(line)
            dec += pc() - ta
            if obj.get("error"):
                err = obj["error"]
            if obj.get("response"):
                out.token_times.append(ta)
                n += 1
            if obj.get("done"):
                out.tokens_out, out.tokens_in = obj.get("eval_count", n), obj.get("prompt_eval_count")
                _take_report(None, obj, out)
        resp.read()
        out.t_end = pc()
        out.decode_ns = dec
        if out.tokens_out is None:
            out.tokens_out = n
        out.entries = self._entries_from_header(resp)
        _finish_stream(out, err)


def _take_usage_and_timing(obj: dict[str, Any], out: Outcome) -> None:
    """An SSE event's ``usage`` and ``server_timing`` (the last event carries them)."""
    usage = obj.get("usage")
    if usage:
        out.tokens_out = usage.get("completion_tokens")
        out.tokens_in = usage.get("prompt_tokens")
    st = obj.get("server_timing")
    if st:
        out.entries = timing.parse_chain(st)


def _finish_stream(out: Outcome, err: Any) -> None:
    if err:
        out.ok = False
        if isinstance(err, dict):
            out.status = str(err.get("status") or err.get("code") or "STREAM_ERROR")
            out.error = str(err.get("message") or err)
        else:
            out.status, out.error = "STREAM_ERROR", str(err)
    else:
        out.ok, out.status = True, "OK"


# --- host URL -> target ------------------------------------------------------------------
def parse_host(host: str) -> tuple[str, str]:
    """``grpc://h:p`` -> ("grpc", "h:p"); ``grpcs://h:p`` -> ("grpc", "h:p") (TLS); ``http(s)://h:p`` ->
    ("http", url); ``openai+http(s)://h:p`` -> ("openai", "http(s)://h:p"); ``openai-sdk+http://h:p`` ->
    ("openai-sdk", ...)."""
    if not host:
        raise ConfigError("host: give the target with -H/--host (grpc://, http://, openai+http://)")
    parts = urlsplit(host)
    scheme = parts.scheme.lower()
    if scheme in ("grpc", "grpcs"):
        if not parts.netloc:
            raise ConfigError(f"host: expected {scheme}://HOST:PORT, got {host!r}")
        return "grpc", parts.netloc
    if scheme in ("http", "https"):
        return "http", host.rstrip("/")
    if scheme in ("openai-sdk+http", "openai-sdk+https"):  # through the official openai SDK
        return "openai-sdk", f"{scheme.split('+', 1)[1]}://{parts.netloc}{parts.path}".rstrip("/")
    if scheme in ("openai+http", "openai+https", "openai"):
        inner = scheme.split("+", 1)[1] if "+" in scheme else "http"
        return "openai", f"{inner}://{parts.netloc}{parts.path}".rstrip("/")
    if scheme in ("ollama+http", "ollama+https"):  # Ollama's native API (its timing fields)
        return "ollama", f"{scheme.split('+', 1)[1]}://{parts.netloc}{parts.path}".rstrip("/")
    raise ConfigError(
        f"host: unknown scheme in {host!r}; use grpc(s)://, http(s)://, openai+http(s)://, "
        "openai-sdk+http:// or ollama+http://"
    )


#: gRPC client implementations a load run can use (``--grpc-client``)
GRPC_CLIENTS = ("h2", "grpcio")


def make_target(
    host: str,
    timeout_s: float = 60.0,
    openai_api: str = "completions",
    grpc_client: str = "h2",
    tls: TlsFiles | None = None,
    api_key: str = "",
) -> Target:
    """``tls``: CA / client certificate for grpcs:// and https:// (unset: the system CAs); grpcs://
    goes over grpcio's channel (the h2 client speaks plaintext HTTP/2)."""
    kind, addr = parse_host(host)
    if kind == "grpc":
        if grpc_client not in GRPC_CLIENTS:
            raise ConfigError(f"grpc-client: expected one of {', '.join(GRPC_CLIENTS)}, got {grpc_client!r}")
        if urlsplit(host).scheme.lower() == "grpcs":
            return GrpcTarget(addr, timeout_s, tls or TlsFiles(), api_key)
        return (
            H2GrpcTarget(addr, timeout_s, api_key)
            if grpc_client == "h2"
            else GrpcTarget(addr, timeout_s, None, api_key)
        )
    if kind == "http":
        return NativeHttpTarget(addr, timeout_s, tls, api_key)
    if kind == "ollama":
        return OllamaTarget(addr, timeout_s)
    if kind == "openai-sdk":
        from pathprobe.loadgen.sdk import OpenAISdkTarget

        return OpenAISdkTarget(addr, timeout_s, openai_api)
    return OpenAITarget(addr, timeout_s, openai_api, tls, api_key)
