"""How an answer of the Cloud TPU API becomes a tpulab error: the one classification table.

google.rpc status names (from an HTTP error body, an HTTP status or a long-running
operation's `error.code`) map to the `tpulab.errors` tree, each with the hint a user
needs. Every caller that classifies an API failure comes here.

Each row also has a `scope`: how far the failure reaches, which is what zone failover
(tpulab.run.attempts) acts on. After SkyPilot's failover handler
(sky/backends/cloud_vm_ray_backend.py, FailoverCloudErrorHandlerV2._gcp_handler):

    zone     try the next zone: no capacity (operation code 8), no reserved capacity
             (9), preempted during create (3), quota "in zone", a zone this project
             cannot use, a type this zone does not offer, anything unparsed
    region   skip the region's other zones too: quota "in region" (or not said)
    fatal    stop at once, every zone would answer the same: IAM denial, bad request,
             a name that exists
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from tpulab.errors import (
    AlreadyExistsError,
    CloudError,
    DeadlineError,
    InvalidArgumentError,
    LocationError,
    NotFoundError,
    PermissionDeniedError,
    PreemptedError,
    QueueExpiredError,
    QuotaError,
    StockoutError,
    TransientError,
)

__all__ = [
    "COMPUTE_ERROR_STATUS",
    "HTTP_STATUS",
    "RPC_STATUS",
    "RULES",
    "Rule",
    "Scope",
    "classify",
    "compute_error",
    "error_for_status",
    "hint_for",
    "scope_of",
]

Scope = Literal["zone", "region", "fatal"]

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


@dataclass(frozen=True)
class Rule:
    """One row of the table: which answers it matches and the error they become.

    A rule matches a google.rpc status in `statuses` when the API's message contains
    one of `phrases` (lower case; none means any message) or its ErrorInfo reason is in
    `reasons`. `summary` and `hint` may name `{zone}`, taken from the message; `summary`
    also `{status}` and `{api_message}` (the API's words, cut short when long).
    """

    statuses: frozenset[str]
    kind: type[CloudError]
    summary: str
    hint: str
    scope: Scope
    phrases: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()

    def matches(self, status: str, lowered: str, reason: str) -> bool:
        if status not in self.statuses:
            return False
        if not self.phrases and not self.reasons:
            return True
        return reason in self.reasons or any(phrase in lowered for phrase in self.phrases)


def _statuses(*names: str) -> frozenset[str]:
    return frozenset(names)


_CAPACITY_HINT = (
    "The zone has no free capacity for this accelerator right now. Try another zone that "
    "offers it (`gcloud compute tpus accelerator-types list --zone=ZONE`), or retry later."
)

# First match wins, so specific rows (a phrase) precede the catch-all row of a status.
# Each row's real message is quoted in tests/test_classify.py.
RULES: tuple[Rule, ...] = (
    Rule(
        _statuses("RESOURCE_EXHAUSTED"),
        StockoutError,
        "the zone is out of capacity (stockout)",
        _CAPACITY_HINT,
        "zone",
        phrases=("capacity", "stockout"),
        # Compute Engine's operation error codes for the same: its message ("does not
        # have enough resources available to fulfill the request") names neither word.
        reasons=("ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS"),
    ),
    Rule(
        # Create-operation code 9: a reservation (or spot/reserved pool) has no room.
        _statuses("FAILED_PRECONDITION"),
        StockoutError,
        "the zone has no reserved capacity left for this accelerator",
        "The reservation this request draws on is full (or has none of this type). Run "
        "without it (on demand or --spot), try another zone, or retry later.",
        "zone",
        phrases=("reserved capacity",),
    ),
    Rule(
        # Create-operation code 3 for a spot node reclaimed before it was READY: the
        # status says "bad request", the words say preempted.
        _statuses("INVALID_ARGUMENT"),
        PreemptedError,
        "the spot node was preempted while it was being created",
        "Spot capacity was reclaimed by Google before the node was ready; another zone "
        "(or a later try) may have room. Use --recover N to retry automatically.",
        "zone",
        phrases=("in state preempted",),
    ),
    Rule(
        # Request-rate limits also come back as 429, but pass in seconds: retry them.
        _statuses("RESOURCE_EXHAUSTED"),
        TransientError,
        "the API is rate limiting requests",
        "The API asked us to slow down; retry in a minute.",
        "zone",
        phrases=("per minute", "rate limit", "ratelimitexceeded"),
        reasons=("RATE_LIMIT_EXCEEDED",),
    ),
    Rule(
        _statuses("RESOURCE_EXHAUSTED"),
        QuotaError,
        "the TPU quota of the zone is exhausted",
        "Your project's TPU quota in this zone is used up. Delete nodes you no longer need "
        "(`tpulab list --all`), use another zone, or request more quota in the Cloud "
        "console (IAM & Admin > Quotas).",
        "zone",
        phrases=(" in zone ",),
    ),
    Rule(
        # A quota not said to be per zone is per region (or wider): every zone of the
        # region would hear the same, so failover skips them.
        _statuses("RESOURCE_EXHAUSTED"),
        QuotaError,
        "a quota is exhausted",
        "Your project's TPU quota in this region is used up. Delete nodes you no longer "
        "need (`tpulab list --all`), use a zone in another region, or request more quota "
        "in the Cloud console (IAM & Admin > Quotas).",
        "region",
    ),
    Rule(
        # Cloud TPU answers an unknown zone, a zone without TPUs, and a project that has
        # no TPU access there alike, so the hint names all three.
        _statuses("PERMISSION_DENIED", "NOT_FOUND"),
        LocationError,
        "zone {zone} is not available to this project for TPUs",
        "Check the zone's spelling and that it offers TPUs (`gcloud compute tpus locations "
        "list`), that the Cloud TPU API is enabled (`gcloud services enable "
        "tpu.googleapis.com`), and that the project has TPU access in {zone}.",
        "zone",
        phrases=("not found or access is unauthorized",),
    ),
    Rule(
        # The zone does not offer this type (or not this size): another zone may.
        _statuses("INVALID_ARGUMENT"),
        InvalidArgumentError,
        "the zone does not offer this accelerator type",
        "Check which types the zone offers: `gcloud compute tpus accelerator-types list "
        "--zone=ZONE` (or let tpulab pick zones that offer it: --zone auto).",
        "zone",
        phrases=("invalid acceleratortype",),
    ),
    Rule(
        # A VPC the project lacks: Compute's words ("The referenced network resource
        # cannot be found", the magic-modules retry predicate quotes them) and GKE's
        # ("has no network named"); a project without `default` fails every create.
        _statuses("INVALID_ARGUMENT", "NOT_FOUND", "FAILED_PRECONDITION"),
        InvalidArgumentError,
        "the project has no such network: {api_message}",
        "Name an existing VPC with --network (and --subnetwork, in the zone's region; "
        "`gcloud compute networks list`), or create the default one: `gcloud compute "
        "networks create default --subnet-mode=auto`. `tpulab doctor` checks it.",
        "fatal",
        phrases=(
            "network resource cannot be found",
            "subnetwork resource cannot be found",
            "has no network named",
        ),
    ),
    Rule(
        _statuses("INVALID_ARGUMENT", "FAILED_PRECONDITION", "OUT_OF_RANGE"),
        InvalidArgumentError,
        "the API rejected the request as invalid",
        "Check the accelerator type and runtime version offered in this zone: `gcloud "
        "compute tpus accelerator-types list --zone=ZONE` and `gcloud compute tpus tpu-vm "
        "versions list --zone=ZONE`.",
        "fatal",
    ),
    Rule(
        _statuses("ALREADY_EXISTS"),
        AlreadyExistsError,
        "it already exists",
        "A node with this name already exists in the zone: choose another --name, or "
        "delete the old node if it is yours.",
        "fatal",
    ),
    Rule(
        _statuses("NOT_FOUND"),
        NotFoundError,
        "it was not found",
        "Check the project, zone and node name (`tpulab list --all`).",
        "fatal",
    ),
    Rule(
        # Compute Engine names the permission it wanted ("Required
        # 'compute.instances.create' permission for 'projects/...'").
        _statuses("PERMISSION_DENIED"),
        PermissionDeniedError,
        "permission denied: {api_message}",
        "Your account needs the Compute Engine permissions of a TPU VM instance "
        "(roles/compute.instanceAdmin.v1, and roles/iam.serviceAccountUser on the VM's "
        "account); refresh credentials with `gcloud auth application-default login`.",
        "fatal",
        phrases=("'compute.",),
    ),
    Rule(
        _statuses("PERMISSION_DENIED", "UNAUTHENTICATED"),
        PermissionDeniedError,
        "permission denied",
        "Check that the Cloud TPU API is enabled for the project and that your account may "
        "use it (roles/tpu.admin); refresh credentials with `gcloud auth "
        "application-default login`.",
        "fatal",
    ),
    Rule(
        # A create operation ends ABORTED when the node is deleted while CREATING (by a
        # colleague, a script, another teardown): an answer, not an outage.
        _statuses("ABORTED", "CANCELLED"),
        NotFoundError,
        "the node was deleted while it was being created",
        "Something other than this run deleted the node before it was READY (another "
        "`tpulab teardown`, a colleague or a script). Check with `tpulab list`, then run "
        "again.",
        # Someone else is deleting this run's nodes: stop and let the user look rather
        # than create one in the next zone.
        "fatal",
        phrases=("deleted during creation", "deleted while"),
    ),
    Rule(
        _statuses("UNAVAILABLE"),
        TransientError,
        "the API is temporarily unavailable",
        "The API had a temporary problem; retry in a minute.",
        "zone",
    ),
    Rule(
        # Still worth retrying, but what happened is the API's to say (an operation that
        # ended INTERNAL is a failure it reported, not an outage): show its words.
        _statuses("INTERNAL", "ABORTED", "UNKNOWN"),
        TransientError,
        "the API answered {status}: {api_message}",
        "The API reported an error of its own; retry in a minute. If it persists, quote "
        "the API's message to Google Cloud support.",
        "zone",
    ),
    Rule(
        # A queued resource FAILED because its window ('valid until') passed before
        # capacity came: a stockout that outlasted the window, not a slow API.
        _statuses("DEADLINE_EXCEEDED"),
        QueueExpiredError,
        "no capacity came before the queued resource's window closed",
        "No capacity came within the window. Retry with a longer --valid-for, another "
        "--zone, or later.",
        "zone",
        phrases=("valid until",),
    ),
    Rule(
        _statuses("DEADLINE_EXCEEDED"),
        DeadlineError,
        "the API did not answer in time",
        "The API did not answer in time; retry, and check with `tpulab list`.",
        "zone",
    ),
)

# How much of the API's message a summary quotes (all of it stays in `api_message`).
_SHOWN_MESSAGE = 300

_ZONE_IN_MESSAGE = re.compile(r"\blocation\s+(?:projects/[^/\s]+/locations/)?([a-z0-9-]+)", re.I)


def classify(status: str, api_message: str, *, reason: str = "") -> Rule | None:
    """The first rule matching a status, message and ErrorInfo reason; None if none does."""
    lowered = api_message.lower()
    return next((rule for rule in RULES if rule.matches(status, lowered, reason)), None)


def error_for_status(status: str, api_message: str, what: str, *, reason: str = "") -> CloudError:
    """The tpulab error for a google.rpc status name and the API's message."""
    rule = classify(status, api_message, reason=reason)
    if rule is None:
        return CloudError(f"Could not {what}: {status}.", status=status, api_message=api_message)
    found = _ZONE_IN_MESSAGE.search(api_message)
    zone = found.group(1) if found else "the zone"
    words = api_message.strip().rstrip(".") or "no message"
    if len(words) > _SHOWN_MESSAGE:
        words = words[:_SHOWN_MESSAGE] + "..."
    summary = rule.summary.format(zone=zone, status=status, api_message=words)
    return rule.kind(
        f"Could not {what}: {summary}.",
        status=status,
        api_message=api_message,
        hint=rule.hint.format(zone=zone),
    )


# Compute Engine's operation error codes (Operation.error.errors[].code, a string) as the
# google.rpc status the table reads; the code itself is matched as the row's `reason`.
# Quota: its message says where ("Quota 'TPUS_PER_TPU_FAMILY' exceeded.  Limit: 0.0 in
# region us-central1."), which the quota rows already scope by zone or region.
COMPUTE_ERROR_STATUS = {
    "ZONE_RESOURCE_POOL_EXHAUSTED": "RESOURCE_EXHAUSTED",
    "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS": "RESOURCE_EXHAUSTED",
    "QUOTA_EXCEEDED": "RESOURCE_EXHAUSTED",
    "RESOURCE_NOT_FOUND": "NOT_FOUND",
    "RESOURCE_ALREADY_EXISTS": "ALREADY_EXISTS",
    "PERMISSIONS_ERROR": "PERMISSION_DENIED",
    "INVALID_FIELD_VALUE": "INVALID_ARGUMENT",
}


def compute_error(code: str, api_message: str, what: str, *, http_status: int = 0) -> CloudError:
    """The tpulab error for a failed Compute Engine operation (its first `errors[]`
    entry), through the same table: the code names the status, else the operation's
    httpErrorStatusCode does."""
    status = COMPUTE_ERROR_STATUS.get(code) or HTTP_STATUS.get(http_status) or "UNKNOWN"
    return error_for_status(status, api_message, what, reason=code)


def hint_for(kind: type[CloudError]) -> str:
    """The hint of the catch-all rule for an error class (empty for classes without one)."""
    hints = [rule.hint for rule in RULES if rule.kind is kind and not rule.phrases]
    return hints[0] if hints else ""


# Errors that arrive without an API status of their own (a wait that ran out, a node
# seen PREEMPTED by a poll) are scoped by their class; anything else unparsed is a zone
# problem, as SkyPilot's handler blocks "unparsed" errors by zone.
_SCOPE_OF_CLASS: tuple[tuple[type[CloudError], Scope], ...] = (
    (PermissionDeniedError, "fatal"),
    (AlreadyExistsError, "fatal"),
    # Something else deleted what this run was waiting for (a queued resource seen
    # DELETING): as the NOT_FOUND rows, another zone is no answer.
    (NotFoundError, "fatal"),
    (QuotaError, "region"),
)


def scope_of(error: CloudError) -> Scope:
    """How far a Cloud TPU API failure reaches: this zone, its region, or every zone."""
    rule = classify(error.status or "", error.api_message or "")
    if rule is not None and isinstance(error, rule.kind):
        return rule.scope
    for kind, scope in _SCOPE_OF_CLASS:
        if isinstance(error, kind):
            return scope
    return "zone"
