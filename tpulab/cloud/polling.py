"""Waiting for the cloud: a jittered backoff schedule and a deadline-bounded poll loop.

Everything takes its clock and sleep as arguments so that tests can drive the schedule
with a fake clock and prove two promises: a change is noticed within one poll interval,
and the deadline is honoured (we never sleep past it, and we probe once more at it).

While a probe runs, `active_wait()` names the loop it belongs to (its schedule object,
timeout and goal): `tpulab run --dry-run` records each polled request once, with the
cadence the real loop would keep, instead of a prose description of it.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from tpulab.errors import DeadlineError, PreemptedError

if TYPE_CHECKING:
    from tpulab.cloud.api import TpuApi
    from tpulab.models import NodeInfo, NodeState

__all__ = [
    "ActiveWait",
    "Backoff",
    "active_wait",
    "announce_wait",
    "operation_schedule",
    "poll_until",
    "wait_for_state",
]

T = TypeVar("T")


class Backoff:
    """Delays that start at `initial`, grow by `factor` and never exceed `cap`.

    Each delay is spread by +-`jitter` (a fraction) so that many controllers polling the
    same API do not fall into step; the spread never pushes a delay above `cap`, which is
    what bounds how late a change can be noticed.
    """

    def __init__(
        self,
        initial: float = 1.0,
        cap: float = 10.0,
        factor: float = 1.6,
        jitter: float = 0.2,
        rng: random.Random | None = None,
    ) -> None:
        if initial <= 0 or cap < initial or factor < 1.0 or not 0.0 <= jitter < 1.0:
            raise ValueError(
                f"bad backoff: initial={initial} cap={cap} factor={factor} jitter={jitter}"
            )
        self.initial = initial
        self.cap = cap
        self.factor = factor
        self.jitter = jitter
        self._rng = rng if rng is not None else random.Random()

    def __iter__(self) -> Iterator[float]:
        base = self.initial
        while True:
            spread = 1.0 + self.jitter * (2.0 * self._rng.random() - 1.0)
            yield min(base * spread, self.cap)
            base = min(base * self.factor, self.cap)

    def __repr__(self) -> str:
        return (
            f"Backoff(initial={self.initial}, cap={self.cap}, factor={self.factor}, "
            f"jitter={self.jitter})"
        )


def operation_schedule(*, local: bool) -> Backoff:
    """How often a long-running operation is polled: cloud-paced, or quick for a local
    emulator, which answers in milliseconds (cloud pacing would only slow tests)."""
    return Backoff(initial=0.05, cap=0.5) if local else Backoff(initial=1.0, cap=10.0)


@dataclass(frozen=True)
class ActiveWait:
    """The poll loop a probe is running in: what it waits for, how often, how long."""

    until: str
    schedule: object  # the delays' iterable itself (a Backoff shows its parameters)
    timeout: float


_ACTIVE_WAIT: ContextVar[ActiveWait | None] = ContextVar("tpulab_active_wait", default=None)


def active_wait() -> ActiveWait | None:
    """The innermost poll loop whose probe is running now, if any."""
    return _ACTIVE_WAIT.get()


@contextmanager
def announce_wait(wait: ActiveWait) -> Iterator[None]:
    """Run a probe as part of the poll loop `wait` (for loops other than `poll_until`)."""
    token = _ACTIVE_WAIT.set(wait)
    try:
        yield
    finally:
        _ACTIVE_WAIT.reset(token)


def poll_until(
    probe: Callable[[], T],
    done: Callable[[T], bool],
    *,
    timeout: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    backoff: Iterable[float] | None = None,
    describe: Callable[[T | None], str] | None = None,
) -> T:
    """Call `probe` until `done(result)`; return that result.

    Probes immediately, then after each backoff delay, cut short so the last probe
    happens exactly at the deadline. Past it, raises DeadlineError whose message comes
    from `describe(last_result)`. Exceptions from `probe` or `done` propagate: that is how
    a caller stops early (a preempted node, a failed operation).
    """
    if timeout < 0:
        raise ValueError(f"timeout must be >= 0, got {timeout}")
    deadline = clock() + timeout
    schedule = backoff if backoff is not None else Backoff()
    delays = iter(schedule)
    loop = ActiveWait(
        describe(None) if describe is not None else "the awaited condition", schedule, timeout
    )
    last: T | None = None
    while True:
        with announce_wait(loop):
            last = probe()
        if done(last):
            return last
        remaining = deadline - clock()
        if remaining <= 0:
            break
        sleep(min(next(delays), remaining))
    what = describe(last) if describe is not None else "the awaited condition"
    raise DeadlineError(
        f"Gave up after {timeout:g}s waiting for {what}.",
        hint="The cloud may just be slow: retry with a longer --timeout, and check the "
        "resource with `tpulab list`.",
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

    A spot node turning PREEMPTED raises PreemptedError at once (unless PREEMPTED is
    wanted), because waiting longer cannot bring it back.
    """
    from tpulab.models import NodeState

    def done(node: NodeInfo) -> bool:
        if node.state in want:
            return True
        if node.state is NodeState.PREEMPTED:
            raise PreemptedError(
                f"Node {node_id} in {zone} was preempted while waiting for {_names(want)}.",
                status="PREEMPTED",
                hint="Spot capacity was reclaimed. Delete the node (tpulab teardown "
                "--verify) and retry later, or run without --spot.",
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
        describe=describe,
    )


def _names(states: set[NodeState]) -> str:
    return "/".join(sorted(state.value for state in states))
