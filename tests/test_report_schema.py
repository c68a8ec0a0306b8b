"""report.json's published JSON schema (docs/report.schema.json): it is the typed report's own
schema, and a report.json of a real compare run validates against it (and reads back)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from pathprobe.analysis.report.model import SCHEMA_VERSION, Report, report_schema

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = ROOT / "docs" / "report.schema.json"


def test_published_schema_is_the_models() -> None:
    assert json.loads(SCHEMA.read_text()) == report_schema(), "docs/report.schema.json is stale: run `make schema`"


def test_schema_rejects_a_report_without_its_targets() -> None:
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text()))
    bad = {"meta": {"config": {}}, "baseline": "a", "concurrency": [1], "method": {"primary_metric": "e2e"}}
    assert not validator.is_valid(bad)


@pytest.mark.slow
def test_a_real_report_validates_and_reads_back(tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ["--engine", "synthetic", "--decode-ms-per-token", "0.2", "--duration", "1", "--warmup", "0.5"]
    args += ["--rounds", "1", "--concurrency", "1", "--targets", "direct-grpc,passthrough", "--no-html"]
    res = subprocess.run(
        [sys.executable, "-m", "pathprobe", "compare", *args, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    data = json.loads((out / "report.json").read_text())
    jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text())).validate(data)
    assert data["schema_version"] == SCHEMA_VERSION
    # read back through the model and written again: the same content
    assert Report.read((out / "report.json").read_text()).to_dict() == data
    assert data["targets"]["passthrough"]["by_concurrency"]["1"]["ok"] > 0
    # checked before the run: the gateway traced the probe under the client's context, the server too
    hops = data["targets"]["passthrough"]["propagation"]["hops"]
    assert [(h["hop"], h["verdict"]) for h in hops] == [("passthrough", "own span"), ("server", "own span")]
    assert data["scorecard"]["rows"][0]["target"] == "passthrough" and data["scorecard"]["rows"][0]["pairs"] > 0
