"""One client connection of the frame relay and the upstream connection paired with it.

Frames are read with the one frame iterator (:func:`pathprobe.h2frames.frames`) and passed on
as bytes in runs; the relay steps in only for header blocks it rewrites, the trailers (the
gateway's ``server-timing`` appended), request bodies over the limit, streams it refuses, and
the ends of calls (metrics, spans). :mod:`pathprobe.gateway.h2proxy` describes the design.
"""

from __future__ import annotations

import asyncio
import logging

from hpack.exceptions import HPACKError
from pathprobe import loopwait, timing
from pathprobe.deadline import PUSHBACK_KEY
from pathprobe.errors import PathprobeError, Unavailable
from pathprobe.gateway import h2spans
from pathprobe.gateway.h2headers import ResponseReader, request_block
from pathprobe.gateway.h2settings import RelaySettings
from pathprobe.gateway.h2streams import CODE_NAMES, NO_TIME, Stream, grpc_error_block
from pathprobe.gateway.upstreams import Upstream
from pathprobe.h2frames import (
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    F_PRIORITY,
    GOAWAY,
    HEADERS,
    PATH,
    PING,
    PREFACE,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    BlockReader,
    FrameError,
    fragment,
    frame,
    frames,
    literal,
)
from pathprobe.timing import now_ms

log = logging.getLogger("pathprobe.gateway")
#: upstream connections being opened (asyncio keeps only weak references to running tasks)
_OPENING: set[asyncio.Task[None]] = set()


class UpstreamProto(asyncio.Protocol):
    def __init__(self, client: ClientConn) -> None:
        self.client = client
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.client.upstream_ready(self)

    def data_received(self, data: bytes) -> None:
        self.client.from_upstream(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.client.upstream_lost(exc)


class ClientConn(asyncio.Protocol):
    """One client connection and the upstream connection paired with it."""

    def __init__(self, settings: RelaySettings, clients: set[ClientConn]) -> None:
        self.settings = settings
        self.clients = clients  # the relay's open connections: this one is in it while open
        self.transport: asyncio.Transport | None = None
        self.up: UpstreamProto | None = None
        self.upstream: Upstream | None = None
        self.cbuf = bytearray()
        self.ubuf = bytearray()
        self.preface = False
        self.streams: dict[int, Stream] = {}
        self.max_sid = 0
        self.pending_up: list[bytes] = []  # client bytes held until the upstream connects
        self.tried: tuple[Upstream, ...] = ()
        self.cdec = BlockReader()  # the client's request header blocks
        self.responses = ResponseReader(settings.metrics, settings.tracing)  # the upstream's
        self.c_hdr: tuple[int, int, bytearray] | None = None  # (sid, flags, block) while CONTINUATIONs come
        self.u_hdr: tuple[int, int, bytes, bytearray] | None = None
        self.dead = False
        self.dead_why = ""
        self.dropped_sids: set[int] = set()
        self.unforwarded: set[int] = set()  # streams refused before the upstream saw them: none of their frames go
        # streams whose trailers were relayed, with the entries sent (bookkeeping after the write)
        self.finishes: list[tuple[Stream, dict[str, float] | None]] = []
        #: the relay loop's watch and this connection's socket (gw.wait); None: not measured (uvloop)
        self.watch = loopwait.watch_of()
        self.fd: int | None = None

    # ---------------------------------------------------------------- connection set-up
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.clients.add(self)
        self.fd = loopwait.fd_of(transport)
        self._connect()

    def _connect(self) -> None:
        try:
            u = self.settings.pool.acquire(self.tried)
        except Unavailable as exc:  # every upstream tried
            self._refuse_all(str(exc))
            return
        self.settings.pool.release(u)  # outstanding is counted per stream below
        self.upstream = u
        u.outstanding += len(self.streams)
        log.info("client connection -> upstream %s", u.target)
        host, _, port = u.target.rpartition(":")
        # held until it ends: the loop keeps only a weak reference to a task
        task = asyncio.ensure_future(self._open(u, host, int(port)))
        _OPENING.add(task)
        task.add_done_callback(_OPENING.discard)

    async def _open(self, u: Upstream, host: str, port: int) -> None:
        loop = asyncio.get_running_loop()
        try:
            ssl_ctx = self.settings.upstream_ssl
            if ssl_ctx is None:
                await loop.create_connection(lambda: UpstreamProto(self), host, port)
            else:
                await loop.create_connection(
                    lambda: UpstreamProto(self),
                    host,
                    port,
                    ssl=ssl_ctx,
                    server_hostname=self.settings.upstream_server_name or host,
                )
        except OSError as exc:
            why = f"upstream {u.target}: connect failed: {exc.strerror or exc}"
            u.mark(False, why)
            u.outstanding -= len(self.streams)
            self.upstream = None
            self.tried += (u,)
            if self.transport is None:
                return
            if len(self.tried) < len(self.settings.pool.upstreams):
                self._connect()
            else:
                self._refuse_all(why)

    def upstream_ready(self, up: UpstreamProto) -> None:
        if self.transport is None:  # the client left meanwhile
            up.transport.close()  # type: ignore[union-attr]
            return
        self.up = up
        if self.pending_up:
            up.transport.write(b"".join(self.pending_up))  # type: ignore[union-attr]
            self.pending_up = []

    def _refuse_all(self, why: str) -> None:
        """No upstream: answer as a minimal HTTP/2 server, every call UNAVAILABLE, then GOAWAY."""
        self.dead_why = why
        self.dead = True
        for st in list(self.streams.values()):
            self._finish(st, "14", why)
        self.max_sid = 0
        if self.transport is None:
            return
        self.transport.write(frame(SETTINGS, 0, 0, b""))
        data = b"".join(self.pending_up) + bytes(self.cbuf)  # from the start, preface included
        self.pending_up = []
        self.cbuf = bytearray()
        self.preface = False
        if data:
            self._refuse_frames(data)

    def _refuse_frames(self, data: bytes) -> None:
        buf = self.cbuf
        buf += data
        if not self.preface:
            if len(buf) < 24:
                return
            del buf[:24]
            self.preface = True
        out = []
        pos = 0
        for start, end, ftype, flags, sid in frames(buf):
            pos = end
            if ftype == SETTINGS and not flags & 1:
                out.append(frame(SETTINGS, 1, 0, b""))
            elif ftype == PING and not flags & 1:
                out.append(frame(PING, 1, 0, bytes(buf[start + 9 : end])))
            elif ftype == HEADERS and sid > self.max_sid:
                self.max_sid = sid
                block = grpc_error_block(14, self.dead_why, NO_TIME, True)
                out.append(frame(HEADERS, END_STREAM | END_HEADERS, sid, block))
                if self.settings.metrics is not None:
                    self.settings.metrics.observe("?", "UNAVAILABLE", 0.0, None, 0.0)
        del buf[:pos]
        if out and self.transport is not None:
            answered = self.max_sid > 0
            if answered:  # then GOAWAY: the client's next call reconnects and tries the upstreams again
                out.append(frame(GOAWAY, 0, 0, self.max_sid.to_bytes(4, "big") + (0).to_bytes(4, "big")))
            self.transport.write(b"".join(out))
            if answered:
                self.transport.close()

    # ---------------------------------------------------------------- client -> upstream
    def data_received(self, data: bytes) -> None:
        if self.dead:
            self._refuse_frames(data)
            return
        # when these bytes can first have been readable: a call that starts in them waited from then
        floor = self.watch.take(self.fd) if self.watch is not None and self.fd is not None else None
        buf = self.cbuf
        buf += data
        pos = 0
        if not self.preface:
            if len(buf) < 24:
                return
            if bytes(buf[:24]) != PREFACE:
                log.warning("client did not open with the HTTP/2 preface; closing")
                if self.transport is not None:
                    self.transport.close()
                return
            self.preface = True
            pos = 24  # forwarded with the first run of frames
        out: list[bytes] = []
        run = 0  # start of the run of frames forwarded untouched
        decode_after: list[tuple[int, bytes]] = []
        new_streams: list[Stream] = []
        settings = self.settings
        start = end = pos  # what is consumed: up to the end of the last whole frame
        for pos, end, ftype, flags, sid in frames(buf, start):
            if self.unforwarded and ftype not in (HEADERS, CONTINUATION) and sid in self.unforwarded:
                # the upstream never saw this stream: RST_STREAM / WINDOW_UPDATE on it would be a connection error
                if run < pos:
                    out.append(bytes(buf[run:pos]))
                run = end
                length = end - pos - 9
                if ftype == DATA and length and self.transport is not None:  # give the client's window back
                    self.transport.write(frame(WINDOW_UPDATE, 0, 0, length.to_bytes(4, "big")))
                continue
            if ftype == DATA:
                length = end - pos - 9
                st = self.streams.get(sid)
                if st is not None:
                    st.received += length
                    if st.received > settings.max_body:
                        if run < pos:
                            out.append(bytes(buf[run:pos]))
                        run = end
                        out.append(self._too_large(st))  # in order: after this stream's HEADERS
                        self.dropped_sids.add(sid)
                if sid in self.dropped_sids:  # a stream the gateway reset: its DATA goes nowhere
                    if run < pos:
                        out.append(bytes(buf[run:pos]))
                    run = end
                    if length and self.transport is not None:  # give the client's window back
                        self.transport.write(frame(WINDOW_UPDATE, 0, 0, length.to_bytes(4, "big")))
            elif ftype in (HEADERS, CONTINUATION):
                payload = bytes(buf[pos + 9 : end])
                if ftype == HEADERS:
                    if sid not in self.streams and sid > self.max_sid:
                        self.max_sid = sid
                        st = Stream(sid, now_ms())
                        st.wait = loopwait.wait_ms(floor, st.t0)
                        self.streams[sid] = st
                        new_streams.append(st)
                        if self.upstream is not None:
                            self.upstream.outstanding += 1
                    try:
                        _prio, frag = fragment(flags, payload)
                    except FrameError as exc:
                        self.connection_error(exc)
                        return
                    self.c_hdr = (sid, flags, bytearray(frag))
                else:
                    if self.c_hdr is not None:
                        self.c_hdr[2].extend(payload)
                if flags & END_HEADERS and self.c_hdr is not None:
                    hsid, hflags, block = self.c_hdr
                    self.c_hdr = None
                    if settings.rewrite:
                        # rewrite the whole block (decoded now): key checked, credential replaced,
                        # the CLIENT span's traceparent
                        if run < pos:
                            out.append(bytes(buf[run:pos]))
                        run = end
                        new = self._rewrite_block(hsid, bytes(block))
                        if self.dead:  # a connection error: nothing more goes anywhere
                            return
                        if new is not None:
                            out.append(frame(HEADERS, (hflags & END_STREAM) | END_HEADERS, hsid, new))
                    elif settings.decode:
                        decode_after.append((hsid, bytes(block)))
                elif settings.rewrite:
                    if run < pos:
                        out.append(bytes(buf[run:pos]))
                    run = end
            elif ftype == RST_STREAM:
                st = self.streams.get(sid)
                if st is not None:
                    self._finish(st, "1", "cancelled by the client")
        pos = end
        if run < pos:
            out.append(bytes(buf[run:pos]))
        del buf[:pos]
        if out:
            payload = b"".join(out) if len(out) > 1 else out[0]
            if self.up is not None and self.up.transport is not None:
                # stamp before the write: a preemption after it must not shrink gw.upstream (traced
                # streams are stamped when their CLIENT span starts, just before their header block is made)
                if new_streams and not settings.tracing:
                    t = now_ms()
                    for st in new_streams:
                        st.t_fwd = t
                self.up.transport.write(payload)
            elif not self.dead:
                self.pending_up.append(payload)
        for sid, req_block in decode_after:
            self._decode_request(sid, req_block)

    def _decode_request(self, sid: int, block: bytes) -> None:
        """Metrics label of a request: its ``:path`` (the block was forwarded already)."""
        try:
            path = self.cdec.read(block, PATH).get(b":path")
        except HPACKError as exc:
            log.warning("cannot decode a client header block: %s", exc)
            return
        st = self.streams.get(sid)
        if st is not None and path is not None:
            st.method = path.decode(errors="replace")

    def connection_error(self, exc: FrameError) -> None:
        """The client broke the protocol: GOAWAY with the error, its streams end, both connections close."""
        log.info("client connection error (h2 error %d): %s", exc.code, exc)
        if self.transport is not None:
            self.transport.write(
                frame(
                    GOAWAY,
                    0,
                    0,
                    self.max_sid.to_bytes(4, "big") + exc.code.to_bytes(4, "big") + str(exc).encode()[:200],
                )
            )
            self.transport.close()
        for st in list(self.streams.values()):
            self._finish(st, "1", f"client connection error: {exc}")
        self.dead = True
        self.dead_why = str(exc)
        if self.up is not None and self.up.transport is not None:
            self.up.transport.close()

    def _rewrite_block(self, sid: int, block: bytes) -> bytes | None:
        """A request header block to forward, or None when the caller's key is refused (the
        client then gets a trailers-only UNAUTHENTICATED and the upstream never sees the stream)."""
        try:
            headers = self.cdec.decode_all(block)
        except HPACKError as exc:  # the header table is out of step now: the connection cannot go on
            self.connection_error(FrameError(f"cannot decode a header block: {exc}", 9))  # COMPRESSION_ERROR
            return None
        st = self.streams.get(sid)
        try:
            return request_block(self.settings, st, headers, self.upstream)
        except PathprobeError as exc:
            if st is not None:
                self._refuse(st, exc)
            return None

    def _refuse(self, st: Stream, exc: PathprobeError) -> None:
        """Answer a stream trailers-only (with the retry hint of an overload refusal); the
        upstream never sees it."""
        self.unforwarded.add(st.sid)
        own = st.own()
        code = exc.grpc_code.value[0]
        retry = getattr(exc, "retry_after_ms", None)
        extra = [(PUSHBACK_KEY.encode(), str(int(retry)).encode())] if retry is not None else []
        if self.transport is not None:
            self.transport.write(
                frame(HEADERS, END_STREAM | END_HEADERS, st.sid, grpc_error_block(code, exc.message, own, True, extra))
            )
        self._finish(st, str(code), exc.message, own, None, True)

    def _too_large(self, st: Stream) -> bytes:
        """Body over the limit: end the stream both ways; returns the upstream RST frame.

        When no response has reached the client yet, it gets a trailers-only answer,
        RESOURCE_EXHAUSTED with the limit named, then RST_STREAM(NO_ERROR) to stop its sending
        (RFC 9113 8.1: a complete response, then a reset with NO_ERROR). Otherwise it gets
        RST_STREAM(ENHANCE_YOUR_CALM), which gRPC reports as RESOURCE_EXHAUSTED. Either way the
        stream ends in a reset, which keeps the connection safe: frames the upstream already
        sent for the stream become a stream error at the client, not a connection error, and
        their header blocks still reach its HPACK decoder.
        """
        msg = f"request body: over the gateway's limit of {self.settings.max_body} bytes (--max-body-bytes)"
        log.info("stream %d: %s", st.sid, msg)
        if self.transport is not None:
            if not st.resp_seen:
                block = grpc_error_block(8, msg, st.own(), True)
                self.transport.write(frame(HEADERS, END_STREAM | END_HEADERS, st.sid, block))
                self.transport.write(frame(RST_STREAM, 0, st.sid, (0).to_bytes(4, "big")))
            else:
                self.transport.write(frame(RST_STREAM, 0, st.sid, (0xB).to_bytes(4, "big")))
        self._finish(st, "8", msg)
        return frame(RST_STREAM, 0, st.sid, (8).to_bytes(4, "big"))

    # ---------------------------------------------------------------- upstream -> client
    def from_upstream(self, data: bytes) -> None:
        t_in = now_ms()
        buf = self.ubuf
        buf += data
        out: list[bytes] = []
        run = 0
        decode_after: list[tuple[int, bytes, bool]] = []
        end = 0  # what is consumed: up to the end of the last whole frame
        for pos, end, ftype, flags, sid in frames(buf):
            if ftype in (HEADERS, CONTINUATION):
                payload = bytes(buf[pos + 9 : end])
                if ftype == HEADERS:
                    try:
                        prio, frag = fragment(flags, payload)
                    except FrameError as exc:  # the upstream broke the protocol: as if it went away
                        if self.up is not None and self.up.transport is not None:
                            self.up.transport.close()
                        self.upstream_lost(exc)
                        return
                    self.u_hdr = (sid, flags, prio, bytearray(frag))
                elif self.u_hdr is not None:
                    self.u_hdr[3].extend(payload)
                u_hdr = self.u_hdr
                if u_hdr is not None and u_hdr[1] & END_STREAM:
                    # the trailers: hold the frames of this block, re-emit it with gw.* appended
                    if run < pos:
                        out.append(bytes(buf[run:pos]))
                    run = end
                    if flags & END_HEADERS:
                        hsid, hflags, prio, block = u_hdr
                        self.u_hdr = None
                        st = self.streams.get(hsid)
                        own = st.own(t_in) if st is not None else None
                        extra = literal(b"server-timing", timing.format_entries(own).encode()) if own else b""
                        out.append(
                            frame(
                                HEADERS,
                                END_STREAM | END_HEADERS | (hflags & F_PRIORITY),
                                hsid,
                                prio + bytes(block) + extra,
                            )
                        )
                        decode_after.append((hsid, bytes(block), True))
                        if st is not None:
                            st.resp_seen = True
                            st.ended = True
                            self.finishes.append((st, own))
                elif flags & END_HEADERS and u_hdr is not None:
                    hsid = u_hdr[0]
                    self.u_hdr = None
                    st = self.streams.get(hsid)
                    if st is not None:
                        st.resp_seen = True
                    decode_after.append((hsid, bytes(u_hdr[3]), False))
            elif ftype == RST_STREAM:
                st = self.streams.get(sid)
                if st is not None and not st.ended:
                    code = int.from_bytes(buf[pos + 9 : pos + 13], "big") if end - pos >= 13 else 0
                    self._finish(st, {8: "1", 7: "14"}.get(code, "2"), f"upstream reset the stream (h2 error {code})")
        pos = end
        if run < pos:
            out.append(bytes(buf[run:pos]))
        del buf[:pos]
        if out and self.transport is not None:
            self.transport.write(b"".join(out) if len(out) > 1 else out[0])
        # bookkeeping after the bytes are on their way
        finishes = self.finishes
        codes: dict[int, str] = {}
        sts: dict[int, str] | None = None
        if self.settings.decode:
            codes, sts = self.responses.read(decode_after, self.upstream.target if self.upstream else "?")
        if finishes:
            self.finishes = []
            for st, own in finishes:
                # without decoding the status is unknown to the relay: label it "?" rather than guess
                self._finish(
                    st,
                    codes.get(st.sid, "2" if self.settings.decode else "?"),
                    None,
                    own,
                    sts.get(st.sid) if sts is not None else None,
                    own is not None,
                )

    # ---------------------------------------------------------------- ends
    def _finish(
        self,
        st: Stream,
        code: str,
        error: str | None,
        own: dict[str, float] | None = None,
        upstream_st: str | None = None,
        sent: bool = False,
    ) -> None:
        """Bookkeeping for a stream that ended; ``sent``: ``own`` went to the client (after ``upstream_st``)."""
        if self.streams.pop(st.sid, None) is None:
            return
        if self.upstream is not None:
            self.upstream.outstanding -= 1
        own = own or st.own()
        m = self.settings.metrics
        if m is not None:
            name = CODE_NAMES.get(code, code)
            m.observe(
                st.method, name, own["gw.total"], self.upstream.target if self.upstream else None, own["gw.upstream"]
            )
            if self.upstream is not None and code in ("14", "4"):
                m.upstream_error(self.upstream.target, name)
        if st.span is not None:
            h2spans.end(st, code, error, own, upstream_st, sent)

    def goaway(self) -> None:
        """Tell the client no stream after the ones it opened will be served (graceful drain)."""
        if self.u_hdr is not None:  # never between the frames of one header block
            asyncio.get_running_loop().call_later(0.005, self.goaway)
            return
        if self.transport is not None and self.preface:
            self.transport.write(frame(GOAWAY, 0, 0, self.max_sid.to_bytes(4, "big") + (0).to_bytes(4, "big")))
        if not self.streams and self.transport is not None:
            self.transport.close()

    def upstream_lost(self, exc: Exception | None) -> None:
        """The upstream went away: fail what was in flight, GOAWAY the client, close."""
        u = self.upstream
        why = f"upstream {u.target if u else '?'}: connection lost" + (f" ({exc})" if exc else "")
        if self.streams and u is not None:
            u.mark(False, why)
        out = []
        for st in list(self.streams.values()):
            own = st.own()
            out.append(
                frame(HEADERS, END_STREAM | END_HEADERS, st.sid, grpc_error_block(14, why, own, not st.resp_seen))
            )
            self._finish(st, "14", why, own, None, True)
        out.append(frame(GOAWAY, 0, 0, self.max_sid.to_bytes(4, "big") + (0).to_bytes(4, "big")))
        if self.transport is not None:
            self.transport.write(b"".join(out))
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.clients.discard(self)
        for st in list(self.streams.values()):
            self._finish(st, "1", "client connection lost")
        if self.up is not None and self.up.transport is not None:
            self.up.transport.close()
