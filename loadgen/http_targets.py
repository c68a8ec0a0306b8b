"""HTTP targets: the native JSON API (``POST /v1/generate``), OpenAI-compatible completions /
chat (any such server), and Ollama's native ``/api/generate``; SSE or JSON lines when streaming."""

from __future__ import annotations

import json
from typing import Any

from pathprobe import timing
from pathprobe.deadline import TIMEOUT_HEADER, format_timeout
from pathprobe.errors import ConfigError
from pathprobe.loadgen.call import CallSpec, Outcome, pc, usage_cached_tokens
from pathprobe.loadgen.http_base import (
    CUT_SHORT,
    HttpTarget,
    extra_headers,
    finish_stream,
    take_report,
    take_usage_and_timing,
)
from pathprobe.tls import TlsFiles


class NativeHttpTarget(HttpTarget):
    """``POST /v1/generate`` (SSE when streaming)."""

    kind = "http"

    def __init__(self, base_url: str, timeout_s: float = 60.0, tls: TlsFiles | None = None, api_key: str = "") -> None:
        super().__init__(base_url, timeout_s, tls, api_key)
        # the request's deadline travels with it (as a gRPC client's would): gateway -> server -> engine
        self._auth = {**self._auth, TIMEOUT_HEADER: format_timeout(timeout_s)}

    def route(self, stream: bool) -> str:
        return "http.generate.stream" if stream else "http.generate"

    def call(self, spec: CallSpec, headers: dict[str, str], out: Outcome) -> None:
        body = {
            "prompt": spec.prompt,
            "max_tokens": spec.max_tokens,
            "ignore_eos": spec.ignore_eos,
            "request_id": spec.request_id,
            "stream": spec.stream,
        }
        if spec.model:
            body["model"] = spec.model
        resp = self._post("/v1/generate", body, headers, out)
        if resp.status_code != 200:
            self._error(resp, out)
            return
        if not spec.stream:
            obj = self._unary(resp, out)
            usage = obj.get("usage") or {}
            out.tokens_out = usage.get("completion_tokens", len(obj.get("token_ids") or ()))
            out.tokens_in = usage.get("prompt_tokens")
            out.cached_tokens = usage_cached_tokens(usage)
            if spec.keep_text:
                out.text.append(str(obj.get("text") or ""))
            out.ok, out.status = True, "OK"
            return
        state: dict[str, Any] = {"n": 0, "err": None}
        keep = spec.keep_text

        def on_event(ta: int, obj: dict[str, Any]) -> None:
            if "error" in obj:
                state["err"] = obj["error"]
            if obj.get("text") or obj.get("token_ids"):
                out.token_times.append(ta)
                out.emit_ms.append(float(obj.get("emit_ms") or 0.0))
                out.fwd_ms.append(float(obj.get("fwd_ms") or 0.0))
                state["n"] += len(obj.get("token_ids") or ()) or 1
                if keep and obj.get("text"):
                    out.text.append(str(obj["text"]))
            take_usage_and_timing(obj, out)
            if obj.get("usage"):
                out.cached_tokens = usage_cached_tokens(obj["usage"])

        if not self._sse(resp, out, on_event) and not state["err"]:
            state["err"] = CUT_SHORT
        if out.tokens_out is None:
            out.tokens_out = state["n"]
        finish_stream(out, state["err"])


class OpenAITarget(HttpTarget):
    """OpenAI-compatible ``/v1/completions`` or ``/v1/chat/completions``; any such server.

    ``Server-Timing`` entries are used when present and are optional.
    """

    kind = "openai"

    def __init__(
        self,
        base_url: str,
        timeout_s: float = 60.0,
        api: str = "completions",
        tls: TlsFiles | None = None,
        api_key: str = "",
    ) -> None:
        super().__init__(base_url, timeout_s, tls, api_key)
        if api not in ("completions", "chat"):
            raise ConfigError(f"openai-api: expected completions or chat, got {api!r}")
        self.api = api
        self._model: str | None = None

    def route(self, stream: bool) -> str:
        base = "openai.chat" if self.api == "chat" else "openai.completions"
        return base + ".stream" if stream else base

    def default_model(self) -> str:
        """First id of ``GET /v1/models`` (OpenAI requires a model name)."""
        if self._model is None:
            self._model = _first_model(self, "/v1/models", "data", "id", {**extra_headers(), **self._auth})
        return self._model

    def call(self, spec: CallSpec, headers: dict[str, str], out: Outcome) -> None:
        model = spec.model or self.default_model()
        chat = self.api == "chat"
        body: dict[str, Any] = {
            "model": model,
            "max_tokens": spec.max_tokens,
            "temperature": 0.0,
            "stream": spec.stream,
        }
        if chat:
            body["messages"] = (
                spec.messages if spec.messages is not None else [{"role": "user", "content": spec.prompt}]
            )
        else:
            body["prompt"] = spec.prompt
        if spec.ignore_eos:
            body["ignore_eos"] = True
        if spec.stream:
            body["stream_options"] = {"include_usage": True}
        path = "/v1/chat/completions" if chat else "/v1/completions"
        resp = self._post(path, body, headers, out)
        if resp.status_code != 200:
            self._error(resp, out)
            return
        if not spec.stream:
            obj = self._unary(resp, out)
            usage = obj.get("usage") or {}
            out.tokens_out = usage.get("completion_tokens")
            out.tokens_in = usage.get("prompt_tokens")
            out.cached_tokens = usage_cached_tokens(usage)
            if spec.keep_text:
                for choice in obj.get("choices") or ():
                    piece = (choice.get("message") or {}).get("content") if chat else choice.get("text")
                    out.text.append(str(piece or ""))
            take_report(resp, obj, out)
            st = obj.get("server_timing")
            if st and not out.entries:
                out.entries = timing.parse_chain(st)
            out.ok, out.status = True, "OK"
            return
        state: dict[str, Any] = {"n": 0, "err": None}
        keep = spec.keep_text

        def on_event(ta: int, obj: dict[str, Any]) -> None:
            if "error" in obj:
                state["err"] = obj["error"]
            for choice in obj.get("choices") or ():
                piece = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
                if piece:
                    out.token_times.append(ta)
                    out.emit_ms.append(float(obj.get("emit_ms") or 0.0))
                    out.fwd_ms.append(float(obj.get("fwd_ms") or 0.0))
                    state["n"] += 1
                    if keep:
                        out.text.append(str(piece))
            take_usage_and_timing(obj, out)
            if obj.get("usage"):
                out.cached_tokens = usage_cached_tokens(obj["usage"])
            if "metrics" in obj:  # vLLM: the final usage chunk carries its per-request metrics
                take_report(None, obj, out)

        if not self._sse(resp, out, on_event) and not state["err"]:
            state["err"] = CUT_SHORT
        if out.tokens_out is None:
            out.tokens_out = state["n"]
        finish_stream(out, state["err"])


class OllamaTarget(HttpTarget):
    """Ollama's native ``POST /api/generate`` (newline-delimited JSON objects when streaming).

    Ollama's OpenAI-compatible routes carry no timing; its native route's final object has
    ``total_duration`` / ``load_duration`` / ``prompt_eval_duration`` / ``eval_duration``
    (ns), read as the server's own report (a server hop)."""

    kind = "ollama"
    null_path = "/api/version"

    def __init__(self, base_url: str, timeout_s: float = 60.0) -> None:
        super().__init__(base_url, timeout_s)
        self._model: str | None = None

    def route(self, stream: bool) -> str:
        return "ollama.generate.stream" if stream else "ollama.generate"

    def default_model(self) -> str:
        """First model of ``GET /api/tags`` (Ollama requires a model name)."""
        if self._model is None:
            self._model = _first_model(self, "/api/tags", "models", "name")
        return self._model

    def call(self, spec: CallSpec, headers: dict[str, str], out: Outcome) -> None:
        body = {
            "model": spec.model or self.default_model(),
            "prompt": spec.prompt,
            "stream": spec.stream,
            "raw": True,
            "options": {"num_predict": spec.max_tokens, "temperature": 0.0},
        }
        resp = self._post("/api/generate", body, headers, out)
        if resp.status_code != 200:
            self._error(resp, out)
            return
        if not spec.stream:
            obj = self._unary(resp, out)
            out.tokens_out, out.tokens_in = obj.get("eval_count"), obj.get("prompt_eval_count")
            take_report(resp, obj, out)
            out.ok, out.status = True, "OK"
            return
        dec, n, err = 0, 0, None
        while True:
            line = resp.readline(b"\n")
            if not line:
                break
            if not line.strip():
                continue
            out.response_bytes += len(line)
            ta = pc()
            obj = self._loads(line)
            t = pc()
            dec += t - ta
            out.decodes.append((ta, t))
            if obj.get("error"):
                err = obj["error"]
            if obj.get("response"):
                out.token_times.append(ta)
                n += 1
            if obj.get("done"):
                out.tokens_out, out.tokens_in = obj.get("eval_count", n), obj.get("prompt_eval_count")
                take_report(None, obj, out)
        resp.read()
        out.t_end = pc()
        out.decode_ns = dec
        if out.tokens_out is None:
            out.tokens_out = n
        out.entries = self._entries_from_header(resp)
        finish_stream(out, err)


def _first_model(target: HttpTarget, path: str, listing: str, key: str, headers: dict[str, str] | None = None) -> str:
    """``key`` of the first item of the ``listing`` array that ``GET path`` answers ("default" when
    there is none, or the server does not answer it: the request then names that model)."""
    try:
        resp = target.client.get(target.prefix + path, headers=headers or {})
        body = resp.read()
        if resp.status_code == 200:
            items = json.loads(body).get(listing) or []
            if items and items[0].get(key):
                return str(items[0][key])
    except Exception:
        pass
    return "default"
