"""A gRPC server for pathprobe's contract that takes a known time and reports nothing (no
``server-timing`` trailer): a server we did not write, speaking our protocol.

    python -m tests.support.silent_grpc --port N --delay-ms D
"""

from __future__ import annotations

import argparse
import time
from concurrent import futures

import grpc
from pathprobe.v1 import llm_pb2


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--delay-ms", type=float, default=0.0)
    cfg = ap.parse_args(argv)

    def generate(request: bytes, context: grpc.ServicerContext) -> bytes:
        req = llm_pb2.GenerateRequest.FromString(request)
        time.sleep(cfg.delay_ms / 1000.0)
        n = max(1, req.max_tokens)
        return llm_pb2.GenerateResponse(
            text=" tok" * n,
            token_ids=list(range(n)),
            finish_reason="length",
            usage=llm_pb2.Usage(prompt_tokens=4, completion_tokens=n),
        ).SerializeToString()

    handler = grpc.method_handlers_generic_handler(
        "pathprobe.v1.LLM", {"Generate": grpc.unary_unary_rpc_method_handler(generate)}
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"127.0.0.1:{cfg.port}")
    server.start()
    server.wait_for_termination()


if __name__ == "__main__":
    main()
