"""The house's shape, read from the source: which module imports which.

- no component (server, gateway, loadgen, analysis) imports another; all of them may import the
  core (``pathprobe.*`` outside them), and the core imports none of them;
- in analysis, ``lab`` (running an experiment) may import ``report`` (figures and pages), never the
  reverse;
- no module imports itself back through others (no cycle), lazy and type-only imports included:
  a circle is an owner split into a friend file, whatever keeps it from failing at import time.

The graph is built with :mod:`ast` from every ``import`` statement, so it needs no installed extra.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: source folder -> the package it is (pyproject.toml's package-dir)
FOLDERS = {
    "core": "pathprobe",
    "server": "pathprobe.server",
    "gateway": "pathprobe.gateway",
    "loadgen": "pathprobe.loadgen",
    "analysis": "pathprobe.analysis",
}
COMPONENTS = ("server", "gateway", "loadgen", "analysis")
GENERATED = ("pathprobe.v1",)  # protoc's stubs


def _modules() -> dict[str, tuple[Path, bool]]:
    """module name -> (file, is a package's __init__)."""
    found: dict[str, tuple[Path, bool]] = {}
    for folder, package in FOLDERS.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = [p for p in path.relative_to(ROOT / folder).with_suffix("").parts if p != "__init__"]
            name = ".".join([package, *parts])
            if not name.startswith(GENERATED):
                found[name] = (path, path.name == "__init__.py")
    return found


MODULES = _modules()


def _targets(module: str, is_package: bool, node: ast.Import | ast.ImportFrom) -> Iterator[str]:
    """The names an import statement may load (a package, and each name imported from it)."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
        return
    base = module if is_package else module.rpartition(".")[0]
    for _ in range(max(node.level - 1, 0)):
        base = base.rpartition(".")[0]
    source = (base + "." + node.module if node.module else base) if node.level else (node.module or "")
    yield source
    yield from (f"{source}.{alias.name}" for alias in node.names)


def _known(name: str) -> str | None:
    """The package module ``name`` loads (its longest prefix that is one of ours)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {name: set() for name in MODULES}
    for name, (path, is_package) in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import | ast.ImportFrom):
                for target in _targets(name, is_package, node):
                    known = _known(target)
                    if known and known != name:
                        graph[name].add(known)
    return graph


GRAPH = _graph()


def _component(module: str) -> str:
    return next((c for c in COMPONENTS if module == f"pathprobe.{c}" or module.startswith(f"pathprobe.{c}.")), "core")


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            nxt = next(edges, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                scc = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    scc.append(member)
                    if member == node:
                        break
                if len(scc) > 1:
                    found.append(sorted(scc))
    return found


def test_the_graph_sees_every_folder() -> None:
    assert {_component(m) for m in MODULES} == {"core", *COMPONENTS}
    assert "pathprobe.analysis.lab.compare" in GRAPH["pathprobe.analysis.lab.compare_cli"]


def test_no_component_imports_another() -> None:
    crossing = sorted(
        f"{a} -> {b}"
        for a, targets in GRAPH.items()
        for b in targets
        if _component(b) != "core" and _component(a) != _component(b)
    )
    assert crossing == []


def test_report_imports_no_lab() -> None:
    back = sorted(
        f"{a} -> {b}"
        for a, targets in GRAPH.items()
        if a.startswith("pathprobe.analysis.report")
        for b in targets
        if b.startswith("pathprobe.analysis.lab")
    )
    assert back == []


def test_no_import_cycle() -> None:
    assert _cycles(GRAPH) == []


def test_the_cycle_finder_finds_one() -> None:
    """The check can fail: a made-up circle of three is found, a chain is not."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


@pytest.mark.parametrize("module", ["pathprobe.analysis.lab.paths", "pathprobe.analysis.report.figures"])
def test_lazy_and_type_only_imports_count(module: str) -> None:
    """paths' PathHost names its types under TYPE_CHECKING: those edges are in the graph too."""
    assert GRAPH[module], module
