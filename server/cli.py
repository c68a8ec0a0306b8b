"""``pathprobe serve`` flags."""

from __future__ import annotations

import argparse

from pathprobe import environment

#: ``--engine-option`` keys each engine reads (vLLM's are passed on to vLLM, unchecked here)
ENGINE_OPTIONS: dict[str, frozenset[str]] = {
    "transformers": frozenset(
        {
            "threads",
            "static_cache",
            "static_max_len",
            "static_wait_ms",
            "cuda_graphs",
            "compile",
            "batching",
            "pad",
            "prefill_max_len",
            "prefill_max_batch",
            "tokenizer",
            "experts",
            "prefix_cache",
            "prefix_cache_mb",
            "prefix_cache_entries",
            "graph_warm",
            "quant",
            "cudnn_sdp",
            "gc_freeze",
        }
    ),
    "synthetic": frozenset(),
}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="model server: gRPC + HTTP/JSON + OpenAI-compatible over one engine")
    p.add_argument(
        "--engine",
        choices=("transformers", "synthetic", "vllm"),
        default=environment.get(environment.PATHPROBE_ENGINE, "transformers"),
        help=f"default: ${environment.PATHPROBE_ENGINE} or transformers",
    )
    p.add_argument(
        "--model",
        default=environment.get(environment.PATHPROBE_MODEL, "tiny"),
        help=f"tiny (default, or ${environment.PATHPROBE_MODEL}), a local model folder, or preset:NAME",
    )
    p.add_argument("--model-name", default=None, help="name clients use (default: derived from --model)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--grpc-port", type=int, default=50051)
    p.add_argument("--http-port", type=int, default=8000)
    p.add_argument(
        "--http-server",
        choices=("aiohttp", "fastapi"),
        default=environment.get(environment.PATHPROBE_HTTP_SERVER, "aiohttp"),
        help="HTTP front end: aiohttp (default, or $PATHPROBE_HTTP_SERVER) or FastAPI on uvicorn; "
        "same routes, errors and timing",
    )
    p.add_argument(
        "--extra-http-server",
        action="append",
        default=[],
        metavar="KIND:PORT",
        help="also serve the HTTP API with front end KIND (aiohttp|fastapi) on PORT, over the same "
        "engine (repeatable): compare both frameworks side by side",
    )
    p.add_argument("--device", default="auto", help="cpu, cuda or auto")
    p.add_argument("--dtype", default="auto", help="float32, bfloat16, float16 or auto")
    p.add_argument("--max-batch-size", type=int, default=8)
    p.add_argument("--max-wait-ms", type=float, default=2.0, help="how long the batcher waits to fill a batch")
    p.add_argument("--max-queue", type=int, default=256, help="requests waiting beyond this get 429/RESOURCE_EXHAUSTED")
    p.add_argument("--max-context", type=int, default=None)
    p.add_argument("--max-body-bytes", type=int, default=4 * 1024 * 1024)
    p.add_argument(
        "--prefill-ms-per-token", type=float, default=0.0, help="synthetic engine: prefill time per prompt token"
    )
    p.add_argument("--decode-ms-per-token", type=float, default=0.0, help="synthetic engine: time per output token")
    p.add_argument(
        "--engine-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="engine-specific option (repeatable), e.g. cuda_graphs=1",
    )
    p.add_argument(
        "--engine-process",
        action="store_true",
        help="run the engine (transformers, synthetic) in a process of its own, so the front ends' "
        "work does not share its interpreter: its time is then the same whichever front end serves "
        "(vLLM runs its engine core apart already)",
    )
    p.add_argument("--traces-file", default=None, help="also write spans as OTLP JSON lines to this file")
    p.add_argument(
        "--api-key",
        default=None,
        metavar="KEY[,KEY...]",
        help="require 'authorization: Bearer KEY' (or 'x-api-key') on every call but health, metrics "
        "and the OpenAPI document (401 / UNAUTHENTICATED otherwise; default: "
        "$PATHPROBE_SERVE_API_KEY, else none)",
    )
    p.add_argument(
        "--drain-delay-s",
        type=float,
        default=0.0,
        help="on SIGTERM: seconds health says NOT_SERVING (and /healthz 503) while new requests are "
        "still served, so balancers take the server out first",
    )
    p.add_argument(
        "--drain-grace-s",
        type=float,
        default=30.0,
        help="on SIGTERM: seconds in-flight requests get to finish once new ones are refused",
    )
    t = p.add_argument_group("TLS (every port; env PATHPROBE_SERVE_TLS_CERT / _KEY / _CA)")
    t.add_argument("--tls-cert", help="serve gRPC and HTTPS with this certificate chain (PEM)")
    t.add_argument("--tls-key", help="the certificate's private key (PEM)")
    t.add_argument("--tls-ca", help="also require client certificates signed by this CA (mTLS)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    from pathprobe.errors import ConfigError
    from pathprobe.server.app import ServeConfig, serve
    from pathprobe.server.engine import EngineConfig

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    options = {}
    for item in args.engine_option:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--engine-option: expected KEY=VALUE, got {item!r}")
        options[key] = value
    known = ENGINE_OPTIONS.get(args.engine)
    for key in options:
        if known is not None and key not in known:
            raise ConfigError(
                f"--engine-option {key}: unknown for the {args.engine} engine "
                f"(known: {', '.join(sorted(known)) or 'none'})"
            )
    for flag in ("drain_delay_s", "drain_grace_s"):
        if getattr(args, flag) < 0:
            raise ConfigError(f"--{flag.replace('_', '-')}: must be >= 0")
    for flag in ("max_batch_size", "max_queue", "max_body_bytes"):
        if getattr(args, flag) < 1:
            raise ConfigError(f"--{flag.replace('_', '-')}: must be at least 1")
    for flag in ("grpc_port", "http_port"):
        if not 0 <= getattr(args, flag) <= 65535:
            raise ConfigError(f"--{flag.replace('_', '-')}: must be a TCP port, 0..65535 (0 picks a free one)")
    for flag in ("max_wait_ms", "prefill_ms_per_token", "decode_ms_per_token"):
        if not getattr(args, flag) >= 0:  # also rejects nan
            raise ConfigError(f"--{flag.replace('_', '-')}: must be >= 0, got {getattr(args, flag)}")
    if args.max_context is not None and args.max_context < 1:
        raise ConfigError("--max-context: must be at least 1")
    engine = EngineConfig(
        kind=args.engine,
        model=args.model,
        model_name=args.model_name,
        device=args.device,
        dtype=args.dtype,
        max_batch_size=args.max_batch_size,
        max_wait_ms=args.max_wait_ms,
        max_queue=args.max_queue,
        max_context=args.max_context,
        prefill_ms_per_token=args.prefill_ms_per_token,
        decode_ms_per_token=args.decode_ms_per_token,
        options=options,
        process=args.engine_process,
    )
    extra = []
    for item in args.extra_http_server:
        kind, sep, port = item.partition(":")
        if not sep or kind not in ("aiohttp", "fastapi") or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"--extra-http-server: expected aiohttp:PORT or fastapi:PORT, got {item!r}")
        extra.append((kind, int(port)))
    config = ServeConfig(
        engine=engine,
        host=args.host,
        grpc_port=args.grpc_port,
        http_port=args.http_port,
        max_body_bytes=args.max_body_bytes,
        traces_file=args.traces_file,
        http_server=args.http_server,
        extra_http=tuple(extra),
        tls=_tls(args),
        api_keys=_keys(args),
        drain_delay_s=args.drain_delay_s,
        drain_grace_s=args.drain_grace_s,
    )
    asyncio.run(serve(config))
    return 0


ENV_API_KEY = environment.PATHPROBE_SERVE_API_KEY


def _tls(args: argparse.Namespace):
    from pathprobe.tls import TlsFiles

    tls = TlsFiles.from_env(
        environment.PATHPROBE_SERVE_TLS, {"cert": args.tls_cert, "key": args.tls_key, "ca": args.tls_ca}
    )
    return tls if tls.serving else None


def _keys(args: argparse.Namespace) -> tuple[bytes, ...]:
    import os

    from pathprobe.auth import parse_keys

    return parse_keys(args.api_key if args.api_key is not None else os.environ.get(ENV_API_KEY), "--api-key")
