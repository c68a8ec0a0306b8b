"""One exception tree for every pathprobe process.

Each error maps to one gRPC status code and one HTTP status, so the server, the
gateway and the load generator report the same failure the same way.
"""

from __future__ import annotations

import grpc
from pathprobe.jsontypes import JsonObject


class PathprobeError(Exception):
    """Base of every error pathprobe raises on purpose."""

    grpc_code: grpc.StatusCode = grpc.StatusCode.INTERNAL
    http_status: int = 500

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def to_json(self) -> JsonObject:
        return error_json(self.http_status, self.grpc_code, self.message, getattr(self, "field", None))


def error_json(status: int, code: grpc.StatusCode, message: str, param: str | None = None) -> JsonObject:
    """The one JSON error shape of every HTTP answer (server and gateway, bodies and SSE events).

    OpenAI-compatible (``message``, ``type``, ``code``, ``param``) plus the gRPC ``status``
    name; ``type`` is ``invalid_request_error`` for a 400, else the gRPC status in lower case.
    """
    return {
        "error": {
            "message": message,
            "type": "invalid_request_error" if status == 400 else code.name.lower(),
            "code": status,
            "status": code.name,
            "param": param,
        }
    }


class InvalidArgument(PathprobeError):
    """A request field is missing, of the wrong type or out of range."""

    grpc_code = grpc.StatusCode.INVALID_ARGUMENT
    http_status = 400

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field


class NotFound(PathprobeError):
    grpc_code = grpc.StatusCode.NOT_FOUND
    http_status = 404


class ResourceExhausted(PathprobeError):
    """The engine queue is full (or a body is over the size limit).

    ``retry_after_ms``: when the caller may try again (sent as ``Retry-After`` /
    ``grpc-retry-pushback-ms``); None for a request that will never fit.
    """

    grpc_code = grpc.StatusCode.RESOURCE_EXHAUSTED
    http_status = 429

    def __init__(self, message: str, retry_after_ms: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_ms = retry_after_ms


class PayloadTooLarge(ResourceExhausted):
    http_status = 413


class Unavailable(PathprobeError):
    grpc_code = grpc.StatusCode.UNAVAILABLE
    http_status = 503


class DeadlineExceeded(PathprobeError):
    grpc_code = grpc.StatusCode.DEADLINE_EXCEEDED
    http_status = 504


class Unauthenticated(PathprobeError):
    """No credential, or one that does not match (the message never echoes it)."""

    grpc_code = grpc.StatusCode.UNAUTHENTICATED
    http_status = 401


class ConfigError(PathprobeError):
    """A command-line flag or config file is wrong; the message names the key."""


# gRPC status -> HTTP status, as grpc-gateway and Envoy's transcoder map them.
GRPC_TO_HTTP: dict[grpc.StatusCode, int] = {
    grpc.StatusCode.OK: 200,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNKNOWN: 500,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DATA_LOSS: 500,
}

# HTTP status -> gRPC status (the inverse direction, for the re-encoding gateway).
HTTP_TO_GRPC: dict[int, grpc.StatusCode] = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.UNIMPLEMENTED,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    499: grpc.StatusCode.CANCELLED,
    501: grpc.StatusCode.UNIMPLEMENTED,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}


def http_to_grpc(status: int) -> grpc.StatusCode:
    if status in HTTP_TO_GRPC:
        return HTTP_TO_GRPC[status]
    return grpc.StatusCode.INTERNAL if status >= 500 else grpc.StatusCode.UNKNOWN
