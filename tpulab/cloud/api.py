"""The Cloud TPU API seam: the calls tpulab makes, whoever answers them.

Everything above `tpulab.cloud` talks to the cloud through `TpuApi`; tests and the
emulator swap the implementation (or the endpoint), never the code that calls it.
Errors are those of `tpulab.errors`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field

from tpulab.contract import MANAGED_BY_LABEL, MANAGED_BY_VALUE, RUN_ID_LABEL
from tpulab.models import DEFER_BUILD, NodeInfo, NodeRequest

__all__ = ["QUEUED_FINAL_STATES", "QueuedResourceInfo", "QueuedResourceRequest", "TpuApi"]

# QueuedResourceState.State values after which no node will come (without a new request).
# DELETING too: someone deleted it, and waiting would only wait out the timeout.
QUEUED_FINAL_STATES = frozenset({"FAILED", "SUSPENDED", "DELETING"})


class QueuedResourceRequest(BaseModel):
    """What `create_queued_resource` sends: one node spec (as for CreateNode) and the
    queueing policy. The spot tier is the node request's `spot`."""

    model_config = ConfigDict(defer_build=DEFER_BUILD, frozen=True, extra="forbid")

    node_id: str
    node: NodeRequest
    valid_for_seconds: int | None = None  # queueingPolicy.validUntilDuration


class QueuedResourceInfo(BaseModel):
    """A queued resource as the API reports it. The v2 QueuedResource has no labels of
    its own, so `labels` are those of the node in its spec: how tpulab finds its own."""

    model_config = ConfigDict(defer_build=DEFER_BUILD, frozen=True)

    project: str
    zone: str
    name: str  # the short queued resource id
    node_id: str = ""
    state: str = "STATE_UNSPECIFIED"  # QueuedResourceState.State name
    accelerator_type: str = ""
    labels: dict[str, str] = Field(default_factory=dict)
    spot: bool = False
    failure: str = ""  # state.failedData.error.message, when FAILED
    failure_code: int = 0  # state.failedData.error.code (a google.rpc.Code), when FAILED
    create_time: datetime | None = None

    @property
    def managed_by_tpulab(self) -> bool:
        return self.labels.get(MANAGED_BY_LABEL) == MANAGED_BY_VALUE

    @property
    def run_id(self) -> str | None:
        return self.labels.get(RUN_ID_LABEL)


class TpuApi(Protocol):
    """The calls tpulab makes, for one project. Errors are those of `tpulab.errors`."""

    project: str
    # Which API holds the nodes ("tpu-api", "compute"): what a leaked node's message tells
    # the user to delete it with, and what the journal row records.
    provider: str

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

    def guest_attributes(
        self, zone: str, node_id: str, query_path: str = "", *, worker: int = 0
    ) -> dict[str, str]:
        """One worker's guest attributes as {"namespace/key": value} (each worker VM of
        a multi-host node has its own guest agent, hence its own host keys)."""
        ...

    def create_queued_resource(self, zone: str, qr_id: str, request: QueuedResourceRequest) -> str:
        """Send CreateQueuedResource; return the operation name. Does not wait."""
        ...

    def get_queued_resource(self, zone: str, qr_id: str) -> QueuedResourceInfo: ...

    def list_queued_resources(self, zone: str) -> list[QueuedResourceInfo]:
        """Every queued resource in the zone, all pages followed."""
        ...

    def delete_queued_resource(self, zone: str, qr_id: str, *, force: bool) -> str:
        """Send DeleteQueuedResource (`force` deletes its node too); return the operation
        name. NotFoundError if already gone."""
        ...
