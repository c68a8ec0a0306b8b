from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.otlp import OTLPReceiver
from tests.support.procs import Server

# Tests keep the tiny model in one cache folder per machine (made once, deterministically).
os.environ.setdefault("PATHPROBE_CACHE", str(Path(__file__).resolve().parent.parent / ".cache"))


@pytest.fixture(scope="session")
def synthetic_server(tmp_path_factory) -> Iterator[Server]:
    """A synthetic-engine server: 0.05 ms/prompt token, 1 ms/output token, 4 slots."""
    srv = Server(
        tmp_path_factory.mktemp("synthetic"),
        "--engine",
        "synthetic",
        "--prefill-ms-per-token",
        "0.05",
        "--decode-ms-per-token",
        "1",
        "--max-batch-size",
        "4",
    )
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def fastapi_server(tmp_path_factory) -> Iterator[Server]:
    """The same synthetic server as ``synthetic_server``, HTTP served by FastAPI on uvicorn."""
    srv = Server(
        tmp_path_factory.mktemp("synthetic-fastapi"),
        "--engine",
        "synthetic",
        "--prefill-ms-per-token",
        "0.05",
        "--decode-ms-per-token",
        "1",
        "--max-batch-size",
        "4",
        "--http-server",
        "fastapi",
    )
    yield srv
    srv.stop()


HTTP_FRONT_ENDS = ("aiohttp", "fastapi")


@pytest.fixture(params=HTTP_FRONT_ENDS)
def http_front_end(request) -> str:
    """Each HTTP front end in turn (``pathprobe serve --http-server``)."""
    return request.param


@pytest.fixture()
def http_server(http_front_end: str, request) -> Server:
    """``synthetic_server`` with each HTTP front end in turn: the same suite for both."""
    return request.getfixturevalue("fastapi_server" if http_front_end == "fastapi" else "synthetic_server")


@pytest.fixture(scope="session")
def tiny_server(tmp_path_factory) -> Iterator[Server]:
    srv = Server(tmp_path_factory.mktemp("tiny"), "--engine", "transformers", "--model", "tiny")
    yield srv
    srv.stop()


@pytest.fixture()
def otlp_receiver() -> Iterator[OTLPReceiver]:
    rec = OTLPReceiver().start()
    yield rec
    rec.stop()
