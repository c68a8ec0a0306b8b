"""Does a grpc.aio consumer's event loop sleep for messages already inside its process?

A gateway decides whether a gap before a chunk was a wait for its upstream by whether its loop slept
in it (:func:`pathprobe.timing.last_waited`). That holds where the loop itself selects on the
upstream's socket. grpc.aio hands each message to the loop from gRPC core's poller thread over a
socket pair, so the loop can sleep while that thread waits for a core. This shows it: a server sends
N small messages at once, the client waits until every one has been sent (and, with a 16 MiB stream
window, received by its gRPC core), then reads them with a fixed amount of work per message, and
counts the sleeps its loop took meanwhile: none of them was a wait for the network.

    python bench/aio_delivery.py                 # as is
    python bench/aio_delivery.py --busy 2        # beside two busy processes (a loaded 2-core box)
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import platform
import time

import grpc
import grpc.aio
from pathprobe import loopwait
from pathprobe.timing import now_ms


def _spin() -> None:
    while True:
        pass


async def _server(n: int, size: int) -> tuple[grpc.aio.Server, int]:
    async def stream(_req: bytes, _ctx: grpc.aio.ServicerContext) -> object:
        for _ in range(n):
            yield b"x" * size

    handler = grpc.method_handlers_generic_handler("b.B", {"S": grpc.unary_stream_rpc_method_handler(stream)})
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


async def _main(args: argparse.Namespace) -> None:
    server, port = await _server(args.messages, args.size)
    watch = loopwait.install()
    assert watch is not None, "the loop has no Python selector"
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.http2.lookahead_bytes", 1 << 24)])
    method = channel.unary_stream("/b.B/S")
    print(f"grpcio {grpc.__version__}, python {platform.python_version()}, busy processes {args.busy}")
    print("round  messages  read_ms  sleeps  slept_ms  sleeps>1ms  longest_ms")
    for rnd in range(args.rounds):
        call = method(b"")
        await call.initial_metadata()
        await asyncio.sleep(args.settle_s)  # every message has been sent by now
        t0 = now_ms()
        count = 0
        async for _ in call:
            count += 1
            t = time.perf_counter()
            while time.perf_counter() - t < args.work_ms / 1000:  # the consumer's work on each message
                pass
        t1 = now_ms()
        sleeps = [b - a for a, b in watch.sleeps if a >= t0]
        print(
            f"{rnd:5d}  {count:8d}  {t1 - t0:7.1f}  {len(sleeps):6d}  {sum(sleeps):8.1f}"
            f"  {sum(1 for x in sleeps if x > 1):10d}  {max(sleeps, default=0.0):10.2f}"
        )
    await channel.close()
    await server.stop(None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=2048)
    ap.add_argument("--size", type=int, default=120, help="bytes per message (a token chunk's size)")
    ap.add_argument("--work-ms", type=float, default=0.15, help="the consumer's work per message")
    ap.add_argument("--settle-s", type=float, default=0.5, help="wait before reading: all messages sent")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--busy", type=int, default=0, help="busy processes beside the run")
    args = ap.parse_args()
    busy = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(args.busy)]
    for p in busy:
        p.start()
    try:
        asyncio.run(_main(args))
    finally:
        for p in busy:
            p.terminate()


if __name__ == "__main__":
    main()
