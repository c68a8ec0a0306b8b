"""The synthetic engine: no model, exact and configurable "inference" time.

Prefill takes ``prefill_ms_per_token`` x prompt tokens; each output token takes
``decode_ms_per_token``. Tokenization and detokenization are real (the tiny model's
tokenizer, or the one named by ``--model``), so the network path can be measured with
a known inference time. ``max_batch_size`` requests run at once (continuous batching:
a slot frees as soon as its request ends); the rest wait in a bounded queue, and that
wait is ``srv.queue``.

Token k of a request is due at ``decode_start + k * D``: sleeping until an absolute
deadline keeps late wake-ups from accumulating, and a :class:`~pathprobe.server.engine.pacer.Pacer`
thread wakes the loop within ~0.1 ms of each deadline (``asyncio.sleep`` alone is up to
1 ms late, which bunched tokens at sub-millisecond token times).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Literal

from pathprobe.server.engine.base import (
    Engine,
    EngineConfig,
    Generation,
    GenParams,
    TokenEvent,
    expired,
    queue_full,
    stop_index,
)
from pathprobe.server.engine.pacer import Pacer
from pathprobe.timing import now_ms

if TYPE_CHECKING:  # pragma: no cover
    from pathprobe.models import ResolvedModel

# A fixed text the engine "generates", cycled; identical on every path.
_TEXT = (
    " The quick brown fox jumps over the lazy dog near the river bank, while the"
    " model server streams one token at a time to every client that asked for it."
)


class SyntheticEngine(Engine):
    def __init__(self, config: EngineConfig, model: ResolvedModel | None = None) -> None:
        from pathprobe import models

        self.config = config
        self.tokenizer = models.load_tokenizer(model or models.resolve(config.model, config.model_name))
        self.model_name = config.model_name or "synthetic"
        self.max_context = config.max_context or 4096
        self._vocab = len(self.tokenizer)
        self._text_ids: list[int] = self.tokenizer.encode(_TEXT, add_special_tokens=False)
        self._slots: asyncio.Semaphore | None = None
        self._waiting = 0
        self._running = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._pacer: Pacer | None = None

    async def start(self) -> None:
        self._slots = asyncio.Semaphore(self.config.max_batch_size)
        self._pacer = Pacer(asyncio.get_running_loop())

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._pacer is not None:
            self._pacer.close()

    def queue_depth(self) -> int:
        return self._waiting

    def running(self) -> int:
        return self._running

    def generate(self, params: GenParams) -> Generation:
        gen, _ = self.prepare(params)
        if self._waiting >= self.config.max_queue:
            raise queue_full(self._waiting, self.config.max_queue)
        self._waiting += 1
        task = asyncio.get_running_loop().create_task(self._run(gen))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

        def abort() -> None:  # front end gone: free the slot at once
            task.cancel()

        gen.on_close = abort
        return gen

    async def _run(self, gen: Generation) -> None:
        assert self._slots is not None, "engine not started"
        t = gen.timing
        t.queue_start = now_ms()
        queued = True
        try:
            await self._acquire(gen)
            try:
                self._waiting -= 1
                queued = False
                self._running += 1
                try:
                    await self._work(gen)
                finally:
                    self._running -= 1
            finally:
                self._slots.release()
        except asyncio.CancelledError:
            gen.finish()
        except Exception as exc:
            gen.fail(exc)
        finally:
            if queued:
                self._waiting -= 1

    async def _acquire(self, gen: Generation) -> None:
        """Wait for a slot; a request whose deadline passes first leaves the queue without generating."""
        assert self._slots is not None
        deadline = gen.params.deadline_ms
        if not deadline:
            await self._slots.acquire()
            return
        task = asyncio.ensure_future(self._slots.acquire())
        try:
            done, _ = await asyncio.wait((task,), timeout=max(0.0, deadline - now_ms()) / 1000.0)
        except asyncio.CancelledError:
            self._drop(task)
            raise
        if not done:
            self._drop(task)
            gen.timing.queue = now_ms() - gen.timing.queue_start
            raise expired(gen, f"in the queue after {gen.timing.queue:.0f} ms")

    def _drop(self, task: asyncio.Future[Literal[True]]) -> None:
        """Give up a pending slot acquisition without leaking a slot it may just have won."""
        assert self._slots is not None
        if task.done() and not task.cancelled() and task.exception() is None:
            self._slots.release()
        else:
            task.cancel()

    async def _sleep_until(self, deadline_ms: float) -> None:
        assert self._pacer is not None, "engine not started"
        await self._pacer.sleep_until(deadline_ms)

    async def _work(self, gen: Generation) -> None:
        cfg, p, t = self.config, gen.params, gen.timing
        t.queue = now_ms() - t.queue_start
        t.batch_size = self._running
        t.prefill_start = now_ms()
        await self._sleep_until(t.prefill_start + cfg.prefill_ms_per_token * gen.prompt_tokens)
        t.prefill = now_ms() - t.prefill_start
        t.decode_start = now_ms()
        text_so_far = ""
        for k in range(p.max_tokens):
            step_start = now_ms()
            # first token comes out of prefill; later ones each cost one decode step
            if k > 0:
                due = t.decode_start + cfg.decode_ms_per_token * k
                if p.deadline_ms and due > p.deadline_ms:
                    # the caller stops waiting before this step ends: free the slot now, not after it
                    await self._sleep_until(p.deadline_ms)
                    t.decode_steps += now_ms() - step_start
                    raise expired(gen, f"after {k} of {p.max_tokens} tokens")
                await self._sleep_until(due)
            t.decode_steps += now_ms() - step_start
            t.batch_size = max(t.batch_size, self._running)
            token = self._text_ids[k % len(self._text_ids)]
            d0 = now_ms()
            piece = self.tokenizer.decode([token])
            t.detokenize += now_ms() - d0
            last = k == p.max_tokens - 1
            stop_at = stop_index(text_so_far + piece, p.stop, len(text_so_far))
            if stop_at is not None:
                piece = (text_so_far + piece)[len(text_so_far) : stop_at]
                gen.push(TokenEvent(piece, [token], "stop"))
                break
            text_so_far += piece
            gen.push(TokenEvent(piece, [token], "length" if last else None))
        gen.finish()
