"""The load generator's configuration: one :class:`Config` per run, from flags and environment.

The rule: a flag (a constructor argument) wins over the environment, which wins over the
default. The variables read are documented constants of :mod:`pathprobe.environment`
(:data:`ENV` maps each field to its variable; the target's TLS files are
``PATHPROBE_LOAD_TLS_CA`` / ``_CERT`` / ``_KEY`` / ``_SERVER_NAME``). No Locust import: the
flags themselves are declared in :mod:`pathprobe.loadgen.flags`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pathprobe import environment as env_vars
from pathprobe.errors import ConfigError
from pathprobe.loadgen import prompts as prompts_mod
from pathprobe.loadgen import traces as traces_mod
from pathprobe.loadgen.monitor import DEFAULT_LAG_THRESHOLD_MS
from pathprobe.records import RECORD_DETAILS
from pathprobe.tls import TlsFiles

#: environment fallbacks of --api-key and --target-* (the flag wins)
ENV_API_KEY = env_vars.PATHPROBE_API_KEY
ENV_TLS = env_vars.PATHPROBE_LOAD_TLS
#: field -> the variable read when its flag is not given
ENV: dict[str, str] = {
    "api_key": ENV_API_KEY,
    "metrics_port": env_vars.PATHPROBE_LOAD_METRICS_PORT,
    "metrics_host": env_vars.PATHPROBE_LOAD_METRICS_HOST,
}
DEFAULT_OUT = "pathprobe-load"
DEFAULT_METRICS_HOST = "127.0.0.1"


@dataclass
class Config:
    out: str = DEFAULT_OUT
    stream: bool = False
    openai_api: str = "completions"
    model: str = ""
    max_tokens: int = 16
    ignore_eos: bool = True
    prompt_set: str = "fixed"
    prompt: str = prompts_mod.DEFAULT_PROMPT
    prompt_tokens: int = 64
    prompt_lengths: tuple[int, ...] = prompts_mod.DEFAULT_LENGTHS
    prompt_file: str = ""
    #: text that prompts of a given token length are cut from (token-count lines, traces); "" = built-in
    corpus: str = ""
    tokenizer: str = "tiny"
    arrival: str = "closed"
    rate: float = 0.0
    ramp: float = 0.0
    #: open-loop replay of an arrival trace (pathprobe.loadgen.traces): its file, format, time scale
    trace: str = ""
    trace_format: str = ""
    time_scale: float = 1.0
    #: conversations (pathprobe.loadgen.sessions): on/off, turns per session, think time (s),
    #: the session affinity header's name ("" = none), a system prompt shared by every session (its
    #: length in tokens of --tokenizer, cut from --prompt; 0 = none), and whether every session's first
    #: message is the prompt set's as it is (default: tagged with the run and session, so turn 0 of
    #: one session shares no prefix with another's beyond the system prompt)
    sessions: bool = False
    turns: int = 3
    think_time: float = 0.0
    session_header: str = ""
    system_prompt_tokens: int = 0
    shared_first_message: bool = False
    timeout_s: float = 60.0
    grpc_client: str = "h2"
    traces_file: str = ""
    records: bool = True
    records_detail: str = "full"  # pathprobe.records.RECORD_DETAILS
    label: str = ""
    seed: int = 0
    lag_threshold_ms: float = DEFAULT_LAG_THRESHOLD_MS
    busy_ms: float = 0.0
    #: call-by-call interleaving: (name, url) per configuration; empty: every call goes to --host
    mix: tuple[tuple[str, str], ...] = ()
    api_key: str = ""
    tls: TlsFiles | None = None  # client TLS files for grpcs:// / https:// (None: system CAs)
    #: Prometheus /metrics of the client-side split, served by each process that runs users (0: off)
    metrics_port: int = 0
    metrics_host: str = DEFAULT_METRICS_HOST

    def __post_init__(self) -> None:
        if self.max_tokens <= 0:
            raise ConfigError(f"max-tokens: must be > 0, got {self.max_tokens}")
        if self.prompt_tokens <= 0:
            raise ConfigError(f"prompt-tokens: must be > 0, got {self.prompt_tokens}")
        if self.arrival != "closed" and self.rate <= 0:
            raise ConfigError(f"rate: --arrival {self.arrival} needs --rate R > 0 (requests/s)")
        if self.trace_format and self.trace_format not in traces_mod.FORMATS:
            raise ConfigError(
                f"trace-format: expected one of {', '.join(traces_mod.FORMATS)}, got {self.trace_format!r}"
            )
        if self.time_scale <= 0:
            raise ConfigError(f"time-scale: must be > 0, got {self.time_scale}")
        if self.trace and self.arrival != "closed":
            raise ConfigError(f"arrival: --trace sets every request's send time; drop --arrival {self.arrival}")
        if self.trace_format and not self.trace:
            raise ConfigError("trace-format: needs --trace FILE")
        if self.turns < 1:
            raise ConfigError(f"turns: must be >= 1, got {self.turns}")
        if self.think_time < 0:
            raise ConfigError(f"think-time: must be >= 0, got {self.think_time}")
        if self.records_detail not in RECORD_DETAILS:
            raise ConfigError(f"records-detail: one of {', '.join(RECORD_DETAILS)}, got {self.records_detail!r}")
        if self.system_prompt_tokens < 0:
            raise ConfigError(f"system-prompt-tokens: must be >= 0, got {self.system_prompt_tokens}")
        if self.sessions and (self.trace or self.arrival != "closed"):
            raise ConfigError("sessions: a session's turns follow each other (closed loop); drop --trace / --arrival")
        if self.sessions and self.mix:
            raise ConfigError("sessions: a session stays on one target; drop --mix")
        if self.session_header and not self.session_header.replace("-", "").isalnum():
            raise ConfigError(
                f"session-header: expected a header name (letters, digits, '-'), got {self.session_header!r}"
            )
        if self.timeout_s <= 0:
            raise ConfigError("timeout-s: must be > 0")
        if self.lag_threshold_ms <= 0:
            raise ConfigError("client-lag-threshold-ms: must be > 0")
        if self.busy_ms < 0:
            raise ConfigError("pathprobe-busy-ms: must be >= 0")
        if not 0 <= self.metrics_port <= 65535:
            raise ConfigError(f"metrics-port: must be a TCP port, 0..65535 (0 = off), got {self.metrics_port}")

    @classmethod
    def from_options(cls, o: Any, environ: Mapping[str, str] | None = None) -> Config:
        """Locust's parsed options (``None``: no flags) > ``environ`` (default ``os.environ``) > defaults."""
        env = os.environ if environ is None else environ
        given = _given(o)
        for name, var in ENV.items():
            if not given.get(name) and env.get(var):
                given[name] = _from_env(name, var, env[var])
        tls = TlsFiles.from_env(
            ENV_TLS, {k: _flag(o, f"target_{k}") or "" for k in ("ca", "cert", "key", "server_name")}, env, "--target"
        )
        given["tls"] = tls if (tls.ca or tls.cert or tls.server_name) else None
        return cls(**{k: v for k, v in given.items() if v is not None})


def _flag(o: Any, name: str) -> Any:
    return getattr(o, name, None) if o is not None else None


def _given(o: Any) -> dict[str, Any]:
    """The flags' values by field name, converted; None where a flag is absent (the default holds)."""

    def f(name: str) -> Any:  # argparse's values: untyped
        return _flag(o, name)

    lengths = f("prompt_lengths")
    lengths = None if lengths is None else tuple(prompts_mod.parse_int_list(str(lengths), "prompt-lengths"))
    no_eos, no_records = f("no_ignore_eos"), f("no_records")
    return {
        "out": f("out") or None,
        "stream": None if f("stream") is None else bool(f("stream")),
        "openai_api": f("openai_api"),
        "model": f("model"),
        "max_tokens": _num(int, f("max_tokens")),
        "ignore_eos": None if no_eos is None else not no_eos,
        "prompt_set": f("prompt_set"),
        "prompt": f("prompt"),
        "prompt_tokens": _num(int, f("prompt_tokens")),
        "prompt_lengths": lengths,
        "prompt_file": f("prompt_file"),
        "corpus": f("corpus"),
        "trace": f("trace"),
        "trace_format": f("trace_format"),
        "time_scale": _num(float, f("time_scale")),
        "sessions": None if f("sessions") is None else bool(f("sessions")),
        "turns": _num(int, f("turns")),
        "think_time": _num(float, f("think_time")),
        "session_header": None if f("session_header") is None else str(f("session_header")).lower(),
        "system_prompt_tokens": _num(int, f("system_prompt_tokens")),
        "shared_first_message": None if f("shared_first_message") is None else bool(f("shared_first_message")),
        "tokenizer": None if f("tokenizer") is None else (f("tokenizer") or "none"),
        "arrival": f("arrival"),
        "rate": _num(float, f("rate")),
        "ramp": _num(float, f("ramp")),
        "timeout_s": _num(float, f("timeout_s")),
        "grpc_client": f("grpc_client") or None,
        "traces_file": f("traces_file"),
        "records": None if no_records is None else not no_records,
        "records_detail": f("records_detail") or None,
        "label": f("label"),
        "seed": _num(int, f("seed")),
        "lag_threshold_ms": _num(float, f("client_lag_threshold_ms")),
        "busy_ms": _num(float, f("pathprobe_busy_ms")),
        "mix": parse_mix(f("mix") or ""),
        "api_key": f("api_key") or None,
        "metrics_port": _num(int, f("metrics_port")) or None,
        "metrics_host": f("metrics_host") or None,
    }


def _num(kind: type[int] | type[float], value: Any) -> Any:
    return None if value is None else kind(value)


def _from_env(name: str, var: str, value: str) -> Any:
    if name != "metrics_port":
        return value
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"{var}: expected a TCP port number, got {value!r}") from None


def parse_mix(text: str) -> tuple[tuple[str, str], ...]:
    """``a=grpc://h:p,b=http://h:q`` -> ``(("a", "grpc://h:p"), ("b", "http://h:q"))``."""
    out: list[tuple[str, str]] = []
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        name, sep, url = item.partition("=")
        if not sep or not name.strip() or not url.strip():
            raise ConfigError(f"mix: expected NAME=URL, got {item!r}")
        if name.strip() in {n for n, _ in out}:
            raise ConfigError(f"mix: configuration name {name.strip()!r} appears twice")
        out.append((name.strip(), url.strip()))
    return tuple(out)
