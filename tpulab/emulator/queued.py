"""Queued resources (Cloud TPU v2 `QueuedResource`) in the emulated cloud.

A queued resource asks the service to create its node when capacity appears:

    WAITING_FOR_RESOURCES -> PROVISIONING -> ACTIVE
          |  validUntil passed first,      | its spot node preempted
          |  quota, an invalid request     v
          v                              SUSPENDING -> SUSPENDED
        FAILED (failedData.error: a full google.rpc.Status)

A new queued resource starts WAITING_FOR_RESOURCES: Google's QueuedResourceState
documents that state as having replaced ACCEPTED (which only an old record, or another
service, still shows; the controller accepts both). FAILED's `failedData.error` carries
code, message and an ErrorInfo detail, so the controller can tell a quota failure
(`quota_zones` fault), an invalid request (`queued_invalid`) and no capacity in time
apart. A deleted queued resource stays DELETING until its node is gone and then for
the emulator's delete time, as a real deletion takes a while.

PROVISIONING creates the node of `tpu.nodeSpec[0]` through `CloudState.create_node`,
so it is an ordinary node (labels, metadata, an SSH host once READY). `capacity_after`
(a fault, per zone) says when capacity arrives. DeleteQueuedResource with `force=true`
deletes the node first, then the queued resource; without force it is refused while a
node exists, as the API documents ("the queued resource will only be deleted if its
nodes have already been deleted or the queued resource is in the ACCEPTED, FAILED, or
SUSPENDED state", DeleteQueuedResourceRequest.force in the v2 discovery document).

Shapes follow the v2 discovery document as gcloud's generated client carries it
(googlecloudsdk/generated_clients/apis/tpu/v2/tpu_v2_messages.py): QueuedResource has
no labels, so the controller finds its queued resources by name and by the labels of
the node inside `tpu.nodeSpec`. Like `state.py`, this knows nothing of HTTP.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from tpulab.emulator.state import CloudState, longrunning_json, node_key
from tpulab.emulator.wire import ApiError, enum_value, rfc3339, rpc_status
from tpulab.emulator.zones import ZONES

__all__ = [
    "QR_STATES",
    "advance_queued",
    "create_queued_resource",
    "delete_queued_resource",
    "get_queued_resource",
    "is_queued_operation",
    "list_queued_resources",
    "queued_operation_json",
    "queued_resource_json",
]

Record = dict[str, Any]

# google.cloud.tpu.v2.QueuedResourceState.State (a test checks them against the client).
QR_STATES = {
    "STATE_UNSPECIFIED": 0,
    "CREATING": 1,
    "ACCEPTED": 2,
    "PROVISIONING": 3,
    "FAILED": 4,
    "DELETING": 5,
    "ACTIVE": 6,
    "SUSPENDING": 7,
    "SUSPENDED": 8,
    "WAITING_FOR_RESOURCES": 9,
}
# Each state's `<name>Data` field of QueuedResourceState (WAITING_FOR_RESOURCES has none).
_STATE_DATA = {
    "CREATING": "creatingData",
    "ACCEPTED": "acceptedData",
    "PROVISIONING": "provisioningData",
    "FAILED": "failedData",
    "DELETING": "deletingData",
    "ACTIVE": "activeData",
    "SUSPENDING": "suspendingData",
    "SUSPENDED": "suspendedData",
}
# `^[A-Za-z0-9_.~+%-]+$` is what the discovery document allows for queuedResourceId; the
# node it creates must still be a valid node id, checked by create_node.
_QR_ID = re.compile(r"^[A-Za-z0-9_.~+%-]+$")
_DURATION = re.compile(r"^(\d+(?:\.\d{1,9})?)s$")
_OP_KIND = "queuedResource"
# Deletable without force (the discovery document's list, plus the states where no
# node was ever made).
_NO_NODE_STATES = {"ACCEPTED", "WAITING_FOR_RESOURCES", "FAILED", "SUSPENDED"}


def _qrs(cloud: CloudState) -> dict[str, Record]:
    return cloud.data.setdefault("queued_resources", {})  # type: ignore[no-any-return]


def qr_path(project: str, zone: str, qr_id: str) -> str:
    return f"projects/{project}/locations/{zone}/queuedResources/{qr_id}"


def _zone(zone: str) -> None:
    if zone not in ZONES:
        raise ApiError(
            403, "PERMISSION_DENIED", f"Location {zone} is not found or access is unauthorized."
        )


# -- requests -----------------------------------------------------------------------------


def create_queued_resource(
    cloud: CloudState, project: str, zone: str, qr_id: str, body: Record, now: float
) -> Record:
    """CreateQueuedResource: check the request as the API would, queue it, return the
    operation (done at once: the resource is accepted; waiting is its state's job)."""
    _zone(zone)
    zone_info = ZONES[zone]
    if not qr_id or not _QR_ID.match(qr_id):
        raise ApiError(
            400,
            "INVALID_ARGUMENT",
            f"Invalid queuedResourceId {qr_id!r}: must match ^[A-Za-z0-9_.~+%-]+$.",
        )
    key = node_key(project, zone, qr_id)
    if key in _qrs(cloud):
        raise ApiError(
            409, "ALREADY_EXISTS", f"Resource '{qr_path(project, zone, qr_id)}' already exists."
        )
    specs = (body.get("tpu") or {}).get("nodeSpec") or (body.get("tpu") or {}).get("node_spec")
    if not isinstance(specs, list) or len(specs) != 1 or not isinstance(specs[0], dict):
        raise ApiError(
            400,
            "INVALID_ARGUMENT",
            "tpu.nodeSpec must hold exactly one node spec (the emulator has no multislice).",
        )
    spec = specs[0]
    node_id = str(spec.get("nodeId") or spec.get("node_id") or "")
    node = spec.get("node")
    if not node_id or not isinstance(node, dict):
        raise ApiError(400, "INVALID_ARGUMENT", "tpu.nodeSpec[0] needs nodeId and node.")
    parent = f"projects/{project}/locations/{zone}"
    if spec.get("parent") not in (parent, None, ""):
        raise ApiError(
            400,
            "INVALID_ARGUMENT",
            f"tpu.nodeSpec[0].parent {spec.get('parent')!r} is not {parent!r}.",
        )
    cloud.check_node_body(zone_info, node)
    if node_key(project, zone, node_id) in cloud.nodes:
        raise ApiError(
            409,
            "ALREADY_EXISTS",
            f"Resource 'projects/{project}/locations/{zone}/nodes/{node_id}' already exists.",
        )
    policy = body.get("queueingPolicy") or body.get("queueing_policy") or {}
    record: Record = {
        "project": project,
        "zone": zone,
        "name": qr_id,
        "node_id": node_id,
        "node": dict(node),
        "spot": body.get("spot") is not None,
        "queueing_policy": dict(policy),
        "valid_until": _valid_until(policy, now),
        "state": "WAITING_FOR_RESOURCES",
        "create_time": now,
        "error": None,
        "force": False,
        "delete_op": None,
    }
    _qrs(cloud)[key] = record
    return _operation(cloud, record, "create", now, done_at=now)


def get_queued_resource(cloud: CloudState, project: str, zone: str, qr_id: str) -> Record:
    _zone(zone)
    record = _qrs(cloud).get(node_key(project, zone, qr_id))
    if record is None:
        raise ApiError(
            404, "NOT_FOUND", f"Resource '{qr_path(project, zone, qr_id)}' was not found"
        )
    return record


def list_queued_resources(cloud: CloudState, project: str, zone: str) -> list[Record]:
    _zone(zone)
    prefix = f"{project}/{zone}/"
    return [r for key, r in sorted(_qrs(cloud).items()) if key.startswith(prefix)]


def delete_queued_resource(
    cloud: CloudState, project: str, zone: str, qr_id: str, force: bool, now: float
) -> Record:
    """DeleteQueuedResource; the operation ends when the resource (and its node) is gone."""
    record = get_queued_resource(cloud, project, zone, qr_id)
    pending = cloud.operations.get(record.get("delete_op") or "")
    if record["state"] == "DELETING" and pending is not None:
        if force and not record["force"]:
            record["force"] = True  # a forced retry of an unforced delete
        return pending
    node = cloud.nodes.get(node_key(project, zone, record["node_id"]))
    if node is not None and node.get("queued_resource") == qr_id and not force:
        raise ApiError(
            400,
            "FAILED_PRECONDITION",
            f"Queued resource {qr_path(project, zone, qr_id)} still has node "
            f"{record['node_id']} ({node['state']}): delete the node first, or delete the "
            "queued resource with force=true to delete both.",
        )
    record["state_before_delete"] = record["state"]
    record["state"] = "DELETING"
    record["force"] = force
    record["deleting_since"] = now
    operation = _operation(cloud, record, "delete", now, done_at=None)
    record["delete_op"] = operation["name"]
    return operation


# -- time -------------------------------------------------------------------------------


def advance_queued(cloud: CloudState, now: float) -> None:
    """Apply every queued-resource transition due by `now` (after the nodes' own)."""
    for key, record in list(_qrs(cloud).items()):
        state = record["state"]
        node = cloud.nodes.get(node_key(record["project"], record["zone"], record["node_id"]))
        ours = node if node is not None and node.get("queued_resource") == record["name"] else None
        accepted_for = cloud.timing.queue_seconds
        if state == "ACCEPTED" and cloud.due(record["create_time"] + accepted_for, now):
            state = record["state"] = "WAITING_FOR_RESOURCES"
        if state == "WAITING_FOR_RESOURCES":
            until = record["valid_until"]
            # Read live, so a test (or the admin endpoint) can make capacity arrive.
            capacity_at = record["create_time"] + cloud.faults.capacity_delay(record["zone"])
            if until is not None and until <= capacity_at and cloud.due(until, now):
                record["state"] = "FAILED"
                record["failed_at"] = until
                # The discovery document's words for this failure (QueuedResourceState
                # FAILED): "unavailability of resources within the constraints of the
                # request (e.g., the 'valid until' start timing constraint expired)".
                record["error"] = rpc_status(
                    ApiError(
                        504,
                        "DEADLINE_EXCEEDED",
                        "The queued resource could not be provisioned before its 'valid "
                        f"until' start timing constraint expired ({rfc3339(until)}): no "
                        f"capacity for {record['node'].get('acceleratorType', '')} in zone "
                        f"{record['zone']} in time.",
                        reason="STOCKOUT",
                    )
                )
            elif cloud.due(capacity_at, now) and cloud.faults.queued_invalid:
                record["state"] = "FAILED"
                record["failed_at"] = now
                # What the service says when it finds, at provisioning, a request it had
                # accepted invalid: the generic INVALID_ARGUMENT wording.
                record["error"] = rpc_status(
                    ApiError(400, "INVALID_ARGUMENT", "Request contains an invalid argument.")
                )
            elif now >= capacity_at:
                start = record["create_time"] + cloud.timing.queue_seconds
                _provision(cloud, record, max(capacity_at, start))
        elif state == "PROVISIONING":
            if ours is None:
                record["state"] = "FAILED"
                record["error"] = rpc_status(
                    ApiError(500, "INTERNAL", "Provisioning the node failed.")
                )
            elif ours["state"] == "READY":
                record["state"] = "ACTIVE"
        elif state == "ACTIVE":
            if ours is None:
                record["state"] = "SUSPENDED"  # its node was deleted from under it
            elif ours["state"] in {"PREEMPTED", "TERMINATED"}:
                # The service reclaims a preempted spot node of a queued resource.
                record["state"] = "SUSPENDING"
                cloud.delete_node(record["project"], record["zone"], record["node_id"], now)
        elif state == "SUSPENDING" and ours is None:
            record["state"] = "SUSPENDED"
        elif state == "DELETING":
            if ours is not None:
                if record["force"] and ours["state"] != "DELETING":
                    cloud.delete_node(record["project"], record["zone"], record["node_id"], now)
                continue  # gone only once its node is
            since = record.setdefault("deleting_since", now)  # (older records lack it)
            if now < since + cloud.timing.delete_seconds:
                continue
            operation = cloud.operations.get(record.get("delete_op") or "")
            if operation is not None:
                operation["done_at"] = now
            del _qrs(cloud)[key]


def _provision(cloud: CloudState, record: Record, at: float) -> None:
    body = dict(record["node"])
    if record["spot"]:
        body["schedulingConfig"] = {**(body.get("schedulingConfig") or {}), "spot": True}
    try:
        cloud.create_node(record["project"], record["zone"], record["node_id"], body, at)
    except ApiError as error:
        record["state"] = "FAILED"
        record["error"] = rpc_status(error)  # e.g. the zone's quota (`quota_zones`)
        return
    node = cloud.nodes[node_key(record["project"], record["zone"], record["node_id"])]
    node["queued_resource"] = record["name"]
    record["state"] = "PROVISIONING"


def _valid_until(policy: Record, now: float) -> float | None:
    duration = policy.get("validUntilDuration") or policy.get("valid_until_duration")
    until = policy.get("validUntilTime") or policy.get("valid_until_time")
    if duration and until:
        raise ApiError(
            400,
            "INVALID_ARGUMENT",
            "Only one of queueingPolicy.validUntilDuration and validUntilTime may be set.",
        )
    if duration:
        match = _DURATION.match(str(duration))
        if not match:
            raise ApiError(
                400,
                "INVALID_ARGUMENT",
                f"Invalid value at 'queued_resource.queueing_policy.valid_until_duration' "
                f'({duration!r}): want a Duration such as "3600s".',
            )
        return now + float(match.group(1))
    if until:
        try:
            return datetime.fromisoformat(str(until).replace("Z", "+00:00")).timestamp()
        except ValueError:
            raise ApiError(
                400,
                "INVALID_ARGUMENT",
                f"Invalid value at 'queued_resource.queueing_policy.valid_until_time' "
                f"({until!r}): want an RFC 3339 timestamp.",
            ) from None
    return None


# -- operations and JSON ----------------------------------------------------------------


def _operation(
    cloud: CloudState, record: Record, verb: str, now: float, *, done_at: float | None
) -> Record:
    operation = cloud._new_operation(
        record["project"], record["zone"], record["name"], verb, now, done_at, None
    )
    operation["kind"] = _OP_KIND
    return operation


def is_queued_operation(operation: Record) -> bool:
    return operation.get("kind") == _OP_KIND


def queued_operation_json(
    operation: Record, record: Record | None, *, now: float, as_int: bool
) -> Record:
    """A queued resource's operation as google.longrunning.Operation JSON."""
    return longrunning_json(
        operation,
        target=qr_path(operation["project"], operation["zone"], operation["node"]),
        response_type="type.googleapis.com/google.cloud.tpu.v2.QueuedResource",
        render=lambda: queued_resource_json(record, as_int=as_int) if record else None,
        now=now,
    )


def queued_resource_json(record: Record, *, as_int: bool) -> Record:
    """A queued-resource record as the v2 API's QueuedResource JSON."""
    project, zone = record["project"], record["zone"]
    state = record["state"]
    state_json: Record = {"state": enum_value(QR_STATES, state, as_int=as_int)}
    data = _STATE_DATA.get(state)
    if data == "failedData":
        error = record.get("error") or {"code": 2, "message": "unknown"}
        state_json[data] = {"error": {"details": [], **error}}
    elif data is not None:
        state_json[data] = {}
    if state in {"SUSPENDING", "SUSPENDED", "FAILED"}:
        state_json["stateInitiator"] = enum_value(
            {"STATE_INITIATOR_UNSPECIFIED": 0, "USER": 1, "SERVICE": 2}, "SERVICE", as_int=as_int
        )
    body: Record = {
        "name": qr_path(project, zone, record["name"]),
        "createTime": rfc3339(record["create_time"]),
        "tpu": {
            "nodeSpec": [
                {
                    "parent": f"projects/{project}/locations/{zone}",
                    "nodeId": record["node_id"],
                    "node": dict(record["node"]),
                }
            ]
        },
        "state": state_json,
    }
    if record["spot"]:
        body["spot"] = {}
    if record["queueing_policy"]:
        body["queueingPolicy"] = dict(record["queueing_policy"])
    return body
