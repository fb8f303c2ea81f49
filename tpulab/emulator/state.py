"""The emulated cloud's state machine over plain JSON records.

Nodes go CREATING -> READY -> DELETING -> gone; spot nodes may turn PREEMPTED and stay
listed until deleted. UpdateNode changes the masked fields when its operation ends.
Transitions are computed from timestamps (`advance(now)`), so an emulator restarted on
the same state carries on where the dead one stopped. This module
knows nothing about HTTP or SSH: `server.py` feeds it requests and starts hosts.
"""

from __future__ import annotations

import math
import re
import secrets
from collections.abc import Callable
from typing import Any

from tpulab.emulator.faults import FaultPlan
from tpulab.emulator.resource_rules import metadata_problem, tpu_label_problem
from tpulab.emulator.timing import Timing
from tpulab.emulator.wire import (
    ACCELERATOR_CONFIG_TYPES,
    API_VERSIONS,
    HEALTHS,
    STATES,
    ApiError,
    enum_value,
    parse_enum,
    rfc3339,
)
from tpulab.emulator.workers import worker_address, worker_attributes, worker_count
from tpulab.emulator.zones import ZONES, Zone, accelerator_family

__all__ = ["CloudState", "longrunning_json", "node_json", "node_key", "operation_json"]

Record = dict[str, Any]

_NODE_ID = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_OP_RETENTION_SECONDS = 3600.0
# acceleratorConfig (type + topology) -> the acceleratorType name gcloud's --type means.
_CONFIG_FAMILY = {
    "V2": ("v2", 2),
    "V3": ("v3", 2),
    "V4": ("v4", 2),
    "V5LITE_POD": ("v5litepod", 1),
    "V5P": ("v5p", 2),
    "V6E": ("v6e", 1),
}
_FAMILY_CONFIG = {family: name for name, (family, _) in _CONFIG_FAMILY.items()}
# UpdateNode's updateMask paths (snake_case as gcloud sends them, camelCase as FieldMask
# JSON has them) -> the node record field. gcloud's update hook builds exactly these
# (command_lib/compute/tpus/tpu_vm/util.py GenerateUpdateMask), plus data_disks, which
# the emulator has no disks to model.
_UPDATE_MASK = {
    "description": "description",
    "labels": "labels",
    "metadata": "metadata",
    "tags": "tags",
    "network_config.enable_external_ips": "external_ips",
    "networkConfig.enableExternalIps": "external_ips",
}


def node_key(project: str, zone: str, name: str) -> str:
    return f"{project}/{zone}/{name}"


def node_path(project: str, zone: str, name: str) -> str:
    return f"projects/{project}/locations/{zone}/nodes/{name}"


def zone_or_403(project: str, zone: str) -> Zone:
    found = ZONES.get(zone)
    if found is None:
        # The real API answers an unknown zone (and one the project may not use) with a
        # 403 in these words, e.g. "Location europe-west1-b is not found or access is
        # unauthorized." (quoted in dstackai/gpuhunt#98), not with a 404.
        raise ApiError(
            403,
            "PERMISSION_DENIED",
            f"Location {zone} is not found or access is unauthorized.",
        )
    return found


class CloudState:
    """One transaction's view of the state; every method takes the current time."""

    def __init__(self, data: Record, timing: Timing, faults: FaultPlan) -> None:
        self.data = data
        self.timing = timing
        self.faults = faults
        self.next_due = math.inf
        """The earliest transition `advance` found not yet due: the ticker sleeps until
        then (server.py) rather than polling the state 20 times a second."""

    @property
    def nodes(self) -> dict[str, Record]:
        return self.data["nodes"]  # type: ignore[no-any-return]

    @property
    def operations(self) -> dict[str, Record]:
        return self.data["operations"]  # type: ignore[no-any-return]

    # -- time --------------------------------------------------------------------

    def due(self, at: float, now: float) -> bool:
        """Is a transition timed `at` due by `now`? One not yet due is noted in
        `next_due`: every timed transition asks here, so the ticker's wake-up time is
        derived from the same comparisons that apply them."""
        if now >= at:
            return True
        self.next_due = min(self.next_due, at)
        return False

    def advance(self, now: float) -> list[Record]:
        """Apply every transition due by `now`; return the node records that vanished."""
        gone: list[Record] = []
        for key, node in list(self.nodes.items()):
            state = node["state"]
            if state == "CREATING" and self.due(node["ready_at"], now):
                if node["fate"] == "stockout":
                    del self.nodes[key]
                    gone.append(node)
                    continue
                node["state"] = "READY"
                node["ready_time"] = node["ready_at"]
                state = "READY"
            preempt = self.faults.preempt_after
            if (
                state == "READY"
                and node["spot"]
                and node.get("vm_stopped_at") is None
                and node.get("preempt_notice_at") is None
                and preempt is not None
                and self.due(node["ready_time"] + preempt, now)
                and self.faults.take_preemption()
            ):
                # Told first (metadata `instance/preempted` TRUE, metadata.py), stopped
                # `preempt_notice` later.
                node["preempt_notice_at"] = now
                node["vm_stops_at"] = now + self.faults.preempt_notice
                node["reported_state"] = self.faults.preempt_as
                node["lag_health"] = self.faults.preempt_lag_health
            stops_at = node.get("vm_stops_at")
            if (
                state == "READY"
                and stops_at is not None
                and node.get("vm_stopped_at") is None
                and self.due(stops_at, now)
            ):
                # The VM stops now (server.py stops its host); the API says so only
                # `preempt_state_lag` later, and then as PREEMPTED or TERMINATED.
                node["vm_stopped_at"] = now
                node["reported_at"] = now + self.faults.preempt_state_lag
            stopped = node.get("vm_stopped_at") is not None
            if state == "READY" and stopped and self.due(node["reported_at"], now):
                if node.get("termination_action") == "DELETE":
                    # A Compute spot VM told to be deleted when preempted (instances.py).
                    del self.nodes[key]
                    gone.append(node)
                    continue
                node["state"] = node["reported_state"]
                node["health"] = "HEALTH_UNSPECIFIED"
            if state == "DELETING":
                operation = self.operations.get(node["delete_op"])
                if operation is not None and operation["done_at"] is None:
                    if self.faults.delete_hangs:
                        continue
                    # The hang was cleared: the delete now runs its normal course.
                    operation["done_at"] = now + self.timing.delete_seconds
                done_at = operation["done_at"] if operation else now
                if self.due(done_at, now):
                    if operation is not None and operation["error"]:
                        node["state"] = node.pop("state_before_delete", "READY")
                        if node["ready_time"] is None:  # deleted while still CREATING
                            node["ready_time"] = done_at
                    else:
                        del self.nodes[key]
                        gone.append(node)
        for name, operation in list(self.operations.items()):
            done_at = operation["done_at"]
            if (
                operation.get("changes") is not None
                and done_at is not None
                and self.due(done_at, now)
            ):
                target = self.nodes.get(
                    node_key(operation["project"], operation["zone"], operation["node"])
                )
                if target is not None:
                    target.update(operation["changes"])
                operation["changes"] = None  # applied once
            if done_at is not None and now - done_at > _OP_RETENTION_SECONDS:
                del self.operations[name]
        return gone

    # -- nodes -------------------------------------------------------------------

    def create_node(
        self, project: str, zone: str, node_id: str, body: Record, now: float
    ) -> Record:
        zone_info = zone_or_403(project, zone)
        if not node_id:
            raise ApiError(400, "INVALID_ARGUMENT", "nodeId is required.")
        if len(node_id) > 63 or not _NODE_ID.match(node_id):
            raise ApiError(
                400,
                "INVALID_ARGUMENT",
                f"Invalid nodeId {node_id!r}: must match [a-z]([-a-z0-9]*[a-z0-9])? and be at "
                "most 63 characters.",
            )
        if zone in self.faults.deny_zones:
            # IAM's words (tensorflow/tpu#296 quotes them for tpu.nodes.get).
            raise ApiError(
                403,
                "PERMISSION_DENIED",
                f"Permission 'tpu.nodes.create' denied on '{node_path(project, zone, node_id)}'",
            )
        quota = self.faults.quota_message(zone)
        if quota is not None:
            raise ApiError(429, "RESOURCE_EXHAUSTED", quota, reason="RESOURCE_EXHAUSTED")
        accelerator, runtime = self.check_node_body(zone_info, body)
        key = node_key(project, zone, node_id)
        if key in self.nodes:
            raise ApiError(
                409,
                "ALREADY_EXISTS",
                f"Resource '{node_path(project, zone, node_id)}' already exists.",
            )
        scheduling = body.get("schedulingConfig") or body.get("scheduling_config") or {}
        account = body.get("serviceAccount") or body.get("service_account") or {}
        network = body.get("networkConfig") or body.get("network_config") or {}
        vpc, subnet = self._placement(project, zone, network)
        number = int(self.data["next_id"])
        self.data["next_id"] = number + 1
        stockout = self.faults.stockout_in(zone, now)
        spot = bool(scheduling.get("spot"))
        preempted = not stockout and spot and self.faults.take_create_preempted()
        stockout = stockout or preempted
        ready_at = now + (self.timing.stockout_seconds if stockout else self.timing.create_seconds)
        node: Record = {
            "project": project,
            "zone": zone,
            "name": node_id,
            "id": str(7_000_000_000_000_000 + number),
            "number": number,
            "accelerator_type": accelerator,
            "runtime_version": runtime,
            "description": str(body.get("description", "")),
            "labels": _checked_map(body, "labels"),
            "metadata": _checked_map(body, "metadata"),
            "spot": spot,
            "preemptible": bool(scheduling.get("preemptible")),
            "external_ips": bool(
                network.get("enableExternalIps", network.get("enable_external_ips", False))
            )
            and not self.faults.no_external_ips,
            "network": vpc,
            "subnetwork": subnet,
            "state": "CREATING",
            "health": "HEALTH_UNSPECIFIED",
            "create_time": now,
            "ready_at": ready_at,
            "ready_time": None,
            "fate": "stockout" if stockout else "ready",
            "delete_op": None,
            "host": None,
            "guest_attributes": {},
            # The identity its metadata server hands out (iam.identity_of fills defaults).
            "service_account": {
                "email": str(account.get("email") or ""),
                "scopes": [str(scope) for scope in account.get("scope") or []],
            },
        }
        self.nodes[key] = node
        error = None
        if preempted:
            # Create-operation code 3, as SkyPilot's failover handler quotes it.
            error = {
                "code": 3,
                "message": "Cloud TPU received a bad request. update is not supported while "
                "in state PREEMPTED [EID: 0x73013519f5b7feb2]",
            }
        elif stockout:
            error = {
                "code": 8,
                "message": f'There is no more capacity in the zone "{zone}"; you can try '
                "in another zone where Cloud TPU Nodes are offered (see "
                "https://cloud.google.com/tpu/docs/regions) [EID: 0x1b27c1d2e6a4f1f0]",
            }
        operation = self._new_operation(project, zone, node_id, "create", now, ready_at, error)
        node["create_op"] = operation["name"]
        return operation

    def check_node_body(self, zone_info: Zone, body: Record) -> tuple[str, str]:
        """The (acceleratorType, runtimeVersion) of a Node body, or the API's 400 refusal.
        A queued resource's nodeSpec is checked by this too, when it is created."""
        accelerator = _accelerator_type(body)
        if self.faults.invalid_type or not zone_info.offers(accelerator):
            raise ApiError(
                400,
                "INVALID_ARGUMENT",
                "CloudTpu received an invalid AcceleratorType, want: one of "
                f"[{' '.join(zone_info.accelerator_types())}], got: {accelerator}",
            )
        runtime = str(body.get("runtimeVersion") or body.get("runtime_version") or "")
        if runtime not in zone_info.runtime_versions():
            raise ApiError(
                400,
                "INVALID_ARGUMENT",
                f"Invalid runtime version {runtime!r} in zone {zone_info.name}. Available "
                "versions: " + ", ".join(zone_info.runtime_versions()),
            )
        _checked_map(body, "labels")
        _checked_map(body, "metadata")
        return accelerator, runtime

    def get_node(self, project: str, zone: str, node_id: str) -> Record:
        zone_or_403(project, zone)
        node = self.nodes.get(node_key(project, zone, node_id))
        if node is None:
            raise ApiError(
                404,
                "NOT_FOUND",
                f"Resource '{node_path(project, zone, node_id)}' was not found",
            )
        return node

    def list_nodes(self, project: str, zone: str) -> list[Record]:
        zone_or_403(project, zone)
        prefix = f"{project}/{zone}/"
        return [node for key, node in sorted(self.nodes.items()) if key.startswith(prefix)]

    def delete_node(self, project: str, zone: str, node_id: str, now: float) -> Record:
        node = self.get_node(project, zone, node_id)
        if node["state"] == "DELETING" and node["delete_op"] in self.operations:
            return self.operations[node["delete_op"]]
        if node["state"] == "CREATING":
            # The create operation can no longer succeed: end it now, as GCE does.
            create_op = self.operations.get(node.get("create_op", ""))
            if create_op is not None:
                create_op["done_at"] = now
                create_op["error"] = {
                    "code": 10,
                    "message": "Operation aborted: the node was deleted during creation.",
                }
        error = None
        done_at: float | None = now + self.timing.delete_seconds
        if self.faults.delete_hangs:
            done_at = None
        elif self.faults.take_delete_failure():
            error = {"code": 13, "message": "Internal error. Deleting the node failed; retry."}
        node["state_before_delete"] = "READY" if node["state"] == "CREATING" else node["state"]
        node["state"] = "DELETING"
        operation = self._new_operation(project, zone, node_id, "delete", now, done_at, error)
        node["delete_op"] = operation["name"]
        return operation

    def update_node(
        self, project: str, zone: str, node_id: str, body: Record, mask: str, now: float
    ) -> Record:
        """UpdateNode: the masked fields of `body` (a Node) replace the node's when the
        operation ends; fields outside the mask are ignored, as the API does."""
        node = self.get_node(project, zone, node_id)
        paths = [p.strip() for p in mask.split(",") if p.strip()]
        if not paths:
            raise ApiError(400, "INVALID_ARGUMENT", "updateMask is required: name the fields.")
        unknown = [p for p in paths if p not in _UPDATE_MASK]
        if unknown:
            raise ApiError(
                400,
                "INVALID_ARGUMENT",
                f"Invalid updateMask path(s) {unknown}; the emulator can update "
                "description, labels, metadata, tags, network_config.enable_external_ips.",
            )
        if node["state"] != "READY":
            raise ApiError(
                400,
                "FAILED_PRECONDITION",
                f"Node {node_id} is {node['state']}; only a READY node can be updated.",
            )
        pending = self.operations.get(node.get("update_op") or "")
        if pending is not None and pending.get("changes") is not None:
            # gcloud's `tpu-vm ssh` expects 409 while another UpdateNode is in flight.
            raise ApiError(
                409, "ABORTED", f"Node {node_id} is being updated by {pending['name']}; retry."
            )
        changes = {_UPDATE_MASK[p]: _update_value(_UPDATE_MASK[p], body) for p in paths}
        operation = self._new_operation(
            project, zone, node_id, "update", now, now + self.timing.update_seconds, None
        )
        operation["changes"] = changes
        node["update_op"] = operation["name"]
        return operation

    def guest_attributes(
        self, node: Record, query_path: str, now: float, worker: int = 0
    ) -> dict[str, str]:
        """What worker `worker` of `node` has published under `query_path`."""
        ready_time = node.get("ready_time")
        if ready_time is None or now < ready_time + self.faults.guest_attributes_delay:
            return {}
        visible = {
            "tpulab-emulator/ready-time": rfc3339(ready_time),
            **worker_attributes(node, worker),
        }
        if not query_path:
            return visible
        if query_path.endswith("/") or "/" not in query_path:
            prefix = query_path.rstrip("/") + "/"
            return {k: v for k, v in visible.items() if k.startswith(prefix)}
        return {k: v for k, v in visible.items() if k == query_path}

    # -- operations --------------------------------------------------------------

    def _placement(self, project: str, zone: str, config: Record) -> tuple[str, str]:
        """The VPC network and subnetwork a CreateNode's networkConfig names (a short
        name or a `projects/P/...` path; unset: `default`, as the API and gcloud's
        `--network` default have it), refused (400) when the project has no such
        network, or the subnetwork is not one of its subnetworks in the zone's region.
        The wording follows Compute's for a missing network ("The referenced network
        resource cannot be found"); the TPU API's own is not on record here."""
        from tpulab.emulator.project_apis import project_networks

        network = str(config.get("network") or "default").rsplit("/", 1)[-1]
        networks = project_networks(self.faults)
        if network not in networks:
            raise ApiError(
                400,
                "INVALID_ARGUMENT",
                f"The referenced network resource cannot be found: "
                f"projects/{project}/global/networks/{network}.",
            )
        subnetwork_path = str(config.get("subnetwork") or "")
        subnetwork = subnetwork_path.rsplit("/", 1)[-1]
        region = zone.rsplit("-", 1)[0]
        parts = subnetwork_path.split("/")
        wrong_region = len(parts) >= 4 and parts[2] == "regions" and parts[3] != region
        # Auto-mode networks: each has one subnetwork per region, named as the network.
        if subnetwork and (subnetwork != network or wrong_region):
            raise ApiError(
                400,
                "INVALID_ARGUMENT",
                f"The referenced subnetwork resource cannot be found: "
                f"projects/{project}/regions/{region}/subnetworks/{subnetwork} "
                f"(network {network}).",
            )
        return network, subnetwork

    def _new_operation(
        self,
        project: str,
        zone: str,
        node_id: str,
        verb: str,
        now: float,
        done_at: float | None,
        error: Record | None,
    ) -> Record:
        name = (
            f"projects/{project}/locations/{zone}/operations/"
            f"operation-{int(now * 1000)}-{secrets.token_hex(6)}"
        )
        operation: Record = {
            "name": name,
            "project": project,
            "zone": zone,
            "node": node_id,
            "verb": verb,
            "create_time": now,
            "done_at": done_at,
            "error": error,
        }
        self.operations[name] = operation
        return operation

    def get_operation(self, project: str, zone: str, name: str) -> Record:
        zone_or_403(project, zone)
        operation = self.operations.get(name)
        if operation is None:
            raise ApiError(404, "NOT_FOUND", f"Resource '{name}' was not found")
        return operation

    def list_operations(self, project: str, zone: str) -> list[Record]:
        zone_or_403(project, zone)
        prefix = f"projects/{project}/locations/{zone}/operations/"
        return [op for name, op in sorted(self.operations.items()) if name.startswith(prefix)]


def _accelerator_type(body: Record) -> str:
    explicit = body.get("acceleratorType") or body.get("accelerator_type")
    if explicit:
        return str(explicit)
    config = body.get("acceleratorConfig") or body.get("accelerator_config")
    if isinstance(config, dict) and config.get("type") is not None:
        kind = parse_enum(ACCELERATOR_CONFIG_TYPES, config["type"], "acceleratorConfig.type")
        family, per_chip = _CONFIG_FAMILY.get(kind, ("", 1))
        chips = 1
        for part in str(config.get("topology", "1")).split("x"):
            chips *= int(part) if part.isdigit() else 0
        return f"{family}-{chips * per_chip}"
    return "v2-8"  # the API's (and gcloud's) default type


def _update_value(field: str, body: Record) -> Any:
    if field == "external_ips":
        network = body.get("networkConfig") or body.get("network_config") or {}
        return bool(network.get("enableExternalIps", network.get("enable_external_ips", False)))
    if field in _RULES:
        return _checked_map(body, field)
    if field == "tags":
        tags = body.get("tags") or []
        if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
            raise ApiError(400, "INVALID_ARGUMENT", "Invalid value at 'node.tags': want strings.")
        return list(tags)
    return str(body.get(field) or "")


# What Google holds a node's string maps to, beyond being maps (emulator/resource_rules.py).
_RULES: dict[str, Callable[[dict[str, str]], str | None]] = {
    "labels": tpu_label_problem,
    "metadata": metadata_problem,
}


def _checked_map(body: Record, field: str) -> dict[str, str]:
    """`body[field]` (labels or metadata) as a create or update takes it, or the API's
    refusal."""
    value = _string_map(body.get(field), field)
    problem = _RULES[field](value)
    if problem is not None:
        raise ApiError(400, "INVALID_ARGUMENT", problem)
    return value


def _string_map(value: Any, field: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise ApiError(400, "INVALID_ARGUMENT", f"Invalid value at 'node.{field}': want a map.")
    return {str(k): v for k, v in value.items()}


def _topology(accelerator: str) -> str:
    family = accelerator_family(accelerator) or ""
    try:
        size = int(accelerator.rsplit("-", 1)[1])
    except (IndexError, ValueError):
        return ""
    chips = size // _CONFIG_FAMILY.get(_FAMILY_CONFIG.get(family, ""), ("", 1))[1]
    if family in {"v4", "v5p"}:
        shapes = {4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4"}
    else:
        shapes = {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16"}
    return shapes.get(chips, "")


def _service_account_json(node: Record) -> Record:
    # What the API echoes: the account asked for at create ("default" when none was).
    account = node.get("service_account") or {}
    return {"email": account.get("email") or "default", "scope": list(account.get("scopes") or [])}


def node_json(node: Record, *, as_int: bool) -> Record:
    """A node record as the v2 API's Node JSON."""
    project, zone, name = node["project"], node["zone"], node["name"]
    accelerator = node["accelerator_type"]
    family = accelerator_family(accelerator) or ""
    region = zone.rsplit("-", 1)[0]
    body: Record = {
        "name": node_path(project, zone, name),
        "description": node["description"],
        "acceleratorType": accelerator,
        "state": enum_value(STATES, node["state"], as_int=as_int),
        "runtimeVersion": node["runtime_version"],
        "networkConfig": {
            "network": f"projects/{project}/global/networks/{node.get('network') or 'default'}",
            "subnetwork": f"projects/{project}/regions/{region}/subnetworks/"
            f"{node.get('subnetwork') or node.get('network') or 'default'}",
            "enableExternalIps": node["external_ips"],
        },
        "cidrBlock": "10.128.0.0/20",
        "serviceAccount": _service_account_json(node),
        "createTime": rfc3339(node["create_time"]),
        "schedulingConfig": {"preemptible": node["preemptible"], "spot": node["spot"]},
        "labels": dict(node["labels"]),
        "metadata": dict(node["metadata"]),
        **({"tags": list(node["tags"])} if node.get("tags") else {}),
        # Output only: the qualified name of the QueuedResource that requested the node.
        **(
            {"queuedResource": f"projects/{project}/locations/{zone}/queuedResources/{qr}"}
            if (qr := node.get("queued_resource"))
            else {}
        ),
        "id": node["id"],
        "apiVersion": enum_value(API_VERSIONS, "V2", as_int=as_int),
    }
    if family in _FAMILY_CONFIG:
        body["acceleratorConfig"] = {
            "type": enum_value(ACCELERATOR_CONFIG_TYPES, _FAMILY_CONFIG[family], as_int=as_int),
            "topology": _topology(accelerator),
        }
    if node["state"] in {"READY", "DELETING"} or node.get("ready_time") is not None:
        # READY is HEALTHY, unless its VM stopped and the state lags (`preempt_lag_health`).
        ready_health = node.get("lag_health", "HEALTHY") if node.get("vm_stopped_at") else "HEALTHY"
        body["health"] = enum_value(
            HEALTHS, ready_health if node["state"] == "READY" else node["health"], as_int=as_int
        )
        # One entry per worker VM, in worker order (a slice has several; clients index
        # this list by worker: gcloud's tpu-vm ssh ParseWorkerFlag, tpulab's run engine).
        body["networkEndpoints"] = [
            _endpoint_json(node, worker) for worker in range(worker_count(node["accelerator_type"]))
        ]
    return body


def _endpoint_json(node: Record, worker: int) -> Record:
    address = worker_address(node, worker)
    endpoint: Record = {"ipAddress": address, "port": 8470}
    if node["external_ips"]:
        # An emulated worker is reached at its one (loopback) address either way.
        endpoint["accessConfig"] = {"externalIp": address}
    return endpoint


def operation_json(operation: Record, node: Record | None, *, now: float, as_int: bool) -> Record:
    """A node's operation record as google.longrunning.Operation JSON."""
    project, zone, name = operation["project"], operation["zone"], operation["node"]
    return longrunning_json(
        operation,
        target=node_path(project, zone, name),
        response_type="type.googleapis.com/google.cloud.tpu.v2.Node",
        render=lambda: node_json(node, as_int=as_int) if node is not None else None,
        now=now,
    )


def longrunning_json(
    operation: Record,
    *,
    target: str,
    response_type: str,
    render: Callable[[], Record | None],
    now: float,
) -> Record:
    """Any operation record (a node's or a queued resource's) as Operation JSON: the one
    shape, with `render` giving the finished resource (None: only its name is known)."""
    done_at = operation["done_at"]
    done = done_at is not None and now >= done_at
    metadata: Record = {
        "@type": "type.googleapis.com/google.cloud.tpu.v2.OperationMetadata",
        "createTime": rfc3339(operation["create_time"]),
        "target": target,
        "verb": operation["verb"],
        "cancelRequested": False,
        "apiVersion": "v2",
    }
    body: Record = {"name": operation["name"], "metadata": metadata, "done": done}
    if not done:
        return body
    metadata["endTime"] = rfc3339(done_at)
    if operation["error"]:
        body["error"] = {**operation["error"], "details": []}
    elif operation["verb"] == "delete":
        body["response"] = {"@type": "type.googleapis.com/google.protobuf.Empty"}
    else:
        body["response"] = {"@type": response_type, **(render() or {"name": target})}
    return body
