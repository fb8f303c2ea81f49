"""Find the tpulab nodes a dead run left behind, delete them, and prove they are gone.

Two sources, because either may be missing: the journal's rows that still need teardown
(this machine's runs, including ones killed with SIGKILL) and the `managed-by=tpulab`
label on nodes listed in the searched zones (runs from other machines, or a journal
that was lost or corrupted). Rules (invariant 4 of docs/architecture.md):

- a node without tpulab's labels is never a candidate, whatever its name;
- a run whose process is still alive on this machine is left to finish its own
  teardown (unless the caller says otherwise): its node is reported as live, not as
  remaining -- its own teardown is running, so nothing is left unattended;
- a live session's node (`tpulab up`: journal phase "session", its state on this
  machine, its --ttl not passed) is kept unless the caller includes sessions: someone
  is using it, and its watchdog deletes it at --ttl or --idle. It is reported as a kept
  session, not as remaining. A session's node that is deleted (or found gone) takes its
  key and state with it (`tpulab.cleanup.sessions`);
- a node this journal does not know whose watchdog's lease is fresh (renewed within
  its period: `tpulab.cleanup.liveness`) is live work of another machine or home -- a
  session in use, a run mid-command -- and is kept unless the caller includes live
  nodes. It is reported as "live elsewhere", not as remaining. A node with no lease
  information is judged by the journal alone, as before, and says so; a lapsed lease
  is a leftover like any other;
- a journal row is closed only on evidence: its node was deleted and confirmed gone,
  or its zone was listed and no node carries its run label.

Queued resources (`run --queued`) are found the same two ways: the journal row names
one, and a listed queued resource whose node spec carries tpulab's labels is ours. It
is a candidate with its node (or, before capacity came, the node it would make), and
is deleted with force by the same teardown, which confirms both gone.

Both providers are searched (tpulab.cleanup.providers): the Cloud TPU API's nodes and
Compute Engine's instances, each journal row through the API of its own provider (the
other answers NOT_FOUND, which must never close a row whose VM bills). Compute that
cannot be asked (disabled, permission denied) is a note in `unasked` where no journal
row needs it, and a failure where one does.

Deletion is `teardown.delete_and_confirm`, the same code `tpulab run` uses. `verify`
lists again at the end: the sweep is clean only when no tpulab node remains in scope and
every zone could be listed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import TypeVar

from tpulab.cleanup.journal import Journal, RunRow, close_vanished, row_is_live, target_for
from tpulab.cleanup.listing import queued_as_node
from tpulab.cleanup.liveness import Liveness, read_liveness
from tpulab.cleanup.providers import (
    TPU_API,
    Apis,
    accelerator_of,
    apis_of,
    cannot_be_asked,
    provider_name,
    where,
)
from tpulab.cleanup.sessions import SESSION_PHASE, SessionStore, conclude_gone, why_gone
from tpulab.cloud.api import QueuedResourceInfo, TpuApi
from tpulab.config import Scope
from tpulab.errors import (
    TARGET_GOOGLE,
    CloudError,
    ConfigError,
    JournalError,
    LeakedNode,
    TeardownError,
    TpuLabError,
    TransientError,
)
from tpulab.models import NodeInfo
from tpulab.polling import Backoff, retry_call
from tpulab.run.session_state import SessionState
from tpulab.run.teardown import delete_and_confirm

__all__ = [
    "Candidate",
    "SweepPlan",
    "SweepResult",
    "find_orphans",
    "forget_command_for",
    "sweep",
    "sweep_command_for",
    "verify_clean",
]

_Listed = TypeVar("_Listed")  # what one of a zone's listings holds


@dataclass(frozen=True)
class Candidate:
    """A tpulab node found in the cloud, with what the journal knows about it."""

    node: NodeInfo
    row: RunRow | None
    live: bool
    age_seconds: float | None
    estimated_cost: float | None
    target: str = TARGET_GOOGLE  # the API it lives behind (journal vocabulary)
    queued: QueuedResourceInfo | None = None  # the queued resource holding the node
    session: str | None = None  # the `tpulab up` session whose node this is, if any
    # Labels and lease, read for a node this journal does not know (None: it knows it).
    liveness: Liveness | None = None
    provider: str = TPU_API  # the API that holds it: a node ("tpu-api") or an instance

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.provider, self.node.zone, self.node.name)

    @property
    def run_id(self) -> str | None:
        return self.node.run_id

    @property
    def source(self) -> str:
        return "journal+labels" if self.row is not None else "labels"

    def leaked(self) -> LeakedNode:
        node = self.node
        queued = self.queued.name if self.queued else None
        return LeakedNode(
            node.project, node.zone, node.name, self.target, self.run_id, queued, self.provider
        )


@dataclass
class SweepPlan:
    """What `find_orphans` saw; nothing has been changed yet."""

    project: str
    target: str
    zones: list[str]
    run_id: str | None = None
    candidates: list[Candidate] = field(default_factory=list)  # to delete
    live: list[Candidate] = field(default_factory=list)  # a running process owns them
    sessions: list[Candidate] = field(default_factory=list)  # live sessions: kept
    elsewhere: list[Candidate] = field(default_factory=list)  # fresh lease, not ours: kept
    # This machine's sessions by run id: their key and state go when their node does.
    session_states: dict[str, SessionState] = field(default_factory=dict)
    stale_rows: list[RunRow] = field(default_factory=list)  # open rows, no node left
    lookalikes: list[NodeInfo] = field(default_factory=list)  # named like ours, unlabelled
    list_errors: dict[str, str] = field(default_factory=dict)  # zone -> why it failed
    # Providers that could not be asked and that no journal row needed (provider -> why).
    unasked: dict[str, str] = field(default_factory=dict)
    other_rows: list[RunRow] = field(default_factory=list)  # open rows for other targets
    unlisted_rows: list[RunRow] = field(default_factory=list)  # open rows, zone unlisted
    journal_error: str | None = None

    def unlisted_leaks(self) -> list[LeakedNode]:
        """Open rows whose zone could not be listed: their nodes may remain. For an
        endpoint that is gone, their commands include `teardown --forget`."""
        return [_leaked(row) for row in self.unlisted_rows]

    @property
    def clean(self) -> bool:
        """Nothing to delete and every zone listed (live runs delete their own nodes;
        kept sessions are guarded by their watchdog and ended with `tpulab down`)."""
        return not (self.candidates or self.list_errors)

    def include_sessions(self) -> None:
        """Delete the live sessions too (--include-sessions, or the user said yes)."""
        self.candidates.extend(self.sessions)
        self.sessions = []

    def include_elsewhere(self) -> None:
        """Delete the nodes live elsewhere too (--include-live, or the user said yes)."""
        self.candidates.extend(self.elsewhere)
        self.elsewhere = []

    @property
    def unjudged(self) -> list[Candidate]:
        """Candidates this journal does not know and whose lease said nothing: deleted
        on the journal's word alone, as before leases were published."""
        return [c for c in self.candidates if c.liveness is not None and c.liveness.lease is None]


@dataclass
class SweepResult:
    deleted: list[Candidate] = field(default_factory=list)
    spared: list[Candidate] = field(default_factory=list)  # lost our labels: not deleted
    failed: list[tuple[Candidate, TeardownError]] = field(default_factory=list)
    closed_rows: list[str] = field(default_factory=list)
    vanished_rows: list[str] = field(default_factory=list)  # closed: gone on their own
    remaining: list[NodeInfo] = field(default_factory=list)  # from the final list
    live: list[NodeInfo] = field(default_factory=list)  # listed, but a live run owns them
    kept_sessions: list[NodeInfo] = field(default_factory=list)  # listed: live sessions kept
    kept_elsewhere: list[NodeInfo] = field(default_factory=list)  # listed: live elsewhere
    ended_sessions: list[str] = field(default_factory=list)  # key and state removed
    ended_rows: list[str] = field(default_factory=list)  # their rows (closed if open)
    list_errors: dict[str, str] = field(default_factory=dict)
    journal_warnings: list[str] = field(default_factory=list)
    # The provider of each node of the final list, by (zone, name): its manual command.
    providers: dict[tuple[str, str], str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not (self.failed or self.remaining or self.list_errors)

    def leaked(self, target: str) -> list[LeakedNode]:
        """What may remain, with the commands that work against `target`."""
        seen = {
            (n.project, n.zone, n.name): (n, self.providers.get((n.zone, n.name), TPU_API))
            for n in self.remaining
        }
        for candidate, _error in self.failed:
            node = candidate.node
            seen.setdefault((node.project, node.zone, node.name), (node, candidate.provider))
        return [
            LeakedNode(p, z, name, target, node.run_id, provider=provider)
            for (p, z, name), (node, provider) in seen.items()
        ]


def sweep_command_for(row: RunRow) -> str:
    """The command that sweeps a journal row's target (shown for rows out of scope)."""
    return _leaked(row).sweep_command()


def forget_command_for(row: RunRow) -> str | None:
    """The command that closes a journal row whose endpoint is gone (None for Google and
    --emulate, which never go away)."""
    return _leaked(row).forget_command()


def _leaked(row: RunRow) -> LeakedNode:
    return LeakedNode(
        row.project, row.zone, row.node_name, row.target, row.run_id, provider=row.provider
    )


def _list_zone(
    api: TpuApi,
    zone: str,
    *,
    list_for: float,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
) -> tuple[list[NodeInfo], list[QueuedResourceInfo]]:
    """A zone's nodes and its queued resources, each list riding out transient errors
    for `list_for` seconds."""

    def riding_out(listing: Callable[[], list[_Listed]]) -> list[_Listed]:
        return retry_call(
            listing,
            retry_if=lambda error: isinstance(error, TransientError),
            timeout=list_for,
            clock=clock,
            sleep=sleep,
            backoff=Backoff(initial=0.5, cap=8.0, factor=2.0),
        )

    nodes = riding_out(lambda: api.list_nodes(zone))
    return nodes, riding_out(lambda: api.list_queued_resources(zone))


def _age_and_cost(
    node: NodeInfo, row: RunRow | None, now: datetime
) -> tuple[float | None, float | None]:
    started = node.create_time or (row.started if row else None)
    if started is None:
        return None, None
    if started.tzinfo is None:
        started = started.replace(tzinfo=timezone.utc)
    age = max(0.0, (now - started).total_seconds())
    # A node names its accelerator type, an instance its machine type; either is found.
    accelerator = accelerator_of(node.accelerator_type) or accelerator_of(
        row.accelerator if row else ""
    )
    if accelerator is None or not accelerator.priced:
        return age, None  # unknown, or no cited price (TPU7x): never shown as $0
    return age, accelerator.estimated_cost(age, spot=node.spot)


def find_orphans(
    api: TpuApi | Apis,
    *,
    target: str,
    zones: Sequence[str] = (),
    run_id: str | None = None,
    journal: Journal | None = None,
    include_live: bool = False,
    include_sessions: bool = False,
    sessions: SessionStore | None = None,
    now: datetime | None = None,
    list_for: float = 60.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    this_home: str | None = None,
) -> SweepPlan:
    """Look (journal, then every zone's `list`) and say what a sweep would do.

    `api` is the Cloud TPU API alone, or every provider's API by name
    (tpulab.cleanup.providers.Apis): each is listed, and each journal row is judged by
    its own provider's listing. `target` is the journal's name for them (see
    `journal.target_for`); rows of other targets or projects are reported in
    `other_rows`, never acted on. `zones` are searched in addition to the zones of this
    target's open journal rows. A journal that cannot be read is reported in
    `journal_error` and the search goes on by labels alone. A zone whose list keeps
    failing transiently for `list_for` seconds lands in `list_errors`; Compute refusing
    to answer where no row needs it lands in `unasked`. A live session's node goes to
    `sessions` unless `include_sessions` (`sessions` is this machine's session store, by
    default the state directory's). A node the journal does not know whose lease is
    fresh goes to `elsewhere` unless `include_live` (`this_home`, this home's owner id,
    only names it in what is shown).
    """
    apis = apis_of(api)
    now = now or datetime.now(timezone.utc)
    journal = journal or Journal()
    project = (apis.get(TPU_API) or next(iter(apis.values()))).project
    plan = SweepPlan(project=project, target=target, zones=[], run_id=run_id)
    plan.session_states = (sessions or SessionStore()).by_run_id()
    rows: list[RunRow] = []
    try:
        for row in journal.open_runs():
            if run_id is not None and row.run_id != run_id:
                continue
            if row.target == target and row.project == project:
                rows.append(row)
            else:
                plan.other_rows.append(row)
    except JournalError as error:
        plan.journal_error = f"{error.message} {error.hint or ''}".strip()
    plan.zones = list(dict.fromkeys([*zones, *(row.zone for row in rows)]))
    if not plan.zones:
        if plan.journal_error is not None:
            why = "the journal could not be read"
        else:
            why = f"the journal has no open run{' ' + run_id if run_id else ''} for this target"
        elsewhere = [sweep_command_for(row) for row in plan.other_rows]
        raise ConfigError(
            f"No zone to search: no --zone was given, none is configured, and {why}.",
            hint=f"That run belongs to another target: `{elsewhere[0]}`"
            if run_id is not None and elsewhere
            else "Pass --zone ZONE (repeat it for several zones).",
        )
    for row in rows:
        if row.provider not in apis:
            # Not askable here (the embedded emulator serves no instances): its node may
            # remain, so the sweep cannot be clean.
            plan.list_errors[where(row.zone, row.provider)] = (
                f"{provider_name(row.provider)} cannot be asked through this target"
            )
    labelled_runs: set[tuple[str, str]] = set()  # (provider, run id) seen with a node
    unknown: list[Candidate] = []  # not in this journal: their leases decide
    for provider, provider_api in apis.items():
        needed = {row.zone for row in rows if row.provider == provider}
        by_run = {row.run_id: row for row in rows if row.provider == provider}
        for zone in plan.zones:
            try:
                listed, queued = _list_zone(
                    provider_api, zone, list_for=list_for, clock=clock, sleep=sleep
                )
            except CloudError as error:
                if cannot_be_asked(provider, error) and zone not in needed:
                    plan.unasked[provider] = error.message
                else:
                    plan.list_errors[where(zone, provider)] = error.message
                continue
            _judge_zone(
                plan,
                _with_queued(listed, queued),
                {q.node_id or q.name: q for q in queued if q.managed_by_tpulab},
                provider=provider,
                zone=zone,
                rows=by_run,
                labelled_runs=labelled_runs,
                unknown=unknown,
                include_live=include_live,
                include_sessions=include_sessions,
                now=now,
            )
    _judge_by_lease(apis, plan, unknown, include_live=include_live, now=now, this_home=this_home)
    for row in rows:
        listed_ok = where(row.zone, row.provider) not in plan.list_errors
        if not listed_ok:
            plan.unlisted_rows.append(row)
        elif (row.provider, row.run_id) not in labelled_runs:
            if row.teardown is None and row_is_live(row) and not include_live:
                continue  # may still be creating its node; it will close its own row
            plan.stale_rows.append(row)
    return plan


def _with_queued(listed: list[NodeInfo], queued: list[QueuedResourceInfo]) -> list[NodeInfo]:
    """The listed nodes, plus the node each of tpulab's queued resources would make
    (ours by the labels of its node spec: a queued resource has none of its own)."""
    names = {node.name for node in listed}
    return listed + [
        queued_as_node(found)
        for found in queued
        if found.managed_by_tpulab and (found.node_id or found.name) not in names
    ]


def _judge_zone(
    plan: SweepPlan,
    listed: list[NodeInfo],
    queued_by_node: dict[str, QueuedResourceInfo],
    *,
    provider: str,
    zone: str,
    rows: dict[str, RunRow],
    labelled_runs: set[tuple[str, str]],
    unknown: list[Candidate],
    include_live: bool,
    include_sessions: bool,
    now: datetime,
) -> None:
    """Sort one zone's listing of one provider into the plan: candidates, live runs,
    kept sessions, lookalikes; nodes this journal does not know go to `unknown`."""
    open_names = {row.node_name for row in rows.values() if row.zone == zone}
    for node in listed:
        if not node.managed_by_tpulab:
            if node.name in open_names or node.name.startswith("tpulab-"):
                plan.lookalikes.append(node)
            continue
        if plan.run_id is not None and node.run_id != plan.run_id:
            continue
        if node.run_id is not None:
            labelled_runs.add((provider, node.run_id))
        known = rows.get(node.run_id or "")
        live = known is not None and known.teardown is None and row_is_live(known)
        age, cost = _age_and_cost(node, known, now)
        holder = queued_by_node.get(node.name)
        state = plan.session_states.get(node.run_id or "")
        session = state.name if state is not None and _is_session(known) else None
        candidate = Candidate(
            node, known, live, age, cost, plan.target, holder, session, provider=provider
        )
        if live and not include_live:
            plan.live.append(candidate)
        elif (
            state is not None
            and session is not None
            and state.deadline_at > now.timestamp()
            and not include_sessions
        ):
            plan.sessions.append(candidate)
        elif known is None:
            unknown.append(candidate)
        else:
            plan.candidates.append(candidate)


def _judge_by_lease(
    apis: Apis,
    plan: SweepPlan,
    unknown: list[Candidate],
    *,
    include_live: bool,
    now: datetime,
    this_home: str | None,
) -> None:
    """Nodes this journal does not know: kept when their lease is fresh (live work of
    another machine or home), candidates otherwise, each with what its lease said."""
    for provider, api in apis.items():
        mine = [c for c in unknown if c.provider == provider]
        read = read_liveness(api, [c.node for c in mine], this_home=this_home, now=now.timestamp)
        for candidate in mine:
            liveness = read[(candidate.node.zone, candidate.node.name)]
            judged = replace(candidate, liveness=liveness)
            if liveness.fresh and not include_live:
                plan.elsewhere.append(judged)
            else:
                plan.candidates.append(judged)


def _is_session(row: RunRow | None) -> bool:
    return row is not None and row.teardown is None and row.phase == SESSION_PHASE


def _close(journal: Journal, run_id: str, detail: str, warnings: list[str]) -> bool:
    try:
        journal.close_run(run_id, "confirmed", detail)
    except JournalError as error:
        warnings.append(error.message)
        return False
    return True


def verify_clean(
    api: TpuApi | Apis,
    zones: Iterable[str],
    *,
    run_id: str | None = None,
    list_for: float = 60.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    unasked: Collection[str] = (),
) -> tuple[list[NodeInfo], dict[str, str]]:
    """tpulab nodes (of `run_id`, if given) still listed, and zones that failed to list
    (a Compute zone named as `providers.where` names it). Providers in `unasked` (the
    sweep's plan found them unaskable, with no row needing them) are not listed again."""
    remaining, errors, _providers = _final_list(
        apis_of(api), list(zones), run_id, list_for, clock, sleep, unasked
    )
    return remaining, errors


def _final_list(
    apis: Apis,
    zones: list[str],
    run_id: str | None,
    list_for: float,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
    unasked: Collection[str],
) -> tuple[list[NodeInfo], dict[str, str], dict[tuple[str, str], str]]:
    """`verify_clean`'s list, with each remaining node's provider by (zone, name)."""
    remaining: list[NodeInfo] = []
    errors: dict[str, str] = {}
    providers: dict[tuple[str, str], str] = {}
    for provider, api in apis.items():
        if provider in unasked:
            continue
        for zone in zones:
            try:
                listed, queued = _list_zone(api, zone, list_for=list_for, clock=clock, sleep=sleep)
            except CloudError as error:
                errors[where(zone, provider)] = error.message
                continue
            for node in _with_queued(listed, queued):
                if node.managed_by_tpulab and (run_id is None or node.run_id == run_id):
                    remaining.append(node)
                    providers[(node.zone, node.name)] = provider
    return remaining, errors, providers


def sweep(
    api: TpuApi | Apis,
    plan: SweepPlan,
    *,
    journal: Journal | None = None,
    sessions: SessionStore | None = None,
    timeout: float = 600.0,
    poll: float = 2.0,
    max_poll: float = 10.0,
    parallel: int = 4,
    list_for: float = 60.0,
    notify: Callable[[str], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> SweepResult:
    """Delete the plan's candidates, close the journal rows it has evidence for, and
    list every zone once more. Never reports success for a node it could not see gone.
    Each candidate is deleted through its own provider's API in `api` (an `Apis`).
    """
    apis = apis_of(api)
    journal = journal or Journal()
    store = sessions or SessionStore()
    result = SweepResult()
    say = notify or (lambda _message: None)

    def one(candidate: Candidate) -> TeardownError | bool:
        """The node's TeardownError, or whether it was spared as no longer ours."""
        node = candidate.node
        try:
            report = delete_and_confirm(
                apis[candidate.provider],
                node.zone,
                node.name,
                run_id=node.run_id,
                # With a run label we recognise the node by it alone, so a stranger's node
                # that later takes the same name is never deleted. Without one, teardown
                # still deletes by name only a node carrying managed-by=tpulab.
                known_ours=node.run_id is None,
                timeout=timeout,
                queued_resource=candidate.queued.name if candidate.queued else None,
                poll=poll,
                max_poll=max_poll,
                clock=clock,
                sleep=sleep,
                notify=say,
            )
        except TeardownError as error:
            return error
        except TpuLabError as error:
            # Whatever went wrong, this node is not confirmed gone: it must come out as a
            # leak with its manual command, never as an API error that hides the others.
            message = (
                f"Teardown of {node.name} NOT confirmed: {error.message} "
                f"(project {node.project}, zone {node.zone}). Resources may still be billing."
            )
            return TeardownError(message, [candidate.leaked()])
        return node.name in report.spared

    if plan.candidates:
        # The delete's wait is a minute or more on Google: say what it waits for, as a
        # run's teardown and `tpulab down` do, rather than sit silent after the table.
        names = ", ".join(c.node.name for c in plan.candidates)
        say(
            f"Deleting {len(plan.candidates)} node(s) ({names}); waiting until a list "
            "confirms each gone..."
        )
    with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(plan.candidates)))) as pool:
        outcomes = list(pool.map(one, plan.candidates))
    for candidate, outcome in zip(plan.candidates, outcomes, strict=True):
        run_id = candidate.run_id
        if outcome is True:
            result.spared.append(candidate)
        elif outcome is False:
            result.deleted.append(candidate)
            if candidate.row is not None and run_id is not None:
                detail = "deleted and confirmed by tpulab teardown --verify"
                if candidate.session is not None:
                    detail = f"session {candidate.session} {detail}"
                if _close(journal, run_id, detail, result.journal_warnings):
                    result.closed_rows.append(run_id)
            if candidate.session is not None:
                store.remove(candidate.session)  # its node is confirmed gone: so is its key
                result.ended_sessions.append(candidate.session)
        else:
            result.failed.append((candidate, outcome))
            if candidate.row is not None and run_id is not None:
                try:
                    journal.close_run(run_id, "unconfirmed", outcome.message)
                except JournalError as journal_error:
                    result.journal_warnings.append(journal_error.message)
    # A row past the create whose run died before its teardown: its node went on its
    # own. The others (killed during the create; a teardown that could not confirm)
    # are closed as plain absence.
    on_its_own = [r for r in plan.stale_rows if r.teardown is None and r.phase != "create"]
    # A session's row among them: its node deleted itself (or was deleted), and its key
    # and state go with it, the row saying why (the one place: conclude_gone).
    for row in on_its_own:
        state = plan.session_states.get(row.run_id)
        if state is None or row.phase != SESSION_PHASE:
            continue
        concluded = conclude_gone(
            store,
            state,
            why_gone(state, now=time.time()),
            seen_by="teardown --verify",
            journal=journal,
        )
        result.ended_sessions.append(state.name)
        result.ended_rows.append(row.run_id)
        result.journal_warnings.extend(concluded.warnings)
        if concluded.journal_closed:
            result.closed_rows.append(row.run_id)
            result.vanished_rows.append(row.run_id)
    others = [r for r in on_its_own if r.run_id not in result.ended_rows]
    vanished, warnings = close_vanished(journal, others, seen_by="teardown --verify")
    result.closed_rows.extend(vanished)
    result.vanished_rows.extend(vanished)
    result.journal_warnings.extend(warnings)
    for row in plan.stale_rows:
        if row in on_its_own:
            continue
        detail = f"no node labelled tpulab-run={row.run_id} in {row.zone} (teardown --verify)"
        if _close(journal, row.run_id, detail, result.journal_warnings):
            result.closed_rows.append(row.run_id)
    listed, result.list_errors, result.providers = _final_list(
        apis, plan.zones, plan.run_id, list_for, clock, sleep, plan.unasked
    )

    def key(node: NodeInfo) -> tuple[str, str, str]:
        return (result.providers[(node.zone, node.name)], node.zone, node.name)

    owned = {c.key for c in plan.live}
    kept = {c.key for c in plan.sessions}
    elsewhere = {c.key for c in plan.elsewhere}
    result.live = [node for node in listed if key(node) in owned]
    result.kept_sessions = [node for node in listed if key(node) in kept]
    result.kept_elsewhere = [node for node in listed if key(node) in elsewhere]
    result.remaining = [node for node in listed if key(node) not in owned | kept | elsewhere]
    return result


def sweep_shielded(
    api: TpuApi | Apis,
    plan: SweepPlan,
    *,
    journal: Journal,
    timeout: float,
    notify: Callable[[str], None],
    force_exit_status: int,
    sessions: SessionStore | None = None,
) -> SweepResult:
    """`sweep` as `teardown --verify` and `tpulab.sweep` run it: signals turn into this
    same teardown, a second Ctrl-C is refused, and a forced quit (the third) prints what
    finishes each candidate by hand, for the API it lives behind."""
    from tpulab.run.signals import shield, signals_to_teardown

    names = ", ".join(c.node.name for c in plan.candidates) or "nothing"
    commands = "\n  ".join(c.leaked().what_to_do() for c in plan.candidates)
    with (
        signals_to_teardown(notify, force_exit_status=force_exit_status),
        shield(f"deleting {names}", manual=commands or None),
    ):
        return sweep(api, plan, journal=journal, sessions=sessions, timeout=timeout, notify=notify)


def find_in_scope(
    api: TpuApi | Apis,
    scope: Scope,
    *,
    journal: Journal,
    include_live: bool,
    include_sessions: bool = False,
) -> SweepPlan:
    """`find_orphans` over a validated teardown scope (`tpulab.config.teardown_inputs`)."""
    from tpulab import paths

    return find_orphans(
        api,
        target=target_for(scope.api_endpoint, embedded_emulator=scope.emulate),
        zones=scope.zones,
        run_id=scope.run_id,
        journal=journal,
        include_live=include_live,
        include_sessions=include_sessions,
        this_home=paths.owner_id(),
    )
