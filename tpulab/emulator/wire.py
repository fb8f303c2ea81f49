"""The Cloud TPU v2 JSON shapes: nodes, operations and errors as Google writes them.

camelCase keys, RFC 3339 timestamps, int64 as strings, and enums written as names or,
when the client asks with `$alt=json;enum-encoding=int` (the Python REST client does),
as numbers. Input accepts both. The numbers are google.cloud.tpu.v2's (a test checks
them against the client library's own enums).
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

__all__ = [
    "ACCELERATOR_CONFIG_TYPES",
    "API_VERSIONS",
    "HEALTHS",
    "STATES",
    "ApiError",
    "enum_value",
    "error_body",
    "parse_enum",
    "rfc3339",
    "rpc_status",
]

STATES = {
    "STATE_UNSPECIFIED": 0,
    "CREATING": 1,
    "READY": 2,
    "RESTARTING": 3,
    "REIMAGING": 4,
    "DELETING": 5,
    "REPAIRING": 6,
    "STOPPED": 8,
    "STOPPING": 9,
    "STARTING": 10,
    "PREEMPTED": 11,
    "TERMINATED": 12,
    "HIDING": 13,
    "HIDDEN": 14,
    "UNHIDING": 15,
    "UNKNOWN": 16,
}
HEALTHS = {
    "HEALTH_UNSPECIFIED": 0,
    "HEALTHY": 1,
    "TIMEOUT": 3,
    "UNHEALTHY_TENSORFLOW": 4,
    "UNHEALTHY_MAINTENANCE": 5,
}
API_VERSIONS = {"API_VERSION_UNSPECIFIED": 0, "V1_ALPHA1": 1, "V1": 2, "V2_ALPHA1": 3, "V2": 4}
ACCELERATOR_CONFIG_TYPES = {
    "TYPE_UNSPECIFIED": 0,
    "V2": 2,
    "V3": 4,
    "V4": 7,
    "V5LITE_POD": 9,
    "V5P": 10,
    "V6E": 11,
}

_RPC_CODES = {
    "INVALID_ARGUMENT": 3,
    "DEADLINE_EXCEEDED": 4,
    "NOT_FOUND": 5,
    "ALREADY_EXISTS": 6,
    "PERMISSION_DENIED": 7,
    "RESOURCE_EXHAUSTED": 8,
    "FAILED_PRECONDITION": 9,
    "INTERNAL": 13,
    "UNAVAILABLE": 14,
}


class ApiError(Exception):
    """An error the emulator answers with, in Google's `{"error": {...}}` shape."""

    def __init__(
        self,
        http_code: int,
        status: str,
        message: str,
        *,
        reason: str = "",
        metadata: dict[str, str] | None = None,
        details: list[dict[str, Any]] | None = None,
    ) -> None:
        super().__init__(message)
        self.http_code = http_code
        self.status = status
        self.message = message
        self.reason = reason or status
        self.metadata = dict(metadata or {})
        self.details = list(details or [])  # after the ErrorInfo, e.g. a PreconditionFailure

    @property
    def rpc_code(self) -> int:
        return _RPC_CODES.get(self.status, 2)


def _error_info(error: ApiError) -> dict[str, Any]:
    return {
        "@type": "type.googleapis.com/google.rpc.ErrorInfo",
        "reason": error.reason,
        "domain": "tpu.googleapis.com",
        "metadata": {"service": "tpu.googleapis.com", **error.metadata},
    }


def error_body(error: ApiError) -> dict[str, Any]:
    return {
        "error": {
            "code": error.http_code,
            "message": error.message,
            "status": error.status,
            "details": [_error_info(error), *error.details],
        }
    }


def rpc_status(error: ApiError) -> dict[str, Any]:
    """The error as a google.rpc.Status (an operation's or a queued resource's `error`):
    the rpc code (not the HTTP one), the message and its ErrorInfo detail."""
    details = [_error_info(error), *error.details]
    return {"code": error.rpc_code, "message": error.message, "details": details}


def enum_value(table: dict[str, int], name: str, *, as_int: bool) -> int | str:
    return table.get(name, 0) if as_int else name


def parse_enum(table: dict[str, int], value: Any, field: str) -> str:
    """An enum from JSON (name or number) as its name; 400 if it is neither."""
    if isinstance(value, str) and value in table:
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        for name, number in table.items():
            if number == value:
                return name
    raise ApiError(
        400, "INVALID_ARGUMENT", f"Invalid value at '{field}': {value!r} is not a valid enum."
    )


def rfc3339(epoch: float) -> str:
    stamp = datetime.fromtimestamp(epoch, timezone.utc).isoformat(timespec="microseconds")
    return stamp.replace("+00:00", "Z")
