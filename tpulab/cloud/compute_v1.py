"""Provider two: TPU VMs as Compute Engine v1 instances, the `TpuApi` verbs over a transport.

Why: the Cloud TPU API "is no longer in active development"; TPU7x and later are served
only through Compute Engine (or GKE), as VM instances with a TPU machine type, and the
resources of one API are invisible to the other (docs/reference/providers.md).

`ComputeTpuApi` writes each verb once as `WireRequest`s (tpulab.cloud.rest's shape) sent
through a `Transport` (tpulab.cloud.transport): `ComputeTransport` (below) over an
authorised `requests` session for a real run, the dry run's recording transport for a
plan. Paths and fields are those of gcloud's generated Compute v1 client
(googlecloudsdk/generated_clients/apis/compute/v1/compute_v1_client.py and
compute_v1_messages.py, read 2026-12-05):

    insert      POST   compute/v1/projects/P/zones/Z/instances          body: Instance
    get         GET    compute/v1/projects/P/zones/Z/instances/N
    list        GET    compute/v1/projects/P/zones/Z/instances?filter=&maxResults=&pageToken=
    delete      DELETE compute/v1/projects/P/zones/Z/instances/N
    guest attrs GET    compute/v1/projects/P/zones/Z/instances/N/getGuestAttributes?queryPath=
    operation   GET    compute/v1/projects/P/zones/Z/operations/O       (zoneOperations.get)

Queued resources are a Cloud TPU API object: every queued verb refuses. Multi-host
slices (a MIG with a workload policy) are out of scope and refused before any call
(tpulab.catalog.check_provider).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from tpulab.cloud.api import QueuedResourceInfo, QueuedResourceRequest
from tpulab.cloud.classify import compute_error
from tpulab.cloud.client_errors import ClientSender
from tpulab.cloud.rest import Method, WireRequest
from tpulab.cloud.transport import Answer, Transport, TransportApi, guest_values, items_of
from tpulab.contract import (
    EMULATOR_SSH_PORT_ATTRIBUTE,
    HOST_KEY_NAMESPACE,
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
)
from tpulab.errors import ConfigError, NotFoundError, UnsupportedAcceleratorError
from tpulab.models import NodeInfo, NodeRequest, NodeState, WorkerEndpoint

__all__ = [
    "COMPUTE_ROOT",
    "EMULATOR_NAMESPACE",
    "HOST_KEYS_QUERY",
    "ComputeTpuApi",
    "instance_body",
    "instance_from_json",
    "instance_path",
    "label_filter",
    "operation_path",
]

COMPUTE_ROOT = "compute/v1"
# Where a Compute VM's guest agent publishes its host keys, as gcloud's `compute ssh` asks
# for them (command_lib/compute/ssh_utils.py GetHostKeysFromGuestAttributes: queryPath
# 'hostkeys/'); and the namespace only an emulator publishes (its SSH port and user).
HOST_KEYS_QUERY = f"{HOST_KEY_NAMESPACE}/"
EMULATOR_NAMESPACE = EMULATOR_SSH_PORT_ATTRIBUTE.split("/", 1)[0] + "/"
# Compute's 404 for a guest attribute path with nothing under it (yet): the words gcloud
# matches in the same function. The instance's own 404 says "The resource
# 'projects/...'" and stays an error.
_NOTHING_PUBLISHED = "of type 'Guest Attribute' was not found"
# gcloud's `compute instances create` names the one-to-one NAT access config so.
_EXTERNAL_NAT = {"type": "ONE_TO_ONE_NAT", "name": "External NAT"}

# Instance.status (compute_v1_messages.Instance.StatusValueValuesEnum) as tpulab's node
# states. run/symptoms.py reads PREEMPTED, TERMINATED and STOPPED of a spot node as a
# preemption; a spot instance is created with instanceTerminationAction STOP, so a
# reclaimed one stays, TERMINATED, where the run can see it (and deletes it itself).
_STATES = {
    "PROVISIONING": NodeState.CREATING,
    "STAGING": NodeState.CREATING,
    "RUNNING": NodeState.READY,
    "STOPPING": NodeState.STOPPING,
    "STOPPED": NodeState.STOPPED,
    "SUSPENDING": NodeState.STOPPING,
    "SUSPENDED": NodeState.STOPPED,
    "TERMINATED": NodeState.TERMINATED,
    "REPAIRING": NodeState.REPAIRING,
    "DEPROVISIONING": NodeState.DELETING,
}


def zone_path(project: str, zone: str) -> str:
    return f"projects/{project}/zones/{zone}"


def instance_path(project: str, zone: str, name: str) -> str:
    return f"{zone_path(project, zone)}/instances/{name}"


def operation_path(project: str, zone: str, operation: str) -> str:
    """What `create_node`/`delete_node` return: Compute's operation names are short and
    zonal, so the zone travels with the name to `wait_operation`."""
    return f"{zone_path(project, zone)}/operations/{operation}"


def label_filter() -> str:
    """The list filter that finds tpulab's instances (Compute's filter syntax:
    `labels.KEY = "VALUE"`), so other VMs of the project are never read."""
    return f'labels.{MANAGED_BY_LABEL} = "{MANAGED_BY_VALUE}"'


def _wire(
    rpc: str,
    method: Method,
    path: str,
    *,
    query: tuple[tuple[str, str], ...] = (),
    body: dict[str, Any] | None = None,
) -> WireRequest:
    message: dict[str, Any] = {"name": path, **dict(query)}
    if body is not None:
        message["body"] = body
    return WireRequest(rpc, method, f"/{COMPUTE_ROOT}/{path}", query, body, message)


def _resource(project: str, kind: str, value: str, region: str = "") -> str:
    """A network or subnetwork as given (a path) or by name, as Compute's partial URL."""
    if "/" in value:
        return value
    if kind == "subnetworks":
        return f"projects/{project}/regions/{region}/subnetworks/{value}"
    return f"projects/{project}/global/networks/{value}"


def instance_body(
    project: str,
    zone: str,
    name: str,
    request: NodeRequest,
    *,
    machine_type: str,
    image: str,
) -> dict[str, Any]:
    """The `Instance` of an instances.insert, as JSON: the same NodeRequest the TPU API
    provider sends as a Node (tpulab.cloud.tpu_v2.node_request built it)."""
    body: dict[str, Any] = {
        "name": name,
        "machineType": f"zones/{zone}/machineTypes/{machine_type}",
        "disks": [{"boot": True, "autoDelete": True, "initializeParams": {"sourceImage": image}}],
    }
    if request.description:
        body["description"] = request.description
    if request.labels:
        body["labels"] = dict(request.labels)
    if request.metadata:
        # Metadata.items[]: the guest agent reads ssh-keys, enable-oslogin and
        # enable-guest-attributes from here as on a TPU VM; startup-script arms the watchdog.
        body["metadata"] = {
            "items": [{"key": key, "value": value} for key, value in request.metadata.items()]
        }
    interface: dict[str, Any] = {}
    if request.network:
        interface["network"] = _resource(project, "networks", request.network)
    if request.subnetwork:
        region = zone.rsplit("-", 1)[0]
        interface["subnetwork"] = _resource(project, "subnetworks", request.subnetwork, region)
    if request.external_ips:
        interface["accessConfigs"] = [dict(_EXTERNAL_NAT)]
    body["networkInterfaces"] = [interface]
    if request.service_account_email or request.service_account_scopes:
        # "default" is Compute's name for the project's default compute service account.
        account: dict[str, Any] = {"email": request.service_account_email or "default"}
        if request.service_account_scopes:
            account["scopes"] = list(request.service_account_scopes)
        body["serviceAccounts"] = [account]
    if request.spot:
        # Scheduling: a Spot VM cannot restart or migrate; STOP keeps a reclaimed one
        # visible as TERMINATED (a preemption to tpulab) instead of gone.
        body["scheduling"] = {
            "provisioningModel": "SPOT",
            "instanceTerminationAction": "STOP",
            "onHostMaintenance": "TERMINATE",
            "automaticRestart": False,
        }
    else:
        # Compute's default for a standard instance is MIGRATE (Scheduling.onHostMaintenance,
        # the v1 reference), which an accelerator VM cannot do (its GPU pages: "must be set
        # to TERMINATE"); whether a TPU machine type turns the default to TERMINATE itself
        # is not on record, and TERMINATE is valid for every instance, so it is said here
        # rather than left to a default that could refuse the insert
        # (docs/reference/compute-facts.md).
        body["scheduling"] = {"onHostMaintenance": "TERMINATE"}
    return body


def instance_from_json(instance: Answer, project: str, zone: str) -> NodeInfo:
    """A Compute `Instance` (REST JSON) as tpulab's NodeInfo; one worker (single host)."""
    interfaces = [i for i in instance.get("networkInterfaces") or [] if isinstance(i, dict)]
    worker = WorkerEndpoint()
    if interfaces:
        access = [a for a in interfaces[0].get("accessConfigs") or [] if isinstance(a, dict)]
        worker = WorkerEndpoint(
            ip_address=str(interfaces[0].get("networkIP") or "") or None,
            external_ip=str(access[0].get("natIP") or "") or None if access else None,
        )
    items = (instance.get("metadata") or {}).get("items") or []
    metadata = {str(i.get("key")): str(i.get("value", "")) for i in items if isinstance(i, dict)}
    scheduling = instance.get("scheduling") or {}
    status = str(instance.get("status") or "")
    spot = scheduling.get("provisioningModel") == "SPOT" or bool(scheduling.get("preemptible"))
    return NodeInfo(
        project=project,
        zone=str(instance.get("zone") or zone).rsplit("/", 1)[-1],
        name=str(instance.get("name", "")),
        accelerator_type=str(instance.get("machineType") or "").rsplit("/", 1)[-1],
        state=_STATES.get(status, NodeState.UNKNOWN if status else NodeState.STATE_UNSPECIFIED),
        labels=dict(instance.get("labels") or {}),
        metadata=metadata,
        ip_address=worker.ip_address,
        external_ip=worker.external_ip,
        workers=(worker,) if interfaces else (),
        spot=spot,
        create_time=instance.get("creationTimestamp") or None,
    )


def _not_here(what: str) -> ConfigError:
    return ConfigError(
        f"{what} is not available on the Compute provider: queued resources are a Cloud "
        "TPU API object.",
        hint="Drop --queued (Compute creates the instance at once), or use --provider "
        "tpu-api with an accelerator it serves.",
    )


class ComputeTpuApi(TransportApi):
    """`TpuApi` for TPU VM instances over a `Transport`. `machine_type_of` names the
    machine type of an accelerator (tpulab.catalog), `image` the boot disk's
    sourceImage; `poll` makes the operation-polling schedule. `published` are the guest
    attribute paths `guest_attributes` reads when asked for everything: Compute answers
    one queryPath at a time, and a real VM's agent publishes the host keys only (an
    emulator adds EMULATOR_NAMESPACE)."""

    provider = "compute"

    def __init__(
        self,
        project: str,
        transport: Transport,
        *,
        machine_type_of: Callable[[str], str],
        image: str,
        poll: Callable[[], Iterable[float]],
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        list_page_size: int = 0,
        published: tuple[str, ...] = (HOST_KEYS_QUERY,),
    ) -> None:
        super().__init__(
            project, transport, poll=poll, clock=clock, sleep=sleep, list_page_size=list_page_size
        )
        self._published = published
        self._machine_type_of = machine_type_of
        self.image = image

    @property
    def api_endpoint(self) -> str | None:
        """The endpoint asked (None: Google's), as `GoogleTpuApi.api_endpoint`: a run's
        preflight asks the same place (tpulab.app.doctor.preflight_for)."""
        endpoint = getattr(self.transport, "api_endpoint", None)
        return endpoint if isinstance(endpoint, str) else None

    def create_node(self, zone: str, node_id: str, request: NodeRequest) -> str:
        body = instance_body(
            self.project,
            zone,
            node_id,
            request,
            machine_type=self._machine_type_of(request.accelerator_type),
            image=self.image,
        )
        wire = _wire(
            "compute.instances.insert",
            "POST",
            f"{zone_path(self.project, zone)}/instances",
            body=body,
        )
        answer = self._send(wire, f"create instance {node_id} in {zone}", idempotent=False)
        return operation_path(self.project, zone, str(answer["name"]))

    def wait_operation(self, operation_name: str, *, timeout: float) -> None:
        wire = _wire("compute.zoneOperations.get", "GET", operation_name)
        operation = self._wait(
            wire, operation_name, lambda answer: answer.get("status") == "DONE", timeout
        )
        errors = items_of(operation.get("error") or {}, "errors")
        if errors:
            raise compute_error(
                str(errors[0].get("code") or ""),
                str(errors[0].get("message") or ""),
                _what(operation),
                http_status=int(operation.get("httpErrorStatusCode") or 0),
            )

    def get_node(self, zone: str, node_id: str) -> NodeInfo:
        wire = _wire("compute.instances.get", "GET", instance_path(self.project, zone, node_id))
        answer = self._send(wire, f"get instance {node_id} in {zone}", idempotent=True)
        return instance_from_json(answer, self.project, zone)

    def list_nodes(self, zone: str) -> list[NodeInfo]:
        """tpulab's instances in the zone (by its managed-by label), all pages."""
        path = f"{zone_path(self.project, zone)}/instances"

        def page(token: str) -> WireRequest:
            query = [("filter", label_filter())]
            if self._list_page_size:
                query.append(("maxResults", str(self._list_page_size)))
            if token:
                query.append(("pageToken", token))
            return _wire("compute.instances.list", "GET", path, query=tuple(query))

        items = self._paged(page, f"list instances in {zone}", "items")
        return [instance_from_json(item, self.project, zone) for item in items]

    def delete_node(self, zone: str, node_id: str) -> str:
        path = instance_path(self.project, zone, node_id)
        answer = self._send(
            _wire("compute.instances.delete", "DELETE", path),
            f"delete instance {node_id} in {zone}",
            idempotent=False,
        )
        return operation_path(self.project, zone, str(answer["name"]))

    def guest_attributes(
        self, zone: str, node_id: str, query_path: str = "", *, worker: int = 0
    ) -> dict[str, str]:
        if worker:
            raise UnsupportedAcceleratorError(
                f"Instance {node_id} is one VM: it has no worker {worker}.",
                hint="Multi-host slices are not available on the Compute provider.",
            )
        if query_path:
            return self._published_under(zone, node_id, query_path)
        found: dict[str, str] = {}
        for published in self._published:
            found.update(self._published_under(zone, node_id, published))
        return found

    def _published_under(self, zone: str, node_id: str, query_path: str) -> dict[str, str]:
        """One getGuestAttributes?queryPath=; nothing published there (yet) is empty, as
        the TPU API's answer is: its 404 is "not yet", not a missing instance."""
        path = f"{instance_path(self.project, zone, node_id)}/getGuestAttributes"
        query = (("queryPath", query_path),)
        wire = _wire("compute.instances.getGuestAttributes", "GET", path, query=query)
        try:
            answer = self._send(
                wire, f"read guest attributes of {node_id} in {zone}", idempotent=True
            )
        except NotFoundError as error:
            if _NOTHING_PUBLISHED in (error.api_message or ""):
                return {}
            raise
        return guest_values(answer.get("queryValue") or {})

    # -- queued resources: a Cloud TPU API object -----------------------------------------

    def create_queued_resource(self, zone: str, qr_id: str, request: QueuedResourceRequest) -> str:
        raise _not_here("A queued resource")

    def get_queued_resource(self, zone: str, qr_id: str) -> QueuedResourceInfo:
        raise _not_here("A queued resource")

    def list_queued_resources(self, zone: str) -> list[QueuedResourceInfo]:
        return []  # none can exist here: listing finds nothing rather than failing

    def delete_queued_resource(self, zone: str, qr_id: str, *, force: bool) -> str:
        raise _not_here("A queued resource")


def _what(operation: Answer) -> str:
    """ "insert instance n in zone" from an operation's type and target, else its name."""
    target = str(operation.get("targetLink") or "").split("/")
    kind = str(operation.get("operationType") or "")
    if kind and len(target) >= 4 and target[-2] == "instances":
        return f"{kind} instance {target[-1]} in {target[-3]}"
    return f"complete operation {operation.get('name', '')}"


class ComputeTransport(ClientSender):
    """The `Transport` of a real run on Compute: each wire request at the URL `apis`
    gives (tpulab.cloud.preflight.ProjectApis: the one way tpulab finds Compute's root,
    at Google or at an emulator) over `session` (tpulab.cloud.google.caller_session's,
    the same authorised session the preflight asks with). Sent through the same loop as
    the TPU API's transport (`tpulab.cloud.reach.send_through`): idempotent requests ride
    out transient failures for up to `retry_for` seconds, insert and delete are sent once,
    and an endpoint that has never answered this command is declared down on the reach
    schedule (at once on loopback) instead of being retried for a minute per call."""

    def __init__(
        self,
        apis: Any,
        session: Any,
        *,
        api_endpoint: str | None = None,
        retry_for: float = 60.0,
        request_timeout: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        notify: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__(
            api_endpoint,
            "compute.googleapis.com",
            api="Compute Engine",
            retry_for=retry_for,
            request_timeout=request_timeout,
            clock=clock,
            sleep=sleep,
            notify=notify,
        )
        self._apis = apis
        self._session = session
        self._api_endpoint = api_endpoint

    @property
    def api_endpoint(self) -> str | None:
        return self._api_endpoint

    def send(self, wire: WireRequest, *, what: str, idempotent: bool) -> Answer:
        return self._send_through(
            lambda timeout: self._once(wire, what, timeout), what, idempotent=idempotent
        )

    def _once(self, wire: WireRequest, what: str, timeout: float) -> Answer:
        """One HTTP request; an HTTP error answer is raised as tpulab's error (the client's
        own network exceptions are left to `send_through`'s translation)."""
        from tpulab.cloud.classify import HTTP_STATUS, error_for_status

        url = self._apis.url("compute", wire.path.removeprefix(f"/{COMPUTE_ROOT}/"))
        answer = self._session.request(
            wire.method, url, params=list(wire.query), json=wire.body, timeout=timeout
        )
        try:
            body = answer.json()
        except ValueError:
            body = {}
        body = body if isinstance(body, dict) else {}
        if answer.status_code < 400:
            return body
        failure: dict[str, Any] = body["error"] if isinstance(body.get("error"), dict) else {}
        reasons = [e.get("reason") for e in failure.get("errors") or [] if isinstance(e, dict)]
        status = str(failure.get("status") or HTTP_STATUS.get(answer.status_code) or "UNKNOWN")
        reason = str(reasons[0] if reasons else "")
        raise error_for_status(status, str(failure.get("message") or ""), what, reason=reason)
