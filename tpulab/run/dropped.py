"""A remote step that the SSH connection dropped under, made once more over a new one.

A Wi-Fi blip of a few seconds used to end a run wherever it fell: the VM was deleted,
and with it the minutes its creation took (and, in the workload's transfers, every file
not yet home). The steps given here are safe to make twice: they put, read or rebuild
what they need, and the verifier's payload is run again only after the one the drop left
running on the VM is stopped (`stop_dropped_payload`). Once: a link that drops again
ends the phase as before. Never when GetNode says the node is gone (preempted, deleted):
no reconnect reaches it, and the phase's error says what happened.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from tpulab.errors import ConnectError
from tpulab.run.symptoms import unreachable

if TYPE_CHECKING:
    from tpulab.run.context import RunContext
    from tpulab.run.workers import Worker

__all__ = ["again_after_a_drop", "stop_dropped_payload"]

_T = TypeVar("_T")


def again_after_a_drop(
    ctx: RunContext,
    worker: Worker,
    step: Callable[[Worker], _T],
    what: str,
    again: str,
    *,
    before: Callable[[Worker], None] | None = None,
) -> _T:
    """`step` on `worker`, and once more when the SSH connection dropped under it (the
    session connects again on its next command); `before` runs first, over the new
    connection. The note names the step (`what`) and what happens (`again`)."""
    try:
        return step(worker)
    except ConnectError as dropped:
        if unreachable(ctx) is not None:
            raise
        where = "" if len(ctx.workers) == 1 else f" (worker {worker.index})"
        ctx.observer.note(f"the SSH connection dropped during the {what}{where}; {again}")
        try:
            if before is not None:
                before(worker)
            return step(worker)
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


def stop_dropped_payload(ctx: RunContext, worker: Worker) -> None:
    """The `before` of the verifier's run: kill the payload a dropped connection left
    running (it may hold the TPU), then free the TPU: libtpu leaves its lock file behind
    a killed holder (jax #10192)."""
    from tpulab.remote.payload import stop_payload_command, stopped_payloads
    from tpulab.remote.tpu_release import release_command

    assert worker.session is not None
    result = worker.session.run(stop_payload_command(ctx.nonce), timeout=60)
    killed = stopped_payloads(result.stdout)
    if killed is None:
        ctx.observer.note(f"could not look for the earlier run (exit {result.exit_status})")
    elif killed:
        ctx.observer.note(f"stopped the earlier run on the VM (pid {', '.join(map(str, killed))})")
    if ctx.frees_stale_tpu:
        worker.session.run(release_command(), timeout=60)
