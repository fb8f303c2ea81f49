"""How a run that may have created a node ends: delete it and confirm by list, whatever
happened, then record the end and pick what to raise.

`end_run(ctx, primary)` is the `finally` of `tpulab run` (and of a failed `tpulab up`):
the teardown runs inside the shield, so a second Ctrl-C cannot cut it short; an
interrupt that beats the shield starts it again (at most `_TEARDOWN_ATTEMPTS` times);
a teardown that cannot be confirmed raises TeardownError, which outranks every other
failure; success needs a verified receipt AND a confirmed teardown.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from tpulab.errors import (
    InterruptedRun,
    LeakedNode,
    TeardownError,
    TpuLabError,
    VerificationError,
)
from tpulab.run.outcome import TeardownEnd
from tpulab.run.progress import Phase
from tpulab.run.signals import SignalInterrupt
from tpulab.run.symptoms import describe_error
from tpulab.run.teardown import delete_and_confirm

if TYPE_CHECKING:
    from tpulab.run.context import RunContext
    from tpulab.run.outcome import RunOutcome

__all__ = ["end_run", "is_interrupt"]

_TEARDOWN_ATTEMPTS = 3
# How long a teardown keeps listing after a CreateNode whose outcome is unknown.
_CREATE_SETTLE_SECONDS = 30.0


def end_run(ctx: RunContext, primary: BaseException | None) -> RunOutcome:
    """Tear down, record the end, then raise TeardownError (not confirmed), the phases'
    first failure (KeyboardInterrupt as InterruptedRun, any other BaseException -- e.g.
    a signal turned into one -- unchanged), or return the outcome of a run whose receipt
    verified and whose node is confirmed gone."""
    leaked: TeardownError | None = None
    attempts = 0
    # `while True`, not `for ... in range()`: no call stands between here and the `try`,
    # which leaves a first signal the least room to skip the teardown.
    while True:
        try:
            leaked = teardown(ctx, primary)
            break
        except BaseException as late:  # an interrupt that beat the shield: go again
            primary = primary or late
            attempts += 1
            if attempts >= _TEARDOWN_ATTEMPTS:
                leaked = _unconfirmed(ctx, primary, "teardown was interrupted repeatedly")
                break
    # Recording the end and choosing the verdict are shielded too: a first signal
    # arriving now must not turn "teardown NOT confirmed" into "interrupted".
    spec = ctx.spec
    with ctx.shield(
        f"recording the end of run {spec.run_id}", manual=spec.leaked_node().what_to_do()
    ):
        if leaked is None and is_interrupt(primary) and ctx.outcome.succeeded:
            # Ctrl-C (or SIGTERM) after the receipt verified: the teardown it asked for
            # is exactly what ran, and it was confirmed. The run succeeded.
            ctx.observer.note("interrupted after the receipt verified: the run is complete")
            primary = None
        _finish(ctx, primary, leaked)
        if leaked is not None:
            raise leaked from primary
        if isinstance(primary, KeyboardInterrupt):
            raise InterruptedRun("SIGINT") from None
        if primary is not None:
            raise primary
        if not ctx.outcome.succeeded:
            # Unreachable unless the verdict and the phases disagree: never exit 0 on a
            # run whose receipt did not verify or whose teardown is unconfirmed.
            raise VerificationError(
                f"The run ended without a verified receipt and a confirmed teardown "
                f"(verdict {ctx.outcome.verdict}, teardown {ctx.outcome.teardown_status})."
            )
    return ctx.outcome


def teardown(ctx: RunContext, primary: BaseException | None) -> TeardownError | None:
    """Delete and confirm if anything may exist; the TeardownError, or None.

    Everything, closing the SSH session included, happens inside the shield, so a second
    Ctrl-C cannot cut it short.
    """
    spec = ctx.spec
    zone, name = spec.zone.value, spec.node_name
    with ctx.shield(f"deleting node {name} in {zone}", manual=spec.leaked_node().what_to_do()):
        ctx.release()
        if not ctx.create_sent:
            ctx.teardown_end = TeardownEnd("not-created")
            return None
        ctx.observer.phase_started(Phase.TEARDOWN)
        ctx.journal_phase(Phase.TEARDOWN)
        started = ctx.clock()
        try:
            report = delete_and_confirm(
                ctx.api,
                zone,
                name,
                run_id=spec.run_id,
                known_ours=ctx.create_accepted,
                # Sent but not known to be accepted (e.g. the reply was lost): the node
                # may still appear, so an empty list is believed only later.
                settle=0.0
                if ctx.create_accepted
                else min(_CREATE_SETTLE_SECONDS, spec.timeouts.teardown / 4),
                timeout=spec.timeouts.teardown,
                poll=ctx.teardown_poll,
                # The cap scales with the first interval (10 s for the default 2 s), so a
                # fast-polling caller rides out a DeleteNode storm just as fast.
                max_poll=min(10.0, ctx.teardown_poll * 5),
                clock=ctx.clock,
                sleep=ctx.sleep,
                notify=ctx.observer.note,
                on_delete_sent=lambda at: ctx.milestone("delete_sent", at),
                queued_resource=name if spec.queued else None,
            )
        except TeardownError as error:
            failure = _unconfirmed(
                ctx, primary, error.message, error.leaked, delete_attempts=error.delete_attempts
            )
        except Exception as error:  # any failure here means "not confirmed"
            failure = _unconfirmed(ctx, primary, f"teardown failed unexpectedly: {error}")
        else:
            ctx.teardown_end = TeardownEnd("confirmed", report)
            ctx.took(Phase.TEARDOWN, started)
            ctx.milestone("teardown_confirmed")
            how = "already gone" if report.already_gone else f"{report.delete_attempts} delete(s)"
            ctx.observer.phase_finished(
                Phase.TEARDOWN, ctx.clock() - started, f"confirmed by list ({how})"
            )
            return None
        ctx.observer.phase_failed(Phase.TEARDOWN, ctx.clock() - started, failure)
        return failure


def _unconfirmed(
    ctx: RunContext,
    primary: BaseException | None,
    why: str,
    leaked: Sequence[LeakedNode] = (),
    *,
    delete_attempts: int = 0,
) -> TeardownError:
    ctx.teardown_end = TeardownEnd("unconfirmed")
    ours = ctx.spec.leaked_node()
    # The teardown knows which names it saw; the run knows their API and run id.
    nodes = [replace(ours, name=node.name) for node in leaked] or [ours]
    message = why
    if primary is not None and not isinstance(primary, TeardownError):
        earlier = primary.message if isinstance(primary, TpuLabError) else repr(primary)
        message += f" (The run had already failed: {earlier})"
    return TeardownError(message, nodes, delete_attempts=delete_attempts)


def _finish(ctx: RunContext, primary: BaseException | None, leaked: TeardownError | None) -> None:
    seconds = ctx.elapsed()
    end = ctx.milestones.get("teardown_confirmed", ctx.clock())
    begin = ctx.milestones.get("create_sent")
    billed = max(0.0, end - begin) if begin is not None else 0.0
    outcome = ctx.conclude(error=leaked or primary, seconds=seconds, billed_seconds=billed)
    try:
        ctx.record_end()
    finally:
        # Whatever the record did, the journal row says how the teardown ended: a row
        # left open would later read as a run "deleted by its watchdog".
        if ctx.journal is not None and ctx.journalled:
            detail = "ok" if outcome.error is None else describe_error(outcome.error)
            ctx.journal.run_finished(ctx.spec.run_id, outcome.teardown_status, detail)


def is_interrupt(error: BaseException | None) -> bool:
    """Ctrl-C, or a signal that `tpulab.run.signals` turned into an exception."""
    return isinstance(error, KeyboardInterrupt | SignalInterrupt | InterruptedRun)
