"""Load generator building blocks: histograms, aggregation, arrivals, prompts, CLI parsing."""

from __future__ import annotations

import json
import random

import pytest
from pathprobe.errors import ConfigError
from pathprobe.loadgen import hist
from pathprobe.loadgen.arrival import Schedule
from pathprobe.loadgen.cli import _opt_value, _without, validate
from pathprobe.loadgen.outputs import format_table
from pathprobe.loadgen.records import Aggregator
from pathprobe.loadgen.targets import parse_host


def test_record_many_matches_record_value_bucket_for_bucket():
    rng = random.Random(1)
    vals = [
        rng.choice([rng.uniform(0, 3), rng.uniform(0, 400), rng.uniform(0, 90_000), -0.5, 0.0]) for _ in range(5000)
    ]
    a, b = hist.new_histogram(), hist.new_histogram()
    for v in vals:
        a.record_value(max(0, int(round(v * 1000))))
    hist.record_many(b, vals)
    small = hist.new_histogram()  # the one-by-one path for small batches, same buckets
    for i in range(0, len(vals), 7):
        hist.record_many(small, vals[i : i + 7])
    for c in (b, small):
        assert a.get_total_count() == c.get_total_count() == len(vals)
        assert (a.get_min_value(), a.get_max_value()) == (c.get_min_value(), c.get_max_value())
        assert all(a.get_count_at_index(i) == c.get_count_at_index(i) for i in range(a.counts_len))


def test_microsecond_values_are_exact_below_32ms():
    h = hist.new_histogram()
    vals = [1.001, 2.002, 3.003, 17.017, 31.999]
    hist.record_many(h, vals)
    st = hist.stats(h, sum(vals))
    assert st["min"] == 1.001 and st["max"] == 31.999 and st["p50"] == 3.003


def test_recycled_histogram_is_as_good_as_a_fresh_one():
    used = hist.new_histogram()
    hist.record_many(used, [0.5, 7.25, 1234.0, 90_000.0])
    hist.recycle(used)
    again = hist.new_histogram()
    assert again is used  # taken back from the pool
    assert again.get_total_count() == 0 and not hist._counts_view(again).any()
    fresh = hist._alloc()
    vals = [0.001, 2.5, 2.5, 31.999, 400.0]
    hist.record_many(again, vals)
    hist.record_many(fresh, vals)
    assert (again.get_min_value(), again.get_max_value()) == (fresh.get_min_value(), fresh.get_max_value())
    assert hist.stats(again, sum(vals)) == hist.stats(fresh, sum(vals))
    assert hist.stats(hist.decode(hist.encode(again)), sum(vals)) == hist.stats(fresh, sum(vals))
    hist.prefill(3)
    assert len(hist._POOL) >= 3


def _rec(route: str, ok: bool, e2e: float, status: str = "OK") -> dict:
    split = {
        "e2e": e2e,
        "network": e2e / 2,
        "serialization": 0.1,
        "queueing": 0.0,
        "inference": e2e / 2 - 0.1,
        "other": 0.0,
        "unsplit": 0.0,
        "network_hop1": e2e / 2,
        "network_hop2": 0.0,
    }
    return {
        "ts": 1.0,
        "route": route,
        "ok": ok,
        "status": status,
        "e2e_ms": e2e,
        "latency_ms": e2e,
        "client_encode_ms": 0.01,
        "client_decode_ms": 0.02,
        "schedule_lag_ms": 0.0,
        "split": split if ok else None,
        "ttft_ms": None,
        "itl_ms": [],
        "tpot_ms": None,
    }


def test_wire_merge_equals_single_aggregation():
    rng = random.Random(2)
    recs = [
        _rec(rng.choice(["grpc.Generate", "http.generate"]), rng.random() > 0.1, rng.uniform(1, 50), "UNAVAILABLE")
        for _ in range(600)
    ]
    for r in recs:
        if r["ok"]:
            r["status"] = "OK"
    whole = Aggregator()
    whole.add_batch(recs)
    parts = [Aggregator(), Aggregator()]
    parts[0].add_batch(recs[:250])
    parts[1].add_batch(recs[250:])
    merged = Aggregator()
    for p in parts:  # through the wire format, as workers ship it (JSON-able)
        merged.merge_wire(json.loads(json.dumps(p.to_wire())))
    a, b = whole.summary({}), merged.summary({})
    assert a["totals"] == b["totals"]
    for route in a["routes"]:
        for m, st in a["routes"][route]["metrics"].items():
            stb = b["routes"][route]["metrics"][m]
            assert {k: v for k, v in st.items() if k != "mean"} == {k: v for k, v in stb.items() if k != "mean"}
            assert st["mean"] == pytest.approx(stb["mean"], abs=1e-3)
    table = format_table(a)
    assert "p50" in table and "p99" in table and "grpc.Generate" in table


def test_stopped_requests_are_counted_apart_from_errors():
    agg = Aggregator()
    agg.add_batch(
        [
            _rec("grpc.Generate", True, 5),
            _rec("grpc.Generate", False, 2, "STOPPED"),
            _rec("grpc.Generate", False, 3, "UNAVAILABLE"),
        ]
    )
    t = agg.totals()
    assert t == {"requests": 3, "ok": 1, "errors": 1, "stopped": 1, "errors_by_status": {"UNAVAILABLE": 1}}


def test_constant_schedule_with_ramp():
    s = Schedule(100.0, "constant", ramp_s=2.0, start_ns=0)
    times = [s.next_ns() / 1e9 for _ in range(400)]
    # ramp: R*T/2 = 100 arrivals in the first 2 s, then 100/s
    assert sum(t <= 2.0 for t in times) == 100
    assert times[199] == pytest.approx(3.0, abs=0.011)
    gaps_late = [b - a for a, b in zip(times[200:], times[201:])]
    assert all(g == pytest.approx(0.01, abs=1e-6) for g in gaps_late)


def test_poisson_schedule_rate():
    s = Schedule(200.0, "poisson", start_ns=0, seed=3)
    times = [s.next_ns() / 1e9 for _ in range(4000)]
    assert 4000 / times[-1] == pytest.approx(200.0, rel=0.06)
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert len(set(round(g, 6) for g in gaps)) > 1000  # not constant


def test_parse_host():
    assert parse_host("grpc://127.0.0.1:5") == ("grpc", "127.0.0.1:5")
    assert parse_host("http://h:8/") == ("http", "http://h:8")
    assert parse_host("openai+http://h:8") == ("openai", "http://h:8")
    assert parse_host("openai+https://h:8/x") == ("openai", "https://h:8/x")
    with pytest.raises(ConfigError, match="host"):
        parse_host("ftp://h:1")


def test_cli_option_helpers_and_validation(tmp_path):
    args = ["-u", "4", "--users=5", "-r2", "--out", "d", "--sweep", "1,2", "-H", "grpc://h:1"]
    assert _opt_value(args, "-u", "--users") == "5"
    assert _opt_value(args, "-r", "--spawn-rate") == "2"
    assert _without(args, "-u", "--users", "-r", "--spawn-rate", "--sweep") == ["--out", "d", "-H", "grpc://h:1"]
    with pytest.raises(ConfigError, match="rate"):
        validate(["-H", "grpc://h:1", "--arrival", "poisson"])
    with pytest.raises(ConfigError, match="host"):
        validate(["-H", "tcp://h:1"])
    with pytest.raises(ConfigError, match="host"):
        validate(["--headless", "-t", "1s"])
    with pytest.raises(ConfigError, match="prompt-file"):
        validate(["--prompt-file", str(tmp_path / "missing.jsonl")])
    with pytest.raises(ConfigError, match="max-tokens"):
        validate(["--max-tokens", "0"])
    with pytest.raises(ConfigError, match="metrics-port"):
        validate(["--metrics-port", "99999"])
    with pytest.raises(ConfigError, match="prompt-tokens"):
        validate(["-u", "2", "--prompt-tokens", "0"])
    with pytest.raises(ConfigError, match="--arrival"):
        validate(["--arrival", "open"])
    with pytest.raises(ConfigError, match="mix"):
        validate(["--mix", "a=grpc://h:1,a=grpc://h:2"])
    with pytest.raises(ConfigError, match="tokenizer"):
        validate(["--tokenizer", str(tmp_path / "missing")])
    with pytest.raises(ConfigError, match="tokenizer"):
        validate(["--tokenizer", "preset:gpt-9"])
    validate(["--tokenizer", "preset:llama-3-8b", "--metrics-port", "0"])
    validate(["--tokenizer", "preset:llama-3-8b@tiny"])


def test_load_config_flag_over_environment_over_default(tmp_path):
    """One Config per run: a flag wins over its variable, which wins over the default."""
    from argparse import Namespace

    from pathprobe import environment as env_vars
    from pathprobe.loadgen.config import Config

    env = {env_vars.PATHPROBE_API_KEY: "env-key", env_vars.PATHPROBE_LOAD_METRICS_PORT: "9464"}
    cfg = Config.from_options(Namespace(api_key="", metrics_port=0, max_tokens=8), env)
    assert (cfg.api_key, cfg.metrics_port, cfg.metrics_host, cfg.max_tokens) == ("env-key", 9464, "127.0.0.1", 8)
    cfg = Config.from_options(Namespace(api_key="flag-key", metrics_port=9100, metrics_host="0.0.0.0"), env)
    assert (cfg.api_key, cfg.metrics_port, cfg.metrics_host) == ("flag-key", 9100, "0.0.0.0")
    assert Config.from_options(None, {}) == Config()
    ca = tmp_path / "ca.pem"
    ca.write_text("-")
    cfg = Config.from_options(None, {f"{env_vars.PATHPROBE_LOAD_TLS}_CA": str(ca)})
    assert cfg.tls is not None and cfg.tls.ca == str(ca)
    with pytest.raises(ConfigError, match=env_vars.PATHPROBE_LOAD_METRICS_PORT):
        Config.from_options(None, {env_vars.PATHPROBE_LOAD_METRICS_PORT: "http"})
    with pytest.raises(ConfigError, match="max-tokens"):
        Config(max_tokens=0)
    with pytest.raises(ConfigError, match="mix"):
        Config.from_options(Namespace(mix="a=grpc://h:1,a=grpc://h:2"), {})


def test_openai_sdk_target_without_the_sdk_is_a_clear_error():
    import subprocess
    import sys

    code = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] == 'openai':
            raise ImportError('blocked in this test: ' + name)
sys.meta_path.insert(0, Block())
from pathprobe.cli import main
sys.exit(main(['load', '--headless', '-t', '1s', '-H', 'openai-sdk+http://127.0.0.1:9']))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "host:" in proc.stderr and "openai" in proc.stderr and "Traceback" not in proc.stderr


def test_preset_tokenizer_without_transformers_is_a_clear_error(tmp_path):
    """A [loadgen] install cannot build a preset's tokenizer: exit 2 naming --tokenizer, no traceback."""
    import os
    import subprocess
    import sys

    code = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] == 'transformers':  # as if not installed
            raise ModuleNotFoundError('No module named ' + repr(name), name=name)
sys.meta_path.insert(0, Block())
from pathprobe.cli import main
from pathprobe.errors import ConfigError
from pathprobe.loadgen import prompts
try:
    prompts.load_tokenizer('preset:llama-3-8b')
except ConfigError as exc:
    assert exc.message.startswith('tokenizer:'), exc.message
else:
    raise AssertionError('no error')
sys.exit(main(['load', '--headless', '-t', '1s', '-H', 'grpc://127.0.0.1:9', '--tokenizer', 'preset:llama-3-8b']))
"""
    env = {**os.environ, "PATHPROBE_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "tokenizer:" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("kind", ["http", "openai"])
def test_http_target_to_a_closed_port_reports_the_connection_error(kind):
    """Nothing listening: the call fails with the connection's own error (was an AttributeError, since the
    request headers were only set once a TCP handshake had succeeded)."""
    import socket

    from pathprobe.loadgen.targets import CallSpec, Outcome, make_target

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when the block ends
    target = make_target(f"{'openai+' if kind == 'openai' else ''}http://127.0.0.1:{port}", 5)
    try:
        with pytest.raises(OSError):
            target.call(CallSpec(prompt="hello", max_tokens=2, stream=False), {}, Outcome())
    finally:
        target.close()


def test_prompt_is_exactly_n_tokens_of_the_tiny_tokenizer():
    from pathprobe import models
    from pathprobe.loadgen import prompts

    tok = models.load_tokenizer("tiny")
    ps = prompts.build("fixed", tokens=64, tokenizer="tiny")
    p = ps.next()
    assert p.text.startswith("The capital of France is")
    assert p.tokens == 64 == len(tok.encode(p.text, add_special_tokens=False))
    sweep = prompts.build("sweep", lengths=[8, 32, 100], tokenizer="tiny")
    got = [len(tok.encode(sweep.next().text, add_special_tokens=False)) for _ in range(3)]
    assert got == [8, 32, 100]


_NO_TORCH_PROMPTS = """
import importlib.abc, json, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('torch', 'transformers'):
            raise ImportError('blocked in this test: ' + name)
sys.meta_path.insert(0, Block())
from pathprobe.loadgen import prompts
ps = prompts.build('sweep', lengths=[8, 32, 100], tokenizer='tiny')
print(json.dumps([ps.next().text for _ in range(3)]))
"""


def test_prompts_cut_without_torch_or_transformers_match_the_servers_tokenizer(tmp_path):
    """A load-generator install (no torch, no transformers) and an empty cache: the tiny tokenizer
    is built alone, and its prompts have exactly N tokens in the server's (transformers) tokenizer."""
    import os
    import subprocess
    import sys

    from pathprobe import models

    env = {**os.environ, "PATHPROBE_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run(
        [sys.executable, "-c", _NO_TORCH_PROMPTS], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    texts = json.loads(proc.stdout)
    assert not (tmp_path / "cache" / f"tiny-v{models.TINY_VERSION}").exists()  # no model was built
    assert (tmp_path / "cache" / f"tiny-v{models.TINY_VERSION}-tokenizer" / "tokenizer.json").is_file()
    tok = models.load_tokenizer("tiny")  # the server's tokenizer, from the tiny model's folder
    assert [len(tok.encode(t, add_special_tokens=False)) for t in texts] == [8, 32, 100]


def test_prompt_file(tmp_path):
    from pathprobe.loadgen import prompts

    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "hello there", "max_tokens": 3}\n"just text"\n')
    ps = prompts.build("file", path=str(f), tokenizer="none")
    a, b = ps.next(), ps.next()
    assert (a.text, a.max_tokens, b.text) == ("hello there", 3, "just text")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": ""}\n')
    with pytest.raises(ConfigError, match="bad.jsonl:1"):
        prompts.build("file", path=str(bad), tokenizer="none")


def test_fast_timing_parse_agrees_with_timing_parse():
    from pathprobe import timing

    for s in [
        "srv.decode;dur=0.012, srv.total;dur=19.500, gw.total;dur=20.1",
        'a;desc="x";dur=1.5, b, c;dur="2"',
        "",
        "x;dur=abc",
        " spaced ;dur=3 , y;dur=1e-3",
    ]:
        assert timing.parse_chain(s) == timing.parse(s), s


def test_numpy_percentiles_agree_with_hdrh():
    rng = random.Random(4)
    h = hist.new_histogram()
    hist.record_many(h, [rng.expovariate(0.05) for _ in range(3000)] + [0.0])
    pcts = [0.0, 1.0, 50.0, 90.0, 99.0, 99.9, 100.0]
    assert hist.percentiles(h, pcts) == h.get_percentile_to_value_dict(pcts)


def test_prompts_are_cached_so_later_runs_skip_the_tokenizer(tmp_path):
    import subprocess
    import sys

    code = (
        "import sys; from pathprobe.loadgen import prompts; "
        "p = prompts.build('fixed', tokens=64, tokenizer='tiny').next(); "
        "print(p.tokens, 'transformers' in sys.modules)"
    )
    first = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    second = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert second.stdout.split() == ["64", "False"], (first.stdout, second.stdout, second.stderr)


def test_jsonl_reader_names_file_and_line(tmp_path) -> None:
    from pathprobe import jsonl
    from pathprobe.analysis.report.records import read_records
    from pathprobe.errors import ConfigError, PathprobeError
    from pathprobe.loadgen.prompts import from_file

    good = tmp_path / "p.jsonl"
    good.write_text('"plain string"\n\n{"prompt": "hi", "max_tokens": 3}\n')
    assert [(n, v) for n, v in jsonl.read(good, "x")] == [(1, "plain string"), (3, {"prompt": "hi", "max_tokens": 3})]
    assert [p.max_tokens for p in from_file(str(good), None)] == [None, 3]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{oops\n')
    with pytest.raises(ConfigError, match=r"^prompt-file: .*bad.jsonl:2: malformed JSON"):
        from_file(str(bad), None)
    with pytest.raises(PathprobeError, match=r"^records: .*bad.jsonl:2: malformed JSON"):
        read_records(bad)
    with pytest.raises(PathprobeError, match="cannot read"):
        read_records(tmp_path / "missing.jsonl")
