"""Every record a real load run writes is a :class:`pathprobe.records.RequestRecord`: each key it
holds is declared there, each required key is present, each value has the declared type."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from pathprobe.analysis.report.records import read_records
from pathprobe.records import HopPartRecord, HopRecord, RequestRecord, SplitRecord
from pydantic import TypeAdapter

from tests.test_load_e2e import run_load

pytestmark = pytest.mark.slow


def _problems(obj: Mapping[str, Any], schema: Any, where: str) -> list[str]:
    """Keys of ``obj`` the TypedDict ``schema`` does not declare, and its required keys ``obj`` lacks."""
    declared = schema.__required_keys__ | schema.__optional_keys__
    out = [f"{where}: undeclared key {k!r}" for k in sorted(obj.keys() - declared)]
    out += [f"{where}: missing required key {k!r}" for k in sorted(schema.__required_keys__ - obj.keys())]
    return out


def _record_problems(rec: Mapping[str, Any]) -> list[str]:
    where = f"record {rec.get('request_id')}"
    out = _problems(rec, RequestRecord, where)
    for i, hop in enumerate(rec.get("hops") or ()):
        out += _problems(hop, HopRecord, f"{where} hops[{i}]")
    split = rec.get("split")
    if split is not None:
        out += _problems(split, SplitRecord, f"{where} split")
        for i, part in enumerate(split.get("hops") or ()):
            out += _problems(part, HopPartRecord, f"{where} split.hops[{i}]")
    return out


def test_the_key_check_can_fail() -> None:
    rec = {k: None for k in RequestRecord.__required_keys__}
    assert _record_problems(rec) == []
    assert _record_problems({**rec, "e2e": 1.0}) == ["record None: undeclared key 'e2e'"]
    rec.pop("ttft_ms")
    assert _record_problems(rec) == ["record None: missing required key 'ttft_ms'"]


def test_records_of_a_real_run_match_the_typed_record(synthetic_server, tmp_path: Path) -> None:
    """A streamed, interleaved (--mix), traced run over gRPC and OpenAI-compatible HTTP: every
    optional key and both transports' records, read back by the analysis' own reader."""
    out = tmp_path / "load"
    grpc_url = f"grpc://{synthetic_server.grpc_target}"
    mix = f"g={grpc_url},o=openai+{synthetic_server.http_url}"
    run_load(
        out,
        *("-H", grpc_url, "--mix", mix, "--stream", "-u", "2", "-r", "2", "-t", "2s", "--max-tokens", "4"),
        *("--tokenizer", "none", "--traces-file", str(tmp_path / "traces.jsonl")),
    )
    records = read_records(out / "records.jsonl")
    summary = json.loads((out / "summary.json").read_text())
    assert len(records) == summary["totals"]["requests"] > 0
    ok = [r for r in records if r["ok"]]
    assert {r["config"] for r in ok} == {"g", "o"}, "both transports' records are checked"
    assert {r["route"] for r in ok} == {"grpc.GenerateStream", "openai.completions.stream"}

    problems = [p for rec in records for p in _record_problems(rec)]
    assert not problems, problems[:20]
    adapter = TypeAdapter(RequestRecord)
    for rec in records:
        adapter.validate_python(rec, strict=True)  # raises, naming the field, on a wrong type
    # the optional keys this run must have written, and what a split and hops hold
    for rec in ok:
        assert {"client_wait_total_ms", "config", "cycle"} <= rec.keys()
        assert rec["split"] is not None and rec["split"]["hops"] and rec["hops"]
        assert isinstance(rec["trace_id"], str) and len(rec["trace_id"]) == 32


def test_timing_detail_keeps_the_schema_and_the_summary(synthetic_server, tmp_path: Path) -> None:
    """``--records-detail timing``: every record still a RequestRecord, durations and the split's
    segments kept, the raw entries and per-chunk lists gone: on 32-token streams, under half the bytes."""
    grpc_url = f"grpc://{synthetic_server.grpc_target}"
    runs = {}
    for detail in ("full", "timing"):
        out = tmp_path / detail
        args = ("-H", grpc_url, "--stream", "-u", "2", "-r", "2", "-t", "2s", "--max-tokens", "32")
        run_load(out, *args, "--tokenizer", "none", "--records-detail", detail)
        runs[detail] = (read_records(out / "records.jsonl"), (out / "records.jsonl").stat().st_size)
    (full, full_bytes), (timing, timing_bytes) = runs["full"], runs["timing"]
    assert timing and not [p for rec in timing for p in _record_problems(rec)]
    adapter = TypeAdapter(RequestRecord)
    for rec in timing:
        adapter.validate_python(rec, strict=True)
    ok = [r for r in timing if r["ok"]]
    assert ok and all(r["entries"] == {} and r["hops"] == [] and r["itl_ms"] == [] for r in ok)
    split = ok[0]["split"]
    assert split is not None and split["hops"] == [] and split["e2e"] == ok[0]["e2e_ms"]
    assert (
        abs(
            sum(split[k] for k in ("network", "serialization", "queueing", "inference", "other", "unsplit"))
            - split["e2e"]
        )
        < 1e-6
    )
    assert all(r["ttft_ms"] is not None for r in ok)
    per_full, per_timing = full_bytes / len(full), timing_bytes / len(timing)
    assert per_timing <= per_full / 2, (per_full, per_timing)
