"""JSON lines files (records, prompt sets): one reader with errors that name the line."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

from pathprobe.errors import PathprobeError


def read(
    path: str | os.PathLike[str],
    what: str,
    error: type[PathprobeError] = PathprobeError,
) -> Iterator[tuple[int, Any]]:
    """``(line number, value)`` for every non-blank line; ``what`` prefixes each error."""
    try:
        fh = open(path, encoding="utf-8")  # noqa: SIM115 - closed by the with below, after a clear error
    except OSError as exc:
        raise error(f"{what}: cannot read {path}: {exc.strerror or exc}") from None
    with fh:
        for lineno, line in enumerate(fh, 1):
            line = line.strip()
            if not line:
                continue
            try:
                yield lineno, json.loads(line)
            except ValueError as exc:
                raise error(f"{what}: {path}:{lineno}: malformed JSON: {exc}") from None
