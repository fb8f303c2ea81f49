"""How an answer of the Cloud TPU API becomes a tpulab error: the one classification table.

google.rpc status names (from an HTTP error body, an HTTP status or a long-running
operation's `error.code`) map to the `tpulab.errors` tree, each with the hint a user
needs. Every caller that classifies an API failure comes here.
"""

from __future__ import annotations

from tpulab.errors import (
    AlreadyExistsError,
    CloudError,
    DeadlineError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    QuotaError,
    StockoutError,
    TransientError,
)

__all__ = ["HTTP_STATUS", "RPC_STATUS", "error_for_status", "hint_for"]

# google.rpc.Code numbers, as they appear in an operation's `error.code`.
RPC_STATUS = {
    0: "OK",
    1: "CANCELLED",
    2: "UNKNOWN",
    3: "INVALID_ARGUMENT",
    4: "DEADLINE_EXCEEDED",
    5: "NOT_FOUND",
    6: "ALREADY_EXISTS",
    7: "PERMISSION_DENIED",
    8: "RESOURCE_EXHAUSTED",
    9: "FAILED_PRECONDITION",
    10: "ABORTED",
    11: "OUT_OF_RANGE",
    12: "UNIMPLEMENTED",
    13: "INTERNAL",
    14: "UNAVAILABLE",
    15: "DATA_LOSS",
    16: "UNAUTHENTICATED",
}
HTTP_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ALREADY_EXISTS",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}

_HINTS: dict[type[CloudError], str] = {
    StockoutError: "The zone has no free capacity for this accelerator right now. Try "
    "another zone that offers it (`gcloud compute tpus accelerator-types list "
    "--zone=ZONE`), or retry later.",
    QuotaError: "Your project's TPU quota in this zone is used up. Delete nodes you no "
    "longer need (`tpulab list --all`) or request more quota in the Cloud console "
    "(IAM & Admin > Quotas).",
    InvalidArgumentError: "Check the accelerator type and runtime version offered in this "
    "zone: `gcloud compute tpus accelerator-types list --zone=ZONE` and `gcloud compute "
    "tpus tpu-vm versions list --zone=ZONE`.",
    AlreadyExistsError: "A node with this name already exists in the zone: choose another "
    "--name, or delete the old node if it is yours.",
    NotFoundError: "Check the project, zone and node name (`tpulab list --all`).",
    PermissionDeniedError: "Check that the Cloud TPU API is enabled for the project and "
    "that your account may use it (roles/tpu.admin); refresh credentials with `gcloud "
    "auth application-default login`.",
    TransientError: "The API had a temporary problem; retry in a minute.",
    DeadlineError: "The API did not answer in time; retry, and check with `tpulab list`.",
}

_SUMMARY: dict[type[CloudError], str] = {
    StockoutError: "the zone is out of capacity (stockout)",
    QuotaError: "a quota is exhausted",
    InvalidArgumentError: "the API rejected the request as invalid",
    AlreadyExistsError: "it already exists",
    NotFoundError: "it was not found",
    PermissionDeniedError: "permission denied",
    TransientError: "the API is temporarily unavailable",
    DeadlineError: "the API did not answer in time",
}


def error_for_status(status: str, api_message: str, what: str, *, reason: str = "") -> CloudError:
    """The tpulab error for a google.rpc status name and the API's message."""
    lowered = api_message.lower()
    kind: type[CloudError]
    if status == "RESOURCE_EXHAUSTED":
        if "capacity" in lowered or "stockout" in lowered:
            kind = StockoutError
        elif reason == "RATE_LIMIT_EXCEEDED" or any(
            phrase in lowered for phrase in ("per minute", "rate limit", "ratelimitexceeded")
        ):
            # Request-rate limits also come back as 429 but pass in seconds: retry them.
            kind = TransientError
        else:
            kind = QuotaError
    elif status in {"INVALID_ARGUMENT", "FAILED_PRECONDITION", "OUT_OF_RANGE"}:
        kind = InvalidArgumentError
    elif status == "ALREADY_EXISTS":
        kind = AlreadyExistsError
    elif status == "NOT_FOUND":
        kind = NotFoundError
    elif status in {"PERMISSION_DENIED", "UNAUTHENTICATED"}:
        kind = PermissionDeniedError
    elif status in {"UNAVAILABLE", "INTERNAL", "ABORTED", "UNKNOWN"}:
        kind = TransientError
    elif status == "DEADLINE_EXCEEDED":
        kind = DeadlineError
    else:
        return CloudError(f"Could not {what}: {status}.", status=status, api_message=api_message)
    return kind(
        f"Could not {what}: {_SUMMARY[kind]}.",
        status=status,
        api_message=api_message,
        hint=_HINTS[kind],
    )


def hint_for(kind: type[CloudError]) -> str:
    """The standard hint for an error class (empty for classes without one)."""
    return _HINTS.get(kind, "")
