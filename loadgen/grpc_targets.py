"""gRPC targets: raw-bytes calls (no stub serializers), so ``client.encode`` / ``client.decode``
time exactly the protobuf (de)serialization; timing entries from the ``server-timing``
trailers (and what proxies put in the response headers).

Two transports give the same records: :class:`H2GrpcTarget` (default, ``--grpc-client h2``:
pathprobe's own HTTP/2 client, :mod:`pathprobe.loadgen.h2grpc`) and :class:`GrpcTarget`
(``--grpc-client grpcio``, and every ``grpcs://`` target).
"""

from __future__ import annotations

from typing import Any

from pathprobe import grpcwait, reporters, rtt, timing
from pathprobe.loadgen.call import HANDSHAKE_PROBES, CallSpec, Outcome, Target, pc
from pathprobe.tls import TlsFiles


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


def cached_tokens(usage: Any) -> int | None:
    """``Usage.cached_tokens`` where the server's proto has that field (None otherwise, and when a
    field with presence is unset)."""
    if usage is None:
        return None
    field = usage.DESCRIPTOR.fields_by_name.get("cached_tokens")
    if field is None:
        return None
    if getattr(field, "has_presence", False) and not usage.HasField("cached_tokens"):
        return None
    return int(usage.cached_tokens)


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
    out.request_bytes = len(data)
    return data, (tuple(headers.items()) + auth if headers else auth) or None


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
        declared: list[tuple[str, str | bytes]] = []
        # a deadline gRPC's core sends exactly, declared: the server measures how long it held the call
        self.timeout_s = grpcwait.declare(timeout_s, declared) or timeout_s
        auth = (("authorization", f"Bearer {api_key}"),) if api_key else ()
        self._auth: tuple[tuple[str, str], ...] = (*auth, *((k, str(v)) for k, v in declared))
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
                self._call_stream(data, md, out, spec.keep_text)
            else:
                resp_bytes, call = self._unary.with_call(data, timeout=self.timeout_s, metadata=md)
                t2 = pc()
                resp = pb.GenerateResponse.FromString(resp_bytes)
                out.t_end = t3 = pc()
                out.decode_ns = t3 - t2
                out.response_bytes = len(resp_bytes)
                out.tokens_out = resp.usage.completion_tokens if resp.HasField("usage") else len(resp.token_ids)
                out.tokens_in = resp.usage.prompt_tokens if resp.HasField("usage") else None
                out.cached_tokens = cached_tokens(resp.usage if resp.HasField("usage") else None)
                if spec.keep_text:
                    out.text.append(resp.text)
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

    def _call_stream(self, data: bytes, md: Any, out: Outcome, keep_text: bool = False) -> None:
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
            t = pc()
            dec += t - ta
            out.decodes.append((ta, t))
            out.response_bytes += len(raw)
            if keep_text and chunk.text:
                out.text.append(chunk.text)
            if chunk.token_ids or chunk.text:
                times.append(ta)
                emits.append(chunk.emit_ms)
                out.fwd_ms.append(chunk.fwd_ms)
                n += len(chunk.token_ids) or 1
            if chunk.HasField("usage"):
                usage = chunk.usage
        out.t_end = pc()
        out.decode_ns = dec
        out.tokens_out = usage.completion_tokens if usage is not None else n
        out.tokens_in = usage.prompt_tokens if usage is not None else None
        out.cached_tokens = cached_tokens(usage)
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
        self.timeout_s = timeout_s  # its grpc-timeout is exact and declared (pathprobe.loadgen.h2grpc)
        self._auth = (("authorization", f"Bearer {api_key}"),) if api_key else ()
        self.channel = Channel(address)
        self._ping = PingEstimate(address)

    def route(self, stream: bool) -> str:
        return "grpc.GenerateStream" if stream else "grpc.Generate"

    def call(self, spec: CallSpec, headers: dict[str, str], out: Outcome) -> None:
        self._call(spec, headers, out)
        if out.ok:
            self._ping.apply(out)

    def read_age_ms(self) -> float | None:
        return self.channel.reads.age_ms

    def _call(self, spec: CallSpec, headers: dict[str, str], out: Outcome) -> None:
        pb = self._pb
        data, md = _grpc_request(pb, spec, headers, self._auth, out)
        if spec.stream:
            self._stream(data, md, out, spec.keep_text)
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
            out.cached_tokens = cached_tokens(resp.usage if resp.HasField("usage") else None)
            if spec.keep_text:
                out.text.append(resp.text)
            out.ok, out.status = True, "OK"
        else:
            out.t_end = pc()
            out.ok = False
            if res.code == 0:  # OK without exactly one message: what grpcio reports for a unary call
                out.status, out.error = "INTERNAL", f"unary call answered with {len(got)} messages"
            else:
                out.status, out.error = res.status, res.details
        out.entries = timing.parse_chain(res.server_timing + res.header_timing)  # trailers, then headers

    def _stream(self, data: bytes, md: Any, out: Outcome, keep_text: bool = False) -> None:
        pb = self._pb
        st: dict[str, Any] = {"dec": 0, "n": 0, "usage": None}
        times = out.token_times
        channel = self.channel

        def on_message(raw: bytes, ta: int) -> None:
            t = pc()
            chunk = pb.GenerateChunk.FromString(raw)
            t1 = pc()
            st["dec"] += t1 - t
            out.decodes.append((t, t1))
            out.response_bytes += len(raw)
            if keep_text and chunk.text:
                out.text.append(chunk.text)
            if chunk.token_ids or chunk.text:
                times.append(ta)
                if channel.reads.arrived_at is not None:  # the read this message came in
                    out.token_rx.append(channel.reads.arrived_at)
                out.emit_ms.append(chunk.emit_ms)
                out.fwd_ms.append(chunk.fwd_ms)
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
        out.cached_tokens = cached_tokens(usage)
        out.ok, out.status = True, "OK"

    def close(self) -> None:
        self.channel.close()
