"""What `tpulab list` shows: nodes across zones, with age and an estimated cost so far.

The Cloud TPU API has no label filter, so every page of every zone is read and tpulab's
own nodes (label managed-by=tpulab) are picked out here. Compute Engine's instances are
asked for by that label (tpulab.cloud.compute_v1.label_filter) and shown beside the
nodes, each with its provider; when Compute cannot be asked (disabled, permission
denied, unreachable) the listing says so in `unasked` and still shows the nodes. Queued
resources are listed too: one holding a node is shown on that node's line; one still
waiting for capacity gets a line of its own for the node it would make (not billing yet:
cost 0). Costs are catalog list-price estimates (see `catalog.PRICE_DATE`), never billing
data; a type without a cited price (TPU7x) has an unknown cost, never $0.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone

from tpulab.cleanup.providers import TPU_API, Apis, accelerator_of, apis_of
from tpulab.cloud.api import QueuedResourceInfo, TpuApi
from tpulab.errors import CloudError
from tpulab.models import NodeInfo

__all__ = ["ListedNode", "Listing", "list_nodes", "list_providers", "queued_as_node"]


@dataclass(frozen=True)
class ListedNode:
    node: NodeInfo
    age_seconds: float | None
    price_per_hour: float | None  # None when the type is not in tpulab's catalog
    estimated_cost: float | None
    queued_resource: str | None = None  # the queued resource holding (or making) it
    queued_state: str | None = None
    provider: str = TPU_API  # the API that holds it: "tpu-api" (a node) or "compute"


@dataclass(frozen=True)
class Listing:
    project: str
    zones: list[str]
    include_all: bool
    nodes: list[ListedNode]
    hidden: int  # nodes listed by the API but not tpulab's (shown with --all)
    # Providers that could not be asked (provider -> why): their resources are not shown.
    unasked: dict[str, str] = field(default_factory=dict)

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


def list_providers(
    apis: TpuApi | Apis,
    zones: Sequence[str],
    *,
    include_all: bool = False,
    now: datetime | None = None,
) -> Listing:
    """`list_nodes` over every provider in `apis`: the Cloud TPU API's failure raises as
    before; another provider's (Compute's) is noted in `unasked` and the nodes are still
    listed, so a project that never enabled Compute lists as it always did."""
    by_provider = apis_of(apis)
    primary = by_provider.get(TPU_API) or next(iter(by_provider.values()))
    listing = Listing(primary.project, list(zones), include_all, [], 0)
    shown: list[ListedNode] = []
    for provider, api in by_provider.items():
        try:
            found = list_nodes(api, zones, include_all=include_all, now=now)
        except CloudError as error:
            if provider == TPU_API:
                raise
            listing.unasked[provider] = error.message
            continue
        shown += [replace(item, provider=provider) for item in found.nodes]
        listing = replace(listing, hidden=listing.hidden + found.hidden)
    shown.sort(key=lambda n: (n.node.zone, n.node.name, n.provider))
    return replace(listing, nodes=shown)


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
    accelerator = accelerator_of(node.accelerator_type)
    if accelerator is None or not accelerator.priced:
        # Unknown, or no cited price (TPU7x): said as unknown, never as $0.
        return ListedNode(node, age, None, None, name, state)
    price = accelerator.price_per_hour(spot=node.spot)
    cost = accelerator.estimated_cost(age, spot=node.spot) if age is not None else None
    return ListedNode(node, age, price, cost if billing else 0.0, name, state)
