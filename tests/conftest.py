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
        "--engine", "synthetic", "--prefill-ms-per-token", "0.05", "--decode-ms-per-token", "1",
        "--max-batch-size", "4",
    )
    yield srv
    srv.stop()


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
