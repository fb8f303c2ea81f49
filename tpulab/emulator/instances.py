"""Compute Engine's instances API for TPU machine types (docs/reference/compute-facts.md).

New TPU generations (TPU7x on) are made through Compute Engine, as VM instances with a
TPU machine type, not through the Cloud TPU API; the two APIs do not see each other's
resources. The emulator serves the Compute v1 calls such a VM needs, under the compute
root gcloud reaches with `CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE=<emulator>/compute/v1/`:

    POST   projects/P/zones/Z/instances                      instances.insert -> Operation
    GET    projects/P/zones/Z/instances[?filter&maxResults&pageToken]   instances.list
    GET    projects/P/zones/Z/instances/I                    instances.get
    DELETE projects/P/zones/Z/instances/I                    instances.delete -> Operation
    POST   projects/P/zones/Z/instances/I/setMetadata        instances.setMetadata -> Operation
    GET    projects/P/zones/Z/instances/I/getGuestAttributes?queryPath=|variableKey=
    GET    projects/P/zones/Z/operations/O                   zoneOperations.get
    POST   projects/P/zones/Z/operations/O/wait              zoneOperations.wait
    GET    projects/P/aggregated/instances                   instances.aggregatedList
    GET    projects/P/zones/Z                                zones.get (gcloud asks first)
    GET    projects/P/zones/Z/machineTypes/M                 machineTypes.get (doctor asks)

The paths and fields are gcloud's generated Compute v1 client and messages
(googlecloudsdk/generated_clients/apis/compute/v1: `Instance`, `Operation`,
`InstanceList`, `InstanceAggregatedList`, `GuestAttributes`, `Scheduling`); the JSON
shapes themselves are written by instance_wire.py.

An instance lives in the same state as TPU nodes (`CloudState.nodes`) under its own key
(`instance_key`: "compute:P/Z/I", which no node key can equal), marked `"api":
"compute"`, so the one state machine (state.py: CREATING -> READY -> DELETING, spot
preemption) and the one boot mechanism (machines.py: guest, metadata server,
startup-script, SSH host, host keys as guest attributes) serve both. Here those states
are shown as Compute's: PROVISIONING, STAGING, RUNNING, STOPPING, TERMINATED.

Compute writes errors in its own shape (`error.errors[]` with `reason` and `domain`, no
`status`), and an operation's failure as `error.errors[].code` (ZONE_RESOURCE_POOL_EXHAUSTED,
QUOTA_EXCEEDED) with `httpErrorStatusCode`; `ComputeError` carries the former. A project
whose Compute Engine API is disabled (`disabled_services` with compute.googleapis.com)
answers every Compute call with `compute_disabled`'s 403 accessNotConfigured.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any, Protocol

from tpulab.contract import EMULATOR_SSH_PORT_ATTRIBUTE, GUEST_ATTRIBUTES_METADATA
from tpulab.emulator.faults import FaultPlan
from tpulab.emulator.iam import granted, project_number
from tpulab.emulator.instance_wire import (
    BASE,
    ComputeError,
    compute_id,
    instance_json,
    instance_path,
    instance_status,
    list_filter,
    list_page,
    metadata_json,
    operation_json,
    quota_error,
    stockout_error,
)
from tpulab.emulator.resource_rules import compute_label_problem, metadata_problem
from tpulab.emulator.state import CloudState
from tpulab.emulator.workers import worker_attributes
from tpulab.emulator.zones import ZONES

__all__ = [
    "COMPUTE_SERVICE",
    "INSTANCE_ROUTES",
    "MACHINE_TYPES",
    "ComputeError",
    "InstanceApi",
    "compute_disabled",
    "instance_key",
    "is_instance",
]

Record = dict[str, Any]

COMPUTE_SERVICE = "compute.googleapis.com"

# TPU machine type -> (the Cloud TPU API accelerator type of the same single VM, which
# the VM's metadata (`accelerator-type`, tpu-env) shows; TPU chips on the VM). The
# emulator's own table, not tpulab.catalog's (a wrong row shared by both could never
# fail a test). Sources, in docs/reference/compute-facts.md: Compute supports TPU7x, v6e
# and v5p ("TPU machines in accelerator-optimized machine family",
# cloud.google.com/compute/docs/tpus/tpu-machines); v6e's ct6e-standard-{1,4,8}t from
# the "TPU v6e" page's configuration table (cloud.google.com/tpu/docs/v6e); v5p's
# ct5p-hightpu-4t, 4 chips a host (cloud.google.com/tpu/docs/v5p: 2x2x1 is one full
# host of 4 chips); tpu7x-standard-4t, four chips a VM (GKE's "Ironwood (TPU7x)" page:
# "Each Ironwood (TPU7x) virtual machine (VM) contains four chips").
MACHINE_TYPES: dict[str, tuple[str, int]] = {
    "ct6e-standard-1t": ("v6e-1", 1),
    "ct6e-standard-4t": ("v6e-4", 4),
    "ct6e-standard-8t": ("v6e-8", 8),
    "ct5p-hightpu-4t": ("v5p-8", 4),
    "tpu7x-standard-4t": ("tpu7x-8", 4),
}

_P = r"(?P<project>[^/]+)"
_Z = r"(?P<zone>[^/]+)"
_I = r"(?P<instance>[^/]+)"
_ROOT = r"^/compute/v1/projects/" + _P
INSTANCE_ROUTES: list[tuple[str, re.Pattern[str], str]] = [
    (m, re.compile(_ROOT + p + "$"), name)
    for m, p, name in (
        ("GET", r"/zones/" + _Z, "get_compute_zone"),
        ("GET", r"/zones/" + _Z + r"/machineTypes/(?P<machine_type>[^/]+)", "get_machine_type"),
        ("POST", r"/zones/" + _Z + r"/instances", "insert_instance"),
        ("GET", r"/zones/" + _Z + r"/instances", "list_instances"),
        ("GET", r"/zones/" + _Z + r"/instances/" + _I, "get_instance"),
        ("DELETE", r"/zones/" + _Z + r"/instances/" + _I, "delete_instance"),
        ("POST", r"/zones/" + _Z + r"/instances/" + _I + r"/setMetadata", "set_instance_metadata"),
        (
            "GET",
            r"/zones/" + _Z + r"/instances/" + _I + r"/getGuestAttributes",
            "get_instance_guest_attributes",
        ),
        ("GET", r"/zones/" + _Z + r"/operations/(?P<op>[^/]+)", "get_zone_operation"),
        ("POST", r"/zones/" + _Z + r"/operations/(?P<op>[^/]+)/wait", "wait_zone_operation"),
        ("GET", r"/aggregated/instances", "aggregated_instances"),
    )
]

# The permission each call needs (IAM's compute.* names).
_PERMISSIONS = {
    "insert_instance": "compute.instances.create",
    "list_instances": "compute.instances.list",
    "aggregated_instances": "compute.instances.list",
    "get_instance": "compute.instances.get",
    "delete_instance": "compute.instances.delete",
    "set_instance_metadata": "compute.instances.setMetadata",
    "get_instance_guest_attributes": "compute.instances.getGuestAttributes",
    "get_zone_operation": "compute.zoneOperations.get",
    "wait_zone_operation": "compute.zoneOperations.get",
    "get_compute_zone": "compute.zones.get",
    "get_machine_type": "compute.machineTypes.get",
}
_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
# The namespace of what only the emulator publishes (its SSH port and user).
_EMULATOR_NAMESPACE = EMULATOR_SSH_PORT_ATTRIBUTE.split("/", 1)[0] + "/"
# zoneOperations.wait returns when the operation is DONE or after about 2 minutes
# (the method's description in compute_v1_client.py); the emulator waits less.
_WAIT_SECONDS = 30.0


class Request(Protocol):
    """What a handler reads of a request (server.py's `_Request`)."""

    params: dict[str, str]
    body: Record
    caller: Record | None

    def arg(self, name: str) -> str: ...


def instance_key(project: str, zone: str, name: str) -> str:
    """An instance's key in the state: no TPU node key (`P/Z/N`) starts "compute:"."""
    return f"compute:{project}/{zone}/{name}"


def is_instance(record: Record) -> bool:
    return record.get("api") == "compute"


def _operation_key(project: str, zone: str, name: str) -> str:
    return f"compute:projects/{project}/zones/{zone}/operations/{name}"


def _not_found(resource: str) -> ComputeError:
    # Compute's words for a missing resource (as its networks.get answers, project_apis.py).
    return ComputeError(404, "notFound", f"The resource '{resource}' was not found")


class InstanceApi:
    """The handlers (`api_<route name>`), each returning (HTTP status, JSON body)."""

    def __init__(
        self,
        transaction: Callable[[], AbstractContextManager[CloudState]],
        clock: Callable[[], float],
        faults: FaultPlan,
        wake: Callable[[], None],
    ) -> None:
        self._transaction = transaction
        self._clock = clock
        self._faults = faults
        self._wake = wake

    def handle(self, name: str, request: Request) -> tuple[int, Record]:
        try:
            if COMPUTE_SERVICE in self._faults.disabled_services:
                raise compute_disabled(request.params["project"])
            self._authorize(name, request)
            handler: Callable[[Request], tuple[int, Record]] = getattr(self, f"api_{name}")
            return handler(request)
        except ComputeError as error:
            return error.code, error.body()

    def _authorize(self, name: str, request: Request) -> None:
        """The controller holds every permission but `caller_lacks`; a VM's own token
        (its metadata server's) what its service account is granted, in its project
        only: the watchdog's DELETE of its own instance passes here as a node's does."""
        caller = request.caller
        for permission in _needed(name, request.body):
            if caller is None:
                allowed = permission not in self._faults.caller_lacks
            else:
                allowed = caller["project"] == request.params["project"] and bool(
                    granted(caller, self._faults, [permission])
                )
            if not allowed:
                # Compute's words: "Required '<permission>' permission for '<resource>'",
                # naming the first permission the caller lacks.
                raise ComputeError(
                    403,
                    "forbidden",
                    f"Required '{permission}' permission for '{_resource(request)}'",
                )

    # -- zones -------------------------------------------------------------------------

    def api_get_compute_zone(self, request: Request) -> tuple[int, Record]:
        project, zone = request.params["project"], request.params["zone"]
        _zone_or_404(project, zone)
        return 200, {
            "kind": "compute#zone",
            "id": compute_id(zone),
            "name": zone,
            "description": zone,
            "status": "UP",
            "region": f"{BASE}projects/{project}/regions/{zone.rsplit('-', 1)[0]}",
            "selfLink": f"{BASE}projects/{project}/zones/{zone}",
            "availableCpuPlatforms": ["AMD Milan"],
        }

    def api_get_machine_type(self, request: Request) -> tuple[int, Record]:
        """machineTypes.get: a TPU machine type the zone offers (MACHINE_TYPES, less the
        `absent_machine_types` fault's), or Compute's 404 notFound for any other. The
        sizes (guestCpus, memoryMb) are not on record here and are left out."""
        params = request.params
        project, zone, name = params["project"], params["zone"], params["machine_type"]
        _zone_or_404(project, zone)
        if name not in MACHINE_TYPES or f"{zone}/{name}" in self._faults.absent_machine_types:
            raise _not_found(f"projects/{project}/zones/{zone}/machineTypes/{name}")
        accelerator, chips = MACHINE_TYPES[name]
        return 200, {
            "kind": "compute#machineType",
            "id": compute_id(f"{zone}/{name}"),
            "creationTimestamp": "2024-01-01T00:00:00.000-08:00",
            "name": name,
            "description": f"{chips} TPU chip(s) ({accelerator} as the Cloud TPU API names it)",
            "zone": zone,
            "isSharedCpu": False,
            "architecture": "X86_64",
            "selfLink": f"{BASE}projects/{project}/zones/{zone}/machineTypes/{name}",
        }

    # -- instances ---------------------------------------------------------------------

    def api_insert_instance(self, request: Request) -> tuple[int, Record]:
        project, zone = request.params["project"], request.params["zone"]
        _zone_or_404(project, zone)
        body = request.body
        name = str(body.get("name") or "")
        if not _NAME.match(name):
            raise ComputeError(
                400,
                "invalid",
                f"Invalid value for field 'resource.name': '{name}'. Must be a match of regex "
                "'(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)'",
            )
        machine_type = _machine_type(zone, body, self._faults.absent_machine_types)
        problem = _labels_or_metadata_problem(body)
        if problem is not None:
            raise ComputeError(400, "invalid", problem)
        now = self._clock()
        with self._transaction() as cloud:
            key = instance_key(project, zone, name)
            if key in cloud.nodes:
                raise ComputeError(
                    409,
                    "alreadyExists",
                    f"The resource '{instance_path(project, zone, name)}' already exists",
                )
            quota = self._faults.quota_message(zone)
            if quota is not None:
                # A quota failure arrives on the operation, not on the insert's reply
                # (googleapis/nodejs-compute#459: insert answers OK, then the VM fails).
                operation = _new_operation(cloud, project, zone, name, "insert", now, now)
                operation["error"] = quota_error(zone, machine_type)
                return 200, operation_json(operation, now)
            record = _new_record(cloud, project, zone, name, machine_type, body, now)
            stockout = self._faults.stockout_in(zone, now)
            timing = cloud.timing
            record["ready_at"] = now + (
                timing.stockout_seconds if stockout else timing.create_seconds
            )
            record["fate"] = "stockout" if stockout else "ready"
            cloud.nodes[key] = record
            operation = _new_operation(cloud, project, zone, name, "insert", now, None)
            operation["done_at"] = record["ready_at"]
            if stockout:
                operation["error"] = stockout_error(project, zone, machine_type)
            record["create_op"] = _operation_key(project, zone, operation["name"])
            answer = operation_json(operation, now)
        self._wake()
        return 200, answer

    def api_get_instance(self, request: Request) -> tuple[int, Record]:
        now = self._clock()
        with self._transaction() as cloud:
            return 200, instance_json(self._instance(cloud, request), now)

    def api_list_instances(self, request: Request) -> tuple[int, Record]:
        project, zone = request.params["project"], request.params["zone"]
        _zone_or_404(project, zone)
        matches = list_filter(request.arg("filter"))
        now = self._clock()
        with self._transaction() as cloud:
            items = [
                instance_json(r, now)
                for r in _instances(cloud, project)
                if r["zone"] == zone and matches(r, now)
            ]
        page, token = list_page(items, request.arg("maxResults"), request.arg("pageToken"))
        answer: Record = {
            "kind": "compute#instanceList",
            "id": f"projects/{project}/zones/{zone}/instances",
            "items": page,
            "selfLink": f"{BASE}projects/{project}/zones/{zone}/instances",
        }
        if token:
            answer["nextPageToken"] = token
        return 200, answer

    def api_aggregated_instances(self, request: Request) -> tuple[int, Record]:
        """instances.aggregatedList (what `gcloud compute instances list` sends): the
        instances by "zones/Z" scope; one page (maxResults is not applied across scopes)."""
        project = request.params["project"]
        matches = list_filter(request.arg("filter"))
        now = self._clock()
        scopes: dict[str, Record] = {}
        with self._transaction() as cloud:
            for record in _instances(cloud, project):
                if matches(record, now):
                    scope = scopes.setdefault(f"zones/{record['zone']}", {"instances": []})
                    scope["instances"].append(instance_json(record, now))
        return 200, {
            "kind": "compute#instanceAggregatedList",
            "id": f"projects/{project}/aggregated/instances",
            "items": scopes,
            "selfLink": f"{BASE}projects/{project}/aggregated/instances",
        }

    def api_delete_instance(self, request: Request) -> tuple[int, Record]:
        now = self._clock()
        with self._transaction() as cloud:
            record = self._instance(cloud, request)
            project, zone, name = record["project"], record["zone"], record["name"]
            pending = cloud.operations.get(record.get("delete_op") or "")
            if record["state"] == "DELETING" and pending is not None:
                return 200, operation_json(pending, now)
            if record["state"] == "CREATING":
                # The insert can no longer succeed: it ends now, as a deleted VM's does.
                create_op = cloud.operations.get(record.get("create_op") or "")
                if create_op is not None:
                    create_op["done_at"] = now
                    create_op["error"] = {
                        "errors": [
                            {
                                "code": "RESOURCE_NOT_FOUND",
                                "message": f"The resource '{instance_path(project, zone, name)}'"
                                " was not found",
                            }
                        ]
                    }
            done_at: float | None = now + cloud.timing.delete_seconds
            error = None
            if self._faults.delete_hangs:
                done_at = None
            elif self._faults.take_delete_failure():
                error = {"errors": [{"code": "INTERNAL_ERROR", "message": "Internal error."}]}
            record["state_before_delete"] = (
                "READY" if record["state"] == "CREATING" else record["state"]
            )
            record["state"] = "DELETING"
            operation = _new_operation(cloud, project, zone, name, "delete", now, done_at)
            operation["error"] = error
            record["delete_op"] = _operation_key(project, zone, operation["name"])
            answer = operation_json(operation, now)
        self._wake()
        return 200, answer

    def api_set_instance_metadata(self, request: Request) -> tuple[int, Record]:
        """instances.setMetadata: the body (a `Metadata`) replaces the instance's items
        when its `fingerprint` is the current one (Compute's optimistic lock: anything
        else is 412 conditionNotMet); the guest agent then installs the new ssh-keys (the
        ticker rekeys the SSH host, as after a node's UpdateNode)."""
        now = self._clock()
        with self._transaction() as cloud:
            record = self._instance(cloud, request)
            current = metadata_json(record)["fingerprint"]
            if request.body.get("fingerprint") != current:
                raise ComputeError(
                    412,
                    "conditionNotMet",
                    "Supplied fingerprint does not match current metadata fingerprint.",
                )
            record["metadata"] = _metadata_items(request.body)
            project, zone, name = record["project"], record["zone"], record["name"]
            done_at = now + cloud.timing.update_seconds
            operation = _new_operation(cloud, project, zone, name, "setMetadata", now, done_at)
            answer = operation_json(operation, now)
        self._wake()
        return 200, answer

    def api_get_instance_guest_attributes(self, request: Request) -> tuple[int, Record]:
        """getGuestAttributes: `variableKey` ("ns/key") answers one value, `queryPath`
        ("ns/" or "ns/key") the items under it; nothing there is a 404, as Compute
        answers for a guest attribute path that does not exist."""
        now = self._clock()
        with self._transaction() as cloud:
            record = self._instance(cloud, request)
            attributes = _visible_attributes(record, now, self._faults)
        link = f"{BASE}{instance_path(record['project'], record['zone'], record['name'])}"
        # Compute's words, as gcloud's compute ssh matches them (command_lib/compute/
        # ssh_utils.py GetHostKeysFromGuestAttributes).
        missing = ComputeError(
            404,
            "notFound",
            f"The resource '{request.arg('variableKey') or request.arg('queryPath')}' of "
            "type 'Guest Attribute' was not found.",
        )
        variable = request.arg("variableKey")
        if variable:
            if variable not in attributes:
                raise missing
            return 200, {
                "kind": "compute#guestAttributes",
                "variableKey": variable,
                "variableValue": attributes[variable],
                "selfLink": f"{link}/guestAttributes/{variable}",
            }
        query = request.arg("queryPath")
        if query.endswith("/") or (query and "/" not in query):
            prefix = query.rstrip("/") + "/"
            found = {k: v for k, v in attributes.items() if k.startswith(prefix)}
        elif query:
            found = {k: v for k, v in attributes.items() if k == query}
        else:
            found = dict(attributes)
        if not found:
            raise missing
        items = [
            {"namespace": k.split("/", 1)[0], "key": k.split("/", 1)[1], "value": v}
            for k, v in sorted(found.items())
        ]
        return 200, {
            "kind": "compute#guestAttributes",
            "queryPath": query,
            "queryValue": {"items": items},
            "selfLink": f"{link}/guestAttributes/{query}",
        }

    # -- operations --------------------------------------------------------------------

    def api_get_zone_operation(self, request: Request) -> tuple[int, Record]:
        now = self._clock()
        with self._transaction() as cloud:
            return 200, operation_json(self._operation(cloud, request), now)

    def api_wait_zone_operation(self, request: Request) -> tuple[int, Record]:
        deadline = time.monotonic() + _WAIT_SECONDS
        while True:
            now = self._clock()
            with self._transaction() as cloud:
                answer = operation_json(self._operation(cloud, request), now)
            if answer["status"] == "DONE" or time.monotonic() >= deadline:
                return 200, answer
            time.sleep(0.05)

    # -- lookups -----------------------------------------------------------------------

    def _instance(self, cloud: CloudState, request: Request) -> Record:
        project, zone = request.params["project"], request.params["zone"]
        name = request.params["instance"]
        _zone_or_404(project, zone)
        record = cloud.nodes.get(instance_key(project, zone, name))
        if record is None:
            raise _not_found(instance_path(project, zone, name))
        return record

    def _operation(self, cloud: CloudState, request: Request) -> Record:
        project, zone, name = (request.params[k] for k in ("project", "zone", "op"))
        _zone_or_404(project, zone)
        operation = cloud.operations.get(_operation_key(project, zone, name))
        if operation is None:
            raise _not_found(f"projects/{project}/zones/{zone}/operations/{name}")
        return operation


def _needed(name: str, body: Record) -> list[str]:
    """The permissions a call needs. An insert needs more than compute.instances.create:
    the boot disk it makes, the subnetwork it joins (and an external IP's use of it),
    and each of metadata, labels and a service account it sets (the permissions Compute's
    "Create a VM instance" pages list for the caller; tpulab/cloud/preflight.py asks the
    same list before a run). Asked in that order, so a refusal names the first one
    lacked, as Compute's does."""
    needed = [_PERMISSIONS[name]]
    if name != "insert_instance":
        return needed
    needed += ["compute.disks.create", "compute.subnetworks.use"]
    interfaces = body.get("networkInterfaces") or [{}]
    if any(
        isinstance(interface, dict) and interface.get("accessConfigs") for interface in interfaces
    ):
        needed.append("compute.subnetworks.useExternalIp")
    if body.get("metadata"):
        needed.append("compute.instances.setMetadata")
    if body.get("labels"):
        needed.append("compute.instances.setLabels")
    if body.get("serviceAccounts"):
        needed.append("compute.instances.setServiceAccount")
    return needed


def _resource(request: Request) -> str:
    params = request.params
    path = f"projects/{params['project']}"
    if "zone" in params:
        path += f"/zones/{params['zone']}"
    instance = params.get("instance") or str(request.body.get("name") or "")
    if "zone" in params and instance:
        # An insert names the instance it would make, as Compute's refusal does:
        # "Required 'compute.instances.create' permission for 'projects/P/zones/Z/
        # instances/I'" (gcloud's and Terraform's output, quoted in many issue threads).
        path += f"/instances/{instance}"
    return path


def compute_disabled(project: str) -> ComputeError:
    """A project that never enabled Compute (or disabled it): 403 with Compute's v1
    reason `accessNotConfigured` in domain `usageLimits`, and Service Usage's words, as
    public client output quotes them ("googleapi: Error 403: Compute Engine API has not
    been used in project N before or it is disabled. Enable it by visiting
    https://console.developers.google.com/apis/api/compute.googleapis.com/overview?
    project=N then retry. ..., accessNotConfigured": hashicorp/terraform#19912,
    midl-dev/tezos-on-gke#34, fog/fog#3996). The `status` and the ErrorInfo detail
    (reason SERVICE_DISABLED, the service and consumer, as the TPU API's 403 carries
    them, project_apis.py) are Google's shared error model; that Compute's v1 body
    carries them too is not on record (docs/reference/compute-facts.md)."""
    number = project_number(project)
    enable = f"https://console.developers.google.com/apis/api/{COMPUTE_SERVICE}/overview"
    return ComputeError(
        403,
        "accessNotConfigured",
        f"Compute Engine API has not been used in project {number} before or it is "
        f"disabled. Enable it by visiting {enable}?project={number} then retry. If you "
        "enabled this API recently, wait a few minutes for the action to propagate to our "
        "systems and retry.",
        domain="usageLimits",
        extra={
            "status": "PERMISSION_DENIED",
            "details": [
                {
                    "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                    "reason": "SERVICE_DISABLED",
                    "domain": "googleapis.com",
                    "metadata": {"consumer": f"projects/{number}", "service": COMPUTE_SERVICE},
                }
            ],
        },
    )


def _zone_or_404(project: str, zone: str) -> None:
    if zone not in ZONES:
        raise _not_found(f"projects/{project}/zones/{zone}")


def _machine_type(zone: str, body: Record, absent: list[str]) -> str:
    """The TPU machine type the body names (a short name or a URL), or Compute's 400
    for a machine type the zone does not have: every type but a TPU one here, and the
    `absent` ones ("ZONE/TYPE", the `absent_machine_types` fault)."""
    given = str(body.get("machineType") or "")
    name = given.rsplit("/", 1)[-1]
    if name not in MACHINE_TYPES or f"{zone}/{name}" in absent:
        raise ComputeError(
            400,
            "invalid",
            f"Invalid value for field 'resource.machineType': '{given}'. Machine type with "
            f"name '{name}' does not exist in zone '{zone}'.",
        )
    return name


def _new_record(
    cloud: CloudState,
    project: str,
    zone: str,
    name: str,
    machine_type: str,
    body: Record,
    now: float,
) -> Record:
    number = int(cloud.data["next_id"])
    cloud.data["next_id"] = number + 1
    scheduling = body.get("scheduling") or {}
    spot = str(scheduling.get("provisioningModel") or "") == "SPOT"
    accounts = body.get("serviceAccounts") or [{}]
    interfaces = body.get("networkInterfaces") or [{}]
    disks = body.get("disks") or [{}]
    image = str(((disks[0] or {}).get("initializeParams") or {}).get("sourceImage") or "")
    return {
        "api": "compute",
        "project": project,
        "zone": zone,
        "name": name,
        "id": str(8_000_000_000_000_000 + number),
        "number": number,
        "machine_type": machine_type,
        "accelerator_type": MACHINE_TYPES[machine_type][0],
        "runtime_version": image.rsplit("/", 1)[-1],
        "image": image,
        "description": str(body.get("description") or ""),
        "labels": {str(k): str(v) for k, v in (body.get("labels") or {}).items()},
        "metadata": _metadata_items(body.get("metadata") or {}),
        "spot": spot,
        "preemptible": bool(scheduling.get("preemptible")) or spot,
        # Spot VMs stop when preempted unless told to be deleted (Compute's default).
        "termination_action": str(
            scheduling.get("instanceTerminationAction") or ("STOP" if spot else "")
        ),
        "external_ips": bool((interfaces[0] or {}).get("accessConfigs")),
        "network": str((interfaces[0] or {}).get("network") or "default").rsplit("/", 1)[-1],
        "subnetwork": str((interfaces[0] or {}).get("subnetwork") or "").rsplit("/", 1)[-1],
        "state": "CREATING",
        "health": "HEALTH_UNSPECIFIED",
        "create_time": now,
        "ready_time": None,
        "delete_op": None,
        "host": None,
        "guest_attributes": {},
        "service_account": {
            "email": str((accounts[0] or {}).get("email") or ""),
            "scopes": [str(s) for s in (accounts[0] or {}).get("scopes") or []],
        },
    }


def _labels_or_metadata_problem(body: Record) -> str | None:
    """Compute's refusal of an insert's labels or metadata (emulator/resource_rules.py)."""
    labels = body.get("labels") or {}
    if not isinstance(labels, dict):
        return "Invalid value for field 'resource.labels': want a map."
    problem = compute_label_problem({str(k): str(v) for k, v in labels.items()})
    if problem is not None:
        return problem
    problem = metadata_problem(_metadata_items(body.get("metadata") or {}))
    return None if problem is None else f"Invalid value for field 'resource.metadata': {problem}"


def _metadata_items(metadata: Record) -> dict[str, str]:
    """A `Metadata` message's items as the record keeps them (key -> value)."""
    items = metadata.get("items") or []
    return {str(item.get("key")): str(item.get("value") or "") for item in items}


def _instances(cloud: CloudState, project: str) -> Iterator[Record]:
    for key, record in sorted(cloud.nodes.items()):
        if key.startswith(f"compute:{project}/") and is_instance(record):
            yield record


def _visible_attributes(record: Record, now: float, faults: FaultPlan) -> dict[str, str]:
    """What the VM's guest agent has published (after the `guest_attributes_delay`)."""
    ready_time = record.get("ready_time")
    if ready_time is None or instance_status(record, now) != "RUNNING":
        return {}
    if now < ready_time + faults.guest_attributes_delay:
        return {}
    published = dict(worker_attributes(record, 0))
    if not _guest_attributes_enabled(record):
        # The guest agent writes guest attributes (the host keys among them) only where
        # the metadata enables them (gcloud's ssh_utils.py _MetadataHasGuestAttributesEnabled:
        # instance metadata first, then the project's, which has none here). What the
        # emulator publishes about itself stays: a real VM listens on port 22 anyway.
        published = {k: v for k, v in published.items() if k.startswith(_EMULATOR_NAMESPACE)}
    return published


def _guest_attributes_enabled(record: Record) -> bool:
    return str(record["metadata"].get(GUEST_ATTRIBUTES_METADATA, "")).strip().lower() == "true"


def _new_operation(
    cloud: CloudState,
    project: str,
    zone: str,
    instance: str,
    verb: str,
    now: float,
    done_at: float | None,
) -> Record:
    name = f"operation-{int(now * 1000)}-{secrets.token_hex(6)}"
    operation: Record = {
        "api": "compute",
        "name": name,
        "id": compute_id(name),
        "project": project,
        "zone": zone,
        "node": instance,
        "verb": verb,
        "create_time": now,
        "done_at": done_at,
        "error": None,
    }
    cloud.operations[_operation_key(project, zone, name)] = operation
    return operation
