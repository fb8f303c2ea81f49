"""The Cloud TPU API seam: the calls tpulab makes, whoever answers them.

Everything above `tpulab.cloud` talks to the cloud through `TpuApi`; tests and the
emulator swap the implementation (or the endpoint), never the code that calls it.
Errors are those of `tpulab.errors`.
"""

from __future__ import annotations

from typing import Protocol

from tpulab.models import NodeInfo, NodeRequest

__all__ = ["TpuApi"]


class TpuApi(Protocol):
    """The calls tpulab makes, for one project. Errors are those of `tpulab.errors`."""

    project: str

    @property
    def call_count(self) -> int:
        """How many API requests this instance has sent (runs report it)."""
        ...

    def create_node(self, zone: str, node_id: str, request: NodeRequest) -> str:
        """Send CreateNode; return the operation name. Does not wait."""
        ...

    def wait_operation(self, operation_name: str, *, timeout: float) -> None:
        """Poll the operation until done; raise the mapped CloudError if it failed."""
        ...

    def get_node(self, zone: str, node_id: str) -> NodeInfo: ...

    def list_nodes(self, zone: str) -> list[NodeInfo]:
        """Every node in the zone, all pages followed (the API has no filter)."""
        ...

    def delete_node(self, zone: str, node_id: str) -> str:
        """Send DeleteNode; return the operation name. NotFoundError if already gone."""
        ...

    def guest_attributes(self, zone: str, node_id: str, query_path: str = "") -> dict[str, str]:
        """Worker 0's guest attributes as {"namespace/key": value}."""
        ...
