"""What `tpulab list` shows: nodes across zones, with age and an estimated cost so far.

The cloud API has no label filter, so every page of every zone is read and tpulab's
own nodes (label managed-by=tpulab) are picked out here. Queued resources are listed
too: one holding a node is shown on that node's line; one still waiting for capacity
gets a line of its own for the node it would make (not billing yet: cost 0). Costs are
catalog list-price estimates (see `catalog.PRICE_DATE`), never billing data.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone

from tpulab import catalog
from tpulab.cloud.api import QueuedResourceInfo, TpuApi
from tpulab.errors import UnknownAcceleratorError
from tpulab.models import NodeInfo

__all__ = ["ListedNode", "Listing", "list_nodes", "queued_as_node"]


@dataclass(frozen=True)
class ListedNode:
    node: NodeInfo
    age_seconds: float | None
    price_per_hour: float | None  # None when the type is not in tpulab's catalog
    estimated_cost: float | None
    queued_resource: str | None = None  # the queued resource holding (or making) it
    queued_state: str | None = None


@dataclass(frozen=True)
class Listing:
    project: str
    zones: list[str]
    include_all: bool
    nodes: list[ListedNode]
    hidden: int  # nodes listed by the API but not tpulab's (shown with --all)

    @property
    def estimated_total(self) -> float:
        return sum(n.estimated_cost or 0.0 for n in self.nodes)


def list_nodes(
    api: TpuApi,
    zones: Sequence[str],
    *,
    include_all: bool = False,
    now: datetime | None = None,
) -> Listing:
    """Every node in `zones` (all pages), tpulab's only unless `include_all`.

    Zones are listed concurrently: each is a separate round trip to the API, and a
    multi-zone sweep should cost one round trip's latency, not one per zone. The first
    failing zone (in the order given) raises.
    """
    moment = now or datetime.now(timezone.utc)
    shown: list[ListedNode] = []
    hidden = 0
    if len(zones) > 1:
        with ThreadPoolExecutor(max_workers=min(len(zones), 8)) as pool:
            futures = [pool.submit(_list_zone, api, zone) for zone in zones]
        per_zone = [future.result() for future in futures]
    else:
        per_zone = [_list_zone(api, zone) for zone in zones]
    for nodes, queued in per_zone:
        holders = {(q.node_id or q.name): q for q in queued}
        for node in nodes:
            if include_all or node.managed_by_tpulab:
                shown.append(_listed(node, moment, holders.pop(node.name, None)))
            else:
                hidden += 1
        for waiting in holders.values():  # no node yet: what it will make
            placeholder = queued_as_node(waiting)
            if include_all or placeholder.managed_by_tpulab:
                shown.append(_listed(placeholder, moment, waiting, billing=False))
            else:
                hidden += 1
    shown.sort(key=lambda n: (n.node.zone, n.node.name))
    return Listing(api.project, list(zones), include_all, shown, hidden)


def _list_zone(api: TpuApi, zone: str) -> tuple[list[NodeInfo], list[QueuedResourceInfo]]:
    return api.list_nodes(zone), api.list_queued_resources(zone)


def queued_as_node(found: QueuedResourceInfo) -> NodeInfo:
    """The node a queued resource makes, as listings show it before the node exists:
    its node id, its node spec's labels, the queued resource's age."""
    return NodeInfo(
        project=found.project,
        zone=found.zone,
        name=found.node_id or found.name,
        accelerator_type=found.accelerator_type,
        labels=dict(found.labels),
        spot=found.spot,
        create_time=found.create_time,
    )


def _listed(
    node: NodeInfo,
    now: datetime,
    queued: QueuedResourceInfo | None = None,
    *,
    billing: bool = True,
) -> ListedNode:
    age = (now - node.create_time).total_seconds() if node.create_time else None
    name, state = (queued.name, queued.state) if queued is not None else (None, None)
    try:
        accelerator = catalog.lookup(node.accelerator_type)
    except UnknownAcceleratorError:
        return ListedNode(node, age, None, None, name, state)
    price = accelerator.price_per_hour(spot=node.spot)
    cost = accelerator.estimated_cost(age, spot=node.spot) if age is not None else None
    return ListedNode(node, age, price, cost if billing else 0.0, name, state)
