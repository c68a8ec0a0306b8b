"""The compare report as a typed structure: what ``report.json`` holds, built once by the lab
(:func:`pathprobe.analysis.lab.compare.build_report`) and read back by ``--rerender``.

Every reader (the section builders, the plots, the command's summary) reads these attributes.
Blocks whose keys vary with what was measured (statistics, checks) name the keys the pages read
and keep every other key as it came (``extra="allow"``), so ``report.json`` keeps them. A number
that was NaN or infinite is ``null`` in JSON, hence the ``| None`` on measured figures.
``docs/report.schema.json`` is :func:`report_schema`; ``make schema`` writes it.
"""

from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, JsonValue, PrivateAttr, model_validator

#: bumped when a key changes meaning or moves; a reader checks it before trusting the rest
SCHEMA_VERSION = 2  # 2: the throughput frontier (Report.frontier, ScoreRow.frontier_*)

Num = float | None  # a measured figure: null in JSON where it was NaN (nothing to measure)
Json = dict[str, JsonValue]


class Open(BaseModel):
    """A block with the keys the pages read typed and any other key kept as it came."""

    model_config = ConfigDict(extra="allow", ser_json_inf_nan="null")


class Estimate(Open):
    """A point estimate with its 95% interval (bootstrap)."""

    value: Num = None
    lo: Num = None
    hi: Num = None


class Percentiles(Open):
    """n, mean, p50/p95/p99 and max of one quantity (ms); only n where nothing was measured."""

    n: int = 0
    mean: Num = None
    p50: Num = None
    p95: Num = None
    p99: Num = None
    max: Num = None


class Summary(Open):
    """The primary metric: n, mean, spread and p50/p95/p99 each with its 95% bootstrap interval."""

    n: int = 0
    mean: Num = None
    std: Num = None
    min: Num = None
    max: Num = None
    p50: Estimate | None = None
    p95: Estimate | None = None
    p99: Estimate | None = None


class Comparison(Open):
    """One configuration against the baseline (Welch's t-test, effect sizes)."""

    p50_diff_ms: Num = None
    p_value: Num = None
    p_adjusted: Num = None
    cliffs_delta: Num = None
    cohens_d: Num = None
    magnitude: str = ""
    significant: bool = False
    verdict: str | None = None


class ClientHealth(Open):
    """The load generator's own health over the rounds (the worst round's figures)."""

    saturated: bool = False
    contended: bool = False
    saturated_rounds: list[int] = []
    contended_rounds: list[int] = []
    reason: str | None = None
    loop_lag_ms: dict[str, Num] = {}
    loop_busy_lag_ms: dict[str, Num] = {}
    loop_wait_lag_ms: dict[str, Num] = {}  # the part waiting for a core (other processes), where measured
    cpu_percent: dict[str, Num] = {}
    processes: int = 1
    rounds: dict[str, Json] = {}  # each round's own block (1-based in the *_rounds lists, 0-based here)


class PathCpu(Open):
    cpu_s: float
    requests: int
    ms_per_request: float
    what: str = ""


class Hop(Open):
    label: str
    total_mean_ms: Num = None
    serialization_mean_ms: Num = None
    own_mean_ms: Num = None


class Link(Open):
    label: str
    mean_ms: Num = None
    p50_ms: Num = None
    estimated: int = 0


class HopPath(Open):
    """A path hop by hop: the network of every link, each reporting hop's own time (means, ms)."""

    n: int = 0
    of: int = 0
    hops: list[Hop] = []
    links: list[Link] = []
    unsplit_mean_ms: Num = None


class AccountingDifference(Open):
    why: str = ""
    status: str = ""
    explained: bool = False


class Accounting(Open):
    """Every request counted again by the hops, by status."""

    error: str | None = None
    client: dict[str, int] = {}
    lost: int | None = None
    differences: list[AccountingDifference] = []


class Chunks(Open):
    buffering: bool = False
    buffered_streams: int = 0
    streams: int = 0


class TaxPart(Open):
    p50: Num = None
    mean: Num = None


class PathTax(Open):
    """One configuration's path tax (everything but the engine) and its parts, per call."""

    n: int = 0
    path_tax: TaxPart | None = None
    network_hop1: TaxPart | None = None
    network_hop2: TaxPart | None = None
    serialization: TaxPart | None = None
    other: TaxPart | None = None
    engine: TaxPart | None = None


class PairedDiff(Open):
    median: Estimate
    mean: Num = None


class Paired(Open):
    """The paired path-tax difference to its partner (``against``: the direct path of the same client
    protocol, or the baseline; calls of the same cycle) and its verdict."""

    n: int = 0
    against: str | None = None
    path_tax: PairedDiff | None = None
    verdict: str | None = None
    why: str | None = None
    min_effect_ms: Num = None


class Group(Open):
    """Every figure of one configuration at one concurrency (rounds pooled)."""

    requests: int = 0
    ok: int = 0
    errors: int = 0
    errors_by_status: dict[str, int] = {}
    stopped: int = 0
    first_error: str | None = None
    ok_without_server_timing: int = 0
    duration_s: Num = None
    rps: Num = None
    e2e: Summary | Percentiles | None = None
    latency: Summary | None = None
    segments: dict[str, Percentiles] = {}
    network_estimated: int = 0
    network_estimate_kind: dict[str, int] = {}
    client_wait: Percentiles | None = None
    chunks: Chunks | None = None
    ttft: Percentiles | None = None
    itl: Percentiles | None = None
    tpot: Percentiles | None = None
    schedule_lag: Percentiles | None = None
    rounds: dict[str, Percentiles] | None = None
    client: ClientHealth | None = None
    path_cpu: PathCpu | None = None
    path: HopPath | None = None
    accounting: Accounting | None = None
    path_tax: PathTax | None = None
    paired: Paired | None = None
    comparison: Comparison | None = None
    self_report: Json | None = None

    def metric(self, name: str) -> Summary | None:
        """The primary metric's summary (``e2e`` or ``latency``), with its intervals."""
        got = self.latency if name == "latency" else self.e2e
        return got if isinstance(got, Summary) else None

    def segment_mean(self, seg: str) -> Num:
        got = self.segments.get(seg)
        return got.mean if got is not None else None


class NetworkInfo(Open):
    """A network condition (a delaying relay) on one hop."""

    hop: str
    describe: str
    delay_ms_one_way: Num = None
    expected_request_ms: Num = None


class ColdStart(Open):
    first_ms: Num = None
    probe_ms: Num = None
    warmup_p50_ms: Num = None
    n: int = 0


class SlowTrace(Open):
    """One of a configuration's slowest requests, with its trace file when traced."""

    trace_id: str | None = None
    e2e_ms: float
    round: int = 0
    concurrency: int | None = None
    file: str | None = None


class TraceCheck(Open):
    """The trace-based split against the in-band one (``outside``: calls beyond the rule, per segment).
    ``unseen_hops``: hops that export no spans; for them ``together`` segments are compared as one sum
    and ``skipped`` ones not at all (a trace cannot split what it does not see)."""

    matched: int = 0
    agree: bool = False
    outside: dict[str, int] = {}
    unseen_hops: list[str] = []
    together: list[str] = []
    skipped: list[str] = []


class TraceCompleteness(Open):
    requests: int = 0
    share: Num = None
    missing: dict[str, int] = {}


class HopPropagation(Open):
    hop: str
    verdict: str  # own span | passes unchanged | new root | wrong parent | no span | unknown
    detail: str = ""


class Propagation(Open):
    """What one request with a traceparent of our own found, hop by hop (the server last)."""

    trace_id: str = ""
    holds: bool = False
    error: str = ""
    hops: list[HopPropagation] = []


class Memory(Open):
    """Resident memory (RSS) of a configuration's own processes (not the shared server), in MB."""

    rest_mb: Num = None  # after start-up and its probe, before any load
    load_mb: Num = None  # the most seen after a measured run: the plateau under load


class FrontierPoint(Open):
    """One load of a frontier search (requests/s, or concurrent streams), the path and its direct
    path measured at the same time: what the path added, and the load generators' own health."""

    load: float
    added_p50_ms: Num = None
    added_p99_ms: Num = None
    requests: int = 0
    errors: int = 0
    client_saturated: bool = False
    reason: str = ""
    clients: dict[str, Json] = {}  # path / direct: each load process's health at this load
    achieved: Num = None  # requests/s the path's load process completed
    cpu_ms_per_request: Num = None  # the path's own processes
    rss_mb: Num = None


class FrontierKnee(Open):
    """One bound's frontier: ``load`` held (the highest measured that did), ``next_load`` did not;
    None: even the first load crossed it (``load``), or nothing measured did (``next_load``)."""

    bound_ms: float
    load: Num = None
    next_load: Num = None


class FrontierSearch(Open):
    """One search (unary rates, or streams): its knees, its points, the points refused (client saturated)."""

    knees: list[FrontierKnee] = []
    points: list[FrontierPoint] = []
    refused: list[FrontierPoint] = []
    note: str = ""

    def knee(self, bound_ms: float) -> FrontierKnee | None:
        return next((k for k in self.knees if k.bound_ms == bound_ms), None)

    def at(self, load: float | None) -> FrontierPoint | None:
        return next((p for p in self.points if p.load == load), None)


class FrontierTarget(Open):
    against: str
    unary: FrontierSearch | None = None
    stream: FrontierSearch | None = None


class Frontier(Open):
    """The throughput frontier of each configuration (see analysis/lab/frontier.py)."""

    bounds_ms: list[float]
    stream_bound_ms: Num = None
    method: str = ""
    config: Json = {}
    targets: dict[str, FrontierTarget] = {}


class ScoreRow(Open):
    """One configuration against the direct path of its client protocol (see analysis/report/scorecard.py)."""

    target: str
    against: str
    protocol: str | None = None
    pairs: int = 0
    added_p50: Estimate | None = None
    added_p99: Estimate | None = None
    added_ttft_p50: Estimate | None = None
    added_ttft_p99: Estimate | None = None
    added_gap_p50: Estimate | None = None
    added_gap_p99: Estimate | None = None
    segments: dict[str, Num] = {}  # mean paired difference per segment (ms)
    buffering: bool | None = None  # streams only: the path held a stream back
    cpu_ms_per_request: Num = None
    rss_rest_mb: Num = None
    rss_load_mb: Num = None
    #: the throughput frontier, when measured: each bound's knee in requests/s (key: the bound in ms,
    #: as text), and in concurrent streams at the stream bound
    frontier_rps: dict[str, FrontierKnee] | None = None
    frontier_streams: FrontierKnee | None = None


class Scorecard(Open):
    """What each configuration adds, in the field's terms, at the lowest concurrency measured."""

    concurrency: int
    formula: str
    rows: list[ScoreRow] = []


class PayloadHop(Open):
    """One reporting hop's serialization at one payload point: its mean, and per MB of the payload's
    bytes (the request's and the response's, as the client measured them on its link)."""

    label: str
    serialization_mean_ms: Num = None
    ms_per_mb: Num = None


class PayloadRow(Open):
    """One configuration at one concurrency and payload point (a sweep's figures, rounds pooled)."""

    target: str
    concurrency: int
    prompt_tokens: int
    max_tokens: int
    n: int = 0
    errors: int = 0
    first_error: str | None = None
    request_bytes: Num = None  # median, as the client serialized it (None: the client cannot see it)
    response_bytes: Num = None  # median, as the client received it
    e2e_p50: Num = None
    ttft_p50: Num = None  # streams
    path_tax_p50: Num = None  # e2e less the engine's queueing and inference
    serialization_mean_ms: Num = None  # every hop's and the client's
    client_ms_per_mb: Num = None  # the client's encode + decode per MB
    hops: list[PayloadHop] = []  # outermost first
    links: list[Link] = []  # network per link, outermost first


class Limit(Open):
    """One limit on the way that compare set for the sweep's largest payload."""

    where: str  # e.g. "server", "gateway", "nginx"
    setting: str  # the flag or directive, e.g. "--max-body-bytes", "client_max_body_size"
    value: str
    why: str = ""


class PayloadSweep(Open):
    """A payload sweep: every (prompt_tokens, max_tokens) point per configuration and concurrency, and
    the limits set for its largest payload. ``by_concurrency`` and the verdicts hold the first point."""

    points: list[tuple[int, int]] = []
    primary: tuple[int, int] | None = None
    rows: list[PayloadRow] = []
    limits: list[Limit] = []


class Target(Open):
    """One configuration: what was started, how it went, and its figures per concurrency."""

    status: str
    reason: str | None = ""
    kind: str = ""
    protocol: str | None = None
    mode: str | None = None
    upstream: str | None = None
    url: str = ""
    notes: list[str] = []
    tls_handshake: dict[str, float] | None = None
    network: NetworkInfo | None = None
    by_concurrency: dict[str, Group] = {}
    cold_start: ColdStart | None = None
    slowest: list[SlowTrace] | None = None
    trace_completeness: TraceCompleteness | None = None
    trace_agreement: dict[str, TraceCheck] | None = None
    witness: Json | None = None
    memory: Memory | None = None
    propagation: Propagation | None = None

    def at(self, conc: int) -> Group | None:
        return self.by_concurrency.get(str(conc))

    @property
    def problem(self) -> bool:
        return self.status in ("failed", "skipped")


class Verdict(Open):
    concurrency: int
    target: str
    against: str | None = None  # the configuration it is paired with (interleaved runs)
    text: str
    client_flag: str | None = None


class ClientWarning(Open):
    concurrency: int
    kind: Literal["saturated", "contended"]
    targets: list[str]
    text: str


class SelfReportLine(Open):
    concurrency: int
    target: str
    text: str


class Method(Open):
    """How the figures were made (the numbers and the words)."""

    primary_metric: str
    summary: str
    stream: bool = False


class Meta(Open):
    """Where and when: start time, engine, host, versions, the config, the CPU placement."""

    started: str = ""
    engine: str = ""
    host: str = ""
    cpus: int | None = None
    versions: dict[str, JsonValue] = {}
    placement: Json | None = None
    load_average: list[float] | None = None  # the machine's 1, 5 and 15 min load averages as the run ended
    config: Json
    rerendered_from: str | None = None


class Report(BaseModel):
    """A compare's report. ``to_json`` is ``report.json``; :meth:`read` reads one back."""

    model_config = ConfigDict(extra="allow", ser_json_inf_nan="null")

    schema_version: int = SCHEMA_VERSION
    meta: Meta
    baseline: str
    concurrency: list[int]
    method: Method
    network: NetworkInfo | None = None
    targets: dict[str, Target]
    verdicts: list[Verdict] = []
    e2e_verdicts: list[Verdict] | None = None
    interleaved: bool = False
    client_warnings: list[ClientWarning] = []
    scorecard: Scorecard | None = None
    payload: PayloadSweep | None = None
    frontier: Frontier | None = None
    self_reports: list[SelfReportLine] = []
    server_startup_ms: dict[str, float] | None = None
    traces_error: str | None = None
    witness_error: str | None = None
    witness: Json | None = None
    files: dict[str, str] | None = None

    #: each configuration's primary-metric samples per concurrency (the CDF plot); not in report.json
    _samples: dict[str, dict[int, list[float]]] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _versioned(self) -> Report:
        self.model_fields_set.add("schema_version")  # always written, also when defaulted
        return self

    @property
    def primary(self) -> str:
        return self.method.primary_metric

    @property
    def samples(self) -> dict[str, dict[int, list[float]]]:
        return self._samples

    def with_samples(self, samples: dict[str, dict[int, list[float]]]) -> Report:
        self._samples = samples
        return self

    def to_dict(self) -> Json:
        """report.json's content: keys that were never set are left out, as they were before the model."""
        got: Json = json.loads(self.model_dump_json(exclude_unset=True))
        return got

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    @classmethod
    def read(cls, text: str) -> Report:
        return cls.model_validate_json(text)


def report_schema() -> Json:
    """report.json's JSON schema (``docs/report.schema.json``)."""
    schema = Report.model_json_schema(mode="serialization")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return schema


def main() -> None:
    """``python -m pathprobe.analysis.report.model``: print the schema (``make schema`` writes it)."""
    print(json.dumps(report_schema(), indent=1))


if __name__ == "__main__":
    main()
