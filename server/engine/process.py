"""The engine in a process of its own (``pathprobe serve --engine-process``).

In one process the engine's scheduler thread and the front ends (grpc.aio's handlers and
poller, aiohttp's loop) take turns on one GIL, so the engine's own time depends on which
front end serves the request: a gRPC stream's per-token work runs between the engine's
steps and stretches them. With the engine in a child process (as vLLM's engine core runs
apart from its API server), what shares the engine's interpreter is the same for every
path, so its time no longer depends on the path.

The parent keeps what must answer at once: validation, tokenization (``srv.tokenize``)
and the context check, so a bad request still fails before anything is streamed. The child
runs the real engine on the token ids; each token event comes back over a pipe with the
engine's timing (queue, prefill, decode steps, detokenize; durations measured in the child,
their ``*_start`` instants on the host's monotonic clock, which both processes share).
The hand-off over the pipe is the server's own time (``srv.other``), not the engine's.

Messages (pickled tuples over one duplex pipe, framed as multiprocessing's ``Connection`` frames
them; the first is read with ``Connection.recv``, every later one on the event loop by
:class:`_Wire`, whose sends never block: a loop blocked in a send to a child that was itself
blocked in a send to it, neither reading, was a deadlock once a 32768-token prompt met eight
512-token streams):

- parent -> child: ``("gen", rid, GenParams)``, ``("close", rid)``, ``("stop",)``
- child -> parent: ``("ready", info)``, ``("error", packed)``, ``("ack", rid, load)``, ``("load", load)``,
  ``("ev", rid, event, timing, load)``,
  ``("end", rid, timing, load)``, ``("fail", rid, packed, timing, load)``, ``("stopped",)``
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import multiprocessing
import os
import pickle
import signal
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from typing import TYPE_CHECKING, Any

from pathprobe.errors import ConfigError, PathprobeError, Unavailable
from pathprobe.server.engine.base import Engine, EngineConfig, EngineTiming, Generation, GenParams, queue_full
from pathprobe.server.startup import StartupTimer

if TYPE_CHECKING:  # pragma: no cover
    from pathprobe.models import ResolvedModel
    from pathprobe.models.tokenizer_build import SlowByteLevelBPE, SlowSentencePiece

#: how long stop() waits for the child to finish its requests and exit
STOP_TIMEOUT_S = 30.0
#: how often the child checks whether its load (queue depth, running) changed unannounced
LOAD_EVERY_S = 0.05

#: the engine timing fields the child measures (tokenize and arrival are the parent's)
_TIMING = ("queue", "prefill", "decode_steps", "detokenize", "queue_start", "prefill_start", "decode_start")

Load = tuple[int, int]  # the child engine's (queue depth, running)


def _timing(t: EngineTiming) -> tuple[float | int, ...]:
    return (*(getattr(t, f) for f in _TIMING), t.cached_tokens, t.batch_size)


def _apply(t: EngineTiming, values: tuple[float | int, ...]) -> None:
    for name, value in zip(_TIMING, values, strict=False):
        setattr(t, name, value)
    t.batch_size = int(values[-1])
    t.cached_tokens = int(values[-2])


def pack_error(exc: BaseException) -> tuple[type[BaseException], str, dict[str, object]]:
    """An exception as (class, message, attributes): PathprobeError subclasses take other
    constructor arguments than they keep, so plain pickling cannot rebuild them."""
    if not isinstance(exc, PathprobeError):
        exc = Unavailable(f"engine process: {type(exc).__name__}: {exc}")
    return type(exc), str(exc), dict(vars(exc))


def unpack_error(packed: tuple[type[BaseException], str, dict[str, object]]) -> BaseException:
    cls, message, attrs = packed
    exc = cls.__new__(cls)
    exc.args = (message,)
    vars(exc).update(attrs)
    return exc


@dataclass(slots=True)
class _Info:
    model_name: str
    max_context: int
    startup: StartupTimer | None  # the child engine's
    device: str
    tokenizer_kind: str  # "slow": the parent tokenizes with the slow encoder too


#: a frame's header: the pickle's length (multiprocessing's ``Connection`` framing, up to 2 GiB)
_HEADER = struct.Struct("!i")


class _Wire(asyncio.Protocol):
    """The pipe's messages on the running loop. :meth:`send` hands a message to the transport,
    which writes what the socket takes and keeps the rest for when it can take more, so a send
    never blocks the loop, and reading goes on meanwhile; ``on_message`` gets each whole message,
    ``on_lost`` the end of the pipe."""

    def __init__(self, on_message: Callable[[tuple[Any, ...]], None], on_lost: Callable[[], None]) -> None:
        self.on_message = on_message
        self.on_lost = on_lost
        self.transport: asyncio.Transport | None = None
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._buf = bytearray()

    @classmethod
    async def attach(
        cls, conn: Connection, on_message: Callable[[tuple[Any, ...]], None], on_lost: Callable[[], None]
    ) -> _Wire:
        """Take over ``conn``'s socket (``conn`` is closed); what is already in it is read next."""
        sock = socket.socket(fileno=os.dup(conn.fileno()))
        conn.close()
        _, wire = await asyncio.get_running_loop().create_unix_connection(lambda: cls(on_message, on_lost), sock=sock)
        return wire

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def send(self, msg: tuple[Any, ...]) -> bool:
        """Queue ``msg``; False when the pipe is closed."""
        t = self.transport
        if t is None or t.is_closing():
            return False
        data = ForkingPickler.dumps(msg)
        t.write(_HEADER.pack(len(data)) + bytes(data))
        return True

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        pos, size = 0, len(buf)
        while size - pos >= _HEADER.size:
            (n,) = _HEADER.unpack_from(buf, pos)
            if size - pos - _HEADER.size < n:
                break
            pos += _HEADER.size
            msg = pickle.loads(buf[pos : pos + n])
            pos += n
            self.on_message(msg)
        del buf[:pos]

    def close(self) -> None:
        """Close after what is queued is written."""
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)
        self.on_lost()


class ProcessEngine(Engine):
    """The engine of ``config`` run in a spawned child process; same interface as the engine itself."""

    def __init__(self, config: EngineConfig, model: ResolvedModel | None = None) -> None:
        from pathprobe import models

        if config.kind == "vllm":
            raise ConfigError("--engine-process: the vllm engine already runs its engine core in a process of its own")
        self.config = config
        #: resolved once (here or by the server); the child gets it, it does not resolve again
        self.model_ref = model or models.resolve(config.model, config.model_name)
        self.tokenizer = models.load_tokenizer(self.model_ref)
        #: the slow (Python) encoder, when the child's engine uses one
        self._slow: SlowByteLevelBPE | SlowSentencePiece | None = None
        self.model_name = config.model_name or ""
        self.max_context = 0
        self.device = ""
        self.startup: StartupTimer | None = None
        self._proc: Any = None
        self._wire: _Wire | None = None
        self._gens: dict[int, Generation] = {}
        self._next = 0
        self._unacked: set[int] = set()  # sent, no word back yet: counted as waiting
        self._load: Load = (0, 0)
        self._stopped: asyncio.Future[None] | None = None
        self._dead: str | None = None
        self._stopping = False  # stop() asked: the pipe's end that follows is not a death
        #: called once when the child goes away unasked (the server turns its health off)
        self.on_down: Callable[[str], None] | None = None

    def encode_prompt(self, text: str) -> list[int]:
        if self._slow is not None:
            return self._slow.encode(text)
        return self.tokenizer.encode(text)

    # --- lifecycle --------------------------------------------------------------------
    async def start(self) -> None:
        ctx = multiprocessing.get_context("spawn")  # never fork a process that runs gRPC threads
        mine, theirs = ctx.Pipe(duplex=True)
        inner = dataclasses.replace(self.config, process=False)
        self._proc = ctx.Process(
            target=child_main, args=(theirs, inner, self.model_ref), name="pathprobe-engine", daemon=True
        )
        self._proc.start()
        theirs.close()
        msg = await asyncio.to_thread(self._first_message, mine)
        if msg[0] == "error":
            await asyncio.to_thread(self._proc.join, 5)
            raise unpack_error(msg[1])
        info: _Info = msg[1]
        self.model_name, self.max_context, self.startup, self.device = (
            info.model_name,
            info.max_context,
            info.startup,
            info.device,
        )
        if info.tokenizer_kind == "slow":
            from pathprobe import models

            self._slow = await asyncio.to_thread(models.load_slow_tokenizer, self.model_ref)
        self._stopped = asyncio.get_running_loop().create_future()
        self._wire = await _Wire.attach(mine, self._dispatch, self._on_lost)

    def _first_message(self, conn: Connection) -> tuple[Any, ...]:
        try:
            return conn.recv()
        except EOFError:
            code = self._proc.exitcode if self._proc is not None else None
            raise Unavailable(f"engine process exited while starting (exit code {code})") from None

    async def stop(self) -> None:
        if self._wire is None:
            return
        if self._dead is None:
            self._stopping = True
            self._wire.send(("stop",))
            assert self._stopped is not None
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._stopped), STOP_TIMEOUT_S)
        self._close_pipe("server shutting down", asked=True)
        await asyncio.to_thread(self._proc.join, 5)
        if self._proc.is_alive():
            self._proc.kill()

    # --- front-end side ---------------------------------------------------------------
    def queue_depth(self) -> int:
        return self._load[0] + len(self._unacked)

    def running(self) -> int:
        return self._load[1]

    def down(self) -> str | None:
        return self._dead

    def generate(self, params: GenParams) -> Generation:
        if self._wire is None or self._dead is not None:
            raise Unavailable(self._dead or "engine not started")
        gen, ids = self.prepare(params)
        depth = self.queue_depth()
        if depth >= self.config.max_queue:
            raise queue_full(depth, self.config.max_queue)
        rid = self._next
        self._next += 1
        # the child gets the token ids (tokenized and checked here), every other field as asked
        inner = dataclasses.replace(params, prompt=None, prompt_token_ids=ids, model="")
        if not self._wire.send(("gen", rid, inner)):
            raise Unavailable("engine process: its pipe is closed")
        self._gens[rid] = gen
        self._unacked.add(rid)
        gen.on_close = lambda: self._cancel(rid)
        return gen

    def _cancel(self, rid: int) -> None:
        if self._gens.pop(rid, None) is None:
            return
        self._unacked.discard(rid)
        if self._wire is not None and self._dead is None:
            self._wire.send(("close", rid))

    # --- messages from the child ------------------------------------------------------
    def _on_lost(self) -> None:
        code = self._proc.exitcode if self._proc is not None else None
        self._close_pipe(f"engine process exited (exit code {code})", asked=self._stopping)

    def _dispatch(self, msg: tuple[Any, ...]) -> None:
        kind = msg[0]
        if kind == "load":
            self._load = msg[1]
            return
        if kind == "ack":  # the child's engine took the request
            self._unacked.discard(msg[1])
            self._load = msg[2]
            return
        if kind == "stopped":
            if self._stopped is not None and not self._stopped.done():
                self._stopped.set_result(None)
            return
        rid, self._load = msg[1], msg[-1]
        self._unacked.discard(rid)
        gen = self._gens.get(rid)
        if gen is None:  # closed by the front end: the child's late words are dropped
            return
        if kind == "ev":
            _apply(gen.timing, msg[3])
            gen.push(msg[2])
            return
        del self._gens[rid]
        _apply(gen.timing, msg[2])
        if kind == "end":
            gen.finish()
        else:
            gen.fail(unpack_error(msg[3]))

    def _close_pipe(self, why: str, asked: bool = False) -> None:
        if self._dead is None:
            self._dead = why
            if not asked and self.on_down is not None:
                self.on_down(why)
        if self._wire is not None:
            self._wire.close()
        gens, self._gens = self._gens, {}
        self._unacked.clear()
        for gen in gens.values():
            gen.fail(Unavailable(why))
        if self._stopped is not None and not self._stopped.done():
            self._stopped.set_result(None)


# --- the child process --------------------------------------------------------------------
def child_main(conn: Connection, config: EngineConfig, model: ResolvedModel) -> None:
    """Entry point of the engine process: the real engine, driven over ``conn``."""
    # the parent decides when the engine stops (a drain on SIGTERM keeps it serving)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    asyncio.run(_Child(conn, config, model).run())


class _Child:
    def __init__(self, conn: Connection, config: EngineConfig, model: ResolvedModel) -> None:
        self.conn = conn
        self.wire: _Wire | None = None  # the pipe on the loop, once the parent has the "ready"
        self.config = config
        self.model = model
        self.engine: Engine | None = None
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self.done: asyncio.Event | None = None
        self.sent_load: Load = (0, 0)

    def send(self, msg: tuple[Any, ...]) -> None:
        """Send to the parent; a parent that is gone is noticed by the reader, which stops the child."""
        if self.wire is not None:
            self.wire.send(msg)
            return
        with contextlib.suppress(OSError):
            self.conn.send(msg)

    def load(self) -> Load:
        assert self.engine is not None
        self.sent_load = (self.engine.queue_depth(), self.engine.running())
        return self.sent_load

    async def watch_load(self) -> None:
        """Every message carries the engine's load; this tells the parent of changes no message
        carried (a cancelled request leaves its slot after its last word was sent)."""
        assert self.engine is not None
        while True:
            await asyncio.sleep(LOAD_EVERY_S)
            if (self.engine.queue_depth(), self.engine.running()) != self.sent_load:
                self.send(("load", self.load()))

    async def run(self) -> None:
        from pathprobe.server.engine.local import create_local_engine

        try:
            self.engine = create_local_engine(self.config, self.model)
            await self.engine.start()
        except Exception as exc:  # any startup failure goes to the parent
            self.send(("error", pack_error(exc)))
            return
        info = _Info(
            self.engine.model_name,
            self.engine.max_context,
            getattr(self.engine, "startup", None),
            str(getattr(self.engine, "device", "")),
            str(getattr(self.engine, "tokenizer_kind", "fast")),
        )
        if info.startup is not None:
            info.startup.sync = None  # e.g. torch.cuda.synchronize: not for the parent
        self.send(("ready", info))
        self.done = asyncio.Event()
        self.wire = await _Wire.attach(self.conn, self.on_message, self.done.set)
        watcher = asyncio.get_running_loop().create_task(self.watch_load())
        await self.done.wait()
        watcher.cancel()
        await self.engine.stop()
        left = list(self.tasks.values())
        if left:  # requests the stopped engine ended say so; any still open are cut
            _, pending = await asyncio.wait(left, timeout=1.0)
            for task in pending:
                task.cancel()
        self.send(("stopped",))
        self.wire.close()  # what is queued is written first
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.wire.closed, STOP_TIMEOUT_S)

    def on_message(self, msg: tuple[Any, ...]) -> None:
        assert self.done is not None
        if msg[0] == "gen":
            self.start(msg[1], msg[2])
        elif msg[0] == "close":
            self.close(msg[1])
        elif msg[0] == "stop":
            self.done.set()

    def start(self, rid: int, params: GenParams) -> None:
        assert self.engine is not None
        try:
            gen = self.engine.generate(params)
        except Exception as exc:  # the parent's request fails with it
            self.send(("fail", rid, _timing(EngineTiming()), pack_error(exc), self.load()))
            return
        self.send(("ack", rid, self.load()))
        task = asyncio.get_running_loop().create_task(self.relay(rid, gen))
        self.tasks[rid] = task
        task.add_done_callback(lambda _: self.tasks.pop(rid, None))

    def close(self, rid: int) -> None:
        task = self.tasks.pop(rid, None)
        if task is not None:
            task.cancel()

    async def relay(self, rid: int, gen: Generation) -> None:
        try:
            async for ev in gen:
                self.send(("ev", rid, ev, _timing(gen.timing), self.load()))
        except asyncio.CancelledError:
            gen.close()
            return
        except Exception as exc:  # deadline, shutdown, engine errors
            self.send(("fail", rid, _timing(gen.timing), pack_error(exc), self.load()))
            return
        self.send(("end", rid, _timing(gen.timing), self.load()))
