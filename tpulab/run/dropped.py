"""A remote step that the SSH connection dropped under, made once more over a new one.

A Wi-Fi blip of a few seconds used to end a run wherever it fell: the VM was deleted,
and with it the minutes its creation took (and, in the workload's transfers, every file
not yet home). The steps given here are safe to make twice: they put, read or rebuild
what they need, and the verifier's payload is run again only after the one the drop left
running on the VM is stopped (`before`). Once: a link that drops again ends the phase as
before. Never when GetNode says the node is gone (preempted, deleted): no reconnect
reaches it, and the phase's error says what happened.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from tpulab.errors import ConnectError
from tpulab.run.symptoms import unreachable

if TYPE_CHECKING:
    from tpulab.run.context import RunContext
    from tpulab.run.workers import Worker

__all__ = ["again_after_a_drop"]

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
    except ConnectError:
        if unreachable(ctx) is not None:
            raise
        where = "" if len(ctx.workers) == 1 else f" (worker {worker.index})"
        ctx.observer.note(f"the SSH connection dropped during the {what}{where}; {again}")
        try:
            if before is not None:
                before(worker)
            return step(worker)
        except ConnectError as again:
            if unreachable(ctx) is None:
                # Not "the VM may have been preempted": GetNode just said it was not.
                again.hint = (
                    "GetNode shows the node up: the network between here and the VM "
                    "dropped again, or was not back in time. Run again on a steadier link "
                    "(`tpulab up` keeps a verified node, and `tpulab exec` follows a "
                    "command across longer outages)."
                )
            raise
