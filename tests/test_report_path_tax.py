"""The path-tax lead table of an interleaved compare: report.json's paired verdicts, and the same rows
leading the Markdown and the HTML report (read back from the page's table cells)."""

from __future__ import annotations

import json
from html.parser import HTMLParser

import numpy as np
import pytest
from pathprobe.analysis.lab.compare import build_report, write_reports
from pathprobe.analysis.lab.config import parse_config
from pathprobe.analysis.lab.runner import Path_, RunResult
from pathprobe.analysis.report.markdown import markdown
from pathprobe.analysis.report.model import Report
from pathprobe.analysis.report.paired import COSTS_MORE, NO_CLEAR
from pathprobe.analysis.report.tables import PATH_TAX_CAPTION, fmt_ms

#: extra path tax per call over the baseline (ms), and how much it varies call to call
EXTRA = {"direct-grpc": (0.0, 0.0), "passthrough": (1.0, 0.1), "same": (0.05, 0.05), "noisy": (0.0, 3.0)}
CONCS = (1, 4)


def _rec(rng, name: str, rnd: int, conc: int, user: int, cycle: int, tax: float, engine: float) -> dict:
    extra, spread = EXTRA[name]
    tax = tax + extra + rng.uniform(-spread, spread)
    hop1, ser, other = 0.5 * tax, 0.2 * tax, 0.3 * tax
    return {
        "ts": 1000.0 + cycle * 0.01,
        "route": "grpc.Generate",
        "config": name,
        "cycle": cycle,
        "worker": "local",
        "user": user,
        "ok": True,
        "status": "OK",
        "e2e_ms": tax + engine,
        "latency_ms": tax + engine,
        "tokens_in": 64,
        "tokens_out": 16,
        "entries": {"srv.total": engine + 0.1},
        "split": {
            "e2e": tax + engine,
            "network": hop1,
            "network_hop1": hop1,
            "network_hop2": 0.0,
            "serialization": ser,
            "queueing": 0.0,
            "inference": engine,
            "other": other,
            "unsplit": 0.0,
        },
        "_round": rnd,
        "_concurrency": conc,
    }


@pytest.fixture(scope="module")
def paired_dir(tmp_path_factory):
    """Four configurations called in interleaved cycles (2 rounds x 2 concurrencies x users x 80 cycles),
    the engine's time large and noisy (20-60 ms, drawn per call), the path tax ~1 ms plus EXTRA."""
    out = tmp_path_factory.mktemp("paired")
    cfg = parse_config(
        {
            "out": str(out),
            "bootstrap": 300,
            "load": {"rounds": 2, "concurrency": list(CONCS), "stream": False, "duration_s": 2},
            "targets": [
                {"name": "direct-grpc", "kind": "direct"},
                {"name": "passthrough", "kind": "gateway", "mode": "passthrough"},
                {"name": "same", "kind": "direct"},
                {"name": "noisy", "kind": "gateway", "mode": "transcode"},
            ],
        }
    )
    rng = np.random.default_rng(3)
    paths = {t.name: Path_(t, url="grpc://x", status="ok") for t in cfg.targets}
    results: dict[str, list[RunResult]] = {n: [] for n in EXTRA}
    for rnd in range(2):
        for conc in CONCS:
            recs: dict[str, list[dict]] = {n: [] for n in EXTRA}
            for user in range(conc):
                for cycle in range(80):
                    tax = 1.0 + rng.uniform(0, 0.3)  # the moment's machine state, shared by the cycle
                    for name in EXTRA:
                        recs[name].append(_rec(rng, name, rnd, conc, user, cycle, tax, rng.uniform(20, 60)))
            for name in EXTRA:
                results[name].append(RunResult(name, conc, rnd, out, recs[name], 2.0))
    report = build_report(cfg, paths, results, {}, "e2e", "2026-12-01T00:00:00Z", 0.0)
    write_reports(report, results, out, True, "e2e")
    return out, json.loads((out / "report.json").read_text())


def test_report_json_has_a_verdict_per_configuration(paired_dir):
    _, rep = paired_dir
    assert rep["interleaved"]
    for c in CONCS:
        g = {n: rep["targets"][n]["by_concurrency"][str(c)] for n in EXTRA}
        assert "paired" not in g["direct-grpc"] and g["direct-grpc"]["path_tax"]["n"] == 160 * c
        pt = g["passthrough"]["paired"]
        assert pt["n"] == 160 * c and abs(pt["path_tax"]["median"]["value"] - 1.0) < 0.05
        assert pt["verdict"] == COSTS_MORE
        # a sure 0.05 ms is below the minimum effect; +-3 ms of noise around 0 has an interval across 0
        assert g["same"]["paired"]["verdict"] == NO_CLEAR and "minimum effect" in g["same"]["paired"]["why"]
        assert g["noisy"]["paired"]["verdict"] == NO_CLEAR
        assert g["same"]["paired"]["min_effect_ms"] == pytest.approx(0.2)
    assert {(v["target"], v["concurrency"]) for v in rep["verdicts"]} == {("passthrough", c) for c in CONCS}


class _Tables(HTMLParser):
    """Every <table> of a page in order: its attributes and its rows' cell texts."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[dict] = []
        self._row: list[str] | None = None
        self._cell: list[str] | None = None
        self._depth = 0

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append({"attrs": dict(attrs), "rows": []})
        elif tag == "tr" and self.tables:
            self._row = []
        elif tag in ("td", "th") and self._row is not None:
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None and self._row is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr" and self._row is not None:
            self.tables[-1]["rows"].append(self._row)
            self._row = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def _path_tax_expected(rep: dict, c: int) -> dict[str, list[str]]:
    out = {}
    for name, t in rep["targets"].items():
        g = t["by_concurrency"][str(c)]
        tx, pr = g["path_tax"], g.get("paired") or {}
        d = (pr.get("path_tax") or {}).get("median")
        out[name] = [
            fmt_ms(tx["path_tax"]["p50"]),
            fmt_ms(tx["network_hop1"]["p50"]),
            fmt_ms(tx["network_hop2"]["p50"]),
            fmt_ms(tx["serialization"]["p50"]),
            fmt_ms(tx["other"]["p50"]),
            fmt_ms(tx["engine"]["p50"]),
            pr.get("against") or "–",
            f"{d['value']:+.3f}" if d else "–",
            f"{d['lo']:+.3f} – {d['hi']:+.3f}" if d else "–",
            str(pr["n"]) if pr else "–",
            pr.get("verdict") or "–",
        ]
    return out


def test_html_leads_with_the_scorecard_then_the_path_tax_table(paired_dir):
    out, rep = paired_dir
    page = _Tables()
    page.feed((out / "report.html").read_text(encoding="utf-8"))
    # the scorecard first (what each configuration adds against its own protocol's direct path),
    # then the path tax, one table per concurrency, before every other table
    tables = page.tables
    if (rep.get("scorecard") or {}).get("rows"):
        assert tables[0]["attrs"].get("class") == "scorecard"
        tables = tables[1:]
    page.tables = tables
    lead = page.tables[: len(CONCS)]
    assert [t["attrs"].get("class") for t in lead] == ["path-tax"] * len(CONCS)
    assert [int(t["attrs"]["data-concurrency"]) for t in lead] == list(CONCS)
    assert all(t["attrs"].get("class") != "path-tax" for t in page.tables[len(CONCS) :])
    for t, c in zip(lead, CONCS):
        head, *rows = t["rows"]
        assert head[0] == "config" and len(head) == 12
        got = {r[0].removesuffix(" (base)"): r[1:] for r in rows}
        assert got == _path_tax_expected(rep, c)
        assert rows[0][0] == "direct-grpc (base)"


def test_markdown_leads_with_the_same_rows(paired_dir):
    _, rep = paired_dir
    md = markdown(Report.model_validate(rep))
    for c in CONCS:
        section = md.split(f"{PATH_TAX_CAPTION}, concurrency {c}:")[1]  # the page leads with them
        first_table = next(b for b in section.split("\n\n") if b.startswith("|")).splitlines()
        head, _, *body = [[x.strip() for x in line.strip("|").split("|")] for line in first_table]
        assert head[:2] == ["config", "path tax"] and head[-1] == "verdict"
        cells = body
        got = {r[0].removesuffix(" (base)"): r for r in cells}
        assert set(got) == set(EXTRA)
        assert got["passthrough"][-1] == COSTS_MORE and got["same"][-1] == NO_CLEAR
        assert got["direct-grpc"][-1] == "–"


@pytest.mark.parametrize("explicit", [False, True])
def test_each_path_is_paired_with_its_own_protocols_direct_path(tmp_path, explicit):
    """An HTTP proxy adding 1 ms over the HTTP front end, which itself costs 3 ms more than gRPC:
    paired with direct-http, the proxy's own 1 ms (not 4 ms, its HTTP client's cost included);
    direct-http itself against the baseline (what HTTP costs over gRPC). A baseline named in the
    config pairs everything with it."""
    adds = {"direct-grpc": 0.0, "direct-http": 3.0, "http-proxy": 4.0}
    cfg = parse_config(
        {
            "out": str(tmp_path),
            "bootstrap": 200,
            **({"baseline": "direct-grpc"} if explicit else {}),
            "load": {"rounds": 1, "concurrency": [1], "stream": False, "duration_s": 2},
            "targets": [
                {"name": "direct-grpc", "kind": "direct"},
                {"name": "direct-http", "kind": "direct", "protocol": "http"},
                {"name": "http-proxy", "kind": "gateway", "mode": "http-proxy"},
            ],
        }
    )
    rng = np.random.default_rng(5)
    recs: dict[str, list[dict]] = {n: [] for n in adds}
    for cycle in range(150):
        tax = 1.0 + rng.uniform(0, 2.0)  # the moment's machine state, shared by the cycle
        for name, extra in adds.items():
            rec = _rec(rng, "direct-grpc", 0, 1, 0, cycle, tax + extra + rng.uniform(-0.1, 0.1), rng.uniform(20, 60))
            recs[name].append({**rec, "config": name})
    results = {n: [RunResult(n, 1, 0, tmp_path, recs[n], 2.0)] for n in adds}
    paths = {t.name: Path_(t, url="grpc://x", status="ok") for t in cfg.targets}
    rep = build_report(cfg, paths, results, {}, "e2e", "2026-12-03T00:00:00Z", 0.0)
    got = {n: rep.targets[n].by_concurrency["1"].paired for n in ("direct-http", "http-proxy")}
    assert got["direct-http"].against == "direct-grpc"
    assert got["direct-http"].path_tax.median.value == pytest.approx(3.0, abs=0.1)
    want = ("direct-grpc", 4.0) if explicit else ("direct-http", 1.0)
    assert got["http-proxy"].against == want[0]
    assert got["http-proxy"].path_tax.median.value == pytest.approx(want[1], abs=0.1)
    verdicts = {v.target: v for v in rep.verdicts}
    assert verdicts["http-proxy"].against == want[0] and verdicts["http-proxy"].verdict == COSTS_MORE
