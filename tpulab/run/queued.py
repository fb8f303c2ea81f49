"""`--queued`: get the run's node through a Cloud TPU QueuedResource.

    CreateQueuedResource (the node spec the lifecycle built: labels, ssh key, spot)
      -> wait for its operation -> poll its state through the one wait loop:
         [ACCEPTED ->] WAITING_FOR_RESOURCES -> PROVISIONING -> ACTIVE   (return)
         FAILED     -> classified from failedData.error by cloud/classify.py: quota ->
                       QuotaError, invalid request -> InvalidArgumentError (fatal), the
                       --valid-for window closing first -> QueueExpiredError ("expired"),
                       no capacity otherwise (or unplaceable) -> StockoutError
         SUSPENDED (its spot node was reclaimed)          -> CloudError "SUSPENDED"
         DELETING (someone deleted it)                    -> NotFoundError, at once

(Google documents WAITING_FOR_RESOURCES as having replaced ACCEPTED; both are waiting.)

The queued resource is named like the node, so teardown (teardown.py, with
`queued_resource=`) deletes it with force and confirms both are gone, and
`teardown --verify` finds it by the node labels inside its spec (QueuedResource has no
labels of its own). The lifecycle's `create` calls `create_through_queue` and then
carries on as for any node: wait READY, host key, SSH...
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from tpulab.cloud.api import QUEUED_FINAL_STATES, QueuedResourceInfo, QueuedResourceRequest
from tpulab.cloud.classify import RPC_STATUS, classify, error_for_status
from tpulab.config.resolve import format_duration
from tpulab.errors import (
    CloudError,
    DeadlineError,
    NotFoundError,
    QueueExpiredError,
    StockoutError,
    TransientError,
)
from tpulab.polling import poll_until

if TYPE_CHECKING:
    from tpulab.cloud.api import TpuApi
    from tpulab.config import RunSpec
    from tpulab.models import NodeRequest

__all__ = ["create_through_queue", "queue_wait_seconds"]

# What the provisioning after capacity arrives may take, on top of the queueing window.
_PROVISION_SECONDS = 900.0


def queue_wait_seconds(spec: RunSpec) -> float:
    """How long the laptop waits for ACTIVE: the window the service was given (or the
    create timeout without one), then provisioning. Past it the run ends and teardown
    deletes the queued resource, so an unbounded server-side wait never bills."""
    window = float(spec.valid_for) if spec.valid_for is not None else spec.timeouts.create
    return window + min(_PROVISION_SECONDS, spec.timeouts.ready)


def create_through_queue(
    api: TpuApi,
    spec: RunSpec,
    node: NodeRequest,
    *,
    on_sent: Callable[[], None],
    on_refused: Callable[[], None],
    on_accepted: Callable[[], None],
    note: Callable[[str], None],
    poll: Iterable[float] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """Create the run's queued resource and wait until it is ACTIVE; the phase detail.

    `on_sent` runs just before the request leaves (from then on teardown must look),
    `on_refused` when the API refused it synchronously (nothing exists), `on_accepted`
    once the API took it. Raises StockoutError / CloudError for FAILED / SUSPENDED.
    """
    zone, name = spec.zone.value, spec.node_name
    request = QueuedResourceRequest(node_id=name, node=node, valid_for_seconds=spec.valid_for)
    sent_at = clock()
    deadline = sent_at + queue_wait_seconds(spec)
    on_sent()
    try:
        operation = api.create_queued_resource(zone, name, request)
    except CloudError as error:
        if not isinstance(error, TransientError):
            on_refused()  # refused with an answer: nothing was queued
        raise
    on_accepted()
    api.wait_operation(operation, timeout=max(0.0, min(spec.timeouts.create, deadline - clock())))

    seen: list[str] = []

    def active(found: QueuedResourceInfo) -> bool:
        if not seen or seen[-1] != found.state:
            seen.append(found.state)
            note(f"queued resource {name}: {found.state}")
        if found.state in QUEUED_FINAL_STATES:
            raise _ended(found, spec, seen, waited=clock() - sent_at)
        return found.state == "ACTIVE"

    poll_until(
        lambda: api.get_queued_resource(zone, name),
        active,
        timeout=max(0.0, deadline - clock()),
        clock=clock,
        sleep=sleep,
        backoff=poll,
        retry_if=lambda error: isinstance(error, TransientError),
        describe=lambda found: (
            f"queued resource {name} in {zone} to become ACTIVE"
            + (f" (last state {found.state})" if found is not None else "")
        ),
    )
    window = f", valid for {spec.valid_for} s" if spec.valid_for is not None else ""
    return f"node {name} through queued resource {name} ({' -> '.join(seen)}{window})"


def _expired(found: QueuedResourceInfo, spec: RunSpec, seen: list[str], waited: float) -> bool:
    """Did FAILED mean that the --valid-for window passed before capacity came? The one
    table says so from the API's words ('valid until'); failing those (the real service's
    wording is not on record), it did if the queue never got as far as PROVISIONING and
    the window is over by the laptop's clock, which started before the service's."""
    rule = classify(RPC_STATUS.get(found.failure_code, "UNKNOWN"), found.failure or "")
    if rule is not None and rule.kind is QueueExpiredError:
        return True
    if spec.valid_for is None or {"PROVISIONING", "ACTIVE"} & set(seen):
        return False
    return waited >= spec.valid_for


def _ended(
    found: QueuedResourceInfo, spec: RunSpec, seen: list[str], *, waited: float
) -> CloudError:
    if found.state == "FAILED" and _expired(found, spec, seen, waited):
        return QueueExpiredError(
            f"Queued resource {found.name} in {found.zone} expired: no capacity came "
            f"within --valid-for {format_duration(spec.valid_for or 0)}"
            + (f" ({found.failure})" if found.failure else "")
            + ".",
            status=RPC_STATUS.get(found.failure_code, "FAILED"),
            api_message=found.failure,
            hint="Retry with a longer --valid-for, another --zone, or later; the queued "
            "resource is deleted by the teardown.",
        )
    if found.state == "FAILED":
        return _failed(found)
    if found.state == "DELETING":
        return NotFoundError(
            f"Queued resource {found.name} in {found.zone} is being deleted (DELETING): "
            "something other than this run deleted it before its node was ready.",
            status="DELETING",
            hint="Another `tpulab teardown`, a colleague or a script deleted it. Check with "
            "`tpulab list`, then run again.",
        )
    return CloudError(
        f"Queued resource {found.name} in {found.zone} was SUSPENDED: its node was "
        "reclaimed" + (" (spot capacity taken back)" if spec.spot else "") + ".",
        status="SUSPENDED",
        hint="Retry the run; with --spot, capacity can be taken back at any time.",
    )


def _failed(found: QueuedResourceInfo) -> CloudError:
    """FAILED, classified by the one table from `failedData.error` (code and message):
    a quota is a quota, an invalid request is fatal, no capacity in time is a stockout.
    The API documents FAILED as resources unavailable within the request's constraints,
    so what the table cannot place (or would call an outage) stays a stockout."""
    status = RPC_STATUS.get(found.failure_code, "UNKNOWN")
    reason = found.failure or "the API gave no reason"
    message = f"Queued resource {found.name} in {found.zone} FAILED: {reason}"
    rule = classify(status, reason)
    if rule is not None and not issubclass(rule.kind, TransientError | DeadlineError):
        # The table's class, hint and scope (scope_of re-reads status and message).
        error = error_for_status(status, reason, "provision the queued resource")
        return rule.kind(message, status=status, api_message=reason, hint=error.hint)
    return StockoutError(
        message,
        status="FAILED",
        api_message=found.failure,
        hint="No capacity came within the window. Retry with a longer --valid-for, "
        "another --zone, or later; the queued resource is deleted by the teardown.",
    )
