"""An OTLP/gRPC trace receiver that writes what it gets to a file, for servers we did not write.

Our own processes write their spans to ``--traces-file``; a third-party server exports OTLP
to an endpoint instead (vLLM: ``--otlp-traces-endpoint``, its ``llm_request`` span). This
receiver is that endpoint on loopback: each export request is appended to ``path`` as one
OTLP JSON ``ExportTraceServiceRequest`` per line (protobuf's ``json_format``), the format
:func:`pathprobe.analysis.report.traces.read_spans` reads beside our own files.
"""

from __future__ import annotations

import json
import threading
from concurrent import futures
from pathlib import Path

import grpc
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from pathprobe.jsontypes import JsonObject


class _Service(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, sink: OtlpFileSink) -> None:
        self.sink = sink

    def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: grpc.ServicerContext
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        self.sink.write(json_format.MessageToDict(request))
        return trace_service_pb2.ExportTraceServiceResponse()


class OtlpFileSink:
    """``OtlpFileSink(path).start()``; ``endpoint`` is what the exporter is given; ``stop()`` when
    the exporting process has ended (its last batch is flushed at its exit)."""

    def __init__(self, path: Path, host: str = "127.0.0.1") -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.touch()
        self._lock = threading.Lock()
        self.batches = 0
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        # protoc's generated registration is untyped
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_Service(self), self.server)  # type: ignore[no-untyped-call]
        self.port = self.server.add_insecure_port(f"{host}:0")
        self.endpoint = f"http://{host}:{self.port}"

    def write(self, doc: JsonObject) -> None:
        line = json.dumps(doc, separators=(",", ":")) + "\n"
        with self._lock, open(self.path, "a", encoding="utf-8") as f:
            f.write(line)
            self.batches += 1

    def start(self) -> OtlpFileSink:
        self.server.start()
        return self

    def stop(self, grace_s: float = 1.0) -> None:
        self.server.stop(grace_s).wait()
