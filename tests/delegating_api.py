"""A TpuApi that forwards every call to a real one.

Tests subclass it and override one method to make the cloud misbehave in a way the
emulator cannot (a 504 on DeleteNode, a create operation that loses a name race): the
TpuApi seam is injected, nothing is patched, and every other call is the real client
against the emulator.
"""

from __future__ import annotations

from tpulab.cloud.api import QueuedResourceInfo, QueuedResourceRequest, TpuApi
from tpulab.models import NodeInfo, NodeRequest

__all__ = ["DelegatingTpuApi"]


class DelegatingTpuApi:
    def __init__(self, api: TpuApi) -> None:
        self.api = api
        self.project = api.project
        self.provider = api.provider

    @property
    def call_count(self) -> int:
        return self.api.call_count

    def create_node(self, zone: str, node_id: str, request: NodeRequest) -> str:
        return self.api.create_node(zone, node_id, request)

    def wait_operation(self, operation_name: str, *, timeout: float) -> None:
        self.api.wait_operation(operation_name, timeout=timeout)

    def get_node(self, zone: str, node_id: str) -> NodeInfo:
        return self.api.get_node(zone, node_id)

    def list_nodes(self, zone: str) -> list[NodeInfo]:
        return self.api.list_nodes(zone)

    def delete_node(self, zone: str, node_id: str) -> str:
        return self.api.delete_node(zone, node_id)

    def guest_attributes(
        self, zone: str, node_id: str, query_path: str = "", *, worker: int = 0
    ) -> dict[str, str]:
        return self.api.guest_attributes(zone, node_id, query_path, worker=worker)

    def create_queued_resource(self, zone: str, qr_id: str, request: QueuedResourceRequest) -> str:
        return self.api.create_queued_resource(zone, qr_id, request)

    def get_queued_resource(self, zone: str, qr_id: str) -> QueuedResourceInfo:
        return self.api.get_queued_resource(zone, qr_id)

    def list_queued_resources(self, zone: str) -> list[QueuedResourceInfo]:
        return self.api.list_queued_resources(zone)

    def delete_queued_resource(self, zone: str, qr_id: str, *, force: bool) -> str:
        return self.api.delete_queued_resource(zone, qr_id, force=force)
