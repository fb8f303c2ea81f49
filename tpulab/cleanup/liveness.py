"""Is a tpulab node someone's live work? What its labels and its watchdog's lease say.

This machine's journal knows its own runs and sessions; a node it does not know may
still be live work of another machine (or another TPULAB_HOME). Every node tpulab makes
carries its kind (`tpulab-kind`: run or session) and its home's owner id
(`tpulab-owner`), and its watchdog publishes the lease it last saw renewed as the guest
attribute `tpulab/lease` (remote_payloads/watchdog.py). A lease renewed within its
period means the watchdog has not fired: whoever renews it is still at work, so
`teardown --verify` keeps the node and `list` says so. A lapsed lease means the node's
owner is gone (its watchdog fires or cannot): a leftover. A node with no lease (made by
an older tpulab, --no-watchdog, not booted yet, or the read failed) says nothing either
way, and is judged as before: by this machine's journal alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from tpulab.cleanup.journal import NOT_IN_JOURNAL
from tpulab.cloud.api import TpuApi
from tpulab.errors import CloudError, NotFoundError, TransientError
from tpulab.models import NodeInfo
from tpulab.polling import Backoff, retry_call
from tpulab.remote.watchdog import LEASE_ATTRIBUTE, PublishedLease, parse_lease

__all__ = ["Liveness", "read_liveness", "with_liveness"]

# How long one node's lease read rides out transient errors: a sweep reads several
# nodes at once, and a node whose lease cannot be read is judged as before (no lease).
_READ_FOR = 10.0


@dataclass(frozen=True)
class Liveness:
    """A node's labels and published lease, read at `now` (epoch seconds)."""

    node: NodeInfo
    lease: PublishedLease | None
    now: float
    unread: str | None = None  # why the lease could not be read (None: read, or absent)
    this_home: str | None = None  # this home's owner id, to say "this home"

    @property
    def fresh(self) -> bool:
        """Someone renews its lease: live work (of whoever owns it)."""
        return self.lease is not None and self.lease.fresh(self.now)

    @property
    def renewed_ago(self) -> float | None:
        return None if self.lease is None else self.lease.age(self.now)

    def owner_text(self) -> str:
        owner = self.node.owner or "unknown"
        if self.this_home is not None and owner == self.this_home:
            return f"{owner}, this home"
        return owner

    def describe(self) -> str:
        """ "live elsewhere (owner X, session, renewed N s ago)" for a fresh lease; what
        the lease says otherwise."""
        kind = self.node.kind or "kind unknown"
        if self.lease is not None:
            ago = f"renewed {self.lease.age(self.now):.0f} s ago"
            if self.fresh:
                return f"live elsewhere (owner {self.owner_text()}, {kind}, {ago})"
            return (
                f"lease lapsed (owner {self.owner_text()}, {kind}, {ago}; its lease is "
                f"{self.lease.lease_seconds:g} s)"
            )
        why = self.unread or "its watchdog published none (older node, or --no-watchdog)"
        return f"no lease information (owner {self.owner_text()}, {kind}: {why})"


def read_liveness(
    api: TpuApi,
    nodes: Iterable[NodeInfo],
    *,
    this_home: str | None = None,
    now: Callable[[], float] = time.time,
    read_for: float = _READ_FOR,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[tuple[str, str], Liveness]:
    """Each node's liveness, by (zone, name), read concurrently (one getGuestAttributes
    per node). Never raises for a node: a lease that cannot be read is `unread`."""
    wanted = list(nodes)

    def one(node: NodeInfo) -> Liveness:
        lease, unread = _read_lease(api, node, read_for=read_for, clock=clock, sleep=sleep)
        return Liveness(node, lease, now(), unread, this_home)

    if not wanted:
        return {}
    with ThreadPoolExecutor(max_workers=min(8, len(wanted))) as pool:
        found = list(pool.map(one, wanted))
    return {(item.node.zone, item.node.name): item for item in found}


def _read_lease(
    api: TpuApi,
    node: NodeInfo,
    *,
    read_for: float,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
) -> tuple[PublishedLease | None, str | None]:
    namespace = LEASE_ATTRIBUTE.split("/")[0] + "/"
    try:
        attributes = retry_call(
            lambda: api.guest_attributes(node.zone, node.name, namespace),
            retry_if=lambda error: isinstance(error, TransientError),
            timeout=read_for,
            clock=clock,
            sleep=sleep,
            backoff=Backoff(initial=0.5, cap=4.0, factor=2.0),
        )
    except NotFoundError:
        return None, "the node has no guest attributes (not booted, or going)"
    except CloudError as error:
        return None, f"its lease could not be read: {error.message}"
    value = attributes.get(LEASE_ATTRIBUTE)
    lease = parse_lease(value)
    if lease is None and value:
        return None, f"its lease attribute is unreadable ({value[:60]!r})"
    return lease, None


def with_liveness(
    api: TpuApi,
    nodes: Iterable[NodeInfo],
    states: Mapping[tuple[str, str, str], str],
    *,
    this_home: str | None = None,
) -> dict[tuple[str, str, str], str]:
    """`list`'s journal column (`journal_view`'s states) with, for each node this
    journal does not know, what its lease says: "live elsewhere (owner X, session,
    renewed N s ago)" or "lease lapsed (...)". A node with no lease keeps the plain
    text: nothing more is known of it."""
    unknown = [n for n in nodes if states.get((n.project, n.zone, n.name)) == NOT_IN_JOURNAL]
    read = read_liveness(api, unknown, this_home=this_home)
    found = dict(states)
    for node in unknown:
        liveness = read[(node.zone, node.name)]
        if liveness.lease is not None:
            found[(node.project, node.zone, node.name)] = f"{NOT_IN_JOURNAL}; {liveness.describe()}"
    return found
