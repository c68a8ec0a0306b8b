"""What transcode's own gRPC client costs against grpc.aio, side by side in one process.

Starts our server (synthetic engine, no engine time) on free loopback ports and makes the same unary
call through both clients in turns (rounds x {grpc.aio, grpcup} x concurrency), printing per call the
wall time (one call at a time: latency; 32 at once: the inverse of throughput) and the client
process's CPU (``time.process_time``: every thread, gRPC core's included).

    python bench/grpc_client_cost.py [--rounds 3] [--calls 600]
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import subprocess
import sys
import time

import grpc
import grpc.aio
from pathprobe.gateway import grpcup
from pathprobe.v1 import llm_pb2

GENERATE = "/pathprobe.v1.LLM/Generate"
REQ = llm_pb2.GenerateRequest(prompt="hello there", max_tokens=8, ignore_eos=True).SerializeToString()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve() -> tuple[subprocess.Popen[bytes], str]:
    gport, hport = _free_port(), _free_port()
    args = ["--engine", "synthetic", "--decode-ms-per-token", "0", "--prefill-ms-per-token", "0"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "pathprobe", "serve", "--grpc-port", str(gport), "--http-port", str(hport), *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    target = f"127.0.0.1:{gport}"
    grpc.channel_ready_future(grpc.insecure_channel(target)).result(timeout=120)
    return proc, target


async def _measure(target: str, rounds: int, calls: int) -> dict[tuple[str, int], list[tuple[float, float]]]:
    own = grpcup.Channel(target)
    aio = grpc.aio.insecure_channel(target)
    aio_call = aio.unary_unary(GENERATE)

    async def one(client: str) -> None:
        if client == "grpcup":
            await (await own.call(GENERATE, REQ, 30.0))
        else:
            await aio_call(REQ, timeout=30.0)

    out: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for _ in range(rounds):
        for client in ("grpc.aio", "grpcup"):
            for conc in (1, 32):
                cpu0, t0 = time.process_time(), time.perf_counter()
                for _ in range(calls // conc):
                    await asyncio.gather(*(one(client) for _ in range(conc)))
                n = (calls // conc) * conc
                wall = (time.perf_counter() - t0) * 1000 / n
                out.setdefault((client, conc), []).append((wall, (time.process_time() - cpu0) * 1000 / n))
    await own.close()
    await aio.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=600)
    a = ap.parse_args()
    proc, target = _serve()
    try:
        res = asyncio.run(_measure(target, a.rounds, a.calls))
    finally:
        proc.terminate()
        proc.wait(10)
    print(f"# {platform.machine()}, {platform.system()} {platform.release()}, Python {platform.python_version()}")
    print("client | concurrency | wall ms/call (median [min, max]) | client CPU ms/call (median [min, max])")
    for (client, conc), v in sorted(res.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        walls, cpus = [w for w, _ in v], [c for _, c in v]
        print(
            f"{client} | {conc} | {statistics.median(walls):.3f} [{min(walls):.3f}, {max(walls):.3f}] | "
            f"{statistics.median(cpus):.3f} [{min(cpus):.3f}, {max(cpus):.3f}]"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
