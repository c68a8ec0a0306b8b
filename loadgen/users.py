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

import itertools
import random
import time

from grpc.experimental import gevent as grpc_gevent

grpc_gevent.init_gevent()  # before any channel exists; makes grpc cooperative under gevent

import gevent  # noqa: E402
from locust import User, constant, task  # noqa: E402
from locust.contrib.fasthttp import FastHttpUser  # noqa: E402
from locust.env import Environment  # noqa: E402
from pathprobe.loadgen import plugin  # noqa: E402  (registers listeners and CLI args)
from pathprobe.loadgen.recordbuild import build_record  # noqa: E402  (importable from here too)
from pathprobe.loadgen.records import STOPPED  # noqa: E402
from pathprobe.loadgen.sessions import Session  # noqa: E402
from pathprobe.loadgen.targets import CallSpec, Outcome, Target, make_target, parse_host  # noqa: E402

pc = time.perf_counter_ns
#: --trace: how long a user whose process has handed out its whole share waits before looking again
IDLE_S = 0.5
_user_ids = itertools.count()


class RequestFailed(Exception):
    """What Locust's stats see for a failed request: ``STATUS: message``."""


class _LLMMixin:
    """The request loop shared by every pathprobe user class."""

    environment: Environment
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
        self._session: Session | None = None  # --sessions: the conversation in progress
        self._session_seq = itertools.count()
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
        item = None
        intended: int | None = None
        if rt.replay is not None:  # --trace: the next entry of this process's share, at its time
            item = rt.replay.take()
            if item is None:  # all taken: the run ends once every process has recorded its share
                gevent.sleep(IDLE_S)
                return
            intended = item.intended_ns
        elif rt.schedule is not None:
            intended = rt.schedule.next_ns()
        if intended is not None:
            now = pc()
            if intended > now:
                gevent.sleep((intended - now) / 1e9)
            lag_ns = max(0, pc() - intended)
        session = None
        if cfg.sessions:  # the next turn of this user's conversation, after its think time
            session = self._session
            if session is None or session.done:
                script = rt.next_conversation()
                turns = min(cfg.turns, len(script)) if script else cfg.turns
                sid = f"{rt.worker}-{self._uid}-{next(self._session_seq)}"
                session = self._session = rt.new_session(sid, turns, script)
            elif cfg.think_time > 0:
                gevent.sleep(cfg.think_time)
        if cfg.busy_ms > 0:  # test hook (--pathprobe-busy-ms): a client too busy for its load
            _burn(cfg.busy_ms)
        scripted = session.scripted() if session is not None else None
        if item is not None:
            prompt = item.prompt
        elif scripted is not None:
            prompt = scripted
        else:
            prompts = rt.prompts
            assert prompts is not None  # built by rt.ensure_started() in _pp_init
            prompt = prompts.next()
        turn = session.turn(prompt) if session is not None else None
        spec = CallSpec(
            prompt=turn.prompt if turn is not None else prompt.text,
            max_tokens=prompt.max_tokens or cfg.max_tokens,
            stream=cfg.stream,
            ignore_eos=cfg.ignore_eos,
            model=cfg.model,
            request_id=f"{rt.worker}-{self._uid}-{next(self._seq)}",
            tokens_in=prompt.tokens if turn is None else None,
            messages=turn.messages if turn is not None else None,
            keep_text=turn is not None,
        )
        config, target, url = self._next_config()
        route = target.route(cfg.stream)
        headers: dict[str, str] = {}
        if turn is not None and cfg.session_header:  # session affinity for routers
            headers[cfg.session_header] = turn.session_id
        out = Outcome()
        span = None
        waits = rt.waits
        tracing = rt.tracing
        if tracing is not None:
            span, out.t0 = tracing.start(route, target, spec, headers)
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
            age = target.read_age_ms()  # the kernel's bound on the same wait: the tighter one is booked
            last_wait = wait[0] if age is None else min(wait[0], age)
            if out.ok:  # round trips for a silent server's network estimate: outside e2e and client wait
                target.after_call(out)
            rec = build_record(out, spec, route, url, ts, lag_ns, self._uid, rt.worker, last_wait)
            if spec.stream:  # every resume's wait: what held chunks back on this side (see analysis.chunks)
                rec["client_wait_total_ms"] = wait[1]
            if config is not None:
                rec["config"] = config
                rec["cycle"] = self._cycle
            if item is not None:
                rec["trace_index"] = item.entry.index
            if out.cached_tokens is not None:  # only what the server reported
                rec["cached_tokens"] = out.cached_tokens
            if turn is not None and session is not None:
                rec["session_id"] = turn.session_id
                rec["turn"] = turn.index
                if out.ok:
                    session.answered(turn, "".join(out.text))
                else:  # a failed turn ends its session: the next request starts a new one
                    self._session = None
            if tracing is not None:
                tracing.end(span, rec, out.t_end)
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
            if item is not None:
                rt.trace_recorded()


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

    def __init__(self, environment: Environment) -> None:
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
