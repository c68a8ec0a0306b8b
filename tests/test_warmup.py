"""The interleaved warm-up reaches every configuration, however long a call is.

Interleaved runs (``interleave: call``) warm up in one mixed run of ``warmup_s`` per configuration;
with calls longer than that (a 2048-token stream: ~0.5 s) a cycle may end the run before it reached
every configuration, which used to fail those configurations ("warm-up: no request was sent") with
nothing wrong on their path. A configuration the mixed warm-up did not reach gets a warm-up of its own.
"""

from __future__ import annotations

import json

import pytest

from tests.support.compare import run_compare

pytestmark = pytest.mark.slow


def test_every_configuration_is_warmed_when_calls_outlast_the_warm_up(tmp_path):
    cfg = {
        "out": str(tmp_path / "out"),
        "bootstrap": 100,
        "slowest": 0,
        "tracing": False,
        # each call ~0.6 s (24 tokens, 25 ms apart) against 0.05 s of warm-up per configuration: the mixed
        # warm-up (0.3 s for six) ends within the first cycle, before it reached them all
        "server": {"engine": "synthetic", "prefill_ms_per_token": 0.0, "decode_ms_per_token": 25.0},
        "load": {
            "duration_s": 1.0,
            "warmup_s": 0.05,
            "rounds": 1,
            "concurrency": [1],
            "stream": True,
            "max_tokens": 24,
            "prompt_tokens": 8,
            "interleave": "call",
        },
        "targets": [
            *({"name": f"grpc-{i}", "kind": "direct", "protocol": "grpc"} for i in range(3)),
            *({"name": f"http-{i}", "kind": "direct", "protocol": "http"} for i in range(3)),
        ],
    }
    report = run_compare(cfg, tmp_path / "w.yaml", timeout=300)
    assert {n: t["status"] for n, t in report["targets"].items()} == dict.fromkeys(report["targets"], "ok")
    for name in report["targets"]:
        recs = [
            json.loads(line)
            for f in (tmp_path / "out" / "runs" / name / "warmup").glob("records.jsonl")
            for line in f.read_text().splitlines()
            if line.strip()
        ]
        assert any(r["ok"] for r in recs), name
