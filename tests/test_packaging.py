"""The distribution holds every module of the tree, and the components' extras keep torch out."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# repository folder -> import path inside the distribution
LAYOUT = {
    "core": "pathprobe",
    "server": "pathprobe/server",
    "gateway": "pathprobe/gateway",
    "loadgen": "pathprobe/loadgen",
}


def _tree_modules() -> set[str]:
    found: set[str] = set()
    for folder, prefix in LAYOUT.items():
        for path in (ROOT / folder).rglob("*"):
            if "__pycache__" in path.parts or path.is_dir():
                continue
            found.add(f"{prefix}/{path.relative_to(ROOT / folder).as_posix()}")
    return found


@pytest.mark.slow
def test_wheel_contains_every_module(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
    )
    (wheel,) = tmp_path.glob("pathprobe-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        shipped = {n for n in zf.namelist() if n.startswith("pathprobe/")}
    missing = _tree_modules() - shipped
    assert not missing, f"modules of the tree not in the wheel: {sorted(missing)}"
    assert "pathprobe/server/engine/synthetic.py" in shipped
    assert "pathprobe/v1/llm_pb2.pyi" in shipped


_BLOCK_HEAVY = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {BLOCKED}:
            raise ImportError('blocked in this test: ' + name)
        return None
sys.meta_path.insert(0, Block())
import importlib, pkgutil
import pathprobe.{component} as pkg
for mod in pkgutil.iter_modules(pkg.__path__):
    if mod.name not in {SKIP}:
        importlib.import_module('pathprobe.{component}.' + mod.name)
from pathprobe.cli import main
try:
    main(['{verb}', '--help'])
except SystemExit as exc:
    assert exc.code == 0, exc.code
"""


@pytest.mark.parametrize(
    ("component", "verb", "blocked", "skip"),
    [
        ("gateway", "gateway", {"torch", "transformers", "locust", "gevent", "scipy", "matplotlib"}, set()),
        # locustfile is Locust's entry file and runs Locust's gevent patching on import
        ("loadgen", "load", {"torch", "transformers", "scipy", "matplotlib"}, {"locustfile"}),
    ],
)
def test_component_imports_without_heavy_dependencies(
    component: str, verb: str, blocked: set[str], skip: set[str]
) -> None:
    code = _BLOCK_HEAVY.replace("{BLOCKED}", repr(blocked)).replace("{SKIP}", repr(skip))
    code = code.replace("{component}", component).replace("{verb}", verb)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("extra", ["gateway", "loadgen"])
def test_component_extra_resolves_without_torch(extra: str, tmp_path: Path) -> None:
    """What `pip install 'pathprobe[EXTRA]'` would install into a fresh environment."""
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--dry-run",
            "--ignore-installed",
            "--no-build-isolation",
            "--report",
            str(report),
            f"{ROOT}[{extra}]",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0 and "Could not find a version" in proc.stderr:
        pytest.skip(f"no package index reachable: {proc.stderr[-300:]}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    names = {item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]}
    assert "pathprobe" in names and "grpcio" in names
    assert not names & {"torch", "nvidia-cublas-cu12", "scipy", "transformers"}, sorted(names)


def test_every_environment_variable_is_a_documented_constant() -> None:
    """Each PATHPROBE_* variable the code names is a constant of pathprobe.environment and in the README."""
    import re

    from pathprobe import environment

    names: set[str] = set()
    for folder in LAYOUT:
        for path in (ROOT / folder).rglob("*.py"):
            names |= set(re.findall(r"\bPATHPROBE_[A-Z0-9_]*[A-Z0-9]\b", path.read_text(encoding="utf-8")))
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert names, "no PATHPROBE_* variable found: the scan is broken"
    assert not {n for n in names if getattr(environment, n, None) != n}, "not constants of pathprobe.environment"
    assert not {n for n in names if f"`{n}`" not in readme}, "not listed in the README"
