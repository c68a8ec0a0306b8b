"""compare's statistics and config validation (no processes)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from pathprobe.analysis.lab.config import CompareConfig, load_config, parse_config
from pathprobe.analysis.report import stats
from pathprobe.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent


def test_bootstrap_ci_covers_true_percentiles():
    rng = np.random.default_rng(1)
    x = rng.exponential(10.0, 4000)
    est = stats.bootstrap_percentiles(x, (50, 99), n_boot=500, seed=3)
    true50, true99 = 10 * math.log(2), 10 * math.log(100)
    assert est[50].lo <= true50 <= est[50].hi
    assert est[99].lo <= true99 <= est[99].hi
    assert est[50].lo < est[50].value < est[50].hi
    # deterministic for a seed
    again = stats.bootstrap_percentiles(x, (50, 99), n_boot=500, seed=3)
    assert again[50].as_dict() == est[50].as_dict()


def test_cliffs_delta_exact_and_cohens_d():
    a, b = [1, 2, 3], [2, 3, 4]
    # pairs: a>b: (3,2)=1; a<b: (1,2)(1,3)(1,4)(2,3)(2,4)(3,4)=6 -> (1-6)/9
    assert stats.cliffs_delta(a, b) == pytest.approx(-5 / 9)
    assert stats.cliffs_delta(b, b) == 0.0
    assert stats.cliffs_delta([10, 11], [1, 2]) == 1.0
    assert stats.cliffs_magnitude(0.1) == "negligible" and stats.cliffs_magnitude(-0.5) == "large"
    assert stats.cohens_d([2, 4], [0, 2]) == pytest.approx(2 / math.sqrt(2))


def test_welch_matches_scipy_and_verdict_only_when_significant():
    from scipy.stats import ttest_ind

    rng = np.random.default_rng(7)
    base = rng.normal(10, 1, 500)
    same = rng.normal(10, 1, 500)
    slower = rng.normal(11, 1.5, 500)
    t, p = stats.welch(slower, base)
    ref = ttest_ind(slower, base, equal_var=False)
    assert t == pytest.approx(ref.statistic) and p == pytest.approx(ref.pvalue)
    comps = [stats.compare(same, base), stats.compare(slower, base)]
    stats.judge(comps, ["same", "slower"], "base")
    assert comps[0].verdict is None and not comps[0].significant
    assert comps[1].significant and "slower is slower than base" in comps[1].verdict
    assert comps[1].p_adjusted >= comps[1].p_value  # Holm never lowers a p-value


def test_holm():
    assert stats.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert math.isnan(stats.holm([math.nan, 0.5])[0])


def test_summarize_has_ci_for_each_percentile():
    s = stats.summarize(list(range(1, 101)), n_boot=200)
    assert s["n"] == 100 and s["p50"]["value"] == pytest.approx(50.5)
    for q in ("p50", "p95", "p99"):
        assert s[q]["lo"] <= s[q]["value"] <= s[q]["hi"]


# ---------------------------------------------------------------- config


def test_default_config_file_equals_builtin_defaults():
    cfg = load_config(ROOT / "configs" / "default.yaml")
    assert cfg == CompareConfig()
    names = [t.name for t in cfg.targets]
    for needed in ("direct-grpc", "direct-http", "passthrough", "transcode", "reencode", "http-proxy", "nginx"):
        assert needed in names


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"load": {"durtion_s": 3}}, "load.durtion_s: unknown key"),
        ({"load": {"rounds": "three"}}, "load.rounds: Input should be a valid integer"),
        ({"load": {"concurrency": [1, 0]}}, "load.concurrency: "),
        ({"targets": [{"name": "g", "kind": "gateway", "mode": "teleport"}]}, "targets[0].mode: Input should be"),
        ({"targets": [{"name": "g", "kind": "gateway"}]}, "targets[0]: kind 'gateway' needs 'mode'"),
        ({"targets": [{"name": "x", "kind": "external"}]}, "targets[0]: kind 'external' needs 'address'"),
        ({"baseline": "nope"}, "baseline 'nope' is not an enabled target"),
        ({"load": {"arrival": "poisson"}}, "needs 'rate'"),
        ({"network": {"delay_ms": -1}}, "network.delay_ms: Input should be greater than or equal to 0"),
        ({"mode": "remote"}, "remote mode: target 'direct-grpc' needs 'address'"),
        (
            {"load": {"prompt_set": "file", "prompt_file": "/no/such/prompts.jsonl"}},
            "load: prompt_file: no such file: /no/such/prompts.jsonl",
        ),
    ],
)
def test_bad_config_names_key(data, expected):
    with pytest.raises(ConfigError) as exc:
        parse_config(data, "x.yaml")
    assert expected in exc.value.message, exc.value.message
    assert exc.value.message.startswith("x.yaml: ")


def test_env_substitution(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text(
        yaml.safe_dump(
            {
                "load": {"rounds": "${ROUNDS}", "max_tokens": "${MAXTOK:-7}"},
                "targets": [{"name": "ext", "kind": "external", "address": "openai+http://${HOST}:8000"}],
            }
        )
    )
    cfg = load_config(f, env={"ROUNDS": "5", "HOST": "10.0.0.9"})
    assert cfg.load.rounds == 5 and cfg.load.max_tokens == 7
    assert cfg.targets[0].address == "openai+http://10.0.0.9:8000" and cfg.targets[0].protocol == "openai"
    with pytest.raises(ConfigError, match=r"targets\[0\]\.address: environment variable \$\{HOST\} is not set"):
        load_config(f, env={"ROUNDS": "5"})


def test_unreadable_and_invalid_yaml(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("load: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_cli_flags_override_and_fail_naming_key(tmp_path, capsys):
    from pathprobe.cli import main

    assert (
        main(
            [
                "compare",
                "--print-config",
                "--engine",
                "synthetic",
                "--concurrency",
                "1,8",
                "--delay-ms",
                "5",
                "--targets",
                "direct-grpc,passthrough",
            ]
        )
        == 0
    )
    out = yaml.safe_load(capsys.readouterr().out)
    assert out["server"]["engine"] == "synthetic" and out["load"]["concurrency"] == [1, 8]
    assert out["network"]["delay_ms"] == 5 and out["network"]["hop"] == "upstream"
    assert [t["name"] for t in out["targets"] if t["enabled"]] == ["direct-grpc", "passthrough"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("load:\n  rounds: many\n")
    assert main(["compare", str(bad)]) == 2
    assert "load.rounds: Input should be a valid integer" in capsys.readouterr().err
