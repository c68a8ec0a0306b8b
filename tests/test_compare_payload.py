"""A payload sweep through ``pathprobe compare``: ``load.prompt_tokens`` as a list runs every point for
every configuration, and the bytes and the serialization grow with the payload on a path that re-encodes
(transcode: JSON in, protobuf upstream) while a path that forwards bytes (passthrough) decodes nothing."""

from __future__ import annotations

import pytest

from tests.support.compare import run_compare

SMALL, LARGE = 64, 16384


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("payload")
    out = tmp / "out"
    cfg = {
        "out": str(out),
        "bootstrap": 100,
        "slowest": 0,
        "tracing": False,
        # the engine in the server's process: one tokenizer load less at start-up
        "server": {
            "engine": "synthetic",
            "prefill_ms_per_token": 0.0,
            "decode_ms_per_token": 0.05,
            "engine_process": False,
        },
        "load": {
            "duration_s": 2,
            "warmup_s": 0,  # no warm-up run: one load process less (each costs seconds here)
            "rounds": 1,
            "concurrency": [1],
            "stream": False,
            "prompt_tokens": [SMALL, LARGE],
            "max_tokens": 8,
        },
        "targets": [
            {"name": "passthrough", "kind": "gateway", "mode": "passthrough"},
            {"name": "transcode", "kind": "gateway", "mode": "transcode"},
        ],
    }
    return out, run_compare(cfg, tmp / "payload.yaml", timeout=600)


def _rows(report: dict) -> dict[tuple[str, int], dict]:
    return {(r["target"], r["prompt_tokens"]): r for r in report["payload"]["rows"]}


def test_every_point_runs_for_every_configuration(swept):
    out, report = swept
    rows = _rows(report)
    assert set(rows) == {(t, p) for t in ("passthrough", "transcode") for p in (SMALL, LARGE)}, set(rows)
    for key, row in rows.items():
        assert row["n"] >= 5 and row["errors"] == 0, (key, row)
        assert (out / "runs" / key[0] / f"c1-p{key[1]}-m8" / "r0" / "records.jsonl").exists()
    # the sections above the sweep hold the first point: its requests only
    assert report["payload"]["primary"] == [SMALL, 8]
    assert report["targets"]["transcode"]["by_concurrency"]["1"]["ok"] == rows[("transcode", SMALL)]["n"]


def test_bytes_are_measured_and_grow_with_the_prompt(swept):
    _, report = swept
    rows = _rows(report)
    for target in ("passthrough", "transcode"):
        small, large = rows[(target, SMALL)], rows[(target, LARGE)]
        # the prompt's text dominates the request: its bytes follow its tokens (x256 here), measured
        assert large["request_bytes"] > 50 * small["request_bytes"], (target, small, large)
        # 8 completion tokens either way: the response does not grow with the prompt
        assert large["response_bytes"] < 2 * small["response_bytes"] + 200, (target, small, large)


def test_reencoding_grows_hop_serialization_forwarding_does_not(swept):
    _, report = swept
    rows = _rows(report)

    def gw(target: str, prompt: int) -> dict:
        return next(h for h in rows[(target, prompt)]["hops"] if h["label"].startswith("gw"))

    # transcode decodes the JSON body and encodes protobuf upstream: its own serialization grows
    small, large = gw("transcode", SMALL)["serialization_mean_ms"], gw("transcode", LARGE)["serialization_mean_ms"]
    assert large > 2 * small and large - small > 0.03, (small, large)
    assert gw("transcode", LARGE)["ms_per_mb"] > 0
    # passthrough forwards the bytes: nothing to decode at any size
    for prompt in (SMALL, LARGE):
        assert gw("passthrough", prompt)["serialization_mean_ms"] == 0.0, rows[("passthrough", prompt)]
    # the server decodes the larger message on both paths
    for target in ("passthrough", "transcode"):
        srv = next(h for h in rows[(target, LARGE)]["hops"] if h["label"] == "server")
        assert srv["serialization_mean_ms"] > 0, rows[(target, LARGE)]


def test_limits_are_reported(swept):
    _, report = swept
    lims = {(x["where"], x["setting"].split()[0]): x["value"] for x in report["payload"]["limits"]}
    assert int(lims[("server", "--max-body-bytes")]) >= 4 * 1024 * 1024
    assert lims[("gateway", "--max-body-bytes")] == lims[("server", "--max-body-bytes")]


def test_the_sweep_shows_in_the_pages(swept):
    """report.json read back: the Markdown has the sweep's rows and limits, the HTML figure draws."""
    from pathprobe.analysis.report.markdown import markdown
    from pathprobe.analysis.report.model import Report
    from pathprobe.analysis.report.plots_payload import plot_payload

    out, _ = swept
    report = Report.read((out / "report.json").read_text())
    assert report.payload is not None and len(report.payload.rows) == 4
    text = markdown(report)
    assert "Payload sweep" in text and "--max-body-bytes" in text
    assert plot_payload(report)  # a PNG, base64
