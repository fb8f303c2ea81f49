"""A remote step that the SSH connection dropped under, made once more over a new one.

A Wi-Fi blip of a few seconds used to end a run wherever it fell: the VM was deleted,
and with it the minutes its creation took (and, in the workload's transfers, every file
not yet home). The steps given here are safe to make twice: they put, read or rebuild
what they need, and the verifier's payload is run again only after the one the drop left
running on the VM is stopped (`stop_dropped_payload`). Once: a link that drops again
ends the phase as before. Never when GetNode says the node is gone (preempted, deleted):
no reconnect reaches it, and the phase's error says what happened.

A slice's verifier run is one jax.distributed program over every worker, and a worker
cannot rejoin it: a drop on any worker's connection stops the payload on every worker
and runs the whole program again (`again_on_every_worker`).

Before the second try, and before each follow of a user's command the link dropped
under (tpulab.run.command), `reconnect` waits for the link for as long as the VM keeps
the run: a laptop changing networks can take longer than one connect's bound.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, TypeVar

from tpulab.errors import ConnectError
from tpulab.run.symptoms import unreachable
from tpulab.run.workers import fan_out, place

if TYPE_CHECKING:
    from tpulab.run.context import RunContext
    from tpulab.run.workers import FanOut, Worker

__all__ = [
    "RECONNECT_FOR_SECONDS",
    "again_after_a_drop",
    "again_on_every_worker",
    "reconnect",
    "stop_dropped_payload",
]

_T = TypeVar("_T")

# After the SSH connection dropped, opening it again is worth it for as long as the VM
# keeps the run: until the watchdog's lease may have lapsed (the VM then deletes itself;
# a train's Wi-Fi gone for five minutes is inside a 10-minute lease). Without a
# watchdog, nothing on the VM bounds it, and this does, counted from when the link was
# last seen up. Each try waits the connection's own reconnect bound. A laptop away
# longer gets what it got before: the stop, the fetch, the delete (or the watchdog).
RECONNECT_FOR_SECONDS = 120.0
# How often a long reconnect says it is still trying (and until when).
STILL_RECONNECTING_EVERY = 60.0

# How long the first try's other workers may take to return once their payloads are
# stopped (their commands end with them), before the program is run again.
_FIRST_TRY_ENDS_WITHIN = 60.0


def again_after_a_drop(
    ctx: RunContext,
    worker: Worker,
    step: Callable[[Worker], _T],
    what: str,
    again: str,
    *,
    before: Callable[[Worker], None] | None = None,
    link_wait: float | None = None,
) -> _T:
    """`step` on `worker`, and once more when the SSH connection dropped under it, once
    the link is back (`reconnect`; `link_wait`: for at most that many seconds, as a
    bounded step after a Ctrl-C must); `before` runs first, over the new connection.
    The note names the step (`what`) and what happens (`again`)."""
    where = "" if len(ctx.workers) == 1 else f" (worker {worker.index})"
    ahead = None if before is None else partial(before, worker)
    return _once_more(ctx, partial(step, worker), f"{what}{where}", again, ahead, worker, link_wait)


def again_on_every_worker(
    ctx: RunContext, run: Callable[[Worker], _T], what: str, phase: str
) -> FanOut[_T]:
    """`run` on every worker of a slice at once (as `ctx.on_workers(run, phase)`), and,
    when the connection to any of them dropped, once more on all: the payload is first
    stopped on every worker (the others wait for the lost one, or run on alone), and the
    first try's runs must have returned, so that none writes over the second's."""
    running = _Running()

    def stop_every_worker() -> None:
        stop = partial(stop_dropped_payload, ctx)
        fan_out(ctx.workers, stop, what="stop", clock=ctx.clock, max_parallel=ctx.parallel_workers)
        still = running.wait_until_none(_FIRST_TRY_ENDS_WITHIN)
        if still:
            raise ConnectError(
                f"The first try of the {what} did not end on worker(s) "
                f"{', '.join(map(str, still))} within {_FIRST_TRY_ENDS_WITHIN:.0f} s of "
                "its payload being stopped: its connection may be stalled."
            )

    again = (
        "a slice's payloads are one program, which a worker cannot rejoin: stopping it on "
        "every worker and running it again"
    )
    return _once_more(
        ctx,
        lambda: ctx.on_workers(running.counted(run), phase),
        what,
        again,
        stop_every_worker,
        None,
        None,
    )


def _once_more(
    ctx: RunContext,
    step: Callable[[], _T],
    what: str,
    again: str,
    before: Callable[[], None] | None,
    worker: Worker | None,
    link_wait: float | None,
) -> _T:
    """`step`, and once more after a drop, once the link is back (`reconnect` on
    `worker`; None: the one the fan-out named, or the only one)."""
    try:
        return step()
    except ConnectError as dropped:
        if unreachable(ctx) is not None:
            raise
        # On a slice, the worker whose connection it was (the fan-out named it).
        to = "" if dropped.worker is None else f" to worker {dropped.worker}"
        ctx.observer.note(f"the SSH connection{to} dropped during the {what}; {again}")
        down = worker if worker is not None else ctx.workers[dropped.worker or 0]
        try:
            waited = reconnect(
                ctx, down, up_at=ctx.clock(), lost=f"during the {what}", within=link_wait
            )
            if waited is not None:
                where = place(down, len(ctx.workers))
                ctx.observer.note(
                    f"reconnected to {where} after {waited:.0f} s; making the {what} again"
                )
            if before is not None:
                before()
            return step()
        except ConnectError as second:
            # The first drop is what the step was doing when it went wrong; the second
            # try's failure is said after it.
            if unreachable(ctx) is None:
                # Not "the VM may have been preempted": GetNode just said it was not.
                dropped.hint = (
                    f"Made again over a new connection, it failed too: {second.message} "
                    "GetNode shows the node up: the network between here and the VM "
                    "dropped again, or was not back in time. Run again on a steadier link "
                    "(`tpulab up` keeps a verified node, and `tpulab exec` follows a "
                    "command across longer outages)."
                )
            raise dropped from second


def reconnect(
    ctx: RunContext, worker: Worker, *, up_at: float, lost: str, within: float | None = None
) -> float | None:
    """Open `worker`'s dropped connection again (with a no-op command), trying until the
    VM may have let the run go: its lease lapsing, or RECONNECT_FOR_SECONDS after `up_at`
    (when the link was last seen up) if no lease was ever renewed, and for at most
    `within` s after `up_at` when given (0: one try, the connection's own bound);
    saying every STILL_RECONNECTING_EVERY s that it still tries. ConnectError when it
    gives up (`lost` says what the link dropped under: "while your command ran"); once
    GetNode says the node is gone (preempted, deleted), the last try's error as it is:
    no reconnect reaches it, and the run's explanation of that error says what
    happened. Returns the seconds since `up_at` when a try failed first (None: the
    first try connected)."""
    session = worker.session
    assert session is not None
    where = place(worker, len(ctx.workers))
    said_at = ctx.clock()
    waited = False
    while True:
        try:
            session.run(["true"], timeout=60)  # a new connection, or ConnectError
        except ConnectError as again:
            waited = True
            if unreachable(ctx) is not None:
                raise
            left = _link_left(ctx, worker, up_at)
            bounded = False  # by `within`, not by what the VM keeps
            if within is not None and within - (ctx.clock() - up_at) < left:
                left, bounded = within - (ctx.clock() - up_at), True
            if left <= 0:
                if bounded:
                    why = ": the run is stopping, and this step waits no longer for it."
                elif _lease_bounds(worker):
                    why = ": by now the VM's lease may have lapsed (it deletes itself)."
                else:
                    why = f" (without a watchdog, tpulab tries for {RECONNECT_FOR_SECONDS:.0f} s)."
                raise ConnectError(
                    f"The SSH connection to {where} dropped {lost} and was not back after "
                    f"{ctx.clock() - up_at:.0f} s of reconnecting{why}",
                    hint=f"The last try: {again.message}",
                ) from again
            if ctx.clock() - said_at >= STILL_RECONNECTING_EVERY:
                said_at = ctx.clock()
                ctx.observer.note(
                    f"still reconnecting to {where} ({said_at - up_at:.0f} s so far); "
                    f"trying for {left:.0f} s more"
                    + (
                        ", until its lease may have lapsed and it deletes itself"
                        if _lease_bounds(worker)
                        else ""
                    )
                )
            continue
        ctx.reattached(worker)
        return ctx.clock() - up_at if waited else None


def _lease_bounds(worker: Worker) -> bool:
    """Whether the worker's lease (renewed at least once) bounds the reconnect."""
    return worker.renewer is not None and worker.renewer.lapses_in() is not None


def _link_left(ctx: RunContext, worker: Worker, up_at: float) -> float:
    """Seconds `reconnect` may go on: until the worker's lease may have lapsed on the
    VM, or RECONNECT_FOR_SECONDS after the link was last up when no lease was renewed."""
    left = worker.renewer.lapses_in() if worker.renewer is not None else None
    if left is None:
        return RECONNECT_FOR_SECONDS - (ctx.clock() - up_at)
    return left


def stop_dropped_payload(ctx: RunContext, worker: Worker) -> None:
    """The `before` of the verifier's run: kill the payload a dropped connection left
    running (it may hold the TPU), then free the TPU: libtpu leaves its lock file behind
    a killed holder (jax #10192)."""
    from tpulab.remote.payload import stop_payload_command, stopped_payloads
    from tpulab.remote.tpu_release import release_command

    assert worker.session is not None
    result = worker.session.run(stop_payload_command(ctx.nonce), timeout=60)
    killed = stopped_payloads(result.stdout)
    where = place(worker, len(ctx.workers))
    if killed is None:
        ctx.observer.note(
            f"could not look for the earlier run on {where} (exit {result.exit_status})"
        )
    elif killed:
        ctx.observer.note(f"stopped the earlier run on {where} (pid {', '.join(map(str, killed))})")
    if ctx.frees_stale_tpu:
        worker.session.run(release_command(), timeout=60)


class _Running:
    """Which workers' runs of one step are still in progress (the first try's, once it
    failed on one worker: the others' go on in their threads)."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._workers: list[int] = []

    def counted(self, run: Callable[[Worker], _T]) -> Callable[[Worker], _T]:
        def counting(worker: Worker) -> _T:
            with self._changed:
                self._workers.append(worker.index)
            try:
                return run(worker)
            finally:
                with self._changed:
                    self._workers.remove(worker.index)
                    self._changed.notify_all()

        return counting

    def wait_until_none(self, timeout: float) -> list[int]:
        """The workers still running after at most `timeout` s ([] once none is)."""
        with self._changed:
            self._changed.wait_for(lambda: not self._workers, timeout)
            return sorted(self._workers)
