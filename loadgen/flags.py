"""pathprobe's command-line flags, added to Locust's parser (``init_command_line_parser``).

Their defaults are :class:`~pathprobe.loadgen.config.Config`'s; :meth:`Config.from_options`
turns the parsed values (and the environment) into the run's configuration.
"""

from __future__ import annotations

from typing import Protocol

from pathprobe.loadgen.config import ENV, ENV_API_KEY, ENV_TLS, Config
from pathprobe.loadgen.prompts import PROMPT_SETS
from pathprobe.loadgen.targets import GRPC_CLIENTS
from pathprobe.loadgen.traces import FORMATS as TRACE_FORMATS
from pathprobe.records import RECORD_DETAILS


class ArgumentParser(Protocol):
    """Locust's parser, or a plain argparse one that drops Locust's own keywords (``include_in_web_ui``)."""

    def add_argument(self, *args: str, **kwargs: object) -> object: ...


#: the defaults every flag shows
D = Config()


def add_arguments(parser: ArgumentParser) -> None:
    g = parser  # Locust's parser (supports include_in_web_ui); groups would not
    g.add_argument(
        "--out",
        default=D.out,
        include_in_web_ui=False,
        help="folder for records.jsonl, summary.json/.csv, histograms.json",
    )
    g.add_argument("--stream", action="store_true", default=False, help="use the streaming route")
    g.add_argument(
        "--openai-api",
        choices=["completions", "chat"],
        default=D.openai_api,
        help="OpenAI-compatible route for openai+http:// targets",
    )
    g.add_argument("--model", default=D.model, help="model name sent (OpenAI default: first of GET /v1/models)")
    g.add_argument("--max-tokens", type=int, default=D.max_tokens, help="max_tokens per request")
    g.add_argument(
        "--no-ignore-eos",
        action="store_true",
        default=False,
        help="let the model stop at EOS (default: ignore_eos, exactly max_tokens)",
    )
    g.add_argument(
        "--prompt-set",
        choices=list(PROMPT_SETS),
        default=D.prompt_set,
        help="fixed: one prompt of --prompt-tokens; sweep: --prompt-lengths round-robin; "
        "mixed: --prompt-lengths at random; file: --prompt-file JSONL; sharegpt: --prompt-file "
        "ShareGPT conversation JSON (first turn sent, max_tokens = the reply's length)",
    )
    g.add_argument("--prompt", default=D.prompt, help="base text of generated prompts")
    g.add_argument(
        "--prompt-tokens", type=int, default=D.prompt_tokens, help="exact prompt length in tokens (fixed set)"
    )
    g.add_argument(
        "--prompt-lengths",
        default=",".join(map(str, D.prompt_lengths)),
        help="token lengths for the sweep/mixed sets, e.g. 16,64,256",
    )
    g.add_argument(
        "--prompt-file",
        default="",
        include_in_web_ui=False,
        help='JSONL prompts: {"prompt": "..."} or {"input_tokens": N} per line, each with an optional '
        '"max_tokens" / "output_tokens"; with --prompt-set sharegpt a ShareGPT JSON file',
    )
    g.add_argument(
        "--corpus",
        default="",
        include_in_web_ui=False,
        help="UTF-8 text that prompts of a given token length are cut from (token-count lines, "
        "--trace); default: a built-in text",
    )
    g.add_argument(
        "--trace",
        default="",
        include_in_web_ui=False,
        help="replay an arrival trace open loop (each request once, split across workers): "
        "Azure LLM inference CSV or Mooncake JSONL",
    )
    g.add_argument(
        "--trace-format",
        choices=["", *TRACE_FORMATS],
        default="",
        include_in_web_ui=False,
        help="azure: CSV TIMESTAMP,ContextTokens,GeneratedTokens; mooncake: JSONL timestamp (ms), "
        "input_length, output_length, hash_ids (default: from the file's extension)",
    )
    g.add_argument(
        "--sessions",
        action="store_true",
        default=False,
        help="conversations: each user runs sessions of --turns turns, each turn sending the "
        "history so far (OpenAI chat: messages; other routes: the history concatenated)",
    )
    g.add_argument("--turns", type=int, default=D.turns, help="--sessions: turns per session")
    g.add_argument(
        "--think-time", type=float, default=D.think_time, help="--sessions: seconds between a reply and the next turn"
    )
    g.add_argument(
        "--session-header",
        default="",
        include_in_web_ui=False,
        help="--sessions: send the session id in this header (e.g. x-session-id) so a router keeps "
        "a session on one upstream",
    )
    g.add_argument(
        "--system-prompt-tokens",
        type=int,
        default=D.system_prompt_tokens,
        help="--sessions: a system prompt of N tokens (cut from --prompt), the same in every session: "
        "the prefix all conversations share (0 = none)",
    )
    g.add_argument(
        "--shared-first-message",
        action="store_true",
        default=False,
        include_in_web_ui=False,
        help="--sessions: send each session's first message as the prompt set has it (default: it "
        "begins with a tag naming the run and the session, so turn 0 of a session finds no other "
        "session's prefix in a server's cache beyond the system prompt)",
    )
    g.add_argument(
        "--time-scale",
        type=float,
        default=D.time_scale,
        include_in_web_ui=False,
        help="--trace: multiplies the trace's arrival times (0.5 replays twice as fast)",
    )
    g.add_argument(
        "--tokenizer", default=D.tokenizer, help="tokenizer for exact prompt lengths: tiny | preset:NAME | PATH | none"
    )
    g.add_argument(
        "--arrival",
        choices=["closed", "constant", "poisson"],
        default=D.arrival,
        help="closed loop (users back to back) or open loop at --rate",
    )
    g.add_argument("--rate", type=float, default=0.0, help="open loop: total requests/s")
    g.add_argument("--ramp", type=float, default=0.0, help="open loop: seconds to ramp from 0 to --rate")
    g.add_argument(
        "--sweep",
        default="",
        include_in_web_ui=False,
        help="concurrency sweep, e.g. 1,4,16,64 (pathprobe load only): one run per value",
    )
    g.add_argument("--timeout-s", type=float, default=D.timeout_s, help="per-request deadline (s)")
    g.add_argument(
        "--grpc-client",
        choices=list(GRPC_CLIENTS),
        default=D.grpc_client,
        help="gRPC transport: h2 = pathprobe's HTTP/2 client (a fraction of grpcio's CPU per call "
        "under gevent, same records); grpcio = grpcio's channel",
    )
    g.add_argument(
        "--api-key",
        default="",
        include_in_web_ui=False,
        help=f"sent as 'Authorization: Bearer KEY' (default: ${ENV_API_KEY})",
    )
    g.add_argument(
        "--target-ca",
        default="",
        include_in_web_ui=False,
        help=f"grpcs:// / https://: CA that signs the target's certificate (default: system CAs; ${ENV_TLS}_CA)",
    )
    g.add_argument(
        "--target-cert",
        default="",
        include_in_web_ui=False,
        help=f"client certificate for targets that want mTLS (${ENV_TLS}_CERT)",
    )
    g.add_argument("--target-key", default="", include_in_web_ui=False, help=f"its private key (${ENV_TLS}_KEY)")
    g.add_argument(
        "--target-server-name",
        default="",
        include_in_web_ui=False,
        help=f"name expected in the target's certificate (default: the host; ${ENV_TLS}_SERVER_NAME)",
    )
    g.add_argument(
        "--traces-file",
        default="",
        include_in_web_ui=False,
        help="write CLIENT spans to this OTLP JSON lines file (OTLP export: OTEL_EXPORTER_OTLP_ENDPOINT)",
    )
    g.add_argument(
        "--no-records",
        action="store_true",
        default=False,
        include_in_web_ui=False,
        help="do not write records.jsonl (summaries stay exact)",
    )
    g.add_argument(
        "--records-detail",
        choices=RECORD_DETAILS,
        default="full",
        include_in_web_ui=False,
        help="records.jsonl per request: full (default), or timing (every duration and the split's segments "
        "and links to the ns, without each hop's raw entries, per-chunk lists and hop shares: under 1 KB a "
        "record whatever the stream's length; summaries and histograms stay exact)",
    )
    g.add_argument("--label", default="", include_in_web_ui=False, help="copied into summary.json meta.label")
    g.add_argument("--seed", type=int, default=0, include_in_web_ui=False, help="seed for Poisson/mixed prompts")
    g.add_argument(
        "--client-lag-threshold-ms",
        type=float,
        default=D.lag_threshold_ms,
        include_in_web_ui=False,
        help="the load generator counts as saturated when its event-loop lag p99 reaches this "
        "(or its loop CPU mean reaches 90%% of a core); see summary.json 'client'",
    )
    g.add_argument(
        "--mix",
        default="",
        include_in_web_ui=False,
        help="call-by-call interleaving: NAME=URL[,NAME=URL...]; each user sends each call to the "
        "next configuration of a freshly shuffled order (records carry 'config' and 'cycle'; "
        "-H is then only Locust's label)",
    )
    g.add_argument(
        "--metrics-port",
        type=int,
        default=0,
        include_in_web_ui=False,
        help="serve Prometheus /metrics (the client-side split, live) on this port from each "
        f"process that runs users (default: ${ENV['metrics_port']}, else off)",
    )
    g.add_argument(
        "--metrics-host",
        default="",
        include_in_web_ui=False,
        help=f"address for --metrics-port (default: ${ENV['metrics_host']}, else {D.metrics_host})",
    )
    g.add_argument(
        "--pathprobe-busy-ms",
        type=float,
        default=0.0,
        include_in_web_ui=False,
        help="TEST HOOK: each user burns this many ms of CPU before each request (outside "
        "the timed part), to make the load generator saturate on purpose",
    )
