"""The model catalog lives in the core (``pathprobe.models``): a server resolves its model once
per start and hands it to its engine (and the engine's process); the load generator and the
analysis use the catalog without importing the server."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pathprobe import models

from tests.support.procs import Server

ROOT = Path(__file__).resolve().parent.parent

# every process that imports it (the server, its spawned engine process) appends its pid to
# $COUNT_FILE each time the catalog resolves a model spec to a folder
_COUNTING = """
import os
from pathprobe import models

_real = models.resolve_model

def resolve_model(spec):
    with open(os.environ["COUNT_FILE"], "a") as fh:
        fh.write(f"{os.getpid()} {spec}\\n")
    return _real(spec)

models.resolve_model = resolve_model
"""


@pytest.mark.parametrize(
    "flags",
    [
        ("--engine", "transformers", "--device", "cpu"),
        ("--engine", "transformers", "--device", "cpu", "--engine-process"),
        ("--engine", "synthetic", "--engine-process"),
    ],
    ids=["transformers", "transformers-process", "synthetic-process"],
)
def test_a_server_start_resolves_its_model_once(tmp_path: Path, flags: tuple[str, ...]) -> None:
    """Before, every engine resolved the model itself, and the tokenizer loads resolved it
    again: 2 resolutions in one process, 3 with the engine process (5 with the slow tokenizer)."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(_COUNTING)
    count = tmp_path / "count.txt"
    pythonpath = os.pathsep.join(p for p in (str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": pythonpath, "COUNT_FILE": str(count)}
    models.ensure_tiny()  # built before the server starts (the count is about resolving, not building)
    srv = Server(tmp_path, *flags, env=env)
    try:
        lines = count.read_text().splitlines()
    finally:
        srv.stop()
    assert len(lines) == 1, lines
    assert lines[0] == f"{srv.popen.pid} tiny"  # in the server's process, not the engine's


def test_an_engine_given_a_resolved_model_does_not_resolve_it_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the engine process's child runs: ``create_engine(config, model)``."""
    from pathprobe.server.engine import EngineConfig, create_engine

    ref = models.resolve("tiny")

    def no(spec: str) -> Path:
        raise AssertionError(f"resolved again: {spec}")

    monkeypatch.setattr(models, "resolve_model", no)
    engine = create_engine(EngineConfig(kind="synthetic", model="tiny"), ref)
    assert len(engine.tokenizer) > 0
    assert (ref.name, ref.folder) == ("tiny", models.tiny_dir())


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


def _package_files(package: str) -> list[Path]:
    import importlib

    mod = importlib.import_module(package)
    return [p for folder in mod.__path__ for p in Path(folder).rglob("*.py")]


@pytest.mark.parametrize("package", ["pathprobe.loadgen", "pathprobe.analysis"])
def test_loadgen_and_analysis_never_import_the_server(package: str) -> None:
    """Not even inside a function: the catalog they need is the core's."""
    files = _package_files(package)
    assert files
    bad = {
        f"{p.relative_to(ROOT)}: {name}"
        for p in files
        for name in _imports(p)
        if name == "pathprobe.server" or name.startswith("pathprobe.server.")
    }
    assert not bad, sorted(bad)


_IMPORT_ALL = """
import importlib, pkgutil, sys
for package in ("pathprobe.loadgen", "pathprobe.analysis"):
    pkg = importlib.import_module(package)
    for mod in pkgutil.walk_packages(pkg.__path__, package + "."):
        if mod.name != "pathprobe.loadgen.locustfile":  # Locust's entry file (gevent patching)
            importlib.import_module(mod.name)
from pathprobe import models  # the catalog: heavy libraries stay lazy
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers"))
server = sorted(m for m in sys.modules if m == "pathprobe.server" or m.startswith("pathprobe.server."))
print(heavy, server)
"""


def test_importing_loadgen_and_analysis_pulls_no_server_module() -> None:
    proc = subprocess.run([sys.executable, "-c", _IMPORT_ALL], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split("\n")[0] == "[] []", proc.stdout
