"""What `tpulab list` and `tpulab teardown --verify` report, as typed envelopes.

Builders only: the CLI prints them (`--json`) and the library facade returns them
(`tpulab.sweep`). `teardown_error` is the one judgement of whether a sweep proved the
scope clean; the CLI's exit status and the envelope's `ok` both come from it.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from datetime import datetime, timezone
from typing import Literal

from pydantic import BaseModel, ConfigDict

from tpulab.catalog import PRICE_DATE
from tpulab.cleanup.journal import VANISHED, JournalView
from tpulab.cleanup.listing import ListedNode, Listing
from tpulab.cleanup.sessions import GoneCause, SessionConcluded, SessionFiles, estimated_cost
from tpulab.cleanup.sweep import Candidate, SweepPlan, SweepResult, sweep_command_for
from tpulab.envelope import Envelope, ErrorReport, NodeReport
from tpulab.errors import TeardownError
from tpulab.models import DEFER_BUILD, NodeInfo
from tpulab.run.report import RunEnvelope

__all__ = [
    "FailedDelete",
    "FoundNode",
    "JournalMissingRow",
    "ListEnvelope",
    "ListedNodeReport",
    "SessionGoneReport",
    "SessionReport",
    "TeardownEnvelope",
    "UpEnvelope",
    "list_envelope",
    "teardown_envelope",
    "teardown_error",
]


class _Part(BaseModel):
    model_config = ConfigDict(defer_build=DEFER_BUILD, extra="forbid", frozen=True)


def _age(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 1)


def _cost(usd: float | None) -> float | None:
    return None if usd is None else round(usd, 4)


class ListedNodeReport(NodeReport):
    provider: str  # the API that holds it: "tpu-api" (a node) or "compute" (an instance)
    spot: bool
    managed_by_tpulab: bool
    create_time: datetime | None
    price_per_hour_usd: float | None  # None when the type is not in tpulab's catalog
    external_ip: str | None
    journal: str | None  # this machine's journal's view of the node, if it has one
    queued_resource: str | None  # the queued resource holding (or still making) the node
    queued_state: str | None  # its QueuedResourceState, e.g. WAITING_FOR_RESOURCES


class JournalMissingRow(_Part):
    """An open journal row whose node the API did not list."""

    run_id: str
    project: str
    zone: str
    node_name: str
    # Set when this listing closed the row: the node went on its own (journal.VANISHED).
    closed_as: str | None = None


class SessionReport(_Part):
    """A session kept by `tpulab up` that is still up (its local state)."""

    name: str
    run_id: str
    project: str
    zone: str
    node_name: str
    accelerator_type: str
    spot: bool
    ssh_user: str
    ssh_host: str
    ssh_port: int
    started_at: datetime
    deadline_at: datetime  # the hard deadline (--ttl)
    idle_expires_at: datetime  # the last lease renewal + --idle
    deadline_in_seconds: float
    idle_expires_in_seconds: float
    age_seconds: float
    estimated_cost_usd: float | None  # so far, at price_date list prices; None: unpriced


class SessionGoneReport(_Part):
    """A session whose node this listing found gone: its key and state were removed."""

    name: str
    run_id: str
    node_name: str
    zone: str
    cause: GoneCause  # "ttl", "idle" or "deleted" (by someone else)
    reason: str


class UpEnvelope(Envelope):
    """`tpulab up --json`: the session kept (None when `up` failed) and the run that
    verified it -- on failure, the very envelope `run --json` prints for it."""

    command: Literal["up"] = "up"
    session: SessionReport | None
    run: RunEnvelope


def session_report(files: SessionFiles, *, now: float) -> SessionReport:
    state = files.state

    def at(epoch: float) -> datetime:
        return datetime.fromtimestamp(epoch, timezone.utc)

    return SessionReport(
        name=state.name,
        run_id=state.run_id,
        project=state.project,
        zone=state.zone,
        node_name=state.node_name,
        accelerator_type=state.accelerator_type,
        spot=state.spot,
        ssh_user=state.ssh_user,
        ssh_host=state.ssh_host,
        ssh_port=state.ssh_port,
        started_at=at(state.started_at),
        deadline_at=at(state.deadline_at),
        idle_expires_at=at(state.idle_expires_at),
        deadline_in_seconds=round(max(0.0, state.deadline_at - now), 1),
        idle_expires_in_seconds=round(max(0.0, state.idle_expires_at - now), 1),
        age_seconds=round(max(0.0, now - state.started_at), 1),
        estimated_cost_usd=_cost(estimated_cost(state, now=now)),
    )


def _gone_report(concluded: SessionConcluded) -> SessionGoneReport:
    return SessionGoneReport(
        name=concluded.name,
        run_id=concluded.run_id,
        node_name=concluded.node_name,
        zone=concluded.zone,
        cause=concluded.vanish.cause,
        reason=concluded.vanish.reason,
    )


class ListEnvelope(Envelope):
    """`tpulab list --json`."""

    command: Literal["list"] = "list"
    project: str
    zones: list[str]
    include_all: bool
    nodes: list[ListedNodeReport]
    hidden: int  # nodes listed by the API but not tpulab's (shown with --all)
    estimated_total_usd: float
    price_date: str
    journal_missing: list[JournalMissingRow]
    journal_error: str | None
    sessions: list[SessionReport]  # sessions kept by `tpulab up` that are up
    sessions_gone: list[SessionGoneReport]  # found gone by this listing: cleaned up
    # Providers that could not be asked (provider -> why): their resources are not shown.
    providers_unasked: dict[str, str]


def _node_fields(node: NodeInfo, age: float | None, cost: float | None) -> dict[str, object]:
    """The fields every NodeReport shares, rounded the same way for every command."""
    return {
        "project": node.project,
        "zone": node.zone,
        "name": node.name,
        "accelerator_type": node.accelerator_type,
        "state": node.state.value,
        "run_id": node.run_id,
        "age_seconds": _age(age),
        "estimated_cost_usd": _cost(cost),
    }


def _listed(item: ListedNode, journal: str | None) -> ListedNodeReport:
    node = item.node
    return ListedNodeReport.model_validate(
        {
            **_node_fields(node, item.age_seconds, item.estimated_cost),
            "provider": item.provider,
            "spot": node.spot,
            "managed_by_tpulab": node.managed_by_tpulab,
            "create_time": node.create_time,
            "price_per_hour_usd": item.price_per_hour,
            "external_ip": node.external_ip,
            "journal": journal,
            "queued_resource": item.queued_resource,
            "queued_state": item.queued_state,
        }
    )


def list_envelope(
    listing: Listing,
    view: JournalView,
    closed: Collection[str] = (),
    *,
    sessions: Sequence[SessionFiles] = (),
    sessions_gone: Sequence[SessionConcluded] = (),
    now: float | None = None,
) -> ListEnvelope:
    """`closed`: run ids of `view.vanished` rows this listing closed; `sessions` and
    `sessions_gone` as `tpulab.cleanup.sessions.reconcile_listed` returns them."""
    moment = time.time() if now is None else now
    return ListEnvelope(
        ok=True,
        project=listing.project,
        zones=listing.zones,
        include_all=listing.include_all,
        nodes=[
            _listed(item, view.states.get((item.node.project, item.node.zone, item.node.name)))
            for item in listing.nodes
        ],
        hidden=listing.hidden,
        estimated_total_usd=round(listing.estimated_total, 4),
        price_date=PRICE_DATE,
        journal_missing=[
            JournalMissingRow(
                run_id=row.run_id,
                project=row.project,
                zone=row.zone,
                node_name=row.node_name,
                closed_as=VANISHED if row.run_id in closed else None,
            )
            for row in view.missing
        ],
        journal_error=view.error,
        sessions=[session_report(files, now=moment) for files in sessions],
        sessions_gone=[_gone_report(concluded) for concluded in sessions_gone],
        providers_unasked=dict(listing.unasked),
    )


class FoundNode(NodeReport):
    provider: str  # the API that holds it: "tpu-api" (a node) or "compute" (an instance)
    source: Literal["journal+labels", "labels"]
    live: bool  # its run is still in progress on this machine: left to finish
    # The `tpulab up` session whose node this is; a live one is kept unless
    # --include-sessions (then it is in `kept_sessions`).
    session: str | None
    # Its labels: "run" or "session", and the tpulab home that made it (None: a node
    # made before tpulab labelled them).
    kind: str | None
    owner: str | None
    # For a node this journal does not know: what its watchdog's lease says ("live
    # elsewhere (...)", "lease lapsed (...)", "no lease information (...)").
    liveness: str | None


class KeptElsewhere(_Part):
    """A node this journal does not know whose lease is fresh: kept (not remaining)."""

    node_name: str
    zone: str
    run_id: str | None
    kind: str | None
    owner: str | None
    renewed_seconds_ago: float
    lease_seconds: float


class FailedDelete(_Part):
    node_name: str
    error: str


class TeardownEnvelope(Envelope):
    """`tpulab teardown --verify --json`: what was found, deleted, and what may remain."""

    command: Literal["teardown"] = "teardown"
    dry_run: bool
    project: str
    target: str  # the API: "google", "emulate" or an endpoint URL (the journal's name)
    zones: list[str]
    run_id: str | None
    found: list[FoundNode]
    deleted: list[str]
    failed: list[FailedDelete]
    remaining: list[str] | None  # None: nothing was deleted, so no final list was made
    closed_journal_rows: list[str]
    # Of those, the rows whose node went on its own (its watchdog, or someone else).
    vanished_journal_rows: list[str]
    # Live sessions' names whose nodes were kept (not counted as remaining).
    kept_sessions: list[str]
    # Nodes live elsewhere (another machine or tpulab home), kept unless --include-live
    # (not counted as remaining).
    kept_elsewhere: list[KeptElsewhere]
    # Sessions whose key and state this teardown removed (node deleted or found gone).
    ended_sessions: list[str]
    untouched_unlabelled: list[str]
    list_errors: dict[str, str]  # zone -> why it could not be listed ("ZONE (compute)")
    # Providers that could not be asked and no journal row needed (provider -> why).
    providers_unasked: dict[str, str]
    other_targets: list[str]  # commands that sweep open journal rows of other targets
    journal_error: str | None
    not_deleted_because: str | None
    manual_commands: list[str]
    price_date: str


def teardown_error(
    plan: SweepPlan, result: SweepResult | None, declined: str
) -> TeardownError | None:
    """None when verified clean; otherwise the error naming every node that may remain."""
    if result is not None:
        if result.ok:
            return None
        leaked = result.leaked(plan.target)
        problems = [f"{c.node.name}: {err.message}" for c, err in result.failed]
        errors = result.list_errors
        if result.remaining:
            problems.append("still listed: " + ", ".join(n.name for n in result.remaining))
    else:
        if plan.clean:
            return None
        leaked = [c.leaked() for c in plan.candidates]
        problems = [f"{len(leaked)} tpulab node(s) remain ({declined})"] if declined else []
        errors = plan.list_errors
    problems += [f"zone {zone} could not be listed ({message})" for zone, message in errors.items()]
    if errors:
        # Rows whose zone could not be listed may still have nodes: name them, with the
        # commands for their target (`teardown --forget` too, when that is an endpoint).
        known = {(node.project, node.zone, node.name) for node in leaked}
        leaked += [
            node
            for node in plan.unlisted_leaks()
            if (node.project, node.zone, node.name) not in known
        ]
    return TeardownError(
        "Teardown NOT confirmed, resources may still be billing: " + "; ".join(problems) + ".",
        leaked,
    )


def _found(candidate: Candidate) -> FoundNode:
    return FoundNode.model_validate(
        {
            **_node_fields(candidate.node, candidate.age_seconds, candidate.estimated_cost),
            "provider": candidate.provider,
            "source": candidate.source,
            "live": candidate.live,
            "session": candidate.session,
            "kind": candidate.node.kind,
            "owner": candidate.node.owner,
            "liveness": candidate.liveness.describe() if candidate.liveness else None,
        }
    )


def _kept_elsewhere(candidate: Candidate) -> KeptElsewhere:
    liveness = candidate.liveness
    lease = liveness.lease if liveness is not None else None
    assert liveness is not None  # kept for its fresh lease: it was read, and found
    assert lease is not None
    return KeptElsewhere(
        node_name=candidate.node.name,
        zone=candidate.node.zone,
        run_id=candidate.run_id,
        kind=candidate.node.kind,
        owner=candidate.node.owner,
        renewed_seconds_ago=round(lease.age(liveness.now), 1),
        lease_seconds=lease.lease_seconds,
    )


def teardown_envelope(
    plan: SweepPlan,
    result: SweepResult | None,
    declined: str,
    *,
    dry_run: bool,
    error: TeardownError | None,
    report: ErrorReport | None,
) -> TeardownEnvelope:
    """`error` is `teardown_error(plan, result, declined)`; `report` is its ErrorReport
    (the exit status inside it is the CLI's choice, so the caller builds it)."""
    return TeardownEnvelope(
        ok=error is None,
        dry_run=dry_run,
        project=plan.project,
        target=plan.target,
        zones=plan.zones,
        run_id=plan.run_id,
        found=[_found(c) for c in [*plan.candidates, *plan.live, *plan.sessions, *plan.elsewhere]],
        deleted=[c.node.name for c in result.deleted] if result else [],
        failed=[
            FailedDelete(node_name=c.node.name, error=e.message)
            for c, e in (result.failed if result else [])
        ],
        remaining=[n.name for n in result.remaining] if result else None,
        closed_journal_rows=result.closed_rows if result else [],
        vanished_journal_rows=result.vanished_rows if result else [],
        kept_sessions=[c.session for c in plan.sessions if c.session is not None],
        kept_elsewhere=[_kept_elsewhere(c) for c in plan.elsewhere],
        ended_sessions=result.ended_sessions if result else [],
        untouched_unlabelled=[n.name for n in plan.lookalikes],
        list_errors=result.list_errors if result else plan.list_errors,
        providers_unasked=dict(plan.unasked),
        other_targets=[sweep_command_for(row) for row in plan.other_rows],
        journal_error=plan.journal_error,
        not_deleted_because=declined or None,
        manual_commands=[n.manual_delete_command() for n in error.leaked] if error else [],
        price_date=PRICE_DATE,
        error=report,
    )
