"""The local run journal: one SQLite row per run, committed before the node is created.

The journal is how tpulab remembers a node after the process that created it died
(SIGKILL, a laptop that never woke up). Its rules:

- a row is committed BEFORE `create_node` is sent, so every node tpulab may have created
  has a row; the row is closed only when teardown was confirmed (or nothing was created);
- every call opens its own connection and runs one short transaction, so concurrent runs
  (several terminals) share the file safely under WAL and a busy timeout;
- a crash mid-write loses at most the uncommitted transaction (SQLite's journal); a file
  that is not a readable database raises JournalError with what to do, never a traceback.
  Labels on the nodes remain the second source of truth: `tpulab teardown --verify` still
  finds tpulab nodes when the journal is unreadable.
"""

from __future__ import annotations

import os
import socket
import sqlite3
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from tpulab import paths
from tpulab.cleanup.journal_schema import SCHEMA_VERSION, statements_from
from tpulab.envelope import escape_undecodable
from tpulab.errors import TARGET_EMULATE, TARGET_GOOGLE, JournalError, target_for
from tpulab.models import NodeInfo

if TYPE_CHECKING:
    from tpulab.config import RunSpec

__all__ = [
    "NOT_IN_JOURNAL",
    "SCHEMA_VERSION",
    "SESSION_PHASE",
    "TARGET_EMULATE",
    "TARGET_GOOGLE",
    "VANISHED",
    "Journal",
    "JournalView",
    "RecordPointer",
    "RunJournalAdapter",
    "RunRow",
    "TeardownResult",
    "close_vanished",
    "journal_view",
    "process_is_live",
    "process_marker",
    "row_is_live",
    "target_for",
]

# The embedded emulator listens on a random port per process, so its rows are keyed by
# TARGET_EMULATE (tpulab.errors, beside LeakedNode) rather than by a URL no later process
# could reach.

# "forgotten": the user closed the row because its API endpoint no longer exists (a
# stopped `tpulab emulator serve`), after `teardown --forget` saw the connection refused.
# Nothing confirmed the node gone; the row says so instead of nagging for ever.
TeardownResult = Literal["confirmed", "unconfirmed", "not-created", "forgotten"]
_TEARDOWN_RESULTS = ("confirmed", "unconfirmed", "not-created", "forgotten")
# How a row reads whose node disappeared without this machine's teardown: its VM's
# watchdog deleted it (the usual case after a SIGKILL), or someone else did.
VANISHED = "deleted by its watchdog or externally"

# Queries are whole literals (no string building), so nothing user-supplied reaches SQL
# except as a bound parameter.
_INSERT = (
    "INSERT INTO runs (run_id, project, zone, node_name, accelerator, target, emulated, "
    "spot, started, updated, phase, pid, host, proc_start, ended, teardown, detail, "
    "queued_resource, provider) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_SELECT_ONE = (
    "SELECT run_id, project, zone, node_name, accelerator, target, emulated, spot, started, "
    "updated, phase, pid, host, proc_start, ended, teardown, detail, queued_resource, "
    "provider FROM runs WHERE run_id = ?"
)
_SELECT_OPEN = (
    "SELECT run_id, project, zone, node_name, accelerator, target, emulated, spot, started, "
    "updated, phase, pid, host, proc_start, ended, teardown, detail, queued_resource, provider "
    "FROM runs "
    "WHERE teardown IS NULL OR teardown = 'unconfirmed' ORDER BY started, rowid"
)
_SELECT_ALL = (
    "SELECT run_id, project, zone, node_name, accelerator, target, emulated, spot, started, "
    "updated, phase, pid, host, proc_start, ended, teardown, detail, queued_resource, provider "
    "FROM runs "
    "ORDER BY started DESC, rowid DESC LIMIT ?"
)
_SELECT_NODE = (
    "SELECT run_id, project, zone, node_name, accelerator, target, emulated, spot, started, "
    "updated, phase, pid, host, proc_start, ended, teardown, detail, queued_resource, provider "
    "FROM runs "
    "WHERE project = ? AND zone = ? AND node_name = ? ORDER BY started DESC, rowid DESC"
)
_SELECT_RECORDS = (
    "SELECT run_id, path, session_run_id, pid, host, proc_start FROM records "
    "ORDER BY written DESC, rowid DESC LIMIT ?"
)
_SELECT_RECORD = (
    "SELECT run_id, path, session_run_id, pid, host, proc_start FROM records WHERE run_id = ?"
)


def process_marker(pid: int) -> str | None:
    """A value that changes when a pid is reused (Linux: the process start time).

    None where /proc is absent; then liveness falls back to the pid alone.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after it.
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[19] if len(fields) > 19 else None


def _process_state(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[0] if fields else None


@dataclass(frozen=True)
class RunRow:
    """One run as the journal knows it. `teardown` is None while the run is open."""

    run_id: str
    project: str
    zone: str
    node_name: str
    accelerator: str
    target: str  # TARGET_GOOGLE, TARGET_EMULATE or an API endpoint URL
    emulated: bool
    started: datetime
    phase: str = "create"
    spot: bool = False
    updated: datetime | None = None
    pid: int | None = None
    host: str | None = None
    proc_start: str | None = None
    ended: datetime | None = None
    teardown: TeardownResult | None = None
    detail: str = ""
    queued_resource: str | None = None  # --queued: the QueuedResource holding the node
    # The API that holds the node: "tpu-api" or "compute" (tpulab.catalog.PROVIDERS).
    provider: str = "tpu-api"

    @classmethod
    def for_this_process(
        cls,
        *,
        run_id: str,
        project: str,
        zone: str,
        node_name: str,
        accelerator: str,
        target: str,
        emulated: bool,
        spot: bool = False,
        phase: str = "create",
        started: datetime | None = None,
        queued_resource: str | None = None,
        provider: str = "tpu-api",
    ) -> RunRow:
        """A new row owned by the calling process (pid and host let a sweep skip it)."""
        pid = os.getpid()
        return cls(
            run_id=run_id,
            project=project,
            zone=zone,
            node_name=node_name,
            accelerator=accelerator,
            target=target,
            emulated=emulated,
            spot=spot,
            phase=phase,
            started=started or datetime.now(timezone.utc),
            pid=pid,
            host=socket.gethostname(),
            proc_start=process_marker(pid),
            queued_resource=queued_resource,
            provider=provider,
        )

    @property
    def needs_teardown(self) -> bool:
        """True while the node may still exist: open, or closed with teardown unconfirmed."""
        return self.teardown is None or self.teardown == "unconfirmed"


def row_is_live(row: RunRow) -> bool:
    """Is the process that wrote this row still running on this machine?"""
    return process_is_live(row.pid, row.host, row.proc_start)


def process_is_live(pid: int | None, host: str | None, proc_start: str | None) -> bool:
    """Is the process (pid on host, started at `proc_start`) still running here?

    A zombie (killed but not yet reaped) counts as dead; a reused pid is told apart by
    the process start time where the platform exposes it. Another host's process is
    never live: this machine cannot tell.
    """
    if pid is None or host != socket.gethostname():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    if _process_state(pid) == "Z":
        return False
    if proc_start is not None:
        return process_marker(pid) == proc_start
    return True


@dataclass(frozen=True)
class RecordPointer:
    """Where a run's (or an exec's) record is, and which process writes it.

    The writer is stamped when the pointer is set, at the start of the run: a record
    that still says "running" once its writer is gone belongs to a run that was killed
    (SIGKILL, power loss) before it could write the final one.
    """

    run_id: str
    path: Path
    session_run_id: str | None = None
    pid: int | None = None
    host: str | None = None
    proc_start: str | None = None

    @property
    def writer_alive(self) -> bool:
        return process_is_live(self.pid, self.host, self.proc_start)


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.astimezone(timezone.utc).isoformat()


def _parse(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


def _row(values: Sequence[object]) -> RunRow:
    (run_id, project, zone, node, acc, target, emulated, spot, started, updated, phase, pid,
     host, proc_start, ended, teardown, detail, queued, provider) = values  # fmt: skip
    started_at = _parse(str(started))
    assert started_at is not None
    if teardown is not None and teardown not in _TEARDOWN_RESULTS:
        raise JournalError(f"The run journal has an unknown teardown value {teardown!r}.")
    return RunRow(
        run_id=str(run_id),
        project=str(project),
        zone=str(zone),
        node_name=str(node),
        accelerator=str(acc),
        target=str(target),
        emulated=bool(emulated),
        spot=bool(spot),
        started=started_at,
        updated=_parse(None if updated is None else str(updated)),
        phase=str(phase),
        pid=None if pid is None else int(str(pid)),
        host=None if host is None else str(host),
        proc_start=None if proc_start is None else str(proc_start),
        ended=_parse(None if ended is None else str(ended)),
        teardown=teardown,  # type: ignore[arg-type]  # checked just above
        detail=str(detail),
        queued_resource=None if queued is None else str(queued),
        provider=str(provider),
    )


def _pointer(values: Sequence[object]) -> RecordPointer:
    run_id, path, session_run_id, pid, host, proc_start = values
    return RecordPointer(
        run_id=str(run_id),
        path=Path(str(path)),
        session_run_id=None if session_run_id is None else str(session_run_id),
        pid=None if pid is None else int(str(pid)),
        host=None if host is None else str(host),
        proc_start=None if proc_start is None else str(proc_start),
    )


# SQLite's words for a disk that refuses a write (SQLITE_FULL, SQLITE_IOERR,
# SQLITE_READONLY), as sqlite3 raises them on every Python tpulab supports.
_CANNOT_WRITE = ("database or disk is full", "disk I/O error", "readonly database")


class Journal:
    """The SQLite journal at `path` (default: `paths.journal_path()`).

    Cheap to construct; nothing touches the disk until the first call. Every method is
    one short transaction on its own connection, so a Journal may be shared freely.
    """

    def __init__(
        self,
        path: Path | None = None,
        *,
        busy_timeout: float = 10.0,
        now: Callable[[], datetime] | None = None,
    ) -> None:
        self.path = path or paths.journal_path()
        self.busy_timeout = busy_timeout
        self._now = now or (lambda: datetime.now(timezone.utc))
        self._ready = False

    # -- writing ---------------------------------------------------------------------

    def open_run(self, row: RunRow) -> None:
        """Record a run about to create its node. Must return before create_node is sent."""
        row = replace(row, updated=row.updated or self._now(), teardown=None, ended=None)
        values = (
            row.run_id, row.project, row.zone, row.node_name, row.accelerator, row.target,
            int(row.emulated), int(row.spot), _iso(row.started), _iso(row.updated),
            row.phase, row.pid, row.host, row.proc_start, None, None, row.detail,
            row.queued_resource, row.provider,
        )  # fmt: skip
        with self._transaction(write=True) as conn:
            try:
                conn.execute(_INSERT, values)
            except sqlite3.IntegrityError:
                raise JournalError(
                    f"Run id {row.run_id} is already in the journal.",
                    hint="Run ids must be unique; let tpulab generate one.",
                ) from None

    def set_phase(self, run_id: str, phase: str, *, busy_timeout: float | None = None) -> None:
        """Record progress; `busy_timeout` overrides how long a lock is waited for.

        Committed without an fsync (WAL, synchronous=NORMAL): a phase lost to a power cut
        is harmless, and an fsync made while holding the write lock can keep the other
        runs of one home waiting for seconds on a loaded disk (ext4 may flush other
        files' dirty data first), the likely cause of a CI run whose phase update gave
        up after its 1 s (2026-12-07, the interruption tests, whose runs share a home).
        Opening and closing a row stay durable."""
        with self._transaction(write=True, busy_timeout=busy_timeout, durable=False) as conn:
            cursor = conn.execute(
                "UPDATE runs SET phase = ?, updated = ? WHERE run_id = ?",
                (phase, _iso(self._now()), run_id),
            )
            self._require_one(cursor.rowcount, run_id)

    def close_run(
        self,
        run_id: str,
        teardown: TeardownResult,
        detail: str = "",
        *,
        ended: datetime | None = None,
    ) -> None:
        """Record the teardown result. "unconfirmed" keeps the row in `open_runs()`.

        `ended` is when billing stopped if that is known better than "now" (a session
        whose node deleted itself at its deadline, noticed later); `tpulab costs` bills
        a closed row to it."""
        if teardown not in _TEARDOWN_RESULTS:
            raise ValueError(f"teardown must be one of {_TEARDOWN_RESULTS}, not {teardown!r}")
        now = _iso(self._now())
        until = now if ended is None else _iso(ended)
        with self._transaction(write=True) as conn:
            cursor = conn.execute(
                "UPDATE runs SET teardown = ?, detail = ?, ended = ?, updated = ? WHERE run_id = ?",
                # A detail may quote a file name that is not UTF-8, which SQLite refuses.
                (teardown, escape_undecodable(detail), until, now, run_id),
            )
            self._require_one(cursor.rowcount, run_id)

    def set_run_record(self, run_id: str, path: Path, *, session_run_id: str | None = None) -> None:
        """Remember where a run's (or a session's exec's) record is, <out>/run.json, for
        `tpulab runs`; an exec names the run id of the session it ran on. Called when the
        run starts, by the process that writes the record, which the pointer names."""
        pid = os.getpid()
        with self._transaction(write=True) as conn:
            conn.execute(
                "INSERT OR REPLACE INTO records (run_id, path, session_run_id, written, pid, "
                "host, proc_start) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    run_id,
                    str(path),
                    session_run_id,
                    _iso(self._now()),
                    pid,
                    socket.gethostname(),
                    process_marker(pid),
                ),
            )

    # -- reading ---------------------------------------------------------------------

    def run_records(self, limit: int = 100) -> list[RecordPointer]:
        """The runs that have a record, newest first."""
        with self._transaction() as conn:
            found = conn.execute(_SELECT_RECORDS, (limit,)).fetchall()
        return [_pointer(values) for values in found]

    def run_record_of(self, run_id: str) -> RecordPointer | None:
        with self._transaction() as conn:
            found = conn.execute(_SELECT_RECORD, (run_id,)).fetchone()
        return None if found is None else _pointer(found)

    def get(self, run_id: str) -> RunRow | None:
        with self._transaction() as conn:
            found = conn.execute(_SELECT_ONE, (run_id,)).fetchone()
        return None if found is None else _row(found)

    def open_runs(self) -> list[RunRow]:
        """Rows whose node may still exist: never closed, or closed "unconfirmed"."""
        with self._transaction() as conn:
            found = conn.execute(_SELECT_OPEN).fetchall()
        return [_row(values) for values in found]

    def all_runs(self, limit: int = 100) -> list[RunRow]:
        """Newest first."""
        with self._transaction() as conn:
            found = conn.execute(_SELECT_ALL, (limit,)).fetchall()
        return [_row(values) for values in found]

    def runs_for_node(self, project: str, zone: str, node_name: str) -> list[RunRow]:
        """Rows naming this node, newest first (names are reusable across runs)."""
        key = (project, zone, node_name)
        return self.runs_for_nodes([key])[key]

    def runs_for_nodes(
        self, keys: Iterable[tuple[str, str, str]]
    ) -> dict[tuple[str, str, str], list[RunRow]]:
        """`runs_for_node` for each (project, zone, name), in one transaction: `tpulab
        list` of 120 nodes opened the journal 120 times."""
        with self._transaction() as conn:
            found = {key: conn.execute(_SELECT_NODE, key).fetchall() for key in keys}
        return {key: [_row(values) for values in rows] for key, rows in found.items()}

    # -- plumbing --------------------------------------------------------------------

    @staticmethod
    def _require_one(rowcount: int, run_id: str) -> None:
        if rowcount != 1:
            raise JournalError(
                f"Run {run_id} is not in the journal.",
                hint="The journal may have been moved aside; `tpulab teardown --verify` "
                "still finds the run's node by its labels.",
            )

    def _error(self, error: sqlite3.Error, busy_timeout: float) -> JournalError:
        text = str(error)
        if isinstance(error, sqlite3.OperationalError) and "locked" in text:
            return JournalError(
                f"The run journal {self.path} stayed locked for {busy_timeout:g} s.",
                hint="Another tpulab process holds it; retry when it finishes.",
            )
        if isinstance(error, sqlite3.OperationalError) and "unable to open" in text:
            return JournalError(
                f"The run journal {self.path} cannot be opened: {text}.",
                hint=f"Check that {self.path.parent} exists and is writable "
                "(or set TPULAB_HOME to a writable directory).",
            )
        if isinstance(error, sqlite3.OperationalError) and any(
            words in text for words in _CANNOT_WRITE
        ):
            # The disk's refusal, not damage: moving the journal aside would lose its
            # open rows and fail the same way on the same disk.
            return JournalError(
                f"The run journal {self.path} cannot be written ({text}).",
                hint=f"Free space on the disk of {self.path.parent} (or make it writable, "
                "or set TPULAB_HOME to another directory) and retry. The journal is not "
                "damaged: keep it.",
            )
        return JournalError(
            f"The run journal {self.path} is unreadable ({text}).",
            hint=f"Move it aside (mv '{self.path}' '{self.path}.corrupt'); a fresh journal "
            "starts with the next run. Nodes are still found by their labels: run "
            "`tpulab teardown --verify --zone ZONE` for each zone you used.",
        )

    def _connect(self, busy_timeout: float) -> sqlite3.Connection:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise JournalError(
                f"Cannot create the journal directory {self.path.parent}: {error.strerror}.",
                hint="Set TPULAB_HOME to a writable directory.",
            ) from None
        # isolation_level=None: transactions are ours (BEGIN IMMEDIATE below), not the
        # module's implicit ones, so a write never upgrades a read lock and deadlocks.
        conn = sqlite3.connect(self.path, timeout=busy_timeout, isolation_level=None)
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
        return conn

    def _ensure_schema(self, conn: sqlite3.Connection) -> None:
        """Check the schema (and the file) once per Journal; create or migrate it if needed.

        The check is a read: readers never wait for writers under WAL, so the many
        short-lived processes that open a journal (every tpulab command, a test polling
        it) do not queue for the write lock. Only a journal that is new or older than
        this tpulab takes the write lock, and looks again under it (another process may
        have created or migrated it meanwhile).
        """
        if self._ready:
            return
        if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
            conn.execute("PRAGMA journal_mode = WAL")
        with _atomic(conn, "BEGIN"):
            current = self._schema_version(conn) == SCHEMA_VERSION
            if current:
                self._check_integrity(conn)
        if not current:
            self._create_or_migrate(conn)
        self._ready = True

    def _schema_version(self, conn: sqlite3.Connection) -> int:
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        if version > SCHEMA_VERSION:
            raise JournalError(
                f"The run journal {self.path} was written by a newer tpulab "
                f"(schema {version}; this one reads {SCHEMA_VERSION}).",
                hint="Upgrade tpulab, or point TPULAB_HOME elsewhere.",
            )
        return version

    @staticmethod
    def _check_integrity(conn: sqlite3.Connection) -> None:
        check = conn.execute("PRAGMA quick_check").fetchone()[0]
        if check != "ok":
            raise sqlite3.DatabaseError(f"integrity check failed: {check}")

    def _create_or_migrate(self, conn: sqlite3.Connection) -> None:
        with _atomic(conn, "BEGIN IMMEDIATE"):
            version = self._schema_version(conn)
            if version < SCHEMA_VERSION:
                # A new journal, or an older tpulab's: its open rows must stay findable,
                # so it is migrated in place (inside this transaction: all steps or none).
                for statement in statements_from(version):
                    conn.execute(statement)
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            self._check_integrity(conn)

    @contextmanager
    def _transaction(
        self, *, write: bool = False, busy_timeout: float | None = None, durable: bool = True
    ) -> Iterator[sqlite3.Connection]:
        conn: sqlite3.Connection | None = None
        timeout = self.busy_timeout if busy_timeout is None else busy_timeout
        try:
            conn = self._connect(timeout)
            self._ensure_schema(conn)
            if not durable:  # this connection's commits skip the fsync (WAL keeps order)
                conn.execute("PRAGMA synchronous = NORMAL")
            with _atomic(conn, "BEGIN IMMEDIATE" if write else "BEGIN"):
                yield conn
        except sqlite3.Error as error:
            raise self._error(error, timeout) from None
        finally:
            if conn is not None:
                conn.close()


@contextmanager
def _atomic(conn: sqlite3.Connection, begin: str) -> Iterator[None]:
    """One transaction: `begin`, then COMMIT, or ROLLBACK on any exit by exception -- a
    signal included, so the file only ever holds whole transactions."""
    conn.execute(begin)
    try:
        yield
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def close_vanished(
    journal: Journal, rows: Iterable[RunRow], *, seen_by: str
) -> tuple[list[str], list[str]]:
    """Close open rows whose node a listing of their zone proved gone, as VANISHED.

    The one place that decides it, for `tpulab list` and `teardown --verify` alike; the
    caller has listed each row's zone and found no node of the row's run. Returns the
    closed run ids and the journal's warnings (a locked journal only warns).
    """
    closed: list[str] = []
    warnings: list[str] = []
    for row in rows:
        detail = f"{VANISHED}: no node labelled tpulab-run={row.run_id} in {row.zone} ({seen_by})"
        try:
            journal.close_run(row.run_id, "confirmed", detail)
        except JournalError as error:
            warnings.append(error.message)
        else:
            closed.append(row.run_id)
    return closed, warnings


@dataclass(frozen=True)
class JournalView:
    """What this machine's journal says about nodes a `list` showed.

    `states` maps (project, zone, node name) to a short text; `missing` holds rows that
    still need teardown in the listed zones but whose node the cloud did not list;
    `vanished` those of them whose node had been created and whose run is over, which
    `tpulab list` closes as VANISHED; `error` is set (and the rest empty) when the
    journal could not be read.
    """

    states: dict[tuple[str, str, str], str]
    missing: list[RunRow]
    error: str | None = None
    vanished: list[RunRow] = field(default_factory=list)


# The journal's phase of a run whose node was kept by `tpulab up` (its process has
# ended on purpose: the session lives on, guarded by its watchdog).
SESSION_PHASE = "session"
# What `list` says of a tpulab node no row of this journal names.
NOT_IN_JOURNAL = "not in this machine's journal"


def _state_text(row: RunRow, sessions: Collection[str] | None = None) -> str:
    if row.teardown is None:
        if row.phase == SESSION_PHASE and sessions is not None and row.run_id not in sessions:
            # Its state file was damaged and set aside (or removed by hand): `down` no
            # longer knows it, so say what does delete it.
            return "session whose state is gone: `tpulab teardown --verify` deletes it"
        if row.phase == SESSION_PHASE:
            return "session (kept by `tpulab up`; `tpulab down` ends it)"
        if row_is_live(row):
            return f"running ({row.phase})"
        return f"orphaned at {row.phase}: run `tpulab teardown --verify`"
    if row.teardown == "unconfirmed":
        return "teardown unconfirmed: run `tpulab teardown --verify`"
    return f"closed ({row.teardown})"


def journal_view(
    nodes: Iterable[NodeInfo],
    *,
    zones: Iterable[str] = (),
    project: str | None = None,
    target: str | None = None,
    journal: Journal | None = None,
    providers: Collection[str] | None = None,
    sessions: Collection[str] | None = None,
) -> JournalView:
    """Journal state next to the cloud's, for `tpulab list`. Never raises JournalError.
    `sessions` (None: not known) are the run ids of the sessions whose state this home
    can read: a session row outside them is one `tpulab down` cannot end.

    `project` and `target` (see `target_for`) say which API was listed, and `providers`
    (None: any) which of its providers answered, so that `missing` only holds rows the
    listing could have shown: a Compute row is never "gone" for a listing that could not
    ask Compute.
    """
    journal = journal or Journal()
    nodes = list(nodes)
    try:
        states: dict[tuple[str, str, str], str] = {}
        named = journal.runs_for_nodes((n.project, n.zone, n.name) for n in nodes)
        for node in nodes:
            key = (node.project, node.zone, node.name)
            rows = named[key]
            by_label = [r for r in rows if node.run_id is not None and r.run_id == node.run_id]
            if by_label:
                states[key] = _state_text(by_label[0], sessions)
            elif node.managed_by_tpulab:
                states[key] = NOT_IN_JOURNAL
        listed = {(n.project, n.zone, n.name) for n in nodes}
        projects = {project} if project else {n.project for n in nodes}
        wanted_zones = set(zones) | {n.zone for n in nodes}
        missing = [
            row
            for row in journal.open_runs()
            if row.zone in wanted_zones
            and (not projects or row.project in projects)
            and (target is None or row.target == target)
            and (providers is None or row.provider in providers)
            and (row.project, row.zone, row.node_name) not in listed
        ]
        # Gone on its own: the run is over (no live process will close it) and it got
        # past the create, so no create whose reply was lost can still bring it back.
        vanished = [
            row
            for row in missing
            if row.teardown is None and row.phase != "create" and not row_is_live(row)
        ]
    except JournalError as error:
        return JournalView(states={}, missing=[], error=error.message)
    return JournalView(states=states, missing=missing, vanished=vanished)


# How long one phase update waits for the lock: short (the VM bills meanwhile, and only
# the first failure waits), but longer than another run's commit on a loaded machine
# (1 s was not: CI, the interruption tests, whose runs share one home).
_PHASE_BUSY_TIMEOUT = 2.0


class RunJournalAdapter:
    """The journal seen through the lifecycle's `progress.RunJournal` protocol.

    `run_started` raises (JournalError) so that a run which cannot be recorded never
    creates a node. Later writes only warn: a locked journal must not fail a run whose
    node teardown already handles; an unclosed row is later closed by a sweep. After the
    first failed phase update the rest are skipped (each would wait for the lock again
    while the VM bills, and say the same thing); the final write is always attempted.
    """

    def __init__(self, journal: Journal | None = None) -> None:
        self.journal = journal or Journal()
        self.warnings: list[str] = []
        self._skip_phases = False

    def _warn(self, message: str) -> None:
        if message not in self.warnings:
            self.warnings.append(message)

    def run_started(self, spec: RunSpec) -> None:
        self.journal.open_run(
            RunRow.for_this_process(
                run_id=spec.run_id,
                project=spec.project.value,
                zone=spec.zone.value,
                node_name=spec.node_name,
                accelerator=spec.accelerator.name,
                target=spec.target,
                emulated=spec.emulated,
                spot=spec.spot,
                queued_resource=spec.node_name if spec.queued else None,
                provider=spec.provider,
            )
        )
        if spec.workload is not None:
            # Known before the run: where its run.json will be written (run.record).
            try:
                self.journal.set_run_record(spec.run_id, spec.workload.out / "run.json")
            except JournalError as error:
                self._warn(f"the journal could not point at run.json: {error.message}")

    def phase_changed(self, run_id: str, phase: str) -> None:
        if self._skip_phases:
            return
        try:
            # Progress is best effort: it is written while the VM bills and nothing
            # depends on it, so a lock is waited for a few seconds at most.
            self.journal.set_phase(run_id, phase, busy_timeout=_PHASE_BUSY_TIMEOUT)
        except JournalError as error:
            self._skip_phases = True
            self._warn(f"{error.message} Phase updates are skipped for the rest of this run.")

    def run_finished(self, run_id: str, teardown: TeardownResult, detail: str) -> None:
        try:
            self.journal.close_run(run_id, teardown, detail)
        except JournalError as error:
            self._warn(error.message)
