"""A small real OpenAI-compatible server that takes a known time per request.

It stands for a third-party server: by default it reports nothing about its time (no
``Server-Timing``), or, with ``--report``, exactly what TGI (``x-*-time`` headers, whole
ms), vLLM (``metrics`` object, ms) or Ollama (``*_duration`` fields, ns) would report
for the same intervals. Each request sleeps ``--queue-ms``, then ``--prefill-ms``, then
``--decode-ms``; the report carries the measured sleeps.

Sockets get TCP_NODELAY and every response (headers and body) leaves in one write:
``http.server``'s default of headers and body in two writes stalls 40 ms per request on
loopback (Nagle + delayed ACK), a real network effect but not the one under test here.

    python -m tests.support.openai_server --port N [--queue-ms Q --prefill-ms P --decode-ms D]
                                          [--report none|tgi|vllm|ollama] [--burst]
"""

from __future__ import annotations

import argparse
import json
import socket
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODEL = "silent-model"


def _sleep_ms(ms: float) -> float:
    """Sleep ``ms`` and return the time it really took (ms)."""
    t0 = time.perf_counter()
    if ms > 0:
        time.sleep(ms / 1000.0)
    return (time.perf_counter() - t0) * 1000.0


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Server

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:
        return None

    def _send(
        self, status: int, body: bytes, headers: dict[str, str] | None = None, ctype: str = "application/json"
    ) -> None:
        head = [
            f"HTTP/1.1 {status} {'OK' if status == 200 else 'Error'}",
            f"Content-Type: {ctype}",
            f"Content-Length: {len(body)}",
        ]
        head += [f"{k}: {v}" for k, v in (headers or {}).items()]
        self.wfile.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            self._send(200, json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]}).encode())
        elif self.path == "/api/tags":  # Ollama's model list
            self._send(200, json.dumps({"models": [{"name": MODEL, "model": MODEL}]}).encode())
        elif self.path in ("/health", "/healthz"):
            self._send(200, b"{}")
        else:
            self._send(404, b'{"error": "not found"}')

    def do_POST(self) -> None:
        t_start = time.perf_counter()
        length = int(self.headers.get("Content-Length") or 0)
        try:
            req = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            self._send(400, b'{"error": {"message": "body: not JSON"}}')
            return
        if self.path not in ("/v1/completions", "/v1/chat/completions", "/api/generate"):
            self._send(404, b'{"error": "not found"}')
            return
        cfg = self.server.cfg
        q = _sleep_ms(cfg.queue_ms)
        p = _sleep_ms(cfg.prefill_ms)
        n = max(1, int(req.get("max_tokens") or (req.get("options") or {}).get("num_predict") or 1))
        chat = self.path.endswith("chat/completions")
        if req.get("stream") and self.path == "/api/generate":
            self._ndjson(n, q, p, t_start)
            return
        if req.get("stream"):
            self._stream(req, n, chat, q, p, t_start)
            return
        d = _sleep_ms(cfg.decode_ms)
        text = " tok" * n
        usage = {"prompt_tokens": 4, "completion_tokens": n, "total_tokens": 4 + n}
        if self.path == "/api/generate":
            body: dict[str, Any] = {
                "model": MODEL,
                "response": text,
                "done": True,
                "prompt_eval_count": 4,
                "eval_count": n,
            }
        elif chat:
            body = {
                "object": "chat.completion",
                "model": MODEL,
                "usage": usage,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}],
            }
        else:
            body = {
                "object": "text_completion",
                "model": MODEL,
                "usage": usage,
                "choices": [{"index": 0, "text": text, "finish_reason": "length"}],
            }
        headers = self._report(body, q, p, d, t_start)
        self._send(200, json.dumps(body).encode(), headers)

    def _report(self, body: dict[str, Any], q: float, p: float, d: float, t_start: float) -> dict[str, str]:
        report = self.server.cfg.report
        if report == "vllm":
            body["metrics"] = {
                "queue_time_ms": q,
                "time_to_first_token_ms": p,
                "generation_time_ms": d,
                "mean_itl_ms": d,
                "tokens_per_second": 1.0,
            }
        elif report == "ollama":
            total = (time.perf_counter() - t_start) * 1000.0
            body.update(
                total_duration=int(total * 1e6),
                load_duration=int(q * 1e6),
                prompt_eval_duration=int(p * 1e6),
                eval_duration=int(d * 1e6),
            )
        elif report == "tgi":
            total = (time.perf_counter() - t_start) * 1000.0
            return {
                "x-total-time": str(int(total)),
                "x-validation-time": "0",
                "x-queue-time": str(int(q)),
                "x-inference-time": str(int(p + d)),
            }
        return {}

    def _stream(self, req: dict[str, Any], n: int, chat: bool, q: float, p: float, t_start: float) -> None:
        head = (
            "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
            "Cache-Control: no-cache\r\n\r\n"
        )
        self.wfile.write(head.encode())
        per_token = self.server.cfg.decode_ms / n
        burst = self.server.cfg.burst
        d = 0.0
        pending = b""
        for i in range(n):
            if i:
                d += _sleep_ms(per_token)
            piece = {"delta": {"content": " tok"}} if chat else {"text": " tok"}
            chunk = {"object": "chunk", "model": MODEL, "choices": [{"index": 0, **piece, "finish_reason": None}]}
            if burst:
                pending += self._framed(chunk)
            else:
                self._chunk(chunk)
        d += _sleep_ms(per_token)
        final: dict[str, Any] = {
            "object": "chunk",
            "model": MODEL,
            "choices": [],
            "usage": {"prompt_tokens": 4, "completion_tokens": n, "total_tokens": 4 + n},
        }
        self._report(final, q, p, d, t_start)
        data = b"data: [DONE]\n\n"
        self.wfile.write(pending + self._framed(final) + b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data))

    def _ndjson(self, n: int, q: float, p: float, t_start: float) -> None:
        """Ollama's stream: one JSON object per line, the last one (done) with the durations."""
        head = "HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n"
        self.wfile.write(head.encode())
        per_token = self.server.cfg.decode_ms / n
        d = 0.0
        for _ in range(n):
            d += _sleep_ms(per_token)
            self._line({"model": MODEL, "response": " tok", "done": False})
        final: dict[str, Any] = {"model": MODEL, "response": "", "done": True, "prompt_eval_count": 4, "eval_count": n}
        self._report(final, q, p, d, t_start)
        self._line(final)
        self.wfile.write(b"0\r\n\r\n")

    def _line(self, obj: dict[str, Any]) -> None:
        data = json.dumps(obj).encode() + b"\n"
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def _chunk(self, obj: dict[str, Any]) -> None:
        self.wfile.write(self._framed(obj))

    @staticmethod
    def _framed(obj: dict[str, Any]) -> bytes:
        """One SSE event as one HTTP chunk."""
        data = b"data: " + json.dumps(obj).encode() + b"\n\n"
        return b"%x\r\n%s\r\n" % (len(data), data)


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, addr: tuple[str, int], cfg: argparse.Namespace) -> None:
        super().__init__(addr, Handler)
        self.cfg = cfg


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--queue-ms", type=float, default=0.0)
    ap.add_argument("--prefill-ms", type=float, default=0.0)
    ap.add_argument("--decode-ms", type=float, default=0.0)
    ap.add_argument("--report", choices=("none", "tgi", "vllm", "ollama"), default="none")
    ap.add_argument(
        "--burst", action="store_true", help="stream: every chunk in one write at the end (as vLLM's CPU build emits)"
    )
    cfg = ap.parse_args(argv)
    Server((cfg.host, cfg.port), cfg).serve_forever()


if __name__ == "__main__":
    main()
