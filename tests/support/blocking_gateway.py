"""``pathprobe gateway`` (an aiohttp mode: transcode, http-proxy) with one test-only route that blocks
its event loop.

``POST /test/block`` with ``{"ms": X}`` sleeps X ms in the loop's thread: an upstream answer that
comes in meanwhile waits for the loop before the gateway reads it (``gw.upwait``). Usage:
``python tests/support/blocking_gateway.py <pathprobe gateway arguments>``.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from pathprobe.cli import main as pathprobe_main
from pathprobe.gateway import httpproxy, transcode

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def block(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.path != "/test/block":
        return await handler(request)
    ms = float(json.loads(await request.read())["ms"])
    time.sleep(ms / 1000.0)  # noqa: ASYNC251 - the loop's thread: nothing else runs meanwhile
    return web.Response(text="{}", content_type="application/json")


def _with_block(run: Callable[..., int]) -> Callable[..., int]:
    def run_blocking(factory: Callable[[], Awaitable[web.Application]], *args: Any, **kw: Any) -> int:
        async def blocking_factory() -> web.Application:
            app = await factory()
            app.middlewares.append(block)
            return app

        return run(blocking_factory, *args, **kw)

    return run_blocking


if __name__ == "__main__":
    transcode.run_aiohttp = _with_block(transcode.run_aiohttp)  # type: ignore[assignment]
    httpproxy.run_aiohttp = _with_block(httpproxy.run_aiohttp)  # type: ignore[assignment]
    sys.exit(pathprobe_main(["gateway", *sys.argv[1:]]))
