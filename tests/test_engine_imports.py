"""The transformers engine's static cache is a lower module: it gets a frozen settings value
from the engine, never a reference back to it (no import circle hf <-> hfstatic)."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

ENGINE = Path(__file__).resolve().parent.parent / "server" / "engine"


def _imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
    return names


def test_the_static_cache_never_imports_the_engine() -> None:
    assert "pathprobe.server.engine.hf" not in _imported(ENGINE / "hfstatic.py")
    src = (ENGINE / "hfstatic.py").read_text(encoding="utf-8")
    assert "engine._" not in src and "TransformersEngine" not in src  # no private reach into the engine


def test_static_settings_are_frozen() -> None:
    from pathprobe.server.engine.hfstatic import StaticSettings

    s = StaticSettings(model=None, device="cpu", cache_kw="cache", pad=0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.pad = 1  # type: ignore[misc]
