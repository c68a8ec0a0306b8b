"""``pathprobe serve`` flags."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping

from pathprobe import engineoptions
from pathprobe.engineoptions import TransformersOptions
from pathprobe.serveconfig import DEFAULTS as D
from pathprobe.serveconfig import ENGINES, ENV, HTTP_SERVERS, ServeConfig, parse_extra_http


def register(sub: argparse._SubParsersAction) -> None:
    """Flags default to None: :class:`ServeConfig` applies the environment, then its one default."""
    p = sub.add_parser("serve", help="model server: gRPC + HTTP/JSON + OpenAI-compatible over one engine")
    p.add_argument(
        "--engine",
        choices=ENGINES,
        help=f"default: ${ENV['engine']} or {D.engine}",
    )
    p.add_argument(
        "--model",
        help=f"{D.model} (default, or ${ENV['model']}), a local model folder, or preset:NAME",
    )
    p.add_argument("--model-name", help="name clients use (default: derived from --model)")
    p.add_argument("--host", help=f"default: {D.host}")
    p.add_argument("--grpc-port", type=int, help=f"default: {D.grpc_port}")
    p.add_argument("--http-port", type=int, help=f"default: {D.http_port}")
    p.add_argument(
        "--http-server",
        choices=HTTP_SERVERS,
        help=f"HTTP front end: {D.http_server} (default, or ${ENV['http_server']}) or FastAPI on uvicorn; "
        "same routes, errors and timing",
    )
    p.add_argument(
        "--extra-http-server",
        action="append",
        metavar="KIND:PORT",
        help="also serve the HTTP API with front end KIND (aiohttp|fastapi) on PORT, over the same "
        "engine (repeatable): compare both frameworks side by side",
    )
    p.add_argument("--device", help=f"cpu, cuda or auto (default: {D.device})")
    p.add_argument("--dtype", help=f"float32, bfloat16, float16 or auto (default: {D.dtype})")
    p.add_argument("--max-batch-size", type=int, help=f"default: {D.max_batch_size}")
    p.add_argument(
        "--max-wait-ms", type=float, help=f"how long the batcher waits to fill a batch (default: {D.max_wait_ms})"
    )
    p.add_argument(
        "--max-queue",
        type=int,
        help=f"requests waiting beyond this get 429/RESOURCE_EXHAUSTED (default: {D.max_queue})",
    )
    p.add_argument("--max-context", type=int, help="default: the model's context length")
    p.add_argument("--max-body-bytes", type=int, help=f"default: {D.max_body_bytes}")
    p.add_argument(
        "--prefill-ms-per-token",
        type=float,
        help=f"synthetic engine: prefill time per prompt token (default: {D.prefill_ms_per_token})",
    )
    p.add_argument(
        "--decode-ms-per-token",
        type=float,
        help=f"synthetic engine: time per output token (default: {D.decode_ms_per_token})",
    )
    p.add_argument(
        "--engine-option",
        action="append",
        metavar="KEY=VALUE",
        help="engine-specific option (repeatable), e.g. cuda_graphs=1; the transformers engine's keys: "
        + ", ".join(f.name for f in dataclasses.fields(TransformersOptions)),
    )
    p.add_argument(
        "--engine-process",
        action="store_const",
        const=True,
        help="run the engine (transformers, synthetic) in a process of its own, so the front ends' "
        "work does not share its interpreter: its time is then the same whichever front end serves "
        "(vLLM runs its engine core apart already)",
    )
    p.add_argument("--traces-file", help="also write spans as OTLP JSON lines to this file")
    p.add_argument(
        "--api-key",
        metavar="KEY[,KEY...]",
        help="require 'authorization: Bearer KEY' (or 'x-api-key') on every call but health, metrics "
        "and the OpenAPI document (401 / UNAUTHENTICATED otherwise; default: "
        "$PATHPROBE_SERVE_API_KEY, else none)",
    )
    p.add_argument(
        "--drain-delay-s",
        type=float,
        help="on SIGTERM: seconds health says NOT_SERVING (and /healthz 503) while new requests are "
        f"still served, so balancers take the server out first (default: {D.drain_delay_s})",
    )
    p.add_argument(
        "--drain-grace-s",
        type=float,
        help="on SIGTERM: seconds in-flight requests get to finish once new ones are refused "
        f"(default: {D.drain_grace_s})",
    )
    t = p.add_argument_group("TLS (every port; env PATHPROBE_SERVE_TLS_CERT / _KEY / _CA)")
    t.add_argument("--tls-cert", help="serve gRPC and HTTPS with this certificate chain (PEM)")
    t.add_argument("--tls-key", help="the certificate's private key (PEM)")
    t.add_argument("--tls-ca", help="also require client certificates signed by this CA (mTLS)")
    p.set_defaults(func=run)


def config_from_args(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> ServeConfig:
    """The flags given (None: not given) > the environment > the defaults, checked once."""
    given = {f.name: getattr(args, f.name, None) for f in dataclasses.fields(ServeConfig) if f.init}
    given["engine_options"] = None
    if args.engine_option:
        engine = args.engine or ServeConfig.from_values({"engine": None}, environ).engine
        given["engine_options"] = engineoptions.parse(engine, args.engine_option)
    if args.extra_http_server:
        given["extra_http_server"] = parse_extra_http(args.extra_http_server)
    return ServeConfig.from_values(given, environ)


def run(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    from pathprobe.server.app import serve

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    asyncio.run(serve(config_from_args(args)))
    return 0
