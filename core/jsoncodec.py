"""JSON <-> protobuf for the native HTTP API (field names exactly as in the .proto).

Used by the server's HTTP front end and the gateway's transcoder, so both accept and
produce the same JSON. Wrong JSON or wrong types raise :class:`InvalidArgument` naming
the field.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import cast

from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from pathprobe.errors import InvalidArgument
from pathprobe.jsontypes import JsonObject, JsonValue
from pathprobe.v1 import llm_pb2

#: JSON keys the native routes accept besides the GenerateRequest fields.
EXTRA_REQUEST_KEYS = frozenset({"stream"})


def loads_object(body: bytes) -> JsonObject:
    """Parse a request body that must be a JSON object."""
    try:
        obj = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidArgument("body", f"malformed JSON: {exc}") from None
    except RecursionError:
        raise InvalidArgument("body", "malformed JSON: nested too deeply") from None
    if not isinstance(obj, dict):
        raise InvalidArgument("body", f"must be a JSON object, got {type(obj).__name__}")
    return obj


def request_from_dict(obj: Mapping[str, JsonValue]) -> llm_pb2.GenerateRequest:
    """Build a GenerateRequest; unknown keys and wrong types name the field."""
    fields = llm_pb2.GenerateRequest.DESCRIPTOR.fields_by_name
    payload: JsonObject = {}
    for key, value in obj.items():
        if key in EXTRA_REQUEST_KEYS:
            continue
        if key not in fields:
            raise InvalidArgument(key, "unknown field")
        if value is None:
            continue
        _check_type(key, fields[key], value)
        payload[key] = value
    msg = llm_pb2.GenerateRequest()
    try:
        json_format.ParseDict(payload, msg)
    except json_format.ParseError as exc:
        raise InvalidArgument(_field_of(str(exc), payload), str(exc)) from None
    return msg


def stream_flag(obj: Mapping[str, JsonValue]) -> bool:
    value = obj.get("stream", False)
    if not isinstance(value, bool):
        raise InvalidArgument("stream", f"must be a boolean, got {type(value).__name__}")
    return value


def to_dict(msg: Message) -> JsonObject:
    return cast(
        JsonObject,
        json_format.MessageToDict(msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True),
    )


def dumps(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


_SCALAR_TYPES = {
    "string": (str,),
    "bool": (bool,),
    "int": (int,),
    "float": (int, float),
}


_INT64 = frozenset(
    {
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_FIXED64,
        FieldDescriptor.TYPE_SFIXED64,
    }
)
_DECIMAL = re.compile(r"-?[0-9]{1,20}")


def _kind(fd: FieldDescriptor) -> str:
    t = fd.type
    if t == fd.TYPE_STRING:
        return "string"
    if t == fd.TYPE_BOOL:
        return "bool"
    if t in (fd.TYPE_FLOAT, fd.TYPE_DOUBLE):
        return "float"
    return "int"


def _check_type(key: str, fd: FieldDescriptor, value: JsonValue) -> None:
    kind = _kind(fd)
    allowed = _SCALAR_TYPES[kind]
    repeated = fd.is_repeated if hasattr(fd, "is_repeated") else fd.label == fd.LABEL_REPEATED
    if repeated:
        if not isinstance(value, list):
            raise InvalidArgument(key, f"must be a list of {kind}, got {type(value).__name__}")
        for i, item in enumerate(value):
            if (isinstance(item, bool) and kind != "bool") or not isinstance(item, allowed):
                raise InvalidArgument(f"{key}[{i}]", f"must be {kind}, got {type(item).__name__}")
        return
    if kind == "int" and fd.type in _INT64 and isinstance(value, str) and _DECIMAL.fullmatch(value):
        return  # the proto3 JSON mapping writes 64-bit integers as strings (to_dict does): read them back
    if (isinstance(value, bool) and kind != "bool") or not isinstance(value, allowed):
        raise InvalidArgument(key, f"must be {kind}, got {type(value).__name__}")
    if kind == "int" and fd.type == fd.TYPE_INT32 and isinstance(value, int) and not -(2**31) <= value < 2**31:
        raise InvalidArgument(key, f"out of int32 range: {value}")


def _field_of(message: str, payload: Mapping[str, JsonValue]) -> str:
    for key in payload:
        if key in message:
            return key
    return "body"
