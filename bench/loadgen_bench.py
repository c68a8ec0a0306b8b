"""Load generator overhead: bare Locust users vs pathprobe users, side by side in one run.

Against one synthetic server (0 ms inference, 1 output token) this runs, in
interleaved rounds (bare, pathprobe, pathprobe+tracing, bare, ...), a closed-loop Locust
test in this process with Locust's library API, for gRPC and for native HTTP:

- bare: a minimal Locust user (grpcio stub / FastHttpUser ``client.post``), Locust's own
  request event, no records, no tracing;
- bare+trailers (gRPC): the grpcio bare user reading trailing metadata (``with_call``);
- bare-h2 (gRPC) / bare-http1 (HTTP): the transport pathprobe's user uses (the ``h2`` gRPC
  client / the ``http1`` keep-alive client), with the request event only: like for like;
- bare-raw (HTTP): a geventhttpclient ``HTTPClient`` (the client under FastHttpUser) with the
  request event only;
- pathprobe: ``GrpcLLMUser`` (``--grpc-client h2``, the default) / ``HttpLLMUser`` with full
  accounting (records, HDR histograms, JSONL written, summary at the end), no tracing;
- pathprobe-grpcio (gRPC): the same user over grpcio's channel (``--grpc-client grpcio``);
- pathprobe+trace: the same plus a CLIENT span per request exported to an OTLP JSON
  lines file.

Reported per variant: max req/s (median over rounds) and load-generator CPU per request
(process CPU time / requests; the server runs in another process). Added overhead =
pathprobe CPU/request − bare CPU/request. Goal: ≤ 10 % lower max req/s and ≤ 50 µs
added per request. Results go to docs/results/<date>-loadgen.{md,json}.

    python bench/loadgen_bench.py [--rounds 3] [--seconds 5] [--users 16] [--protocols grpc,http]
"""

from __future__ import annotations

from grpc.experimental import gevent as grpc_gevent

grpc_gevent.init_gevent()

import argparse  # noqa: E402
import datetime as dt  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import gevent  # noqa: E402
import grpc  # noqa: E402
import locust  # noqa: E402
from locust import User, constant, task  # noqa: E402
from locust.contrib.fasthttp import FastHttpUser  # noqa: E402
from locust.env import Environment  # noqa: E402
from locust.event import Events  # noqa: E402
from pathprobe import timing  # noqa: E402
from pathprobe.loadgen import plugin  # noqa: E402
from pathprobe.loadgen.targets import Target  # noqa: E402
from pathprobe.loadgen.users import GrpcLLMUser, HttpLLMUser  # noqa: E402
from pathprobe.v1 import llm_pb2, llm_pb2_grpc  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.support.procs import Server  # noqa: E402

PROMPT = "The capital of France is"
MAX_TOKENS = 1


class BareGrpcUser(User):
    wait_time = constant(0)

    def on_start(self) -> None:
        self.channel = grpc.insecure_channel(self.host.removeprefix("grpc://"))
        self.stub = llm_pb2_grpc.LLMStub(self.channel)
        self.req = dict(prompt=PROMPT, max_tokens=MAX_TOKENS, ignore_eos=True)

    def on_stop(self) -> None:
        self.channel.close()

    @task
    def generate(self) -> None:
        t0 = time.perf_counter()
        exc = None
        try:
            self.stub.Generate(llm_pb2.GenerateRequest(**self.req), timeout=60)
        except grpc.RpcError as e:
            exc = e
        self.environment.events.request.fire(
            request_type="grpc",
            name="bare.Generate",
            response_time=(time.perf_counter() - t0) * 1000,
            response_length=0,
            exception=exc,
            context={},
        )


class BareGrpcTrailersUser(BareGrpcUser):
    """Bare, but reads the trailing metadata (what any client needs to see `server-timing`)."""

    @task
    def generate(self) -> None:
        t0 = time.perf_counter()
        exc = None
        try:
            _resp, call = self.stub.Generate.with_call(llm_pb2.GenerateRequest(**self.req), timeout=60)
            call.trailing_metadata()
        except grpc.RpcError as e:
            exc = e
        self.environment.events.request.fire(
            request_type="grpc",
            name="bare.Generate",
            response_time=(time.perf_counter() - t0) * 1000,
            response_length=0,
            exception=exc,
            context={},
        )


class BareH2GrpcUser(User):
    """Bare, over the same HTTP/2 client pathprobe's gRPC user uses (trailers read, no accounting)."""

    wait_time = constant(0)

    def on_start(self) -> None:
        from pathprobe.loadgen.h2grpc import Channel

        self.channel = Channel(self.host.removeprefix("grpc://"))
        self.req = llm_pb2.GenerateRequest(prompt=PROMPT, max_tokens=MAX_TOKENS, ignore_eos=True)

    def on_stop(self) -> None:
        self.channel.close()

    @task
    def generate(self) -> None:
        t0 = time.perf_counter()
        got: list[bytes] = []
        res = self.channel.call(
            "/pathprobe.v1.LLM/Generate", self.req.SerializeToString(), 60, None, lambda m, _t: got.append(m)
        )
        llm_pb2.GenerateResponse.FromString(got[0]) if got else None
        self.environment.events.request.fire(
            request_type="grpc",
            name="bare.Generate",
            response_time=(time.perf_counter() - t0) * 1000,
            response_length=0,
            exception=None if res.code == 0 else RuntimeError(res.details),
            context={},
        )


class _BareClientUser(User):
    """A bare HTTP user over a raw client: ``post()`` sends the request, Locust's event only."""

    abstract = True
    wait_time = constant(0)

    def post(self) -> Any:
        raise NotImplementedError

    @task
    def generate(self) -> None:
        t0 = time.perf_counter()
        resp = self.post()
        json.loads(resp.read())
        self.environment.events.request.fire(
            request_type="http",
            name="bare.generate",
            response_time=(time.perf_counter() - t0) * 1000,
            response_length=0,
            exception=None if resp.status_code == 200 else RuntimeError(resp.status_code),
            context={},
        )


class BareRawHttpUser(_BareClientUser):
    """Bare, over a geventhttpclient ``HTTPClient`` (the client under FastHttpUser)."""

    def on_start(self) -> None:
        from geventhttpclient import HTTPClient
        from geventhttpclient.url import URL

        self.client = HTTPClient.from_url(URL(self.host.rstrip("/") + "/"), concurrency=1)
        self.body = json.dumps({"prompt": PROMPT, "max_tokens": MAX_TOKENS, "ignore_eos": True}).encode()

    def on_stop(self) -> None:
        self.client.close()

    def post(self) -> Any:
        return self.client.post("/v1/generate", body=self.body, headers={"Content-Type": "application/json"})


class BareHttp1User(_BareClientUser):
    """Bare, over the same HTTP/1.1 client pathprobe's HTTP user uses (``pathprobe.loadgen.http1``)."""

    def on_start(self) -> None:
        from urllib.parse import urlsplit

        from pathprobe.loadgen.http1 import Connection

        u = urlsplit(self.host)
        self.conn = Connection(u.hostname or "127.0.0.1", u.port or 80, 60)
        self.body = json.dumps({"prompt": PROMPT, "max_tokens": MAX_TOKENS, "ignore_eos": True}).encode()

    def on_stop(self) -> None:
        self.conn.close()

    def post(self) -> Any:
        return self.conn.post("/v1/generate", self.body, {"Content-Type": "application/json"})


class BareHttpUser(FastHttpUser):
    wait_time = constant(0)

    @task
    def generate(self) -> None:
        self.client.post(
            "/v1/generate", json={"prompt": PROMPT, "max_tokens": MAX_TOKENS, "ignore_eos": True}, name="bare.generate"
        )


class PPGrpcUser(GrpcLLMUser):
    pass


class PPHttpUser(HttpLLMUser):
    abstract = False


def fresh_events() -> Events:
    """One Events per Environment: Locust's runners add stats listeners to it, and sharing
    the global one across rounds would make every later round log into every earlier runner."""
    ev = Events()
    plugin.attach(ev)
    return ev


def run_round(
    user_class: type, host: str, users: int, seconds: float, out: str, traces: str | None, grpc_client: str = "h2"
) -> dict:
    opts = argparse.Namespace(
        out=out,
        tokenizer="none",
        prompt=PROMPT,
        prompt_set="fixed",
        prompt_tokens=5,
        max_tokens=MAX_TOKENS,
        traces_file=traces or "",
        headless=True,
        num_users=users,
        host=host,
        otel=False,
        grpc_client=grpc_client,
    )
    env = Environment(user_classes=[user_class], events=fresh_events(), host=host, parsed_options=opts)
    runner = env.create_local_runner()
    env.events.init.fire(environment=env, runner=runner, web_ui=None)
    count = {"n": 0, "fail": 0}

    def on_request(exception=None, **_kw):
        count["n"] += 1
        if exception is not None:
            count["fail"] += 1

    env.events.request.add_listener(on_request)
    runner.start(users, spawn_rate=users * 10)
    gevent.sleep(1.0)  # spawn + warm-up, not measured
    n0, c0, t0, s0 = count["n"], time.process_time(), time.perf_counter(), schedstat()
    gevent.sleep(seconds)
    n1, c1, t1, s1 = count["n"], time.process_time(), time.perf_counter(), schedstat()
    runner.stop()
    runner.quit()
    env.events.request.remove_listener(on_request)
    n = n1 - n0
    return {
        "requests": n,
        "failures": count["fail"],
        "rps": n / (t1 - t0),
        "cpu_us_per_req": (c1 - c0) / n * 1e6 if n else None,
        # share of the window the process ran / waited runnable for a core (Linux schedstat, all
        # threads): their sum near 1 means it never waited for anything but a CPU
        "on_cpu_share": (s1[0] - s0[0]) / 1e9 / (t1 - t0) if s0 and s1 else None,
        "runqueue_share": (s1[1] - s0[1]) / 1e9 / (t1 - t0) if s0 and s1 else None,
    }


def schedstat() -> tuple[int, int] | None:
    """(ns on a CPU, ns runnable waiting for one) summed over this process's threads; None off Linux."""
    run = wait = 0
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return None
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/schedstat", encoding="ascii") as fh:
                a, b, _ = fh.read().split()
        except (OSError, ValueError):
            continue  # a thread that ended meanwhile
        run += int(a)
        wait += int(b)
    return run, wait


SERVER_TIMING = (
    "srv.decode;dur=0.012, srv.queue;dur=0.008, srv.tokenize;dur=0.101, srv.prefill;dur=0.210, "
    "srv.decode_steps;dur=0.022, srv.detokenize;dur=0.030, srv.encode;dur=0.015, srv.total;dur=0.900"
)


class NullTarget(Target):
    """Answers instantly with a realistic outcome: isolates pathprobe's own bookkeeping."""

    kind = "grpc"
    address = "null"

    def route(self, stream: bool) -> str:
        return "grpc.Generate"

    def call(self, spec, headers, out) -> None:
        out.t0 = time.perf_counter_ns()
        out.encode_ns, out.decode_ns = 8000, 9000
        out.entries = timing.parse_chain(SERVER_TIMING)
        out.tokens_in, out.tokens_out = 5, 1
        out.ok, out.status = True, "OK"
        out.t_end = time.perf_counter_ns() + 1_000_000


def bookkeeping(n: int, out: str) -> dict:
    """CPU per request of the accounting alone (no network), pathprobe vs a bare event fire."""
    opts = argparse.Namespace(
        out=out,
        tokenizer="none",
        prompt=PROMPT,
        prompt_set="fixed",
        max_tokens=MAX_TOKENS,
        traces_file="",
        headless=True,
        otel=False,
    )
    env = Environment(user_classes=[PPGrpcUser], events=fresh_events(), host="grpc://127.0.0.1:1", parsed_options=opts)
    runner = env.create_local_runner()
    env.events.init.fire(environment=env, runner=runner, web_ui=None)
    env.events.test_start.fire(environment=env)
    user = PPGrpcUser(env)
    user._pp_init()
    user.target = NullTarget()
    fire = env.events.request.fire
    res = {}
    for _ in range(2):  # second pass is the measured one (warm caches)
        c0 = time.process_time()
        for _i in range(n):
            t0 = time.perf_counter()
            fire(
                request_type="grpc",
                name="bare.Generate",
                response_time=(time.perf_counter() - t0) * 1000,
                response_length=0,
                exception=None,
                context={},
            )
        c1 = time.process_time()
        for _i in range(n):
            user.generate()
        plugin.runtime(env).agg.flush(plugin.runtime(env).writer)  # histograms + JSONL, as the flusher does
        c2 = time.process_time()
        res = {"bare_us": (c1 - c0) / n * 1e6, "pathprobe_us": (c2 - c1) / n * 1e6}
    env.events.test_stop.fire(environment=env)
    runner.quit()
    res["added_us"] = res["pathprobe_us"] - res["bare_us"]
    return res


def bare_event(fire: Any, kind: str, t0: float) -> None:
    """Locust's request event for one bare call begun at ``t0`` (perf_counter seconds)."""
    fire(
        request_type=kind,
        name="bare",
        response_time=(time.perf_counter() - t0) * 1000,
        response_length=0,
        exception=None,
        context={},
    )


def interleaved_blocks(
    variants: dict[str, Callable[[], None]], blocks: int, block: int, seed: int, flush: Callable[[], None]
) -> dict[str, dict[str, float]]:
    """CPU and wall µs per call of each variant: ``blocks`` blocks of ``block`` calls each, the
    variants in a freshly shuffled order every block (block 0 is a warm-up, not counted);
    pathprobe's variants then flush their histograms and records, as the flusher does."""
    import random

    cpu = {n: 0.0 for n in variants}
    wall = {n: 0.0 for n in variants}
    rnd = random.Random(seed)
    order = list(variants)
    for b in range(blocks + 1):
        rnd.shuffle(order)
        for name in order:
            fn = variants[name]
            c0, w0 = time.process_time(), time.perf_counter()
            for _ in range(block):
                fn()
            if name.startswith("pathprobe"):
                flush()
            if b:
                cpu[name] += time.process_time() - c0
                wall[name] += time.perf_counter() - w0
    n = blocks * block
    return {
        name: {"cpu_us_per_call": cpu[name] / n * 1e6, "wall_us_per_call": wall[name] / n * 1e6} for name in variants
    }


def http_client_cpu(url: str, blocks: int, block: int, out: str) -> dict:
    """The same as :func:`client_cpu` for the native HTTP users: Locust's FastHttpSession (what a bare
    FastHttpUser posts with), a bare geventhttpclient ``HTTPClient`` (the client under it), a bare
    ``http1`` connection (what pathprobe's user posts with) and pathprobe's ``HttpLLMUser``."""

    from geventhttpclient import HTTPClient
    from geventhttpclient.url import URL
    from locust.contrib.fasthttp import FastHttpSession

    opts = argparse.Namespace(
        out=out,
        tokenizer="none",
        prompt=PROMPT,
        prompt_set="fixed",
        prompt_tokens=5,
        max_tokens=MAX_TOKENS,
        traces_file="",
        headless=True,
        otel=False,
    )
    env = Environment(user_classes=[PPHttpUser], events=fresh_events(), host=url, parsed_options=opts)
    runner = env.create_local_runner()
    env.events.init.fire(environment=env, runner=runner, web_ui=None)
    env.events.test_start.fire(environment=env)
    rt = plugin.runtime(env)
    user = type("PPHttpUserHere", (PPHttpUser,), {"host": url})(env)  # Locust's runner sets .host this way
    user.on_start()
    fire = env.events.request.fire
    session = FastHttpSession(url, env.events.request, user=None)
    raw = HTTPClient.from_url(URL(url.rstrip("/") + "/"), concurrency=1)
    from urllib.parse import urlsplit

    from pathprobe.loadgen.http1 import Connection

    u = urlsplit(url)
    h1 = Connection(u.hostname or "127.0.0.1", u.port or 80, 60)
    body = {"prompt": PROMPT, "max_tokens": MAX_TOKENS, "ignore_eos": True}

    def bare_fasthttp() -> None:
        session.post("/v1/generate", json=body, name="bare")

    def bare_raw() -> None:
        t0 = time.perf_counter()
        resp = raw.post("/v1/generate", body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        json.loads(resp.read())
        bare_event(fire, "http", t0)

    def bare_http1() -> None:
        t0 = time.perf_counter()
        resp = h1.post("/v1/generate", json.dumps(body).encode(), {"Content-Type": "application/json"})
        json.loads(resp.read())
        bare_event(fire, "http", t0)

    variants = {
        "bare FastHttpUser": bare_fasthttp,
        "bare geventhttpclient": bare_raw,
        "bare http1": bare_http1,
        "pathprobe http": user.generate,
    }
    per_call = interleaved_blocks(variants, blocks, block, 5, lambda: rt.agg.flush(rt.writer))
    env.events.test_stop.fire(environment=env)
    runner.quit()
    raw.close()
    h1.close()
    user.on_stop()
    return per_call


def client_cpu(address: str, blocks: int, block: int, out: str) -> dict:
    """Client CPU per call of each gRPC client, one call at a time against the real server,
    interleaved in blocks of ``block`` calls in shuffled order (the server is another process, so
    its CPU is not counted; grpcio's own threads are). No Locust scheduling, so the per-call
    difference between clients is resolved to a few µs even on a busy machine."""

    from pathprobe.loadgen.h2grpc import Channel
    from pathprobe.loadgen.targets import GrpcTarget, H2GrpcTarget

    opts = argparse.Namespace(
        out=out,
        tokenizer="none",
        prompt=PROMPT,
        prompt_set="fixed",
        prompt_tokens=5,
        max_tokens=MAX_TOKENS,
        traces_file="",
        headless=True,
        otel=False,
    )
    env = Environment(user_classes=[PPGrpcUser], events=fresh_events(), host=f"grpc://{address}", parsed_options=opts)
    runner = env.create_local_runner()
    env.events.init.fire(environment=env, runner=runner, web_ui=None)
    env.events.test_start.fire(environment=env)
    rt = plugin.runtime(env)
    users = {}
    for client, cls in (("h2", H2GrpcTarget), ("grpcio", GrpcTarget)):
        u = PPGrpcUser(env)
        u._pp_init()
        u.target.close()
        u.target = cls(address, 60.0)
        users[client] = u
    fire = env.events.request.fire
    channel = grpc.insecure_channel(address)
    stub = llm_pb2_grpc.LLMStub(channel)
    h2 = Channel(address)
    req = llm_pb2.GenerateRequest(prompt=PROMPT, max_tokens=MAX_TOKENS, ignore_eos=True)

    def bare_grpcio() -> None:
        t0 = time.perf_counter()
        stub.Generate(req, timeout=60)
        bare_event(fire, "grpc", t0)

    def bare_grpcio_trailers() -> None:
        t0 = time.perf_counter()
        _r, call = stub.Generate.with_call(req, timeout=60)
        call.trailing_metadata()
        bare_event(fire, "grpc", t0)

    def bare_h2() -> None:
        t0 = time.perf_counter()
        got: list[bytes] = []
        h2.call("/pathprobe.v1.LLM/Generate", req.SerializeToString(), 60, None, lambda m, _t: got.append(m))
        llm_pb2.GenerateResponse.FromString(got[0])
        bare_event(fire, "grpc", t0)

    variants = {
        "bare grpcio": bare_grpcio,
        "bare grpcio+trailers": bare_grpcio_trailers,
        "bare h2": bare_h2,
        "pathprobe h2": users["h2"].generate,
        "pathprobe grpcio": users["grpcio"].generate,
    }
    per_call = interleaved_blocks(variants, blocks, block, 3, lambda: rt.agg.flush(rt.writer))
    env.events.test_stop.fire(environment=env)
    runner.quit()
    channel.close()
    h2.close()
    for u in users.values():
        u.target.close()
    return per_call


class Upstream:
    """What the users call: an nginx stub (default; the load generator saturates first) or the server."""

    def __init__(self, tmp: Path, kind: str) -> None:
        self.placement = "none"
        if kind == "stub":
            from gateway_sweep import nginx_stub

            # not pinned: on a shared box a pinned load generator waits for its one core behind
            # other processes (event-loop lag of 100s of ms was seen), which swamps what is measured
            self.proc, gport, hport = nginx_stub(tmp / "stub", None, MAX_TOKENS)
            self.grpc_target, self.http_url = f"127.0.0.1:{gport}", f"http://127.0.0.1:{hport}"
            self.describe = "nginx stub: a fixed answer with the server's timing entries"
            self.server = None
        else:
            self.server = Server(
                tmp,
                "--engine",
                "synthetic",
                "--prefill-ms-per-token",
                "0",
                "--decode-ms-per-token",
                "0",
                "--max-batch-size",
                "64",
            )
            self.grpc_target, self.http_url = self.server.grpc_target, self.server.http_url
            self.describe = "pathprobe serve --engine synthetic, 0 ms inference"

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
        else:
            self.proc.terminate()
            self.proc.wait(10)


def versions() -> dict:
    import hdrh  # noqa: F401
    from pathprobe import __version__

    return {
        "pathprobe": __version__,
        "locust": locust.__version__,
        "grpcio": grpc.__version__,
        "gevent": gevent.__version__,
        "python": platform.python_version(),
    }


def device() -> dict:
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {"cpu": cpu, "cores": os.cpu_count(), "platform": platform.platform(), "loadavg_at_start": load}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--users", type=int, default=16)
    ap.add_argument("--protocols", default="grpc,http")
    ap.add_argument("--no-trace-variant", action="store_true")
    ap.add_argument(
        "--upstream",
        choices=("stub", "server"),
        default="stub" if shutil.which("nginx") else "server",
        help="stub: nginx answering instantly (the client is what saturates); server: pathprobe serve",
    )
    ap.add_argument("--cpu-blocks", type=int, default=10, help="client CPU per call: blocks of 100 calls per client")
    ap.add_argument("--results", default=str(ROOT / "docs" / "results"))
    ap.add_argument("--name", default="loadgen", help="results file name: <date>-<name>.{md,json}")
    ap.add_argument("--render", metavar="JSON", help="only re-render the Markdown of a saved result")
    args = ap.parse_args()
    if args.render:
        doc = json.loads(Path(args.render).read_text())
        doc["summary"] = summarize(doc["rounds"])
        Path(args.render).write_text(json.dumps(doc, indent=2))
        Path(args.render).with_suffix(".md").write_text(render_md(doc))
        return 0

    tmp = Path(tempfile.mkdtemp(prefix="loadgen-bench-"))
    dev = device()
    book = [bookkeeping(20000, str(tmp / f"book{i}")) for i in range(3)]
    for b in book:
        print(
            f"bookkeeping: bare {b['bare_us']:.1f} us, pathprobe {b['pathprobe_us']:.1f} us, "
            f"added {b['added_us']:.1f} us per request",
            flush=True,
        )
    srv = Upstream(tmp, args.upstream)
    results: dict[str, dict[str, list[dict]]] = {}
    try:
        percall = [
            {
                **client_cpu(srv.grpc_target, args.cpu_blocks, 100, str(tmp / f"cpu{i}")),
                **http_client_cpu(srv.http_url, args.cpu_blocks, 100, str(tmp / f"hcpu{i}")),
            }
            for i in range(3)
        ]
        for name in percall[0]:
            print(
                f"client CPU per call, {name:22}: "
                + ", ".join(f"{p[name]['cpu_us_per_call']:.0f}" for p in percall)
                + " us",
                flush=True,
            )
        protos = [p for p in args.protocols.split(",") if p]
        classes = {
            "grpc": (BareGrpcUser, PPGrpcUser, f"grpc://{srv.grpc_target}"),
            "http": (BareHttpUser, PPHttpUser, srv.http_url),
        }
        for proto in protos:
            bare, pp, host = classes[proto]
            variants = [("bare", bare, None, "h2"), ("pathprobe", pp, None, "h2")]
            if proto == "grpc":
                variants[1:1] = [
                    ("bare+trailers", BareGrpcTrailersUser, None, "h2"),
                    ("bare-h2", BareH2GrpcUser, None, "h2"),
                ]
                variants.append(("pathprobe-grpcio", pp, None, "grpcio"))
            else:
                variants[1:1] = [("bare-raw", BareRawHttpUser, None, "h2"), ("bare-http1", BareHttp1User, None, "h2")]
            if not args.no_trace_variant:
                variants.append(("pathprobe+trace", pp, str(tmp / f"traces-{proto}.jsonl"), "h2"))
            results[proto] = {name: [] for name, _, _, _ in variants}
            for r in range(args.rounds):
                order = variants if r % 2 == 0 else list(reversed(variants))
                for name, cls, traces, client in order:
                    res = run_round(
                        cls, host, args.users, args.seconds, str(tmp / f"out-{proto}-{name}-{r}"), traces, client
                    )
                    results[proto][name].append(res)
                    print(
                        f"{proto:5} round {r} {name:16} {res['rps']:8.1f} req/s  "
                        f"{res['cpu_us_per_req']:7.1f} us CPU/req  failures {res['failures']}  "
                        f"on CPU {res['on_cpu_share'] or 0:.2f}, runnable waiting {res['runqueue_share'] or 0:.2f}",
                        flush=True,
                    )
    finally:
        srv.stop()

    summary = summarize(results)

    today = dt.date.today().isoformat()
    doc = {
        "date": today,
        "device": dev,
        "versions": versions(),
        "bookkeeping": {
            "runs": book,
            "added_us_median": statistics.median(b["added_us"] for b in book),
            "pathprobe_us_median": statistics.median(b["pathprobe_us"] for b in book),
            "bare_us_median": statistics.median(b["bare_us"] for b in book),
        },
        "client_cpu_per_call": percall,
        "config": {
            "rounds": args.rounds,
            "cpu_blocks": args.cpu_blocks,
            "seconds": args.seconds,
            "users": args.users,
            "max_tokens": MAX_TOKENS,
            "server": srv.describe,
            "placement": srv.placement,
        },
        "summary": summary,
        "rounds": results,
    }
    os.makedirs(args.results, exist_ok=True)
    jpath = Path(args.results) / f"{today}-{args.name}.json"
    jpath.write_text(json.dumps(doc, indent=2))
    md = render_md(doc)
    (Path(args.results) / f"{today}-{args.name}.md").write_text(md)
    print(md)
    return 0


def summarize(results: dict[str, dict[str, list[dict]]]) -> dict[str, dict]:
    """Medians over rounds, plus paired figures: each variant against the bare run of the same
    round (adjacent in time, so slow drift of the shared machine cancels)."""
    summary: dict[str, dict] = {}
    for proto, by in results.items():
        bare = by["bare"]
        # the same transport as pathprobe's users, no accounting (results before the http1 client: bare-raw)
        raw = by.get("bare-h2") or by.get("bare-http1") or by.get("bare-raw") or bare
        med: dict[str, dict] = {}
        for name, runs in by.items():
            med[name] = {
                "paired_rps_ratio_vs_raw": statistics.median(x["rps"] / b["rps"] for x, b in zip(runs, raw)),
                "paired_added_cpu_us_vs_raw": statistics.median(
                    x["cpu_us_per_req"] - b["cpu_us_per_req"] for x, b in zip(runs, raw)
                ),
                "rps": statistics.median(x["rps"] for x in runs),
                "cpu_us_per_req": statistics.median(x["cpu_us_per_req"] for x in runs),
                "paired_rps_ratio": statistics.median(x["rps"] / b["rps"] for x, b in zip(runs, bare)),
                # the spread of the paired ratio over rounds (min, max)
                "paired_rps_ratio_range": [
                    min(x["rps"] / b["rps"] for x, b in zip(runs, bare)),
                    max(x["rps"] / b["rps"] for x, b in zip(runs, bare)),
                ],
                "paired_added_cpu_us": statistics.median(
                    x["cpu_us_per_req"] - b["cpu_us_per_req"] for x, b in zip(runs, bare)
                ),
                # req/s per CPU-second against bare's in the same round: the CPU-bound ceiling's ratio
                "paired_ceiling_ratio": statistics.median(
                    b["cpu_us_per_req"] / x["cpu_us_per_req"] for x, b in zip(runs, bare)
                ),
                "runnable_share": statistics.median(shares) if (shares := _runnable(runs)) else None,
            }
        summary[proto] = med
    return summary


def _runnable(runs: list[dict]) -> list[float]:
    """Each round's share of the window on a CPU or runnable waiting for one (older results: none)."""
    return [
        x["on_cpu_share"] + x["runqueue_share"]
        for x in runs
        if x.get("on_cpu_share") is not None and x.get("runqueue_share") is not None
    ]


def render_md(doc: dict) -> str:
    lines = [
        f"# Load generator overhead ({doc['date']})",
        "",
        "`bench/loadgen_bench.py`: bare Locust users vs pathprobe users against the same upstream "
        f"({doc['config']['server']}; placement: {doc['config'].get('placement', 'none')}; 1 output token) in one "
        "run, interleaved rounds "
        f"({doc['config']['rounds']} x {doc['config']['seconds']} s per variant, {doc['config']['users']} users, "
        "one Locust process). CPU/request is the load generator process's CPU time divided by requests "
        "(the server is another process). Medians over rounds.",
        "",
        f"Device: {doc['device']['cpu']}, {doc['device']['cores']} cores, {doc['device']['platform']}, "
        f"load average at start {doc['device']['loadavg_at_start']} (shared machine).",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in doc["versions"].items()) + ".",
        "",
        "| protocol | variant | max req/s | req/s vs bare (paired) | range over rounds | CPU µs/req "
        "| added µs/req (paired) | req/s per CPU-s vs bare (paired) | runnable share "
        "| req/s vs same transport bare | added µs/req vs same transport bare |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    summary = summarize(doc["rounds"])
    for proto, med in summary.items():
        for name, m in med.items():
            lo, hi = m["paired_rps_ratio_range"]
            share = f"{m['runnable_share']:.2f}" if m["runnable_share"] is not None else "–"
            lines.append(
                f"| {proto} | {name} | {m['rps']:.0f} | {m['paired_rps_ratio']:.3f} | {lo:.2f}–{hi:.2f} | "
                f"{m['cpu_us_per_req']:.0f} | {m['paired_added_cpu_us']:+.0f} | {m['paired_ceiling_ratio']:.3f} | "
                f"{share} | {m['paired_rps_ratio_vs_raw']:.3f} | {m['paired_added_cpu_us_vs_raw']:+.0f} |"
            )
    if doc.get("client_cpu_per_call"):
        runs = doc["client_cpu_per_call"]
        lines += [
            "",
            "Client CPU per call, one call at a time against the same server, clients interleaved in "
            f"blocks of 100 calls ({doc['config'].get('cpu_blocks', 10)} blocks each, 3 runs: median, and "
            "the range over runs):",
            "",
            "| client | CPU µs/call | range | added vs bare Locust user (grpcio / FastHttpUser) | wall µs/call |",
            "|---|---:|---:|---:|---:|",
        ]
        for name in runs[0]:
            base_name = (
                "bare grpcio"
                if name in ("bare grpcio", "bare grpcio+trailers", "bare h2", "pathprobe h2", "pathprobe grpcio")
                else "bare FastHttpUser"
            )
            base = statistics.median(r[base_name]["cpu_us_per_call"] for r in runs)
            v = [r[name]["cpu_us_per_call"] for r in runs]
            w = statistics.median(r[name]["wall_us_per_call"] for r in runs)
            lines.append(
                f"| {name} | {statistics.median(v):.0f} | {min(v):.0f}–{max(v):.0f} | "
                f"{statistics.median(v) - base:+.0f} | {w:.0f} |"
            )
    bk = doc["bookkeeping"]
    lines += [
        "",
        "Bookkeeping alone (no network; the user's request path with an instantly answering target, "
        "then the flush into HDR histograms + JSONL, vs a bare Locust request event; 20,000 requests, "
        f"median of 3): bare {bk['bare_us_median']:.1f} µs, pathprobe {bk['pathprobe_us_median']:.1f} µs, "
        f"**added {bk['added_us_median']:.1f} µs per request**.",
        "",
        "Goal: pathprobe's users ≤ 10 % fewer req/s than bare Locust users (gRPC: grpcio; HTTP: "
        "FastHttpUser) and ≤ 50 µs added per request.",
        "",
    ]
    runs = doc.get("client_cpu_per_call") or []

    def med_cpu(name: str) -> float | None:
        v = [r[name]["cpu_us_per_call"] for r in runs if name in r]
        return statistics.median(v) if v else None

    http_raw = "bare http1" if med_cpu("bare http1") else "bare geventhttpclient"  # older results: no http1
    for proto, ref, mine, raw in (
        ("grpc", "bare grpcio", "pathprobe h2", "bare h2"),
        ("http", "bare FastHttpUser", "pathprobe http", http_raw),
    ):
        if proto in summary:
            m = summary[proto]["pathprobe"]
            lines.append(
                f"- {proto}, Locust rounds (16 users, paired with the bare run of the same round): "
                f"{(m['paired_rps_ratio'] - 1) * 100:+.1f} % req/s, {m['paired_added_cpu_us']:+.0f} µs "
                f"CPU/req vs bare; vs the same transport without accounting "
                f"{(m['paired_rps_ratio_vs_raw'] - 1) * 100:+.1f} % req/s, "
                f"{m['paired_added_cpu_us_vs_raw']:+.0f} µs CPU/req."
            )
        c_ref, c_mine, c_raw = med_cpu(ref), med_cpu(mine), med_cpu(raw)
        if c_ref and c_mine and c_raw:
            lines.append(
                f"- {proto}, client CPU per call (interleaved, no Locust scheduling): {mine} "
                f"{c_mine - c_ref:+.0f} µs vs {ref} ({'within' if c_mine - c_ref <= 50 else 'NOT within'} "
                f"the 50 µs goal; as a CPU-bound ceiling {c_ref / c_mine:.2f}× its req/s); pathprobe's own "
                f"accounting over the same transport {c_mine - c_raw:+.0f} µs."
            )
    lines.append(f"- bookkeeping alone: {bk['added_us_median']:+.1f} µs per request.")
    lines += [
        "",
        "Per-round figures are in the JSON file. How to read them:",
        "",
        "- The machine is a shared 2-core box: req/s of the *same* variant swings by tens of % between",
        "  rounds (the load generator waits for a core behind other processes: event-loop lag of",
        "  100s of ms while the loop itself is idle). Paired columns compare each variant with the",
        "  bare run of the same round; client CPU per call (measured outside Locust, interleaved in",
        "  blocks) is the figure that resolves tens of µs here, and for a load generator that is the",
        "  limit: its max req/s on a core is 1 / CPU per request.",
        "- runnable share: the part of each round's window the load generator process was on a CPU",
        "  or runnable waiting for one (Linux schedstat, all its threads). Near 1 it never waited for",
        "  anything else (no blocking I/O, no sleeps): its req/s is its CPU share divided by its CPU per",
        "  request, and the share is set by the other processes on the machine, so on a shared box the",
        "  paired req/s swings with them while req/s per CPU-second (1 / CPU per request) does not.",
        "- `bare-h2` / `bare-http1` use the transport pathprobe's users use, with only Locust's request",
        "  event: pathprobe's own accounting is the difference to them. `bare-raw` is geventhttpclient",
        "  (the client under FastHttpUser) with only the request event.",
        "- `pathprobe+trace` exports a CLIENT span per request to an OTLP JSON lines file in the",
        "  same process; sample (`OTEL_TRACES_SAMPLER=traceidratio OTEL_TRACES_SAMPLER_ARG=0.1`)",
        "  when tracing under maximum load.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
