"""The run's state in one Locust process (:class:`Runtime`, one per ``Environment``).

It holds the configuration, the aggregator and the JSONL writer, the prompt set, the
arrival schedule, the tracing, the loop monitor and client-wait tracker, and the
Prometheus export; it starts and stops them with the test and flushes the records
between requests. The events that drive it are in :mod:`pathprobe.loadgen.listeners`,
what workers and master exchange in :mod:`pathprobe.loadgen.distributed`.
"""

from __future__ import annotations

import logging
import os
import platform
import time
import weakref
from collections.abc import Callable

import gevent
from locust.env import Environment
from locust.runners import MasterRunner, WorkerRunner
from pathprobe import genai
from pathprobe.errors import ConfigError
from pathprobe.loadgen import clientwait, datasets, hist
from pathprobe.loadgen import metrics as metrics_mod
from pathprobe.loadgen import monitor as monitor_mod
from pathprobe.loadgen import prompts as prompts_mod
from pathprobe.loadgen import sessions as sessions_mod
from pathprobe.loadgen import traces as traces_mod
from pathprobe.loadgen.arrival import Schedule
from pathprobe.loadgen.config import Config
from pathprobe.loadgen.outputs import JsonlWriter, SummaryFile, write_outputs
from pathprobe.loadgen.records import METRICS, Aggregator, Totals
from pathprobe.loadgen.replay import Replay
from pathprobe.loadgen.slices import in_slices
from pathprobe.loadgen.tracing import Tracing

log = logging.getLogger("pathprobe.loadgen")

#: seconds between two flushes of the records (histograms, records.jsonl, metrics, spans)
LOCAL_FLUSH_S = 0.25
#: records per slice of a periodic flush; the event loop runs between slices, so a flush never
#: holds the loop (and every user's next request) for more than a ms or two (one 1 s flush of
#: ~4k records held it ~100 ms and cut a 16-user run's req/s by half; slices of 128 records of an
#: interleaved run, 8 configurations, held it 5-10 ms: the demo's own busy lag at c=4)
FLUSH_SLICE = 16


class Runtime:
    """pathprobe's state for one Locust ``Environment`` (get it with :func:`runtime`)."""

    def __init__(self, environment: Environment) -> None:
        self.env = environment
        self.cfg = Config.from_options(environment.parsed_options)
        self.agg = Aggregator()
        self.worker_agg = Aggregator()  # worker: what this worker measured (cumulative)
        self.writer: JsonlWriter | None = None
        self.schedule: Schedule | None = None
        self.prompts: prompts_mod.PromptSet | None = None
        self.tracing: Tracing | None = None
        self.started = False
        self.share = 1.0
        self.finals: dict[str, Totals] = {}
        self.final_sent = False
        self.flusher: gevent.Greenlet[[], None] | None = None
        self.start_wall = 0.0
        self.end_wall = 0.0
        self.last_summary: SummaryFile | None = None
        self.monitor: monitor_mod.LoopMonitor | None = None
        self.waits: clientwait.WaitTracker | None = None
        self.next_flush = 0.0
        self.client_wires: dict[str, monitor_mod.MonitorWire] = {}  # master: each worker's monitor data
        self.metrics: metrics_mod.LoadMetrics | None = None  # Prometheus export (processes that run users)
        self.client: monitor_mod.ClientBlock | None = None
        self._prompts_key: tuple[object, ...] | None = None
        #: --trace: the trace's entries and the corpus its prompts are cut from (read at init),
        #: this process's share of it (made at test start), and this worker's rank among ``of``
        #: (dealt by the master; a single process replays everything)
        self.trace_entries: list[traces_mod.TraceEntry] = []
        self.corpus: datasets.Corpus | None = None
        self.replay: Replay | None = None
        self.rank = 0
        self.of = 1
        #: called when this process has recorded its whole share of the trace (a worker: tell the master)
        self.on_trace_done: Callable[[], None] = self.end_run
        self.trace_done_workers: set[str] = set()  # master: the workers that have recorded their share
        #: --sessions over ShareGPT: each conversation's user turns; handed out round robin
        self.conversations: list[list[prompts_mod.Prompt]] = []
        self._conversation = 0
        #: --sessions: the system prompt all sessions share ("" = none); this run's id in first messages
        self.system_prompt = ""
        self.run_nonce = sessions_mod.run_nonce()

    # role
    @property
    def role(self) -> str:
        r = self.env.runner
        if isinstance(r, MasterRunner):
            return "master"
        if isinstance(r, WorkerRunner):
            return "worker"
        return "local"

    @property
    def worker(self) -> str:
        r = self.env.runner
        if isinstance(r, WorkerRunner):
            return str(r.worker_index)
        return "local"

    # lifecycle
    def start_test(self) -> None:
        self.cfg = Config.from_options(self.env.parsed_options)  # workers: master's flags have arrived
        self.agg = Aggregator()
        self.worker_agg = Aggregator()
        self.finals = {}
        self.client_wires = {}
        self.client = None
        self.trace_done_workers = set()
        self.final_sent = False
        self.start_wall = time.time()
        self.started = False
        if self.metrics is not None:
            self.metrics.label = self.cfg.label
        if self.role != "worker":
            if self.writer is not None:
                self.writer.close()
            path = os.path.join(self.cfg.out, "records.jsonl")
            self.writer = JsonlWriter(path, self.cfg.records_detail) if self.cfg.records else None
            if self.writer is not None:
                self.writer.open_fresh()
        if self.role in ("local", "worker"):
            self.ensure_started()
        if self.role in ("local", "worker"):
            # this process runs users: watch its event loop for the whole run
            self.monitor = monitor_mod.LoopMonitor().start()
            # and book the time a response waits for the loop as the client's, not the network's
            self.waits = clientwait.WaitTracker().start()
        self.next_flush = time.monotonic() + LOCAL_FLUSH_S
        if self.role == "local":
            # the records are flushed by the users between two requests (after_request); this
            # greenlet only covers a run whose requests outlast the flush interval
            self.flusher = gevent.spawn(self._flush_loop)

    def prepare(self) -> None:
        """Build the prompt set (loads the tokenizer): done at init, before the clock runs."""
        cfg = self.cfg
        key = (
            cfg.prompt_set,
            cfg.prompt,
            cfg.prompt_tokens,
            cfg.prompt_lengths,
            cfg.prompt_file,
            cfg.tokenizer,
            cfg.seed,
            cfg.corpus,
            cfg.trace,
            cfg.trace_format,
            cfg.sessions,
            cfg.system_prompt_tokens,
        )
        if self._prompts_key != key:
            if cfg.trace:  # the trace's own lengths: every prompt is cut from the corpus at its turn
                self.trace_entries = traces_mod.read(cfg.trace, cfg.trace_format)
                self.corpus = datasets.load_corpus(cfg.corpus, prompts_mod.load_tokenizer(cfg.tokenizer))
                self.prompts = None
            else:
                self.prompts = prompts_mod.build(
                    cfg.prompt_set,
                    base=cfg.prompt,
                    tokens=cfg.prompt_tokens,
                    lengths=cfg.prompt_lengths,
                    path=cfg.prompt_file or None,
                    tokenizer=cfg.tokenizer,
                    seed=cfg.seed,
                    corpus=cfg.corpus,
                )
            self.conversations = []
            if cfg.sessions and cfg.prompt_set == "sharegpt" and cfg.prompt_file:  # each session one conversation
                tok = prompts_mod.load_tokenizer(cfg.tokenizer)
                self.conversations = datasets.read_sharegpt_conversations(cfg.prompt_file, tok)
            self.system_prompt = ""
            if cfg.sessions and cfg.system_prompt_tokens:  # one text for every session: their shared prefix
                n, spec = cfg.system_prompt_tokens, cfg.tokenizer
                self.system_prompt = prompts_mod.exact_length_cached(
                    cfg.prompt, n, spec, lambda: prompts_mod.load_tokenizer(spec)
                ).text
            self._prompts_key = key
            # every route's histograms + the loop monitor's, allocated before the clock runs: one route per
            # configuration of a --mix. Allocated lazily at the first flush instead (2.5 MB and ~5 ms each),
            # an 18-configuration interleaved run held its loop 0.5 s mid-run on a quiet machine and 14 s
            # on a busy one, long enough that two configurations sent no warm-up call (2026-12-03)
            hist.prefill(len(METRICS) * max(1, len(cfg.mix)) + 2)
            # the loop's cached clock went stale while we blocked; timers (Locust's -t) must not fire early
            gevent.get_hub().loop.update_now()

    def ensure_started(self) -> None:
        if self.started:
            return
        cfg = self.cfg
        self.prepare()
        if cfg.arrival in ("constant", "poisson"):
            rate = cfg.rate * self.share
            seed = cfg.seed * 1000 + (int(self.worker) if self.worker.isdigit() else 0)
            self.schedule = Schedule(rate, cfg.arrival, cfg.ramp, seed=seed)
        else:
            self.schedule = None
        self.replay = None
        if cfg.trace and self.corpus is not None:
            self.replay = Replay(self.trace_entries, self.corpus, cfg.time_scale, self.rank, self.of)
            log.info(
                "pathprobe: replaying %d of the trace's %d requests (share %d of %d)",
                self.replay.total,
                len(self.trace_entries),
                self.rank,
                self.of,
            )
            if self.replay.total == 0:  # more workers than requests: nothing for this one
                gevent.spawn(self.on_trace_done)
        if self.tracing is None:
            self.tracing = Tracing.create(cfg, self.env.parsed_options)
        self.started = True

    def new_session(self, session_id: str, turns: int, script: list[prompts_mod.Prompt]) -> sessions_mod.Session:
        """A session with this run's system prompt and (unless --shared-first-message) its first-message tag."""
        tag = "" if self.cfg.shared_first_message else sessions_mod.first_message_tag(self.run_nonce, session_id)
        return sessions_mod.Session(session_id, turns, script=script, system=self.system_prompt, tag=tag)

    def next_conversation(self) -> list[prompts_mod.Prompt]:
        """The next recorded conversation for a new session ([] when sessions use the prompt set)."""
        if not self.conversations:
            return []
        conv = self.conversations[self._conversation % len(self.conversations)]
        self._conversation += 1
        return conv

    def trace_recorded(self) -> None:
        """A user recorded one request of the trace; the last of this process's share ends its part."""
        if self.replay is not None and self.replay.done_one():
            gevent.spawn(self.on_trace_done)

    def end_run(self) -> None:
        """The whole trace is recorded: stop the test (headless: and quit, as ``-t`` does)."""
        runner = self.env.runner
        if runner is None:
            return
        log.info("pathprobe: the trace is replayed; stopping")
        if getattr(self.env.parsed_options, "headless", False):
            runner.quit()
        else:
            runner.stop()

    def _flush_loop(self) -> None:
        while True:
            gevent.sleep(LOCAL_FLUSH_S)
            if time.monotonic() >= self.next_flush + 5 * LOCAL_FLUSH_S:  # no request ended for a while
                self.flush()

    def flush(self) -> None:
        """Records into the histograms and records.jsonl, finished spans to their exporter."""
        self.next_flush = time.monotonic() + LOCAL_FLUSH_S
        if self.role == "local":
            self.flush_local(yielding=True)  # other users' responses are read between slices
        if self.tracing is not None:
            self.tracing.drain(pause=_yield)

    def after_request(self) -> None:
        """Called by a user right after it recorded a request and before it sends the next: the
        flushing happens here, outside every timed request of this user (with one user, outside
        every request), instead of on a timer that fires while a response waits for the loop."""
        if time.monotonic() >= self.next_flush:
            self.flush()

    def flush_local(self, yielding: bool = False) -> None:
        """Histograms, JSONL and metrics for the pending records, ``FLUSH_SLICE`` at a time.

        ``yielding`` (the periodic flush): the event loop runs between slices. Each slice is
        taken off ``pending`` only when it is processed, and the greenlet can only be killed at
        the yield, so a flush cut short by the end of the test loses nothing: the rest is still
        pending for the final flush."""
        pending = self.agg.pending

        def take(n: int) -> int:
            part = pending[:n]
            del pending[:n]
            self.agg.add_batch(part)
            if self.writer is not None:
                self.writer(part)
            if self.metrics is not None:
                self.metrics.observe(part)
            return len(part)

        # records added meanwhile wait for the next flush
        in_slices(take, len(pending), FLUSH_SLICE, gevent.sleep if yielding else None)

    def serve_metrics(self) -> None:
        """Start the Prometheus endpoint when a port is given (flag or env), and the GenAI metrics' OTLP
        export when one is configured (:func:`pathprobe.genai.setup_otlp`); once per process."""
        port, host = self.cfg.metrics_port, self.cfg.metrics_host
        if self.metrics is not None:
            return
        otlp = genai.setup_otlp("pathprobe-loadgen")
        if not port and otlp is None:
            return
        self.metrics = metrics_mod.LoadMetrics(self.cfg.label, otlp=otlp, prometheus=bool(port))
        if not port:
            return
        try:
            self.metrics.serve(host, port)
        except OSError as exc:
            raise ConfigError(f"metrics-port: cannot serve on {host}:{port}: {exc.strerror or exc}") from None
        log.info("pathprobe: Prometheus metrics on http://%s:%d/metrics", host, port)

    def meta(self) -> dict[str, object]:
        from pathprobe import __version__
        from pathprobe.loadgen.targets import parse_host

        o = self.env.parsed_options
        host = self.env.host or getattr(o, "host", "") or ""
        try:
            kind = parse_host(host)[0]
        except ConfigError:
            kind = None
        import locust

        cfg = self.cfg
        return {
            "host": host,
            "target_kind": kind,
            "stream": cfg.stream,
            "openai_api": cfg.openai_api if kind == "openai" else None,
            "arrival": cfg.arrival,
            "rate": cfg.rate if cfg.arrival != "closed" else None,
            "ramp_s": cfg.ramp if cfg.arrival != "closed" else None,
            "users": getattr(o, "num_users", None),
            "max_tokens": cfg.max_tokens,
            "ignore_eos": cfg.ignore_eos,
            "prompt_set": cfg.prompt_set,
            "prompt_tokens": cfg.prompt_tokens if cfg.prompt_set == "fixed" else None,
            "prompt_lengths": list(cfg.prompt_lengths) if cfg.prompt_set in ("sweep", "mixed") else None,
            "trace": cfg.trace or None,
            "time_scale": cfg.time_scale if cfg.trace else None,
            "start_wall": self.start_wall,
            "end_wall": self.end_wall or time.time(),
            "duration_s": round((self.end_wall or time.time()) - self.start_wall, 3),
            "label": cfg.label,
            "role": self.role,
            "workers": len(self.finals) if self.role == "master" else None,
            "histogram": "HdrHistogram, 1 us unit, 4 significant figures",
            "versions": {"pathprobe": __version__, "locust": locust.__version__, "python": platform.python_version()},
        }

    def stop_monitor(self) -> monitor_mod.MonitorWire | None:
        """Stop this process's loop monitor; its wire data (None when it never ran)."""
        if self.waits is not None:
            self.waits.stop()
            self.waits = None
        if self.monitor is None:
            return None
        self.monitor.stop()
        wire = self.monitor.to_wire()
        self.monitor = None
        return wire

    def stop_test_local(self) -> None:
        if self.flusher is not None:
            self.flusher.kill(block=True)
            self.flusher = None
        wire = self.stop_monitor()
        if wire is not None:
            self.client_wires = {"local": wire}
        self.flush_local()
        self.end_wall = time.time()
        self.write_summary()

    def write_summary(self) -> None:
        """summary.json/.csv and histograms.json of this process's aggregate; the saturation warnings."""
        if self.writer is not None:
            self.writer.close()
        self.client = monitor_mod.merge_blocks(self.client_wires, self.cfg.lag_threshold_ms)
        self.last_summary = write_outputs(self.cfg.out, self.agg, self.meta(), client=self.client)
        for line in monitor_mod.warning_lines(self.client):
            log.warning("pathprobe: %s", line)


_RUNTIMES: weakref.WeakKeyDictionary[Environment, Runtime] = weakref.WeakKeyDictionary()


def _yield() -> None:
    """Let the event loop run (other users' responses) between two slices of a flush."""
    gevent.sleep(0)


def runtime(environment: Environment) -> Runtime:
    """The environment's runtime, made on first use."""
    rt = _RUNTIMES.get(environment)
    if rt is None:
        rt = _RUNTIMES[environment] = Runtime(environment)
    return rt


def find(environment: Environment) -> Runtime | None:
    """The environment's runtime if one was made (None: pathprobe never ran in it)."""
    return _RUNTIMES.get(environment)
