"""Each Cloud TPU v2 call tpulab makes, as the request that goes on the wire. No google.*.

One builder per call returns a `WireRequest`: the request *message* as JSON (camelCase,
default values left out, exactly as protobuf's JSON printer writes it) and, derived from
it by the call's HTTP rule, the method, path, query and body that google-cloud-tpu's REST
transport sends. `GoogleTpuApi` parses `message` into the client's request proto, so the
client sends what these builders say; `tpulab run --dry-run` prints the same objects.
tests/test_plan_is_the_run.py holds them against what the emulator receives.

    create_node   POST   /v2/{parent}/nodes?nodeId=N     body: the Node
    get_node      GET    /v2/{name}
    list_nodes    GET    /v2/{parent}/nodes?pageSize=&pageToken=
    delete_node   DELETE /v2/{name}
    guest attrs   POST   /v2/{name}:getGuestAttributes   body: {queryPath, workerIds}
    operation     GET    /v2/{name}                      (the operations mixin)
    create QR     POST   /v2/{parent}/queuedResources?queuedResourceId=Q  body: QueuedResource
    get QR        GET    /v2/{name}
    list QRs      GET    /v2/{parent}/queuedResources?pageSize=&pageToken=
    delete QR     DELETE /v2/{name}?force=true
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from tpulab.cloud.api import QueuedResourceRequest
from tpulab.models import NodeRequest

__all__ = [
    "API_VERSION",
    "TRANSPORT_ALT",
    "WireRequest",
    "create_node",
    "create_queued_resource",
    "delete_node",
    "delete_queued_resource",
    "get_guest_attributes",
    "get_node",
    "get_operation",
    "get_queued_resource",
    "list_nodes",
    "list_queued_resources",
    "node_body",
    "node_path",
    "parent_path",
    "queued_resource_body",
    "queued_resource_path",
]

API_VERSION = "v2"
# The REST transport appends this to every TpuClient call (so enums may come back as
# ints); the operations mixin's GetOperation goes without it.
TRANSPORT_ALT = ("$alt", "json;enum-encoding=int")

Method = Literal["GET", "POST", "DELETE"]


@dataclass(frozen=True)
class WireRequest:
    """One HTTP request of the Cloud TPU API, and the message it was transcoded from."""

    rpc: str  # "CreateNode", ...
    method: Method
    path: str  # "/v2/projects/p/locations/z/nodes", percent-decoded
    query: tuple[tuple[str, str], ...] = ()
    body: dict[str, Any] | None = None
    message: dict[str, Any] = field(default_factory=dict)

    @property
    def target(self) -> str:
        """Path and query as one readable string (not percent-encoded)."""
        if not self.query:
            return self.path
        return self.path + "?" + "&".join(f"{k}={v}" for k, v in self.query)


def parent_path(project: str, zone: str) -> str:
    return f"projects/{project}/locations/{zone}"


def node_path(project: str, zone: str, node_id: str) -> str:
    return f"{parent_path(project, zone)}/nodes/{node_id}"


def node_body(request: NodeRequest) -> dict[str, Any]:
    """The Node of a CreateNode, as JSON. Empty fields are left out: protobuf's printer
    drops them too, so what is here is what the wire carries."""
    node: dict[str, Any] = {
        "acceleratorType": request.accelerator_type,
        "runtimeVersion": request.runtime_version,
    }
    if request.description:
        node["description"] = request.description
    if request.labels:
        node["labels"] = dict(request.labels)
    if request.metadata:
        node["metadata"] = dict(request.metadata)
    # An external IP is what lets the laptop reach the VM over SSH (--internal-ip: from
    # inside the VPC, none is asked for: false is proto3's default, which the REST
    # transport leaves out of the JSON).
    network: dict[str, Any] = {"enableExternalIps": True} if request.external_ips else {}
    # --network / --subnetwork as given (a name or a path: the API takes either, as
    # gcloud's `tpu-vm create --network` passes it through); unset: the API's default.
    if request.network:
        network["network"] = request.network
    if request.subnetwork:
        network["subnetwork"] = request.subnetwork
    node["networkConfig"] = network
    if request.service_account_email or request.service_account_scopes:
        # google.cloud.tpu.v2.ServiceAccount: an empty email means the project's default
        # compute service account; the scopes bound what its metadata token may do.
        account: dict[str, Any] = {}
        if request.service_account_email:
            account["email"] = request.service_account_email
        if request.service_account_scopes:
            account["scope"] = list(request.service_account_scopes)
        node["serviceAccount"] = account
    # Sent even when empty (on-demand): the client always set a SchedulingConfig, and an
    # explicit submessage is printed as {} rather than dropped.
    node["schedulingConfig"] = {"spot": True} if request.spot else {}
    return node


def _transcode(
    rpc: str,
    method: Method,
    message: Mapping[str, Any],
    *,
    resource: str,
    suffix: str = "",
    body: str | None = None,
    alt: bool = True,
) -> WireRequest:
    """Apply an HTTP rule: `resource` names the field bound into the path, `body` the
    field sent as the body ("*" = every field not in the path); the rest is the query."""
    path = f"/{API_VERSION}/{message[resource]}{suffix}"
    rest = {k: v for k, v in message.items() if k != resource}
    payload: dict[str, Any] | None
    if body == "*":
        payload, rest = dict(rest), {}
    elif body is not None:
        payload = dict(rest.pop(body))
    else:
        payload = None
    # A bool goes as JSON writes it ("true"), which is what the transport sends.
    query = [(key, json.dumps(v) if isinstance(v, bool) else str(v)) for key, v in rest.items()]
    if alt:
        query.append(TRANSPORT_ALT)
    return WireRequest(rpc, method, path, tuple(query), payload, dict(message))


def create_node(project: str, zone: str, node_id: str, request: NodeRequest) -> WireRequest:
    message = {
        "parent": parent_path(project, zone),
        "nodeId": node_id,
        "node": node_body(request),
    }
    return _transcode(
        "CreateNode", "POST", message, resource="parent", suffix="/nodes", body="node"
    )


def get_node(project: str, zone: str, node_id: str) -> WireRequest:
    message = {"name": node_path(project, zone, node_id)}
    return _transcode("GetNode", "GET", message, resource="name")


def list_nodes(project: str, zone: str, *, page_size: int = 0, page_token: str = "") -> WireRequest:
    message: dict[str, Any] = {"parent": parent_path(project, zone)}
    if page_size:
        message["pageSize"] = page_size
    if page_token:
        message["pageToken"] = page_token
    return _transcode("ListNodes", "GET", message, resource="parent", suffix="/nodes")


def delete_node(project: str, zone: str, node_id: str) -> WireRequest:
    message = {"name": node_path(project, zone, node_id)}
    return _transcode("DeleteNode", "DELETE", message, resource="name")


def get_guest_attributes(
    project: str,
    zone: str,
    node_id: str,
    query_path: str = "",
    worker_ids: tuple[str, ...] = ("0",),
) -> WireRequest:
    """One worker by id (worker 0 of a single-host node is all it has), which keeps the
    answer to one entry; every worker of a multi-host node has its own attributes."""
    message: dict[str, Any] = {"name": node_path(project, zone, node_id)}
    if query_path:
        message["queryPath"] = query_path
    if worker_ids:
        message["workerIds"] = list(worker_ids)
    return _transcode(
        "GetGuestAttributes",
        "POST",
        message,
        resource="name",
        suffix=":getGuestAttributes",
        body="*",
    )


def get_operation(operation_name: str) -> WireRequest:
    return _transcode("GetOperation", "GET", {"name": operation_name}, resource="name", alt=False)


def queued_resource_path(project: str, zone: str, qr_id: str) -> str:
    return f"{parent_path(project, zone)}/queuedResources/{qr_id}"


def queued_resource_body(project: str, zone: str, request: QueuedResourceRequest) -> dict[str, Any]:
    """The QueuedResource of a CreateQueuedResource, as JSON: the node as CreateNode
    sends it, minus its schedulingConfig (gcloud's CreateNodeSpec sets none: a queued
    resource asks for spot with its own `spot` tier), and the queueing policy."""
    node = {k: v for k, v in node_body(request.node).items() if k != "schedulingConfig"}
    body: dict[str, Any] = {
        "tpu": {
            "nodeSpec": [
                {"parent": parent_path(project, zone), "nodeId": request.node_id, "node": node}
            ]
        }
    }
    if request.node.spot:
        body["spot"] = {}
    if request.valid_for_seconds is not None:
        # A google.protobuf.Duration in JSON: whole seconds, as the printer writes them.
        body["queueingPolicy"] = {"validUntilDuration": f"{request.valid_for_seconds}s"}
    return body


def create_queued_resource(
    project: str, zone: str, qr_id: str, request: QueuedResourceRequest
) -> WireRequest:
    message = {
        "parent": parent_path(project, zone),
        "queuedResourceId": qr_id,
        "queuedResource": queued_resource_body(project, zone, request),
    }
    return _transcode(
        "CreateQueuedResource",
        "POST",
        message,
        resource="parent",
        suffix="/queuedResources",
        body="queuedResource",
    )


def get_queued_resource(project: str, zone: str, qr_id: str) -> WireRequest:
    message = {"name": queued_resource_path(project, zone, qr_id)}
    return _transcode("GetQueuedResource", "GET", message, resource="name")


def list_queued_resources(
    project: str, zone: str, *, page_size: int = 0, page_token: str = ""
) -> WireRequest:
    message: dict[str, Any] = {"parent": parent_path(project, zone)}
    if page_size:
        message["pageSize"] = page_size
    if page_token:
        message["pageToken"] = page_token
    return _transcode(
        "ListQueuedResources", "GET", message, resource="parent", suffix="/queuedResources"
    )


def delete_queued_resource(project: str, zone: str, qr_id: str, *, force: bool) -> WireRequest:
    message: dict[str, Any] = {"name": queued_resource_path(project, zone, qr_id)}
    if force:
        message["force"] = True
    return _transcode("DeleteQueuedResource", "DELETE", message, resource="name")
