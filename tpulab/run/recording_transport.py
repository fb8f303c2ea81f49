"""The dry run's API transport: records each wire request the provider's own verbs send
and answers as the API would (tpulab.run.recording composes it into a plan)."""

from __future__ import annotations

from tpulab.cloud import rest
from tpulab.cloud.api import TpuApi
from tpulab.cloud.polling import operation_schedule
from tpulab.cloud.tpu_v2 import TpuV2Api
from tpulab.cloud.transport import Answer
from tpulab.config.endpoint import classify_endpoint
from tpulab.contract import HOST_KEY_ATTRIBUTE, STARTUP_SCRIPT_METADATA, WATCHDOG_STATE_ATTRIBUTE
from tpulab.errors import NotFoundError
from tpulab.polling import active_wait
from tpulab.run.plan_steps import (
    _PLACEHOLDER_HOST_KEY,
    PLACEHOLDER_CREATE_OPERATION,
    PLACEHOLDER_DELETE_OPERATION,
    PLACEHOLDER_IMAGE,
    PLACEHOLDER_NODE_IP,
    PLACEHOLDER_QR_OPERATION,
    PollCadence,
    StepSink,
    worker_ip_placeholder,
)

__all__ = ["RecordingTransport", "recording_api"]


class RecordingTransport:
    """The dry run's `Transport` (tpulab.cloud.transport): records each wire request the
    TPU v2 verbs send (tpulab.cloud.tpu_v2, the very code of a real run) and answers it
    as the API would, in its REST JSON: a node is READY at once, an operation done."""

    def __init__(self, recorder: StepSink) -> None:
        self.recorder = recorder
        spec = recorder.spec
        self.project = spec.project.value
        self.calls = 0
        # The node as CreateNode sent it (its REST body), and whether it was deleted since.
        self.created: Answer | None = None
        self.deleted = False
        self.queued: Answer | None = None  # --queued: the QueuedResource's REST body

    @property
    def call_count(self) -> int:
        return self.calls

    def send(self, wire: rest.WireRequest, *, what: str, idempotent: bool) -> Answer:
        del what, idempotent  # nothing fails in a plan, so nothing is resent
        self.calls += 1
        wait = active_wait()  # answers come at once, so each loop probes exactly once
        poll = (
            PollCadence(
                until=wait.until, schedule=repr(wait.schedule), timeout_seconds=wait.timeout
            )
            if wait is not None
            else None
        )
        self.recorder.add(
            "api", wire.rpc, method=wire.method, path=wire.target, body=wire.body, poll=poll
        )
        return self._answer(wire)

    def _answer(self, wire: rest.WireRequest) -> Answer:
        if wire.rpc.startswith("compute."):
            return self._compute_answer(wire)
        rpc, name = wire.rpc, str(wire.message.get("name") or wire.message.get("parent"))
        if rpc == "GetOperation":
            return {"name": name, "done": True}
        if rpc == "CreateNode":
            self.created = dict(wire.message["node"])
            return self._operation(name, PLACEHOLDER_CREATE_OPERATION)
        if rpc == "CreateQueuedResource":
            self.queued = dict(wire.message["queuedResource"])
            spec = self.queued["tpu"]["nodeSpec"][0]
            self.created = {**spec["node"], "schedulingConfig": {"spot": "spot" in self.queued}}
            return self._operation(name, PLACEHOLDER_QR_OPERATION)
        if rpc == "ListNodes":
            node_name = rest.node_path(self.project, _zone(name), self.recorder.spec.node_name)
            return {"nodes": [self._node(node_name)]} if self._exists() else {}
        if rpc == "ListQueuedResources":
            qr_id = self.recorder.spec.node_name
            found = self.queued is not None and not self.deleted
            path = rest.queued_resource_path(self.project, _zone(name), qr_id)
            return {"queuedResources": [self._queued_resource(path)]} if found else {}
        if rpc in ("GetQueuedResource", "DeleteQueuedResource"):
            answer = self._queued_resource(name)  # NOT_FOUND, as the API would, if none
            if rpc == "GetQueuedResource":
                return answer
            self.deleted = True  # force: its node goes with it
            return self._operation(name, PLACEHOLDER_QR_OPERATION)
        node = self._node(name)  # GetNode, DeleteNode, GetGuestAttributes: NOT_FOUND if none
        if rpc == "DeleteNode":
            self.deleted = True
            return self._operation(name, PLACEHOLDER_DELETE_OPERATION)
        if rpc == "GetGuestAttributes":
            return self._guest_attributes(node)
        return node

    def _compute_answer(self, wire: rest.WireRequest) -> Answer:
        """Compute Engine's answers (tpulab.cloud.compute_v1): an operation DONE at the
        first look, the instance RUNNING at a placeholder address, its guest attributes
        as the TPU API's, nothing listed once the delete went out."""
        rpc, path = wire.rpc, str(wire.message.get("name"))
        zone_path = "/".join(path.split("/")[:4])  # projects/P/zones/Z
        if rpc == "compute.zoneOperations.get":
            return {"name": path.rsplit("/", 1)[-1], "status": "DONE"}
        if rpc == "compute.instances.insert":
            self.created = dict(wire.body or {})
            return {"name": PLACEHOLDER_CREATE_OPERATION, "status": "PENDING"}
        if rpc == "compute.instances.list":
            return {"items": [self._instance(zone_path)]} if self._exists() else {}
        instance = self._instance(zone_path)  # get, delete, guest attributes: NOT_FOUND if none
        if rpc == "compute.instances.delete":
            self.deleted = True
            return {"name": PLACEHOLDER_DELETE_OPERATION, "status": "PENDING"}
        if rpc == "compute.instances.getGuestAttributes":
            attributes = self._guest_attributes({"metadata": self._metadata_of(instance)})
            return _under_query_path(attributes, str(wire.message.get("queryPath") or ""))
        return instance

    @staticmethod
    def _metadata_of(instance: Answer) -> dict[str, str]:
        items = (instance.get("metadata") or {}).get("items") or []
        return {str(item["key"]): str(item.get("value", "")) for item in items}

    def _instance(self, zone_path: str) -> Answer:
        if self.created is None or self.deleted:
            name = self.recorder.spec.node_name
            raise NotFoundError(f"Instance {name} was not found.", status="NOT_FOUND")
        body = self.created
        interfaces = []
        for interface in body.get("networkInterfaces") or [{}]:
            answered: Answer = {**interface, "networkIP": PLACEHOLDER_NODE_IP}
            if interface.get("accessConfigs"):
                # As Compute answers: an external address only when one was asked for.
                answered["accessConfigs"] = [
                    {**config, "natIP": PLACEHOLDER_NODE_IP}
                    for config in interface["accessConfigs"]
                ]
            interfaces.append(answered)
        return {
            **body,
            "zone": zone_path,
            "status": "RUNNING",
            "networkInterfaces": interfaces,
        }

    def _exists(self) -> bool:
        return self.created is not None and not self.deleted

    def _operation(self, resource: str, placeholder: str) -> Answer:
        parent = "/".join(resource.split("/")[:4])  # projects/P/locations/Z
        return {"name": f"{parent}/operations/{placeholder}", "done": False}

    def _node(self, name: str) -> Answer:
        if self.created is None or self.deleted:
            zone, node_id = _zone(name), name.split("/")[-1]
            raise NotFoundError(f"Node {node_id} in {zone} was not found.", status="NOT_FOUND")
        body = self.created
        external = (body.get("networkConfig") or {}).get("enableExternalIps")
        hosts = self.recorder.spec.accelerator.hosts
        endpoints: list[Answer] = []
        for worker in range(hosts):
            # One endpoint per worker VM (a slice's worker i at networkEndpoints[i]).
            address = PLACEHOLDER_NODE_IP if hosts == 1 else worker_ip_placeholder(worker)
            endpoint: Answer = {"ipAddress": address}
            if external:
                # As the API answers: an external address only when the create asked for one.
                endpoint["accessConfig"] = {"externalIp": address}
            endpoints.append(endpoint)
        return {**body, "name": name, "state": "READY", "networkEndpoints": endpoints}

    def _guest_attributes(self, node: Answer) -> Answer:
        published = {HOST_KEY_ATTRIBUTE: _PLACEHOLDER_HOST_KEY}
        if STARTUP_SCRIPT_METADATA in (node.get("metadata") or {}):
            published[WATCHDOG_STATE_ATTRIBUTE] = "armed"  # as a permitted watchdog says
        items = [
            {"namespace": key.split("/", 1)[0], "key": key.split("/", 1)[1], "value": value}
            for key, value in published.items()
        ]
        return {"guestAttributes": [{"queryPath": "", "queryValue": {"items": items}}]}

    def _queued_resource(self, name: str) -> Answer:
        if self.queued is None or self.deleted:
            qr_id, zone = name.split("/")[-1], _zone(name)
            raise NotFoundError(
                f"Queued resource {qr_id} in {zone} was not found.", status="NOT_FOUND"
            )
        # Accepted, then ACTIVE with its node READY at the first look (the plan shows the
        # wait's cadence once, as for every poll).
        return {**self.queued, "name": name, "state": {"state": "ACTIVE"}}


def _under_query_path(attributes: Answer, query: str) -> Answer:
    """Compute's answer to getGuestAttributes?queryPath= ("ns/" or "ns/key"): the items
    under it, or its 404 when nothing is published there (as a real VM's emulator
    namespace never is)."""
    items = attributes["guestAttributes"][0]["queryValue"]["items"]
    namespace, _, key = query.partition("/")
    found = [i for i in items if i["namespace"] == namespace and (not key or i["key"] == key)]
    if not found:
        raise NotFoundError(
            f"Guest attributes {query} were not found.",
            status="NOT_FOUND",
            api_message=f"The resource '{query}' of type 'Guest Attribute' was not found.",
        )
    return {"queryPath": query, "queryValue": {"items": found}}


def _zone(resource: str) -> str:
    parts = resource.split("/")  # projects/P/locations/Z/...
    return parts[3] if len(parts) > 3 else ""


def recording_api(recorder: StepSink, transport: RecordingTransport) -> TpuApi:
    """The run's provider over the recording transport -- the TPU v2 verbs, or Compute
    Engine's -- polling operations on the schedule the real one would use."""
    spec = recorder.spec
    local = spec.mode == "emulate" or classify_endpoint(spec.api_endpoint).is_loopback
    if spec.provider == "compute":
        from tpulab import catalog
        from tpulab.cloud.compute_v1 import EMULATOR_NAMESPACE, HOST_KEYS_QUERY, ComputeTpuApi

        return ComputeTpuApi(
            spec.project.value,
            transport,
            machine_type_of=lambda name: str(catalog.lookup(name).machine_type),
            image=spec.image or PLACEHOLDER_IMAGE,
            poll=lambda: operation_schedule(local=local),
            published=(HOST_KEYS_QUERY, EMULATOR_NAMESPACE) if local else (HOST_KEYS_QUERY,),
            clock=recorder.clock,
            sleep=recorder.sleep,
        )
    return TpuV2Api(
        spec.project.value,
        transport,
        poll=lambda: operation_schedule(local=local),
        clock=recorder.clock,
        sleep=recorder.sleep,
    )
