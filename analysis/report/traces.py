"""Read exported traces (OTLP JSON, Jaeger JSON, Jaeger's query API) and rebuild them.

Accepted inputs, detected per JSON document:
- OTLP JSON ``{"resourceSpans": [...]}``: our JSON-lines files
  (:class:`pathprobe.telemetry.OTLPJsonLinesExporter`), an OpenTelemetry Collector
  ``file`` exporter's output (one document per line), or a single document;
- Jaeger's API v3 answer ``{"result": {"resourceSpans": [...]}}`` (one or several);
- Jaeger's classic JSON ``{"data": [{"traceID": ..., "spans": [...], "processes": {...}}]}``
  (the UI's "download JSON" and ``/api/traces``);
- a JSON array of any of these.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from pathprobe._otlpjson import attributes
from pathprobe.errors import ConfigError, PathprobeError
from pathprobe.jsontypes import JsonArray, JsonObject, JsonValue

KIND_NAMES = {0: "UNSPECIFIED", 1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}


@dataclass(slots=True)
class Span:
    trace_id: str
    span_id: str
    parent_id: str
    name: str
    kind: str  # SERVER, CLIENT, INTERNAL, ...
    start_ns: int
    end_ns: int
    service: str = ""
    # JSON attribute values, left open until tracesplit (another branch) narrows what it reads
    attributes: dict[str, Any] = field(default_factory=dict)
    resource: JsonObject = field(default_factory=dict)
    status: JsonObject = field(default_factory=dict)
    scope: str = ""

    @property
    def duration_ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6


# ------------------------------------------------------------------ decoding


def _obj(v: JsonValue) -> JsonObject:
    """``v or {}`` for a member that should be an object (a wrong type fails, as a lookup on it would)."""
    if not v:
        return {}
    if not isinstance(v, dict):
        raise TypeError(f"expected a JSON object, got {type(v).__name__}")
    return v


def _arr(v: JsonValue) -> JsonArray:
    """``v or []`` for a member that should be an array (a wrong type fails, as iterating it would)."""
    if not v:
        return []
    if not isinstance(v, list):
        raise TypeError(f"expected a JSON array, got {type(v).__name__}")
    return v


def _objs(v: JsonValue) -> list[JsonObject]:
    """The objects of an array member (``v or []``, each item an object)."""
    return [_obj(x) or {} for x in _arr(v)]


def _num(v: JsonValue) -> int | float | str:
    """A JSON number or its string spelling (OTLP JSON writes 64-bit integers as strings)."""
    if isinstance(v, (int, float, str)):
        return v
    raise TypeError(f"expected a number, got {type(v).__name__}")


def _norm_id(value: JsonValue, nbytes: int) -> str:
    """Hex id from hex (OTLP JSON) or base64 (protobuf's json_format) spellings."""
    if not value:
        return ""
    s = str(value)
    if len(s) == nbytes * 2:
        try:
            bytes.fromhex(s)
            return s.lower()
        except ValueError:
            pass
    try:
        raw = base64.b64decode(s, validate=True)
        if len(raw) == nbytes:
            return raw.hex()
    except (binascii.Error, ValueError):
        pass
    return s.lower()


def _any_value(v: JsonValue) -> JsonValue:
    if not isinstance(v, dict):
        return v
    if "stringValue" in v:
        return v["stringValue"]
    if "intValue" in v:
        return int(_num(v["intValue"]))
    if "doubleValue" in v:
        return float(_num(v["doubleValue"]))
    if "boolValue" in v:
        return bool(v["boolValue"])
    if "arrayValue" in v:
        return [_any_value(x) for x in _arr(_obj(v["arrayValue"]).get("values", []))]
    if "kvlistValue" in v:
        return {str(kv["key"]): _any_value(kv.get("value")) for kv in _objs(_obj(v["kvlistValue"]).get("values", []))}
    if "bytesValue" in v:
        return v["bytesValue"]
    return None


def _attrs(kvs: JsonValue) -> JsonObject:
    return {str(kv["key"]): _any_value(kv.get("value")) for kv in _objs(kvs) if "key" in kv}


def _kind(v: JsonValue) -> str:
    if isinstance(v, int):
        return KIND_NAMES.get(v, str(v))
    s = str(v or "UNSPECIFIED").upper()
    return s.removeprefix("SPAN_KIND_")


def spans_from_otlp(doc: JsonObject) -> Iterator[Span]:
    for rs in _objs(doc.get("resourceSpans") or doc.get("resource_spans")):
        resource = _attrs(_obj(rs.get("resource")).get("attributes"))
        service = str(resource.get("service.name", ""))
        for ss in _objs(rs.get("scopeSpans") or rs.get("scope_spans") or rs.get("instrumentationLibrarySpans")):
            scope = str(_obj(ss.get("scope") or ss.get("instrumentationLibrary")).get("name", ""))
            for sp in _objs(ss.get("spans")):
                yield Span(
                    trace_id=_norm_id(sp.get("traceId") or sp.get("trace_id"), 16),
                    span_id=_norm_id(sp.get("spanId") or sp.get("span_id"), 8),
                    parent_id=_norm_id(sp.get("parentSpanId") or sp.get("parent_span_id"), 8),
                    name=str(sp.get("name", "")),
                    kind=_kind(sp.get("kind")),
                    start_ns=int(_num(sp.get("startTimeUnixNano") or sp.get("start_time_unix_nano") or 0)),
                    end_ns=int(_num(sp.get("endTimeUnixNano") or sp.get("end_time_unix_nano") or 0)),
                    service=service,
                    attributes=_attrs(sp.get("attributes")),
                    resource=resource,
                    status=_obj(sp.get("status")),
                    scope=scope,
                )


def _jaeger_tag(tag: JsonObject) -> JsonValue:
    v = tag.get("value")
    t = str(tag.get("type", "string")).lower()
    if t in ("int64", "int"):
        return int(_num(v))
    if t in ("float64", "float"):
        return float(_num(v))
    if t == "bool":
        return bool(v)
    return v


def spans_from_jaeger(doc: JsonObject) -> Iterator[Span]:
    for tr in _objs(doc.get("data")):
        processes = _obj(tr.get("processes"))
        for sp in _objs(tr.get("spans")):
            pid = sp.get("processID")
            proc = _obj(processes[pid]) if isinstance(pid, str) and pid in processes else _obj(sp.get("process"))
            tags = {str(t["key"]): _jaeger_tag(t) for t in _objs(sp.get("tags")) if "key" in t}
            parent: JsonValue = ""
            for ref in _objs(sp.get("references")):
                if ref.get("refType", "CHILD_OF") == "CHILD_OF":
                    parent = ref.get("spanID", "")
                    break
            kind = str(tags.pop("span.kind", "internal")).upper()
            start_ns = int(_num(sp.get("startTime", 0))) * 1000
            yield Span(
                trace_id=_norm_id(sp.get("traceID") or tr.get("traceID"), 16).rjust(32, "0"),
                span_id=_norm_id(sp.get("spanID"), 8).rjust(16, "0"),
                parent_id=_norm_id(parent, 8).rjust(16, "0") if parent else "",
                name=str(sp.get("operationName", "")),
                kind=kind,
                start_ns=start_ns,
                end_ns=start_ns + int(_num(sp.get("duration", 0))) * 1000,
                service=str(proc.get("serviceName", "")),
                attributes=tags,
                resource={str(t["key"]): _jaeger_tag(t) for t in _objs(proc.get("tags")) if "key" in t},
            )


def spans_from_document(doc: JsonValue) -> Iterator[Span]:
    if isinstance(doc, list):
        for item in doc:
            yield from spans_from_document(item)
        return
    if not isinstance(doc, dict):
        return
    if "result" in doc and isinstance(doc["result"], dict):
        yield from spans_from_otlp(doc["result"])
    elif "resourceSpans" in doc or "resource_spans" in doc:
        yield from spans_from_otlp(doc)
    elif "data" in doc and isinstance(doc["data"], list):
        yield from spans_from_jaeger(doc)
    elif "error" in doc:
        err = doc["error"]
        message = err.get("message", err) if isinstance(err, dict) else err
        raise PathprobeError(f"trace source answered an error: {message}")


def iter_documents(text: str) -> Iterator[JsonValue]:
    """One or more JSON documents: a single one, JSON lines, or concatenated objects."""
    dec = json.JSONDecoder()
    i, n = 0, len(text)
    while i < n:
        while i < n and text[i] in " \t\r\n":
            i += 1
        if i >= n:
            break
        try:
            obj, i = dec.raw_decode(text, i)
        except json.JSONDecodeError as exc:
            line = text.count("\n", 0, exc.pos) + 1
            raise PathprobeError(f"not valid JSON at line {line}: {exc.msg}") from None
        yield obj


def read_spans(paths: Iterable[str | os.PathLike[str]]) -> list[Span]:
    spans: list[Span] = []
    for p in paths:
        path = Path(p)
        files = sorted(path.rglob("*.json*")) if path.is_dir() else [path]
        for f in files:
            try:
                text = f.read_text(encoding="utf-8")
            except OSError as exc:
                raise ConfigError(f"{f}: cannot read: {exc.strerror or exc}") from None
            try:
                spans.extend(s for doc in iter_documents(text) for s in spans_from_document(doc))
            except PathprobeError as exc:
                raise PathprobeError(f"{f}: {exc.message}") from None
    return spans


# ------------------------------------------------------------------ Jaeger query API


def _get_json_text(url: str, timeout: float) -> str:
    req = urllib.request.Request(url, headers={"Accept": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            body_bytes: bytes = resp.read()
            return body_bytes.decode("utf-8")
    except urllib.error.HTTPError as exc:
        body = exc.read().decode("utf-8", "replace")[:300]
        if exc.code == 404:
            return ""  # no traces: Jaeger answers 404 "trace not found"
        raise PathprobeError(f"{url}: HTTP {exc.code}: {body}") from None
    except OSError as exc:
        raise PathprobeError(f"{url}: cannot reach the Jaeger query API: {getattr(exc, 'reason', exc)}") from None


def query_jaeger(
    base_url: str,
    *,
    service: str | None = None,
    trace_ids: Iterable[str] = (),
    lookback: timedelta = timedelta(hours=1),
    limit: int = 1000,
    operation: str | None = None,
    timeout: float = 30.0,
) -> list[Span]:
    """Fetch traces from Jaeger's ``/api/v3/traces`` (OTLP JSON in ``{"result": ...}``)."""
    base = base_url.rstrip("/")
    texts: list[str] = []
    ids = list(trace_ids)
    if ids:
        for tid in ids:
            texts.append(_get_json_text(f"{base}/api/v3/traces/{urllib.parse.quote(tid)}", timeout))
    else:
        if not service:
            raise ConfigError("--jaeger needs --service (or --trace-id): Jaeger searches one service at a time")
        now = datetime.now(UTC)
        params = {
            "query.service_name": service,
            "query.start_time_min": (now - lookback).isoformat().replace("+00:00", "Z"),
            "query.start_time_max": now.isoformat().replace("+00:00", "Z"),
            "query.search_depth": str(limit),
            "query.num_traces": str(limit),
        }
        if operation:
            params["query.operation_name"] = operation
        texts.append(_get_json_text(f"{base}/api/v3/traces?{urllib.parse.urlencode(params)}", timeout))
    spans: list[Span] = []
    for text in texts:
        for doc in iter_documents(text):
            spans.extend(spans_from_document(doc))
    return spans


# ------------------------------------------------------------------ traces


@dataclass(slots=True)
class Trace:
    trace_id: str
    spans: list[Span]
    by_id: dict[str, Span] = field(default_factory=dict)
    children: dict[str, list[Span]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # the same span may arrive twice (two exporters, overlapping files): keep one
        uniq: dict[str, Span] = {}
        for s in self.spans:
            uniq.setdefault(s.span_id, s)
        self.spans = sorted(uniq.values(), key=lambda s: (s.start_ns, s.end_ns))
        self.by_id = uniq
        self.children = {}
        for s in self.spans:
            if s.parent_id and s.parent_id in uniq:
                self.children.setdefault(s.parent_id, []).append(s)

    @property
    def roots(self) -> list[Span]:
        return [s for s in self.spans if not s.parent_id or s.parent_id not in self.by_id]

    def descendants(self, span: Span, below: str | None = None) -> Iterator[Span]:
        """The spans under ``span``; with ``below``, not a span of that kind nor what is under it (the
        next hop's: ``below="SERVER"``)."""
        for c in self.children.get(span.span_id, []):
            if c.kind != below:
                yield c
                yield from self.descendants(c, below)

    def ancestors(self, span: Span) -> Iterator[Span]:
        cur = self.by_id.get(span.parent_id)
        while cur is not None:
            yield cur
            cur = self.by_id.get(cur.parent_id)

    @property
    def duration_ms(self) -> float:
        return (max(s.end_ns for s in self.spans) - min(s.start_ns for s in self.spans)) / 1e6


def group_traces(spans: Iterable[Span]) -> dict[str, Trace]:
    by_trace: dict[str, list[Span]] = {}
    for s in spans:
        by_trace.setdefault(s.trace_id, []).append(s)
    return {tid: Trace(tid, ss) for tid, ss in by_trace.items()}


# ------------------------------------------------------------------ writing


_KIND_NUM = {v: k for k, v in KIND_NAMES.items()}


def to_otlp_json(trace: Trace) -> JsonObject:
    """One trace as an OTLP JSON ``ExportTraceServiceRequest`` (Jaeger's UI uploads it)."""
    by_service: dict[str, list[Span]] = {}
    for s in trace.spans:
        by_service.setdefault(s.service, []).append(s)
    resource_spans: JsonArray = []
    for service, spans in by_service.items():
        resource = dict(spans[0].resource) or {"service.name": service}
        resource_spans.append(
            {
                "resource": {"attributes": attributes(resource)},
                "scopeSpans": [
                    {
                        "scope": {"name": spans[0].scope or "pathprobe"},
                        "spans": [
                            {
                                "traceId": s.trace_id,
                                "spanId": s.span_id,
                                **({"parentSpanId": s.parent_id} if s.parent_id else {}),
                                "name": s.name,
                                "kind": _KIND_NUM.get(s.kind, 1),
                                "startTimeUnixNano": str(s.start_ns),
                                "endTimeUnixNano": str(s.end_ns),
                                "attributes": attributes(s.attributes),
                                "status": s.status,
                            }
                            for s in spans
                        ],
                    }
                ],
            }
        )
    return {"resourceSpans": resource_spans}


def _jaeger_tags(d: JsonObject) -> JsonArray:
    out: JsonArray = []
    for k, v in d.items():
        if isinstance(v, bool):
            out.append({"key": k, "type": "bool", "value": v})
        elif isinstance(v, int):
            out.append({"key": k, "type": "int64", "value": v})
        elif isinstance(v, float):
            out.append({"key": k, "type": "float64", "value": v})
        else:
            out.append({"key": k, "type": "string", "value": v if isinstance(v, str) else json.dumps(v)})
    return out


def to_jaeger_json(traces: Iterable[Trace]) -> JsonObject:
    """Jaeger's classic JSON (``{"data": [...]}``), which every Jaeger UI's "JSON File" upload opens."""
    data: JsonArray = []
    for trace in traces:
        processes: JsonObject = {}
        pid_of: dict[str, str] = {}
        spans: JsonArray = []
        for s in trace.spans:
            pid = pid_of.get(s.service)
            if pid is None:
                pid = pid_of[s.service] = f"p{len(pid_of) + 1}"
                res = {k: v for k, v in s.resource.items() if k != "service.name"}
                processes[pid] = {"serviceName": s.service or "unknown", "tags": _jaeger_tags(res)}
            tags = dict(s.attributes)
            if s.kind not in ("INTERNAL", "UNSPECIFIED"):
                tags["span.kind"] = s.kind.lower()
            code = s.status.get("code") if s.status else None
            if code in (2, "STATUS_CODE_ERROR"):
                tags["error"] = True
                tags["otel.status_description"] = s.status.get("message", "")
            spans.append(
                {
                    "traceID": s.trace_id,
                    "spanID": s.span_id,
                    "operationName": s.name,
                    "references": [{"refType": "CHILD_OF", "traceID": s.trace_id, "spanID": s.parent_id}]
                    if s.parent_id
                    else [],
                    "startTime": s.start_ns // 1000,
                    "duration": max(0, (s.end_ns - s.start_ns) // 1000),
                    "tags": _jaeger_tags(tags),
                    "logs": [],
                    "processID": pid,
                    "warnings": None,
                    "flags": 1,
                }
            )
        data.append({"traceID": trace.trace_id, "spans": spans, "processes": processes, "warnings": None})
    return {"data": data, "total": 0, "limit": 0, "offset": 0, "errors": None}


def write_trace_file(traces: Iterable[Trace], path: str | os.PathLike[str], fmt: str = "jaeger") -> Path:
    traces = list(traces)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "jaeger":
        out.write_text(json.dumps(to_jaeger_json(traces), indent=1), encoding="utf-8")
    elif fmt == "otlp":
        out.write_text(
            "\n".join(json.dumps(to_otlp_json(t), separators=(",", ":")) for t in traces) + "\n", encoding="utf-8"
        )
    else:
        raise ConfigError(f"--format: expected jaeger or otlp, got {fmt!r}")
    return out
