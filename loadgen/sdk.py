"""A load target that goes through the official ``openai`` SDK (``openai-sdk+http://``).

Applications talk to their model server through an SDK, not through a raw HTTP client;
this target shows what that SDK adds. Its HTTP client's transport is wrapped so the
record still splits honestly:

- ``client.encode`` = from the call until the SDK hands the request to the transport
  (building the body and headers, validation, retries' bookkeeping);
- ``client.decode`` = for a unary call, the SDK turning the response into its typed
  object; for a stream, per event, from the arrival of the bytes that carried it (or, when
  those bytes came in one read with an earlier event's, from when the loop asked for it)
  until the SDK yields it (its SSE decoding and typed parsing). Each token's arrival is the
  arrival of its bytes, not the moment the SDK was done with them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

from pathprobe import rtt, timing
from pathprobe.loadgen import nullrtt
from pathprobe.loadgen.call import HANDSHAKE_PROBES, CallSpec, Outcome, Target
from pathprobe.loadgen.http_base import take_report

pc = time.perf_counter_ns
#: the API key the SDK sends (the SDK requires one; local servers ignore it)
OPENAI_API_KEY = "OPENAI_API_KEY"


class _Clock:
    """When the transport sent the request and when each piece of the body arrived."""

    __slots__ = ("arrivals", "sent")

    def __init__(self) -> None:
        self.sent = 0
        self.arrivals: list[int] = []

    def reset(self) -> None:
        self.sent = 0
        self.arrivals.clear()

    def last_arrival(self) -> int:
        return self.arrivals[-1] if self.arrivals else pc()


def _timed_transport(http: Any, clock: _Clock) -> Any:
    """A transport of the SDK's HTTP library that stamps the request and body chunks."""

    class TimedStream(http.SyncByteStream):
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def __iter__(self) -> Iterator[bytes]:
            for chunk in self.inner:
                clock.arrivals.append(pc())
                yield chunk

        def close(self) -> None:
            self.inner.close()

    class TimedTransport(http.HTTPTransport):
        def handle_request(self, request: Any) -> Any:
            clock.sent = pc()
            resp = super().handle_request(request)
            clock.arrivals.append(pc())  # the response head
            resp.stream = TimedStream(resp.stream)
            return resp

    return TimedTransport()


class OpenAISdkTarget(Target):
    kind = "openai"

    def __init__(self, base_url: str, timeout_s: float = 60.0, api: str = "completions") -> None:
        import openai
        from openai import _base_client

        sdk_client: Any = _base_client  # which HTTP library it imports depends on the SDK's version
        http = sdk_client.httpx2 if hasattr(sdk_client, "httpx2") else sdk_client.httpx  # the SDK's own
        self.address = base_url
        self.api = api
        self.clock = _Clock()
        self.http = openai.DefaultHttpxClient(transport=_timed_transport(http, self.clock), timeout=timeout_s)
        self.client = openai.OpenAI(
            base_url=base_url.rstrip("/") + "/v1",
            http_client=self.http,
            max_retries=0,
            api_key=os.environ.get(OPENAI_API_KEY) or "none",
            timeout=timeout_s,
        )
        self._openai = openai
        self._model: str | None = None
        parts = urlsplit(base_url)  # the shortest TCP handshake: the network floor to a silent server
        self.connect_ms = rtt.tcp_handshake_ms(
            parts.hostname or "127.0.0.1", parts.port or (443 if parts.scheme == "https" else 80), HANDSHAKE_PROBES
        )
        self._models_url = base_url.rstrip("/") + "/v1/models"
        self._null = nullrtt.NullRoundTrip(self._null_request)

    def _null_request(self) -> bool:
        """``GET /v1/models`` through the SDK's own HTTP client and pool (the requests' connection)."""
        try:
            self.http.get(self._models_url).read()
        except Exception:
            return False
        return True

    def after_call(self, out: Outcome) -> None:
        self._null.apply(out)

    def route(self, stream: bool) -> str:
        base = "openai-sdk.chat" if self.api == "chat" else "openai-sdk.completions"
        return base + ".stream" if stream else base

    def default_model(self) -> str:
        if self._model is None:
            try:
                self._model = self.client.models.list().data[0].id
            except Exception:
                self._model = "default"
        return self._model

    def call(self, spec: CallSpec, headers: dict[str, str], out: Outcome) -> None:
        model = spec.model or self.default_model()
        clock = self.clock
        clock.reset()
        kwargs: dict[str, Any] = {
            "model": model,
            "max_tokens": spec.max_tokens,
            "temperature": 0.0,
            "stream": spec.stream,
            "extra_headers": headers or None,
        }
        if spec.ignore_eos:
            kwargs["extra_body"] = {"ignore_eos": True}
        if spec.stream:
            kwargs["stream_options"] = {"include_usage": True}
        create: Callable[..., Any]
        if self.api == "chat":
            create = self.client.chat.completions.with_raw_response.create
            kwargs["messages"] = [{"role": "user", "content": spec.prompt}]
        else:
            create = self.client.completions.with_raw_response.create
            kwargs["prompt"] = spec.prompt
        out.t0 = t0 = out.t0 or pc()
        try:
            raw = create(**kwargs)
            out.encode_ns = clock.sent - t0
            out.entries = timing.parse_chain(raw.headers.get_list("server-timing"))
            if spec.stream:
                self._stream(raw.parse(), out)
            else:
                t1 = pc()
                obj = raw.parse()
                out.t_end = pc()
                out.decode_ns = out.t_end - t1
                self._usage(obj, out)
                take_report(raw.headers, obj.model_extra or {}, out)  # vLLM's metrics, TGI's headers
            nullrtt.floor(out, self.connect_ms)
            out.ok, out.status = True, "OK"
        except self._openai.APIStatusError as exc:
            out.t_end = pc()
            out.encode_ns = (clock.sent - t0) if clock.sent else 0
            out.ok, out.status = False, str(exc.status_code)
            out.error = str(exc.message)[:500]
            out.entries = timing.parse_chain(exc.response.headers.get_list("server-timing"))
        except self._openai.APIError as exc:  # connection errors, timeouts
            out.t_end = pc()
            out.ok, out.status, out.error = False, type(exc).__name__, str(exc)[:500]

    def _stream(self, events: Any, out: Outcome) -> None:
        clock = self.clock
        dec = 0
        asked = 0  # when this loop asked the SDK for the next event
        for ev in events:
            ta = clock.last_arrival()
            # the SDK's work on this event: from its bytes' arrival, or from when it was asked for it
            # when those bytes came with an earlier event's (a burst: several events in one read),
            # so a burst's parsing is counted once, never once per event
            t = pc()
            dec += t - max(ta, asked)
            out.decodes.append((max(ta, asked), t))
            choices = ev.choices or ()
            if any((c.delta.content if self.api == "chat" else c.text) for c in choices):
                out.token_times.append(ta)
            self._usage(ev, out)
            extra = ev.model_extra or {}
            st = extra.get("server_timing")
            if st:
                out.entries = timing.parse_chain(st)
            if extra.get("metrics"):  # vLLM: its per-request metrics ride on the final usage chunk
                take_report(None, extra, out)
            asked = pc()
        out.t_end = pc()
        out.decode_ns = dec
        if out.tokens_out is None:
            out.tokens_out = len(out.token_times)

    @staticmethod
    def _usage(obj: Any, out: Outcome) -> None:
        usage = getattr(obj, "usage", None)
        if usage is not None:
            out.tokens_out = usage.completion_tokens
            out.tokens_in = usage.prompt_tokens

    def close(self) -> None:
        self.http.close()
