"""``pathprobe serve`` (synthetic engine) with one test-only route that blocks its event loop.

``POST /test/block`` with ``{"ms": X}`` sleeps X ms in the loop's thread: every other request that
arrives meanwhile waits for the loop before its handler's first timestamp (``srv.wait``). Usage:
``python -m tests.support.blocking_server GRPC_PORT HTTP_PORT`` (or run the file).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from aiohttp import web
from pathprobe.serveconfig import ServeConfig
from pathprobe.server import app as server_app
from pathprobe.server.core import ServerState


async def block(request: web.Request) -> web.Response:
    ms = float(json.loads(await request.read())["ms"])
    time.sleep(ms / 1000.0)  # noqa: ASYNC251 - the loop's thread: nothing else runs meanwhile
    return web.Response(text="{}", content_type="application/json")


def main() -> None:
    grpc_port, http_port = int(sys.argv[1]), int(sys.argv[2])
    build = server_app.build_app

    def build_app(state: ServerState, max_body_bytes: int) -> web.Application:
        app = build(state, max_body_bytes)
        app.router.add_post("/test/block", block)
        return app

    server_app.build_app = build_app  # type: ignore[assignment]
    config = ServeConfig(engine="synthetic", host="127.0.0.1", grpc_port=grpc_port, http_port=http_port)
    asyncio.run(server_app.serve(config))


if __name__ == "__main__":
    main()
