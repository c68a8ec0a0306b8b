"""JSON as types: what ``json.loads`` gives and ``json.dumps`` takes.

``JsonValue`` is any JSON document; ``JsonObject`` one object (the common case: a record, a
request body, a report section). Lists and dicts are the mutable built-ins, as the parser
makes them, so a value built here can be appended to; read-only code may take a
``Mapping[str, JsonValue]`` instead.
"""

from __future__ import annotations

from typing import TypeAlias

JsonScalar: TypeAlias = "str | int | float | bool | None"
JsonValue: TypeAlias = "JsonScalar | list[JsonValue] | dict[str, JsonValue]"
JsonObject: TypeAlias = "dict[str, JsonValue]"
JsonArray: TypeAlias = "list[JsonValue]"
