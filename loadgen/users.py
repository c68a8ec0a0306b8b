"""Locust users that record every request with its segment split.

Import this module in a locustfile to get pathprobe's accounting (it registers the
plugin's event listeners and command-line arguments):

    from pathprobe.loadgen.users import LLMUser            # picks gRPC/HTTP/OpenAI from --host
    from pathprobe.loadgen.users import GrpcLLMUser, HttpLLMUser, OpenAIUser

Every request fires Locust's ``request`` event (name = route, e.g. ``grpc.Generate``;
request_type = ``grpc``/``http``/``openai``) and adds one record to the run's
aggregator. A request interrupted by the end of the test is recorded as ``CANCELLED``.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
import time
from typing import Any

from grpc.experimental import gevent as grpc_gevent

grpc_gevent.init_gevent()  # before any channel exists; makes grpc cooperative under gevent

import gevent  # noqa: E402
from locust import User, constant, task  # noqa: E402
from locust.contrib.fasthttp import FastHttpUser  # noqa: E402
from pathprobe import segments, serverreports  # noqa: E402
from pathprobe.loadgen import plugin  # noqa: E402  (registers listeners and CLI args)
from pathprobe.loadgen.records import STOPPED  # noqa: E402
from pathprobe.loadgen.targets import CallSpec, Outcome, Target, make_target, parse_host  # noqa: E402

pc = time.perf_counter_ns
_user_ids = itertools.count()
_SPLIT_FIELDS = tuple(f.name for f in dataclasses.fields(segments.Split))


class RequestFailed(Exception):
    """What Locust's stats see for a failed request: ``STATUS: message``."""


class _LLMMixin:
    """The request loop shared by every pathprobe user class."""

    environment: Any
    host: str | None
    target_kind: str | None = None  # None: taken from the host URL

    def _pp_init(self) -> None:
        self._rt = plugin.runtime(self.environment)
        self._rt.ensure_started()
        self._uid = next(_user_ids)
        self._seq = itertools.count()
        host = self.host or self.environment.host or ""
        kind, _ = parse_host(host)
        if self.target_kind and kind != self.target_kind:
            # e.g. HttpLLMUser given grpc://: say so instead of failing obscurely
            from pathprobe.errors import ConfigError

            raise ConfigError(f"host: {type(self).__name__} needs a {self.target_kind} target, got {host!r}")
        self._host = host
        cfg = self._rt.cfg
        #: call-by-call interleaving (--mix): one target per configuration, a shuffled order per cycle
        self._mix: dict[str, tuple[str, Target]] = {
            name: (url, make_target(url, cfg.timeout_s, cfg.openai_api, cfg.grpc_client, cfg.tls, cfg.api_key))
            for name, url in cfg.mix
        }
        self._order: list[str] = []
        self._cycle = -1
        self._rng = random.Random(cfg.seed * 100_003 + self._uid)
        self.target: Target = (
            next(iter(self._mix.values()))[1]
            if self._mix
            else make_target(host, cfg.timeout_s, cfg.openai_api, cfg.grpc_client, cfg.tls, cfg.api_key)
        )

    def _next_config(self) -> tuple[str | None, Target, str]:
        """(configuration name, its target, its URL): the next of this cycle's shuffled order."""
        if not self._mix:
            return None, self.target, self._host
        if not self._order:
            self._order = list(self._mix)
            self._rng.shuffle(self._order)
            self._cycle += 1
        name = self._order.pop()
        url, target = self._mix[name]
        return name, target, url

    def _pp_stop(self) -> None:
        target = getattr(self, "target", None)
        if target is not None:
            target.close()
        for _, t in getattr(self, "_mix", {}).values():
            if t is not target:
                t.close()

    def generate(self) -> None:
        """One request: pace (open loop), send, measure, record, fire Locust's event."""
        rt = self._rt
        cfg = rt.cfg
        lag_ns = 0
        if rt.schedule is not None:
            intended = rt.schedule.next_ns()
            now = pc()
            if intended > now:
                gevent.sleep((intended - now) / 1e9)
            lag_ns = max(0, pc() - intended)
        if cfg.busy_ms > 0:  # test hook (--pathprobe-busy-ms): a client too busy for its load
            _burn(cfg.busy_ms)
        prompt = rt.prompts.next()
        spec = CallSpec(
            prompt=prompt.text,
            max_tokens=prompt.max_tokens or cfg.max_tokens,
            stream=cfg.stream,
            ignore_eos=cfg.ignore_eos,
            model=cfg.model,
            request_id=f"{rt.worker}-{self._uid}-{next(self._seq)}",
            tokens_in=prompt.tokens,
        )
        config, target, url = self._next_config()
        route = target.route(cfg.stream)
        headers: dict[str, str] = {}
        out = Outcome()
        span = None
        waits = rt.waits
        if rt.tracing is not None:
            span, out.t0 = rt.tracing.start(route, target, spec, headers)
        ts = time.time()
        if waits is not None:
            waits.begin()
        try:
            target.call(spec, headers, out)
        except gevent.GreenletExit:
            _interrupted(out, STOPPED, "the test stopped while the request was in flight")
            raise
        except Exception as exc:
            _interrupted(out, "CLIENT_ERROR", f"{type(exc).__name__}: {exc}")
        except BaseException:
            _interrupted(out, "CANCELLED", "interrupted")
            raise
        finally:
            wait = waits.end() if waits is not None else (0.0, 0.0)
            if out.ok:  # round trips for a silent server's network estimate: outside e2e and client wait
                target.after_call(out)
            rec = build_record(out, spec, route, url, ts, lag_ns, self._uid, rt.worker, wait[0])
            if spec.stream:  # every resume's wait: what held chunks back on this side (see analysis.chunks)
                rec["client_wait_total_ms"] = wait[1]
            if config is not None:
                rec["config"] = config
                rec["cycle"] = self._cycle
            if span is not None:
                rt.tracing.end(span, rec, out.t_end)
            rt.agg.add(rec)
            if rec["status"] != STOPPED:  # like Locust's own users: a killed request is not a failure
                self.environment.events.request.fire(
                    request_type=target.kind,
                    name=route,
                    response_time=rec["latency_ms"],
                    response_length=out.response_bytes,
                    exception=None if rec["ok"] else RequestFailed(f"{rec['status']}: {rec['error']}"),
                    context={},
                    start_time=ts,
                    url=url,
                    response=None,
                )
            rt.after_request()  # records/spans flushed here: between this user's requests, never inside one


def _burn(ms: float) -> None:
    """Keep the CPU (and so the event loop) busy for ``ms`` of wall time, without yielding."""
    end = pc() + int(ms * 1e6)
    while pc() < end:
        pass


def _interrupted(out: Outcome, status: str, error: str) -> None:
    if out.t0 == 0:
        out.t0 = pc()
    out.t_end = pc()
    out.ok = False
    out.status = status
    out.error = error


def build_record(
    out: Outcome,
    spec: CallSpec,
    route: str,
    host: str,
    ts: float,
    lag_ns: int,
    user: int,
    worker: str,
    client_wait_ms: float = 0.0,
) -> dict[str, Any]:
    e2e = (out.t_end - out.t0) / 1e6
    enc = out.encode_ns / 1e6
    dec = out.decode_ns / 1e6
    lag = lag_ns / 1e6
    times = out.token_times
    ttft = itl = tpot = None
    if spec.stream:
        if times:
            ttft = (times[0] - out.t0) / 1e6
            itl = [(b - a) / 1e6 for a, b in itertools.pairwise(times)]
        else:
            itl = []
        n = out.tokens_out or 0
        if ttft is not None and n > 1:
            tpot = (e2e - ttft) / (n - 1)
    rep = out.server_report
    chain = serverreports.with_report(out.entries, rep)  # a server's own report as its hop, when it has a total
    overlap = 0.0
    if spec.stream and out.ok:  # decode that ran while the server was still producing: not on the path
        overlap = serverreports.decode_overlap(e2e, chain, rep, enc, dec)
        dec -= overlap
    emit = out.emit_ms if spec.stream and len(out.emit_ms) == len(times) and all(out.emit_ms) else None
    if out.ok:
        est = serverreports.network_estimate(chain, out.network_estimate_ms)
        s = serverreports.split(e2e, chain, rep, enc, dec, network_estimate_ms=est, client_wait_ms=client_wait_ms)
        # Split.as_dict() (dataclasses.asdict) costs ~18 us; the same dict built directly
        sp = {f: getattr(s, f) for f in _SPLIT_FIELDS}
        sp["links"] = list(s.links)
        sp["links_estimated"] = list(s.links_estimated)
        sp["hops"] = [
            {"label": h.label, "total": h.total, "serialization": h.serialization, "other": h.other} for h in s.hops
        ]
        client_wait_ms = s.client_wait
        kind = serverreports.network_estimate_kind(chain, out.network_estimate_kind) if s.network_estimated else None
    else:
        sp = kind = None
    return {
        "ts": ts,
        # t0 on the wall clock (CLOCK_REALTIME, what packet captures stamp), from the monotonic t0 and
        # the two clocks' offset read now: it moves only by NTP slewing (<= 0.05% of the request's time)
        "t0_wall_ns": out.t0 + time.time_ns() - pc(),
        "route": route,
        "target": host,
        "ok": out.ok,
        "status": out.status,
        "error": out.error,
        "e2e_ms": e2e,
        "latency_ms": e2e + lag,
        "client_encode_ms": enc,
        "client_decode_ms": dec,
        # of the stream's measured decode, what overlapped the server's own measured work (left out above)
        "client_decode_overlap_ms": overlap,
        "ttft_ms": ttft,
        "itl_ms": itl if itl is not None else [],
        # the server's emit offset of each token chunk (ms since it got the request; None: not reported)
        "emit_ms": emit,
        "tpot_ms": tpot,
        "tokens_in": out.tokens_in if out.tokens_in is not None else spec.tokens_in,
        "tokens_out": out.tokens_out,
        "schedule_lag_ms": lag,
        "client_wait_ms": client_wait_ms,
        "entries": out.entries,
        "hops": [hop.as_dict() for hop in chain.hops],
        "server_report": {"source": rep.source, "entries": rep.entries} if rep is not None else None,
        "network_estimate_ms": out.network_estimate_ms,
        # which estimate the split booked for a silent link (pathprobe.rtt kinds, or a forwarder's
        # "<kind>.connect"), None when every link is measured; the transport floor beside it
        "network_estimate_kind": kind,
        "network_floor_ms": out.network_floor_ms,
        "split": sp,
        "trace_id": None,
        "user": user,
        "worker": worker,
        "request_id": spec.request_id,
    }


class LLMUser(_LLMMixin, User):
    """Talks to whatever ``--host`` names: ``grpc://``, ``http://`` or ``openai+http://``."""

    abstract = False
    wait_time = constant(0)

    def on_start(self) -> None:
        self._pp_init()

    def on_stop(self) -> None:
        self._pp_stop()

    @task
    def llm(self) -> None:
        self.generate()


class GrpcLLMUser(LLMUser):
    """gRPC ``pathprobe.v1.LLM`` (one channel per user; deadline = ``--timeout-s``)."""

    target_kind = "grpc"


class _FastHttpBase(_LLMMixin, FastHttpUser):
    """FastHttpUser whose ``self.client`` stays usable for extra calls of your own;
    the LLM calls go through pathprobe's measured geventhttpclient connection."""

    abstract = True
    wait_time = constant(0)

    def __init__(self, environment: Any) -> None:
        host = self.host or environment.host or ""
        if host.startswith("openai+"):
            self.host = host[len("openai+") :]  # FastHttpUser wants http(s)://
        super().__init__(environment)
        self._orig_host = host

    def on_start(self) -> None:
        if getattr(self, "_orig_host", None):
            self.host = self._orig_host
        self._pp_init()

    def on_stop(self) -> None:
        self._pp_stop()

    @task
    def llm(self) -> None:
        self.generate()


class HttpLLMUser(_FastHttpBase):
    """Native JSON API ``POST /v1/generate`` (SSE with ``--stream``)."""

    abstract = True  # concrete in your locustfile: ``class MyUser(HttpLLMUser): pass``
    target_kind = "http"


class OpenAIUser(_FastHttpBase):
    """OpenAI-compatible completions/chat (``--openai-api``), stream or not; any such server."""

    abstract = True
    target_kind = "openai"
