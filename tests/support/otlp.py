"""A real OTLP/gRPC trace receiver, run inside the test process."""

from __future__ import annotations

import threading
import time
from concurrent import futures

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1 import trace_pb2


class _Service(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: OTLPReceiver) -> None:
        self.receiver = receiver

    def Export(self, request, context):
        time.sleep(self.receiver.delay_s)  # a slow collector: the exporter's call waits for its answer
        with self.receiver.lock:
            for rs in request.resource_spans:
                service = next((a.value.string_value for a in rs.resource.attributes if a.key == "service.name"), "")
                for ss in rs.scope_spans:
                    for span in ss.spans:
                        self.receiver.spans.append((service, span))
        return trace_service_pb2.ExportTraceServiceResponse()


class OTLPReceiver:
    """Collects every exported span as ``(service_name, Span proto)``; ``delay_s``: each export is
    answered that late (the spans are kept first)."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.lock = threading.Lock()
        self.spans: list[tuple[str, trace_pb2.Span]] = []
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_Service(self), self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.endpoint = f"http://127.0.0.1:{self.port}"

    def start(self) -> OTLPReceiver:
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop(0)

    def wait_for(self, predicate, timeout: float = 15.0) -> list[tuple[str, trace_pb2.Span]]:
        """Wait until ``predicate(spans)`` is true; returns a snapshot of the spans."""
        deadline = time.monotonic() + timeout
        while True:
            with self.lock:
                snapshot = list(self.spans)
            if predicate(snapshot) or time.monotonic() > deadline:
                return snapshot
            time.sleep(0.1)

    def trace(self, trace_id: bytes) -> list[tuple[str, trace_pb2.Span]]:
        with self.lock:
            return [(s, sp) for s, sp in self.spans if sp.trace_id == trace_id]

    def dump(self, path, trace_ids: set[bytes] | None = None) -> None:
        """Write the spans received (of ``trace_ids``, or all) as one OTLP JSON document, the
        way a collector's file exporter would (protobuf's JSON mapping)."""
        from google.protobuf import json_format
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
        from opentelemetry.proto.common.v1 import common_pb2

        by_service: dict[str, list[trace_pb2.Span]] = {}
        with self.lock:
            for service, span in self.spans:
                if trace_ids is None or span.trace_id in trace_ids:
                    by_service.setdefault(service, []).append(span)
        req = ExportTraceServiceRequest()
        for service, spans in by_service.items():
            rs = req.resource_spans.add()
            rs.resource.attributes.append(
                common_pb2.KeyValue(key="service.name", value=common_pb2.AnyValue(string_value=service))
            )
            rs.scope_spans.add().spans.extend(spans)
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(json_format.MessageToJson(req))
