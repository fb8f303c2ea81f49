"""Provider one: the Cloud TPU v2 API, its verbs over a transport, and its node request.

- `TpuV2Api`: the `TpuApi` verbs (tpulab.cloud.api), each written once as wire requests
  (tpulab.cloud.rest) sent through a `Transport` (tpulab.cloud.transport), the answers
  read from the API's REST JSON into tpulab's neutral records (NodeInfo,
  QueuedResourceInfo). `GoogleTpuApi` is this over google-cloud-tpu's client; the dry run
  is this over a recording transport.
- `node_request`: what a run's node asks for. The run engine (tpulab.run.provision) knows
  a run's key and watchdog; how they reach a TPU VM -- the `ssh-keys` metadata the guest
  agent installs, OS Login off so it does, guest attributes on for the host key, a
  startup-script for the watchdog, the scopes its token needs -- is this API's business.
"""

from __future__ import annotations

from typing import Any

from tpulab.cloud import rest
from tpulab.cloud.api import QueuedResourceInfo, QueuedResourceRequest
from tpulab.cloud.classify import RPC_STATUS, error_for_status
from tpulab.cloud.transport import Answer, TransportApi, guest_values, items_of
from tpulab.config import RunSpec
from tpulab.contract import (
    GUEST_ATTRIBUTES_METADATA,
    OS_LOGIN_METADATA,
    SSH_KEYS_METADATA,
    STARTUP_SCRIPT_METADATA,
)
from tpulab.models import NodeInfo, NodeRequest, NodeState, WorkerEndpoint

__all__ = [
    "CLOUD_PLATFORM_SCOPE",
    "TpuV2Api",
    "node_from_json",
    "node_request",
    "queued_resource_from_json",
]

# What the watchdog's service account may do with its metadata token: deleting the node
# needs the Cloud TPU API, which cloud-platform covers.
CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"


def node_request(spec: RunSpec, *, ssh_keys: str, startup_script: str | None) -> NodeRequest:
    """The node `spec` asks for: its labels, `ssh_keys` (the per-run key's metadata
    line) and the watchdog's `startup_script` (None: --no-watchdog)."""
    metadata = {
        SSH_KEYS_METADATA: ssh_keys,
        # Our key reaches the VM only through ssh-keys, which OS Login would make the
        # guest agent ignore; the host key only through guest attributes.
        OS_LOGIN_METADATA: "FALSE",
        GUEST_ATTRIBUTES_METADATA: "TRUE",
    }
    if startup_script is not None:
        metadata[STARTUP_SCRIPT_METADATA] = startup_script
    return NodeRequest(
        accelerator_type=spec.accelerator.name,
        runtime_version=spec.accelerator.runtime_version,
        labels=spec.labels,
        metadata=metadata,
        spot=spec.spot,
        description=f"tpulab run {spec.run_id}",
        external_ips=not spec.internal_ip,
        network=spec.network or "",
        subnetwork=spec.subnetwork or "",
        service_account_email=spec.service_account or "",
        # The watchdog's token must reach the TPU API; without a watchdog the VM keeps
        # the API's default scopes unless an account was asked for.
        service_account_scopes=(CLOUD_PLATFORM_SCOPE,)
        if startup_script is not None or spec.service_account
        else (),
    )


class TpuV2Api(TransportApi):
    """`TpuApi` over a `Transport`. `poll` makes the operation-polling schedule;
    `list_page_size` 0 lets the API choose its pages."""

    provider = "tpu-api"

    # -- nodes ----------------------------------------------------------------------

    def create_node(self, zone: str, node_id: str, request: NodeRequest) -> str:
        wire = rest.create_node(self.project, zone, node_id, request)
        answer = self._send(wire, f"create node {node_id} in {zone}", idempotent=False)
        return str(answer["name"])

    def wait_operation(self, operation_name: str, *, timeout: float) -> None:
        wire = rest.get_operation(operation_name)
        operation = self._wait(
            wire, operation_name, lambda answer: bool(answer.get("done")), timeout
        )
        error = operation.get("error") or {}
        if int(error.get("code") or 0) != 0:
            status = RPC_STATUS.get(int(error["code"]), "UNKNOWN")
            raise error_for_status(status, str(error.get("message", "")), _what(operation))

    def get_node(self, zone: str, node_id: str) -> NodeInfo:
        wire = rest.get_node(self.project, zone, node_id)
        answer = self._send(wire, f"get node {node_id} in {zone}", idempotent=True)
        return node_from_json(answer, self.project, zone)

    def list_nodes(self, zone: str) -> list[NodeInfo]:
        nodes = self._paged(
            lambda token: rest.list_nodes(
                self.project, zone, page_size=self._list_page_size, page_token=token
            ),
            f"list nodes in {zone}",
            "nodes",
        )
        return [node_from_json(node, self.project, zone) for node in nodes]

    def delete_node(self, zone: str, node_id: str) -> str:
        wire = rest.delete_node(self.project, zone, node_id)
        answer = self._send(wire, f"delete node {node_id} in {zone}", idempotent=False)
        return str(answer["name"])

    def guest_attributes(
        self, zone: str, node_id: str, query_path: str = "", *, worker: int = 0
    ) -> dict[str, str]:
        wire = rest.get_guest_attributes(self.project, zone, node_id, query_path, (str(worker),))
        what = f"read guest attributes of {node_id} in {zone}"
        if worker:
            what += f" (worker {worker})"
        workers = items_of(self._send(wire, what, idempotent=True), "guestAttributes")
        if not workers:
            return {}
        return guest_values(workers[0].get("queryValue") or {})

    # -- queued resources -----------------------------------------------------------

    def create_queued_resource(self, zone: str, qr_id: str, request: QueuedResourceRequest) -> str:
        wire = rest.create_queued_resource(self.project, zone, qr_id, request)
        answer = self._send(wire, f"create queued resource {qr_id} in {zone}", idempotent=False)
        return str(answer["name"])

    def get_queued_resource(self, zone: str, qr_id: str) -> QueuedResourceInfo:
        wire = rest.get_queued_resource(self.project, zone, qr_id)
        answer = self._send(wire, f"get queued resource {qr_id} in {zone}", idempotent=True)
        return queued_resource_from_json(answer, self.project, zone)

    def list_queued_resources(self, zone: str) -> list[QueuedResourceInfo]:
        resources = self._paged(
            lambda token: rest.list_queued_resources(
                self.project, zone, page_size=self._list_page_size, page_token=token
            ),
            f"list queued resources in {zone}",
            "queuedResources",
        )
        return [queued_resource_from_json(r, self.project, zone) for r in resources]

    def delete_queued_resource(self, zone: str, qr_id: str, *, force: bool) -> str:
        wire = rest.delete_queued_resource(self.project, zone, qr_id, force=force)
        answer = self._send(wire, f"delete queued resource {qr_id} in {zone}", idempotent=False)
        return str(answer["name"])


# -- the API's JSON, read into tpulab's records ------------------------------------------


def _zone_of(name: str, zone: str) -> str:
    parts = name.split("/")  # projects/P/locations/Z/nodes/N
    return parts[3] if len(parts) >= 6 else zone


def _enum(value: Any, unspecified: str) -> str:
    """An enum's name, "" for its unspecified value (the API may also leave it out)."""
    name = str(value or "")
    return "" if name == unspecified else name


def node_from_json(node: Answer, project: str, zone: str) -> NodeInfo:
    """A v2 `Node` (REST JSON) as tpulab's NodeInfo."""
    name = str(node.get("name", ""))
    workers = tuple(_worker(endpoint) for endpoint in items_of(node, "networkEndpoints"))
    first = workers[0] if workers else WorkerEndpoint()
    scheduling = node.get("schedulingConfig") or {}
    return NodeInfo(
        project=project,
        zone=_zone_of(name, zone),
        name=name.split("/")[-1],
        accelerator_type=str(node.get("acceleratorType", "")),
        runtime_version=str(node.get("runtimeVersion", "")),
        state=NodeState(_enum(node.get("state"), "") or "STATE_UNSPECIFIED"),
        health=_enum(node.get("health"), "HEALTH_UNSPECIFIED"),
        labels=dict(node.get("labels") or {}),
        metadata=dict(node.get("metadata") or {}),
        ip_address=first.ip_address,
        external_ip=first.external_ip,
        workers=workers,
        spot=bool(scheduling.get("spot") or scheduling.get("preemptible")),
        create_time=node.get("createTime") or None,
    )


def _worker(endpoint: Answer) -> WorkerEndpoint:
    access = endpoint.get("accessConfig") or {}
    return WorkerEndpoint(
        ip_address=str(endpoint.get("ipAddress") or "") or None,
        external_ip=str(access.get("externalIp") or "") or None,
    )


def queued_resource_from_json(resource: Answer, project: str, zone: str) -> QueuedResourceInfo:
    """A v2 `QueuedResource` (REST JSON) as tpulab's QueuedResourceInfo. It has no labels
    of its own: those of the node in its spec are how tpulab finds its own."""
    name = str(resource.get("name", ""))
    specs = items_of(resource.get("tpu") or {}, "nodeSpec")
    node = (specs[0].get("node") or {}) if specs else {}
    state = resource.get("state") or {}
    failed = (state.get("failedData") or {}).get("error") or {}
    return QueuedResourceInfo(
        project=project,
        zone=_zone_of(name, zone),
        name=name.split("/")[-1],
        node_id=str(specs[0].get("nodeId", "")) if specs else "",
        state=str(state.get("state") or "STATE_UNSPECIFIED"),
        accelerator_type=str(node.get("acceleratorType", "")),
        labels=dict(node.get("labels") or {}),
        spot="spot" in resource,
        failure=str(failed.get("message", "")),
        failure_code=int(failed.get("code") or 0),
        create_time=resource.get("createTime") or None,
    )


def _what(operation: Answer) -> str:
    """ "create node n in zone" from an operation's metadata, else its name."""
    metadata = operation.get("metadata") or {}
    verb, target = str(metadata.get("verb", "")), str(metadata.get("target", ""))
    parts = target.split("/")
    if verb and len(parts) >= 6:
        kind = "queued resource" if parts[-2] == "queuedResources" else "node"
        return f"{verb} {kind} {parts[-1]} in {parts[3]}"
    return f"complete operation {operation.get('name', '')}"
