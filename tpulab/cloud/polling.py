"""Waiting for the cloud: a node reaching a state, and how often operations are polled.

The loop itself (backoff, deadline, retries, the `ActiveWait` a dry run records) is
`tpulab.polling`, a leaf so that `tpulab.remote` can wait with it too. Transient API
errors (503s, rate limits, an unreachable endpoint) while waiting count as "not yet": a
storm must not end a wait that only its deadline should end.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, TypeVar

from tpulab.errors import CloudError, PreemptedError, TransientError
from tpulab.polling import Backoff, poll_until

if TYPE_CHECKING:
    from tpulab.cloud.api import TpuApi
    from tpulab.models import NodeInfo, NodeState

__all__ = ["operation_schedule", "wait_for_operation", "wait_for_state"]

T = TypeVar("T")


def operation_schedule(*, local: bool) -> Backoff:
    """How often a long-running operation is polled: cloud-paced, or quick for a local
    emulator, which answers in milliseconds (cloud pacing would only slow tests). The
    local cap is 0.1 s: at 0.5 s, noticing the end of an emulated create and delete cost
    an emulated run about 0.3 s of waiting, for some eight requests saved (about 3 ms
    of an emulator's time each)."""
    return Backoff(initial=0.05, cap=0.1) if local else Backoff(initial=1.0, cap=10.0)


def wait_for_operation(
    probe: Callable[[], T],
    done: Callable[[T], bool],
    *,
    operation_name: str,
    timeout: float,
    backoff: Iterable[float],
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Poll a long-running operation with `probe` (one GetOperation) until `done`; the
    one loop behind GoogleTpuApi.wait_operation and the dry run's record of it
    (tpulab.run.recording), so the plan shows the cadence the run really polls at."""
    return poll_until(
        probe,
        done,
        timeout=timeout,
        clock=clock,
        sleep=sleep,
        backoff=backoff,
        retry_if=lambda error: isinstance(error, TransientError),
        describe=lambda _answer: f"operation {operation_name} to finish",
    )


def wait_for_state(
    api: TpuApi,
    zone: str,
    node_id: str,
    want: set[NodeState],
    *,
    timeout: float,
    poll: Iterable[float] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> NodeInfo:
    """Poll `get_node` until the node is in one of `want`; return it.

    A node turning PREEMPTED (a spot node also TERMINATED or STOPPED) raises
    PreemptedError at once (unless wanted), because waiting longer cannot bring it back;
    any other node TERMINATED raises CloudError. Transient errors are ridden
    out until the deadline.
    """
    from tpulab.models import NodeState

    # How Google reports a reclaimed spot VM: PREEMPTED, or TERMINATED / STOPPED (a
    # TPU VM need not go READY -> PREEMPTED: SkyPilot #1468). None comes back by itself.
    reclaimed = {NodeState.PREEMPTED, NodeState.TERMINATED, NodeState.STOPPED}

    def done(node: NodeInfo) -> bool:
        if node.state in want:
            return True
        if node.state is NodeState.PREEMPTED or (node.spot and node.state in reclaimed):
            raise PreemptedError(
                f"Node {node_id} in {zone} was preempted ({node.state.value}) while waiting "
                f"for {_names(want)}.",
                status="PREEMPTED",
                hint="Spot capacity was reclaimed by Google; nothing is wrong with the run. "
                "Retry later, or run without --spot.",
            )
        if node.state is NodeState.TERMINATED:
            raise CloudError(
                f"Node {node_id} in {zone} is TERMINATED while waiting for {_names(want)}.",
                status="TERMINATED",
                hint="Google ended the VM (a maintenance event or a host failure); retry.",
            )
        return False

    def describe(node: NodeInfo | None) -> str:
        seen = f" (last state {node.state.value})" if node is not None else ""
        return f"node {node_id} in {zone} to reach {_names(want)}{seen}"

    return poll_until(
        lambda: api.get_node(zone, node_id),
        done,
        timeout=timeout,
        clock=clock,
        sleep=sleep,
        backoff=poll,
        retry_if=lambda error: isinstance(error, TransientError),
        describe=describe,
    )


def _names(states: set[NodeState]) -> str:
    return "/".join(sorted(state.value for state in states))
