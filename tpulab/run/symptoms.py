"""What a failed phase really means: a spot node reclaimed, or a node its watchdog (or
someone) deleted under the run. A dropped SSH session or a failed call is the symptom;
the user should hear the cause.

`explain(ctx, error)` is what the drivers of tpulab.run.lifecycle call on a phase's
RemoteError or CloudError; an exec explains its own (tpulab.run.attach).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpulab.contract import PREEMPTED_ATTRIBUTE
from tpulab.errors import (
    CloudError,
    CommandFailedError,
    DeadlineError,
    NotFoundError,
    PreemptedError,
    TpuLabError,
    TransientError,
)
from tpulab.models import NodeState
from tpulab.polling import poll_until
from tpulab.run.lease import look_up, vanished

if TYPE_CHECKING:
    from tpulab.run.context import RunContext

__all__ = ["RECLAIMED", "describe_error", "explain", "unreachable"]

# The states in which Google reports a reclaimed spot TPU VM (see `preemption`).
RECLAIMED = frozenset(
    {NodeState.PREEMPTED.value, NodeState.TERMINATED.value, NodeState.STOPPED.value}
)
# The node healths that, on a spot node, mean it is being reclaimed while its state may
# still say READY. The v2 Node's HealthValueValuesEnum (gcloud's generated
# tpu_v2_messages.py) documents UNHEALTHY_MAINTENANCE as "under maintenance/priority
# boost caused rescheduling and will resume running once rescheduled"; a spot VM is
# never rescheduled (it stops on host maintenance), so for one this is the reclaim. The
# v2 `symptoms[].symptomType` enum has no preemption type (LOW_MEMORY, OUT_OF_MEMORY,
# EXECUTE_TIMED_OUT, MESH_BUILD_FAIL, HBM_OUT_OF_MEMORY, PROJECT_ABUSE), so symptoms
# are not read for this.
_RECLAIMING_HEALTH = frozenset({"UNHEALTHY_MAINTENANCE"})


def explain(ctx: RunContext, error: TpuLabError) -> TpuLabError | None:
    """The cause behind `error`, or None when it is its own explanation."""
    return preemption(ctx, error) or _vanished(ctx, error)


def _phase_name(ctx: RunContext) -> str:
    return ctx.current_phase.label if ctx.current_phase else "the run"


def _vanished(ctx: RunContext, error: TpuLabError) -> TpuLabError | None:
    """A node its watchdog (or anyone) deleted under us: say so, not the symptom."""
    # Only a node that booted has a watchdog that could have fired.
    if ctx.watchdog is None or "ready_seen" not in ctx.milestones:
        return None
    created = ctx.milestones.get("create_sent", ctx.started_at)
    return vanished(
        ctx.api,
        ctx.spec.zone.value,
        ctx.spec.node_name,
        phase=_phase_name(ctx).lower(),
        error=error,
        renewer=ctx.renewer,
        # The watchdog starts at boot, after the create was sent: not earlier.
        deadline_passed=ctx.clock() - created >= ctx.watchdog.max_duration_seconds,
    )


def preemption(ctx: RunContext, error: TpuLabError) -> PreemptedError | None:
    """A spot node reclaimed under us shows up as a dropped SSH session or a failed call;
    ask the API, so the user hears "preempted" rather than a symptom.

    Google reports it late and in more than one way: the state can stay READY for about
    a minute after the VM stopped (SkyPilot #849), and a reclaimed TPU VM may end
    TERMINATED or STOPPED rather than PREEMPTED, or simply vanish (SkyPilot #1468). So
    the node is polled for up to `preemption_wait` seconds (a command's own non-zero exit
    is no symptom: one look then), and any of those counts. Two signals do not lag: the
    VM's own word (its watchdog's `tpulab/preempted` guest attribute, read once) and a
    node health that means reclaiming; either counts at once, even while READY."""
    spec = ctx.spec
    if not spec.spot or isinstance(error, PreemptedError) or not ctx.create_accepted:
        return None
    own_exit = isinstance(error, CommandFailedError) and error.exit_status >= 0
    wait = 0.0 if own_exit else ctx.preemption_wait
    if wait > 0:
        ctx.observer.note(
            f"spot node {spec.node_name}: {describe_error(error)}; asking the API for up "
            f"to {wait:g} s whether it was preempted (its state can lag the VM)"
        )
    seen = _vm_says_preempted(ctx) or _reclaimed_state(ctx, wait)
    if seen is None:
        return None
    return PreemptedError(
        f"Spot node {spec.node_name} was preempted during {_phase_name(ctx).lower()} "
        f"(the API says {seen}; {error.message}).",
        status="PREEMPTED",
        hint="Spot capacity was reclaimed by Google; nothing is wrong with the run. "
        "Retry later, or run without --spot (on-demand costs about five times more).",
    )


def _vm_says_preempted(ctx: RunContext) -> str | None:
    """What the VM published about its own preemption (one GetGuestAttributes), or None.
    Best effort: a guest-attribute read that fails for any reason is no signal, and the
    node's state is asked next as before."""
    zone, name = ctx.spec.zone.value, ctx.spec.node_name
    try:
        published = ctx.api.guest_attributes(zone, name, PREEMPTED_ATTRIBUTE)
    except Exception:  # no answer is no signal, whatever the failure
        return None
    if published.get(PREEMPTED_ATTRIBUTE, "").strip().upper() != "TRUE":
        return None
    ctx.observer.note(f"spot node {name}: its VM published {PREEMPTED_ATTRIBUTE}=TRUE")
    return f"READY, but its VM says it was preempted ({PREEMPTED_ATTRIBUTE}=TRUE)"


def _reclaimed_state(ctx: RunContext, wait: float) -> str | None:
    """The state that says a spot node was reclaimed (or "gone"), polled for up to `wait`
    s; None if it still looks alive then, or if its own watchdog (or someone) is deleting
    it, which `_vanished` explains."""
    zone, name = ctx.spec.zone.value, ctx.spec.node_name
    last: list[str] = []

    def look() -> str:
        try:
            node = ctx.api.get_node(zone, name)
        except NotFoundError:
            state = "gone"
        else:
            state = node.state.value
            if node.health in _RECLAIMING_HEALTH:
                state = f"{state}, health {node.health}"
        if not last or last[-1] != state:
            if last:
                ctx.observer.note(f"spot node {name}: {state}")
            last.append(state)
        return state

    settled = {*RECLAIMED, NodeState.DELETING.value, "gone"}
    try:
        state = poll_until(
            look,
            lambda found: found in settled or _says_reclaiming(found),
            timeout=wait,
            clock=ctx.clock,
            sleep=ctx.sleep,
            backoff=ctx.poll,
            retry_if=lambda failure: isinstance(failure, TransientError),
            describe=lambda _found: f"spot node {name} to show whether it was preempted",
        )
    except DeadlineError:
        return None  # still READY (or similar) all along: not a preemption
    except CloudError:
        return None  # the API cannot say; the original error stands
    if state == NodeState.DELETING.value:
        return None
    if _says_reclaiming(state):
        return state
    if state == "gone" and _watchdog_fired(ctx):
        return None
    return state


def _says_reclaiming(seen: str) -> bool:
    """Whether `look` saw a health that means the spot node is being reclaimed."""
    return any(seen.endswith(f"health {health}") for health in _RECLAIMING_HEALTH)


def _watchdog_fired(ctx: RunContext) -> bool:
    """Would this run's own watchdog have deleted the node by now?"""
    if ctx.watchdog is None:
        return False
    created = ctx.milestones.get("create_sent", ctx.started_at)
    if ctx.clock() - created >= ctx.watchdog.max_duration_seconds:
        return True
    return ctx.renewer is not None and ctx.renewer.lapsed()


def describe_error(error: BaseException) -> str:
    if isinstance(error, TpuLabError):
        return f"{type(error).__name__}: {error.message}"
    return f"{type(error).__name__}: {error}"


def unreachable(ctx: RunContext) -> str | None:
    """The run's node's state when GetNode shows it cannot be reached any more (gone,
    DELETING, or stopped: preempted, terminated); on a spot node also the signals that
    do not lag its state (a reclaiming health, the VM's own word: `preemption`); None
    when it is READY, when it is booting again, or when the API cannot say -- then
    reconnecting is worth a try."""
    state, node = look_up(ctx.api, ctx.spec.zone.value, ctx.spec.node_name)
    if state is not None:
        return state
    if node is not None and node.state.value in {*RECLAIMED, NodeState.STOPPING.value}:
        return node.state.value
    if node is not None and ctx.spec.spot:
        if node.health in _RECLAIMING_HEALTH:
            return f"{node.state.value}, health {node.health}"
        return _vm_says_preempted(ctx)
    return None
