"""Every size limit on a compare's paths, derived in one place from the sweep's largest payload.

A request that is larger than some hop on its way allows fails there (413 / RESOURCE_EXHAUSTED,
naming the limit), so a payload sweep that leaves any default in place measures the smallest
default, not the path. :func:`derive` sizes every limit from the largest prompt (its bytes as cut,
when the prompts are cut before the run; else an upper bound per token) and the largest
``max_tokens``; :func:`apply_server`, :func:`gateway_args` and :func:`proxy_values` hand them to
each process compare starts. docs/design.md (Payload sizes and limits) lists them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pathprobe.analysis.lab.config import CompareConfig
from pathprobe.serveconfig import DEFAULT_MAX_BODY

MIB = 1024 * 1024
#: JSON escapes a character into at most 6 bytes (``\\u00e9``); a gRPC message adds a few bytes per field
JSON_EXPANSION = 6
#: room for the request's envelope (model, max_tokens, a chat's messages) beyond the prompt's text
ENVELOPE = MIB
#: an upper bound of a token's text in bytes, used only when the prompts are not cut before the run
BYTES_PER_TOKEN = 16
#: a completion token in a unary response: its text (<= 16 bytes) and its id in JSON (<= 12 bytes)
RESPONSE_BYTES_PER_TOKEN = 32
#: the synthetic engine's context when none is given (server/engine/synthetic.py)
SYNTHETIC_CONTEXT = 4096
#: a server may add a few tokens of its own (a BOS, a chat template's) to the prompt
CONTEXT_MARGIN = 64


@dataclass(frozen=True, slots=True)
class Limits:
    """The limits of one compare run (bytes, tokens)."""

    body_bytes: int  # request body / gRPC message, every hop (server, gateways, proxies)
    response_bytes: int  # a unary response's message, every gRPC receiver
    context_tokens: int | None  # the synthetic server's context (None: the engine's own)
    largest_prompt_bytes: int  # what the body limit was sized from
    measured: bool  # largest_prompt_bytes came from the cut prompts (else from the token bound)

    def rows(self, cfg: CompareConfig) -> list[dict[str, str]]:
        """What was set where, for the report (``payload.limits``)."""
        body, resp = str(self.body_bytes), str(self.response_bytes)
        why = (
            f"{JSON_EXPANSION} x the largest prompt ({self.largest_prompt_bytes} bytes"
            f"{'' if self.measured else ', bounded from its tokens'}) + {ENVELOPE // MIB} MiB"
        )
        rows = [
            _row("server", "--max-body-bytes (HTTP body; gRPC message, checked by the handler)", body, why),
            _row(
                "load generator",
                "grpc.max_receive_message_length",
                "64 MiB",
                f"fixed, above the largest unary response's bound ({resp} bytes)",
            ),
        ]
        if self.context_tokens is not None:
            rows.append(
                _row("server", "--max-context", str(self.context_tokens), "largest prompt + max_tokens + margin")
            )
        kinds: set[str] = {h.kind for t in cfg.enabled_targets for h in (t.chain or [])}
        kinds |= {t.kind for t in cfg.enabled_targets if t.kind != "chain"}
        if "gateway" in kinds:
            rows.append(_row("gateway", "--max-body-bytes (HTTP body, gRPC message)", body, why))
        for kind in sorted(kinds & set(PROXY_SETTINGS)):
            rows += [_row(kind, key, value.format(body=body), note) for key, value, note in PROXY_SETTINGS[kind]]
        return rows


def _row(where: str, setting: str, value: str, why: str) -> dict[str, str]:
    return {"where": where, "setting": setting, "value": value, "why": why}


#: per third-party proxy: (setting, value, why); ``{body}`` is the body limit in bytes
PROXY_SETTINGS: dict[str, list[tuple[str, str, str]]] = {
    "nginx": [
        ("client_max_body_size", "{body}", "413 above it (default 1m; our template had 4m)"),
        ("client_body_buffer_size", "{body}", "keeps a large body in memory, not in a temp file on disk"),
    ],
    "haproxy": [
        (
            "(none)",
            "-",
            "bodies are streamed, never buffered whole (no http-buffer-request); tune.bufsize "
            "(16384) bounds headers only",
        ),
    ],
    "caddy": [("request_body max_size", "{body}", "413 above it (Caddy's default: no limit)")],
    "litellm": [
        (
            "(none set)",
            "-",
            "no body limit by default; general_settings.max_request_size_mb / max_response_size_mb are "
            "enterprise-only (not enforced by the open-source proxy), so left unset",
        ),
    ],
}


def prompt_bytes(files: list[Path | None]) -> int | None:
    """The largest prompt's UTF-8 bytes in the cut prompt files (None: a prompt was not cut here)."""
    import json

    most = 0
    for f in files:
        if f is None:
            return None
        for line in f.read_text(encoding="utf-8").splitlines():
            if line.strip():
                most = max(most, len(json.loads(line)["prompt"].encode("utf-8")))
    return most


def derive(cfg: CompareConfig, prompt_files: list[Path | None] | None = None) -> Limits:
    """The limits for the config's largest payload (its prompt's bytes from ``prompt_files`` when cut)."""
    L = cfg.load
    top_prompt, top_max = max(L.prompt_sizes), max(L.max_sizes)
    measured = prompt_bytes(prompt_files) if prompt_files else None
    largest = measured if measured is not None else top_prompt * BYTES_PER_TOKEN
    body = max(DEFAULT_MAX_BODY, _round_mib(JSON_EXPANSION * largest + ENVELOPE))
    response = _round_mib(RESPONSE_BYTES_PER_TOKEN * top_max + ENVELOPE)
    context = None
    if cfg.server.engine == "synthetic" and top_prompt + top_max + CONTEXT_MARGIN > SYNTHETIC_CONTEXT:
        context = top_prompt + top_max + CONTEXT_MARGIN
    return Limits(body, response, context, largest, measured is not None)


def _round_mib(n: int) -> int:
    return -(-n // MIB) * MIB


def server_keys(limits: Limits) -> dict[str, int]:
    """``serve`` keys for our servers (added to what compare passes them)."""
    keys = {"max_body_bytes": limits.body_bytes}
    if limits.context_tokens is not None:
        keys["max_context"] = limits.context_tokens
    return keys


def gateway_args(limits: Limits, given: list[str]) -> list[str]:
    """``pathprobe gateway`` flags for the limits, unless the target's own ``gateway_args`` set them."""
    return [] if "--max-body-bytes" in given else ["--max-body-bytes", str(limits.body_bytes)]
