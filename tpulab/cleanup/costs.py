"""`tpulab costs`: a ledger of what every journalled run billed, estimated from list prices.

Read-only: the journal (`Journal.all_runs()`) is the only source. One row is one billed
node (a run, a failover attempt, a queued run), so the ledger is one line per row; the
rows of one run's failover attempts ("<id>", "<id>-a2", ... from
`tpulab.config.capacity.attempt_suffix`) are grouped under that run (`Ledger.runs`), and
totals count runs and attempts apart.

Billed time is derived from the row, because the journal stores no billing figure:

- from `started`: the row is committed by `Lifecycle.create()` (via `run_started`)
  just before CreateNode / CreateQueuedResource is sent, so it is an upper bound on when
  the node began to exist (a queued run's also counts its wait for capacity, which
  Google does not bill);
- to `ended`: the moment the row was closed. A "confirmed" row is closed once teardown
  was confirmed by a list, so that is when billing stopped. A "forgotten" row (its
  endpoint is gone: `teardown --forget`) and any closure a newer journal writes (e.g. a
  node found self-deleted) are billed to their `ended` likewise;
- a "not-created" row bills 0: nothing existed;
- an open row (never closed) or an "unconfirmed" one may still exist and bill: it is
  billed up to `now` and marked `still_billing` (the ledger cannot know; `tpulab
  teardown --verify` can).

A session's row (`tpulab up`: journal phase "session") is of kind "session". While its
state is on this machine and neither its --ttl deadline nor its idle expiry has passed,
it is "up" (billing now, on purpose: billed to `now`, not flagged as a leak). Once
ended, it is billed to its close: `tpulab down`'s confirmed delete, or for a node that
deleted itself the earliest moment it can have gone, which `conclude_gone` records
(tpulab.cleanup.sessions).

Prices come from `Accelerator.estimated_cost`, the one cost rule, at `PRICE_DATE` list
prices. Emulated rows are listed with their time but cost 0 and are totalled apart: an
emulator bills nothing. Day totals put a row on the UTC day it started.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import date, datetime, timezone
from typing import Literal

from pydantic import BaseModel, ConfigDict

from tpulab import catalog
from tpulab.catalog import PRICE_DATE
from tpulab.cleanup.journal import Journal, RunRow, row_is_live
from tpulab.cleanup.sessions import SESSION_PHASE, SessionStore
from tpulab.config.capacity import split_attempt
from tpulab.envelope import Envelope
from tpulab.errors import UnknownAcceleratorError
from tpulab.models import DEFER_BUILD
from tpulab.run.session_state import SessionState

__all__ = [
    "CostsEnvelope",
    "Ledger",
    "LedgerEntry",
    "LedgerEntryReport",
    "LedgerTotal",
    "LedgerTotalReport",
    "RunCost",
    "RunCostReport",
    "costs_envelope",
    "ledger",
    "ledger_from_rows",
]

# `all_runs` takes a row limit; the ledger wants every row (SQLite binds 64-bit ints).
_EVERY_ROW = sys.maxsize

# "deleted": teardown confirmed; "forgotten": closed by `teardown --forget` because its
# endpoint is gone (never confirmed, billed to that moment); "closed": a closure this
# version does not know (a newer journal's), billed to its end like "deleted".
# "up": a session whose node is kept for it, live as far as this machine knows.
BillingState = Literal[
    "deleted", "not-created", "running", "open", "unconfirmed", "forgotten", "closed", "up"
]
# A journal row is a one-shot run's (or attempt's) or a session's (`tpulab up`).
EntryKind = Literal["run", "session"]


@dataclass(frozen=True)
class LedgerEntry:
    """One journal row, priced."""

    row: RunRow
    state: BillingState
    billed_until: datetime | None  # None: nothing was created, so nothing billed
    billed_seconds: float
    price_per_hour: float | None  # None: emulated, or a type without a cited price
    estimated_cost: float | None  # None only for a type without a cited price (TPU7x)
    # The run this row is an attempt of, and which attempt (1: the run's own row).
    run_group: str = ""
    attempt: int = 1
    session: str | None = None  # the session's name while its state is on this machine

    @property
    def group(self) -> str:
        return self.run_group or self.row.run_id

    @property
    def kind(self) -> EntryKind:
        return "session" if self.row.phase == SESSION_PHASE else "run"

    @property
    def still_billing(self) -> bool:
        """The node may exist now: the row was never closed, or closed unconfirmed (or
        it is a session that is up: it does exist, and bills)."""
        return self.state in ("running", "open", "unconfirmed", "up")

    @property
    def unaccounted(self) -> bool:
        """May still bill with nobody in charge of it (a session that is up is)."""
        return self.still_billing and self.state != "up"

    @property
    def day(self) -> date:
        return self.row.started.astimezone(timezone.utc).date()


@dataclass(frozen=True)
class LedgerTotal:
    """A sum over entries: `key` is a UTC day (YYYY-MM-DD), an accelerator type or ''."""

    key: str
    runs: int  # distinct runs: a run's failover attempts count once
    attempts: int  # rows (billed nodes): every attempt counts
    billed_seconds: float
    estimated_cost: float
    unpriced: int  # entries whose type is not in the catalog (their cost is not summed)
    still_billing: int


@dataclass(frozen=True)
class RunCost:
    """One run and every attempt of it in the ledger, the first attempt first."""

    run_id: str
    entries: list[LedgerEntry]

    @property
    def attempts(self) -> int:
        return len(self.entries)

    @property
    def started(self) -> datetime:
        return min(e.row.started for e in self.entries)

    @property
    def billed_seconds(self) -> float:
        return sum(e.billed_seconds for e in self.entries)

    @property
    def estimated_cost(self) -> float | None:
        """None when an attempt's type is not priced: a partial sum would mislead."""
        costs = [e.estimated_cost for e in self.entries]
        return None if None in costs else sum(c or 0.0 for c in costs)

    @property
    def still_billing(self) -> bool:
        return any(e.still_billing for e in self.entries)


@dataclass(frozen=True)
class Ledger:
    now: datetime
    since: datetime | None
    entries: list[LedgerEntry]  # newest first, emulated ones included

    @property
    def runs(self) -> list[RunCost]:
        """Entries grouped by run (a run's failover attempts together), newest run first."""
        groups: dict[str, list[LedgerEntry]] = {}
        for entry in self.entries:
            groups.setdefault(entry.group, []).append(entry)
        found = [
            RunCost(run_id, sorted(entries, key=lambda e: e.attempt))
            for run_id, entries in groups.items()
        ]
        return sorted(found, key=lambda run: run.started, reverse=True)

    @property
    def billable(self) -> list[LedgerEntry]:
        return [e for e in self.entries if not e.row.emulated]

    @property
    def emulated(self) -> list[LedgerEntry]:
        return [e for e in self.entries if e.row.emulated]

    @property
    def by_day(self) -> list[LedgerTotal]:
        """Per UTC day, oldest first; emulated rows are not in it."""
        return _grouped(self.billable, lambda e: e.day.isoformat())

    @property
    def by_accelerator(self) -> list[LedgerTotal]:
        """Per accelerator type, by name; emulated rows are not in it."""
        return _grouped(self.billable, lambda e: e.row.accelerator)

    @property
    def total(self) -> LedgerTotal:
        return _total("", self.billable)

    @property
    def emulated_total(self) -> LedgerTotal:
        """The emulated rows: their time, at a cost of 0."""
        return _total("", self.emulated)


def _grouped(entries: list[LedgerEntry], key: Callable[[LedgerEntry], str]) -> list[LedgerTotal]:
    groups: dict[str, list[LedgerEntry]] = {}
    for entry in entries:
        groups.setdefault(key(entry), []).append(entry)
    return [_total(name, groups[name]) for name in sorted(groups)]


def _total(key: str, entries: Iterable[LedgerEntry]) -> LedgerTotal:
    found = list(entries)
    return LedgerTotal(
        key=key,
        runs=len({e.group for e in found}),
        attempts=len(found),
        billed_seconds=sum(e.billed_seconds for e in found),
        estimated_cost=sum(e.estimated_cost or 0.0 for e in found),
        unpriced=sum(1 for e in found if e.estimated_cost is None),
        still_billing=sum(1 for e in found if e.still_billing),
    )


def _state(row: RunRow, session: SessionState | None, now: datetime) -> BillingState:
    if row.teardown == "not-created":
        return "not-created"
    if row.teardown == "unconfirmed":
        return "unconfirmed"
    if row.teardown is None:
        if row_is_live(row):
            return "running"
        if (
            session is not None
            and row.phase == SESSION_PHASE
            and now.timestamp() < min(session.deadline_at, session.idle_expires_at)
        ):
            return "up"
        return "open"
    if row.teardown == "confirmed":
        return "deleted"
    if row.teardown == "forgotten":
        return "forgotten"
    return "closed"


def _entry(row: RunRow, now: datetime, session: SessionState | None = None) -> LedgerEntry:
    state = _state(row, session, now)
    name = session.name if session is not None and row.teardown is None else None
    if state == "not-created":
        until: datetime | None = None
    elif state in ("deleted", "forgotten", "closed"):
        until = row.ended or row.updated or row.started  # closed rows always have `ended`
    else:
        until = now
    seconds = 0.0 if until is None else max((until - row.started).total_seconds(), 0.0)
    if row.emulated:
        return LedgerEntry(row, state, until, seconds, None, 0.0, session=name)
    try:
        accelerator = catalog.lookup(row.accelerator)
    except UnknownAcceleratorError:
        return LedgerEntry(row, state, until, seconds, None, None, session=name)
    if not accelerator.priced:
        # No cited list price (TPU7x, a Compute-only type): unknown, never $0.
        return LedgerEntry(row, state, until, seconds, None, None, session=name)
    return LedgerEntry(
        row,
        state,
        until,
        seconds,
        accelerator.price_per_hour(spot=row.spot),
        accelerator.estimated_cost(seconds, spot=row.spot),
        session=name,
    )


def ledger_from_rows(
    rows: Iterable[RunRow],
    *,
    now: datetime,
    since: datetime | None = None,
    sessions: Mapping[str, SessionState] | None = None,
) -> Ledger:
    """Price `rows` as of `now`. With `since`, rows that started before it are left out,
    except those still billing: a node that may be running is never hidden. `sessions`
    are this machine's session states by run id (their rows may be "up")."""
    found = sessions or {}
    entries = [_entry(row, now, found.get(row.run_id)) for row in rows]
    if since is not None:
        entries = [e for e in entries if e.row.started >= since or e.still_billing]
    entries.sort(key=lambda e: e.row.started, reverse=True)
    return Ledger(now=now, since=since, entries=_grouped_attempts(entries))


def _grouped_attempts(entries: list[LedgerEntry]) -> list[LedgerEntry]:
    """Mark "<id>-aN" rows as attempt N of run "<id>" when that run's own row is listed
    with the same target: a run id that only looks like an attempt stays its own run."""
    first_rows = {(e.row.run_id, e.row.target) for e in entries}
    marked = []
    for entry in entries:
        base, number = split_attempt(entry.row.run_id)
        if number > 1 and (base, entry.row.target) in first_rows:
            entry = dataclasses.replace(entry, run_group=base, attempt=number)
        marked.append(entry)
    return marked


def ledger(
    *,
    since: datetime | None = None,
    now: datetime | None = None,
    journal: Journal | None = None,
    sessions: SessionStore | None = None,
) -> Ledger:
    """The ledger of this machine's journal (and its sessions' states, which say which
    session rows are up). Raises JournalError when the journal is unreadable."""
    rows = (journal or Journal()).all_runs(limit=_EVERY_ROW)
    return ledger_from_rows(
        rows,
        now=now or datetime.now(timezone.utc),
        since=since,
        sessions=(sessions or SessionStore()).by_run_id(),
    )


# -- the --json envelope --------------------------------------------------------------


class _Part(BaseModel):
    model_config = ConfigDict(defer_build=DEFER_BUILD, extra="forbid", frozen=True)


class LedgerEntryReport(_Part):
    """One row of the ledger, as `tpulab costs --json` prints it."""

    run_id: str
    kind: EntryKind  # "session": kept by `tpulab up`
    session: str | None  # the session's name while it is on this machine
    # The run this row is an attempt of (its own run_id for a run's first row) and which
    # attempt: failover attempts "<id>-aN" share the run_id "<id>" here.
    group_run_id: str
    attempt: int
    project: str
    zone: str
    node_name: str
    accelerator_type: str
    spot: bool
    target: str  # "google", "emulate" or an API endpoint URL (the journal's name)
    provider: str  # "tpu-api" (a Cloud TPU API node) or "compute" (a Compute instance)
    emulated: bool
    queued_resource: str | None
    state: BillingState
    still_billing: bool
    started: datetime
    billed_until: datetime | None
    billed_seconds: float
    price_per_hour_usd: float | None
    estimated_cost_usd: float | None


class RunCostReport(_Part):
    """One run with its attempts summed (each attempt is also its own entry)."""

    run_id: str
    kind: EntryKind
    attempts: int
    attempt_run_ids: list[str]  # the entries' run ids, the first attempt first
    accelerator_type: str
    emulated: bool
    started: datetime
    billed_seconds: float
    estimated_cost_usd: float | None  # None when an attempt's type is not priced
    still_billing: bool


class LedgerTotalReport(_Part):
    key: str  # the UTC day or the accelerator type; "" for a grand total
    runs: int  # distinct runs
    attempts: int  # billed rows, every failover attempt counted
    billed_seconds: float
    estimated_cost_usd: float
    unpriced: int
    still_billing: int


class CostsEnvelope(Envelope):
    """`tpulab costs --json`: every journalled run priced, with totals."""

    command: Literal["costs"] = "costs"
    now: datetime
    since: datetime | None
    price_date: str
    entries: list[LedgerEntryReport]  # one per attempt (journal row), newest first
    runs: list[RunCostReport]  # the entries grouped by run, newest first
    by_day: list[LedgerTotalReport]  # billable rows only, per UTC start day
    by_accelerator: list[LedgerTotalReport]  # billable rows only
    total: LedgerTotalReport  # billable rows
    emulated_total: LedgerTotalReport  # emulated rows: listed, costed 0


def _money(usd: float | None) -> float | None:
    return None if usd is None else round(usd, 4)


def _entry_report(entry: LedgerEntry) -> LedgerEntryReport:
    row = entry.row
    return LedgerEntryReport(
        run_id=row.run_id,
        kind=entry.kind,
        session=entry.session,
        group_run_id=entry.group,
        attempt=entry.attempt,
        project=row.project,
        zone=row.zone,
        node_name=row.node_name,
        accelerator_type=row.accelerator,
        spot=row.spot,
        target=row.target,
        provider=row.provider,
        emulated=row.emulated,
        queued_resource=row.queued_resource,
        state=entry.state,
        still_billing=entry.still_billing,
        started=row.started,
        billed_until=entry.billed_until,
        billed_seconds=round(entry.billed_seconds, 1),
        price_per_hour_usd=entry.price_per_hour,
        estimated_cost_usd=_money(entry.estimated_cost),
    )


def _total_report(total: LedgerTotal) -> LedgerTotalReport:
    return LedgerTotalReport(
        key=total.key,
        runs=total.runs,
        attempts=total.attempts,
        billed_seconds=round(total.billed_seconds, 1),
        estimated_cost_usd=round(total.estimated_cost, 4),
        unpriced=total.unpriced,
        still_billing=total.still_billing,
    )


def _run_report(run: RunCost) -> RunCostReport:
    first = run.entries[0].row
    return RunCostReport(
        run_id=run.run_id,
        kind=run.entries[0].kind,
        attempts=run.attempts,
        attempt_run_ids=[e.row.run_id for e in run.entries],
        accelerator_type=first.accelerator,
        emulated=first.emulated,
        started=run.started,
        billed_seconds=round(run.billed_seconds, 1),
        estimated_cost_usd=_money(run.estimated_cost),
        still_billing=run.still_billing,
    )


def costs_envelope(found: Ledger) -> CostsEnvelope:
    return CostsEnvelope(
        ok=True,
        now=found.now,
        since=found.since,
        price_date=PRICE_DATE,
        entries=[_entry_report(e) for e in found.entries],
        runs=[_run_report(r) for r in found.runs],
        by_day=[_total_report(t) for t in found.by_day],
        by_accelerator=[_total_report(t) for t in found.by_accelerator],
        total=_total_report(found.total),
        emulated_total=_total_report(found.emulated_total),
    )
