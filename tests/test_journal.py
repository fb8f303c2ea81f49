"""The run journal: rows before create, concurrency, crashes mid-write, corrupted files."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from tpulab import paths
from tpulab.cleanup.journal import (
    SCHEMA_VERSION,
    TARGET_EMULATE,
    Journal,
    RunRow,
    journal_view,
    row_is_live,
    target_for,
)
from tpulab.errors import JournalError
from tpulab.models import NodeInfo, tpulab_labels

ZONE = "us-central1-a"


def _row(run_id: str, node: str | None = None, **changes: object) -> RunRow:
    row = RunRow.for_this_process(
        run_id=run_id,
        project="proj",
        zone=ZONE,
        node_name=node or f"tpulab-{run_id}",
        accelerator="v5litepod-4",
        target="http://127.0.0.1:1",
        emulated=True,
    )
    return row if not changes else RunRow(**{**row.__dict__, **changes})


def test_default_path_is_under_the_state_dir_and_rows_round_trip() -> None:
    journal = Journal()
    assert journal.path == paths.journal_path()
    journal.open_run(_row("r1"))
    assert journal.path.is_file()
    got = journal.get("r1")
    assert got is not None
    assert (got.run_id, got.node_name, got.phase, got.teardown) == (
        "r1",
        "tpulab-r1",
        "create",
        None,
    )
    assert got.pid == os.getpid()
    assert got.emulated is True
    assert got.needs_teardown
    with sqlite3.connect(journal.path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_phases_and_closing_decide_what_stays_open(tmp_path: Path) -> None:
    clock = iter(
        datetime(2026, 1, 1, tzinfo=timezone.utc) + timedelta(seconds=s) for s in range(99)
    )
    journal = Journal(tmp_path / "j.sqlite3", now=lambda: next(clock))
    for run_id in ("a", "b", "c", "d"):
        journal.open_run(_row(run_id))
    journal.set_phase("a", "execute")
    journal.close_run("b", "confirmed", "deleted and listed")
    journal.close_run("c", "unconfirmed", "delete hung")
    journal.close_run("d", "not-created", "stockout")
    open_ids = [row.run_id for row in journal.open_runs()]
    assert open_ids == ["a", "c"]  # unconfirmed rows still need a sweep
    a = journal.get("a")
    b = journal.get("b")
    assert a is not None
    assert a.phase == "execute"
    assert a.updated is not None
    assert b is not None
    assert b.teardown == "confirmed"
    assert b.detail == "deleted and listed"
    assert b.ended is not None
    assert [row.run_id for row in journal.all_runs(limit=2)] == ["d", "c"]


def test_unknown_runs_and_duplicate_ids_are_errors_with_hints(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.sqlite3")
    journal.open_run(_row("r1"))
    with pytest.raises(JournalError, match="already in the journal"):
        journal.open_run(_row("r1"))
    with pytest.raises(JournalError, match="not in the journal") as caught:
        journal.set_phase("nope", "wait")
    assert caught.value.hint
    assert "labels" in caught.value.hint
    with pytest.raises(ValueError, match="teardown must be"):
        journal.close_run("r1", "deleted")  # type: ignore[arg-type]


def test_target_names() -> None:
    assert target_for(None) == "google"
    assert target_for("http://127.0.0.1:8470/") == "http://127.0.0.1:8470"
    assert target_for("http://127.0.0.1:9", embedded_emulator=True) == TARGET_EMULATE


def test_liveness_tells_dead_and_reused_pids_apart(tmp_path: Path) -> None:
    assert row_is_live(_row("me"))
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert row_is_live(_row("child", pid=child.pid, proc_start=None))
        # Same pid, different start time: the pid was reused by another process.
        assert not row_is_live(_row("reused", pid=child.pid, proc_start="1"))
        child.kill()
        deadline = time.monotonic() + 5
        # Killed but not reaped yet: a zombie is dead for our purposes.
        while row_is_live(_row("child", pid=child.pid, proc_start=None)):
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        child.kill()
        child.wait()
    assert not row_is_live(_row("other-host", host="elsewhere.example"))


WRITER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from tpulab.cleanup.journal import Journal, RunRow

    # SQLite's lock waits are not fair: a writer that has waited a while polls every
    # 100 ms while the others' fresh attempts win, so on a loaded CI machine one of four
    # back-to-back writers waited out the default 10 s. This file is about losing
    # nothing, not about latency: the wait here outlasts all the other writers' work, so
    # it can only end in the lock.
    journal = Journal(Path(sys.argv[1]), busy_timeout=300.0)
    prefix = sys.argv[2]
    for i in range(int(sys.argv[3])):
        run_id = f"{prefix}-{i}"
        journal.open_run(RunRow.for_this_process(
            run_id=run_id, project="proj", zone="us-central1-a", node_name=run_id,
            accelerator="v5litepod-4", target="google", emulated=False))
        journal.set_phase(run_id, "wait")
        journal.close_run(run_id, "confirmed", "x" * 2000)
        print(run_id, flush=True)
    """
)


def test_concurrent_writers_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite3"
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(path), f"w{n}", "40"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(4)
    ]
    for writer in writers:
        _, err = writer.communicate(timeout=120)
        assert writer.returncode == 0, err
    rows = Journal(path).all_runs(limit=1000)
    assert len(rows) == 160
    assert all(row.teardown == "confirmed" and row.phase == "wait" for row in rows)


def test_sigkill_mid_write_leaves_every_committed_row_and_a_usable_file(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite3"
    committed: list[str] = []
    for attempt, delay in enumerate((0.15, 0.3, 0.45)):
        writer = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(path), f"k{attempt}", "100000"],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert writer.stdout is not None
        committed.append(writer.stdout.readline().strip())  # it is writing now
        time.sleep(delay)
        writer.send_signal(signal.SIGKILL)
        rest, _ = writer.communicate(timeout=10)
        committed.extend(rest.split())
        assert writer.returncode == -signal.SIGKILL
    journal = Journal(path)
    rows = {row.run_id: row for row in journal.all_runs(limit=1_000_000)}
    missing = [run_id for run_id in committed if run_id not in rows]
    assert not missing, f"committed rows lost after SIGKILL: {missing[:5]}"
    # The row the writer was in the middle of is whole or absent, never half-written.
    assert all(row.node_name == row.run_id for row in rows.values())
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    journal.open_run(_row("after-crash"))
    assert journal.get("after-crash") is not None


HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from tpulab.cleanup.journal import Journal, RunRow

    path = Path(sys.argv[1])
    Journal(path).open_run(RunRow.for_this_process(
        run_id="held", project="proj", zone="us-central1-a", node_name="held",
        accelerator="v5litepod-4", target="google", emulated=False))

    def stuck_clock():
        # Called inside set_phase's write transaction: freeze there holding the lock.
        print("in-transaction", flush=True)
        time.sleep(600)

    Journal(path, now=stuck_clock).set_phase("held", "never-committed")
    """
)


def test_a_writer_killed_inside_its_transaction_releases_the_lock(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite3"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path)], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None
    assert holder.stdout.readline().strip() == "in-transaction"
    blocked = Journal(path, busy_timeout=0.3)
    with pytest.raises(JournalError, match="locked") as caught:
        blocked.open_run(_row("while-held"))
    assert caught.value.hint
    assert "retry" in caught.value.hint
    holder.kill()
    holder.wait(timeout=10)
    journal = Journal(path, busy_timeout=2)
    held = journal.get("held")
    assert held is not None
    assert held.phase == "create"
    journal.open_run(_row("after-kill"))
    assert {row.run_id for row in journal.open_runs()} == {"held", "after-kill"}


def test_a_reader_never_queues_behind_a_writer(tmp_path: Path) -> None:
    """Every tpulab command opens its own Journal; reading one (`list`, `runs`, a test
    polling a run's phase) must not wait for the write lock. Each new Journal used to
    take it (BEGIN IMMEDIATE and an integrity check) to look at the schema: with seven
    runs sharing one home on a loaded machine, that queue outlasted the busy timeout
    (test_interruptions' workload matrix, CI). A writer holds the lock here for as long
    as the test likes (HOLDER freezes inside set_phase's transaction)."""
    path = tmp_path / "j.sqlite3"
    Journal(path).open_run(_row("before"))
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "in-transaction"
        fresh = Journal(path, busy_timeout=0.3)  # a new process's first look
        assert {row.run_id for row in fresh.open_runs()} == {"before", "held"}
        assert Journal(path, busy_timeout=0.3).get("held") is not None
        # Writers still wait for it (and say so), as before.
        with pytest.raises(JournalError, match="locked"):
            Journal(path, busy_timeout=0.3).open_run(_row("while-held"))
    finally:
        holder.kill()
        holder.wait(timeout=10)


@pytest.mark.parametrize("damage", ["garbage", "truncated", "scribbled"])
def test_a_corrupted_journal_is_a_clear_error_not_a_traceback(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "j.sqlite3"
    journal = Journal(path)
    for i in range(200):
        journal.open_run(_row(f"r{i}", node=f"node-{i}-" + "x" * 40))
    with sqlite3.connect(path) as conn:  # fold the WAL in, so the damage hits real pages
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = path.read_bytes()
    if damage == "garbage":
        path.write_bytes(b"this is not a database, it is a shopping list\n" * 50)
    elif damage == "truncated":
        path.write_bytes(data[: len(data) // 3])
    else:
        path.write_bytes(data[:4096] + os.urandom(len(data) - 4096))
    for wal in (tmp_path / "j.sqlite3-wal", tmp_path / "j.sqlite3-shm"):
        wal.unlink(missing_ok=True)
    fresh = Journal(path)
    with pytest.raises(JournalError) as caught:
        fresh.open_runs()
    error = caught.value
    assert str(path) in error.message
    assert "unreadable" in error.message
    assert error.hint
    assert "mv" in error.hint
    assert "labels" in error.hint
    assert error.__cause__ is None
    assert error.__suppress_context__


def test_a_journal_from_a_newer_tpulab_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite3"
    Journal(path).open_run(_row("r1"))
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA user_version = 99")
    with pytest.raises(JournalError, match="newer tpulab"):
        Journal(path).open_runs()


def test_an_unwritable_location_names_the_directory(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(JournalError, match="journal directory") as caught:
        Journal(blocker / "sub" / "j.sqlite3").open_runs()
    assert caught.value.hint
    assert "TPULAB_HOME" in caught.value.hint


def _node(name: str, labels: dict[str, str], zone: str = ZONE) -> NodeInfo:
    return NodeInfo(project="proj", zone=zone, name=name, labels=labels)


def test_journal_view_puts_journal_state_next_to_the_cloud(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.sqlite3")
    journal.open_run(_row("live", node="n-live"))
    journal.set_phase("live", "execute")
    journal.open_run(_row("dead", node="n-dead", pid=2**22 + 7))
    journal.open_run(_row("gone", node="n-gone"))  # open, but the cloud has no such node
    journal.open_run(_row("done", node="n-done"))
    journal.close_run("done", "confirmed")
    nodes = [
        _node("n-live", tpulab_labels("live")),
        _node("n-dead", tpulab_labels("dead")),
        _node("n-done", tpulab_labels("done")),
        _node("n-other-machine", tpulab_labels("elsewhere")),
        _node("tpulab-lookalike", {}),
    ]
    view = journal_view(nodes, zones=[ZONE], journal=journal)
    assert view.error is None
    states = {name: view.states.get(("proj", ZONE, name)) for name in [n.name for n in nodes]}
    assert states["n-live"] == "running (execute)"
    assert states["n-dead"] is not None
    assert states["n-dead"].startswith("orphaned at create")
    assert states["n-done"] == "closed (confirmed)"
    assert states["n-other-machine"] == "not in this machine's journal"
    assert states["tpulab-lookalike"] is None
    assert [row.run_id for row in view.missing] == ["gone"]


def test_journal_view_degrades_on_a_corrupted_file(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite3"
    path.write_bytes(b"\x00garbage" * 100)
    view = journal_view([_node("n", tpulab_labels("r"))], journal=Journal(path))
    assert view.error is not None
    assert "unreadable" in view.error
    assert view.states == {}
    assert view.missing == []


def test_journal_view_reports_missing_nodes_only_for_the_listed_api(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.sqlite3")
    journal.open_run(_row("here", node="n-here", pid=2**22 + 7))
    journal.open_run(_row("emulated", node="n-em", pid=2**22 + 7, target=TARGET_EMULATE))
    journal.open_run(_row("other-project", node="n-op", pid=2**22 + 7, project="elsewhere"))
    view = journal_view(
        [], zones=[ZONE], project="proj", target="http://127.0.0.1:1", journal=journal
    )
    assert [row.run_id for row in view.missing] == ["here"]
    view = journal_view([], zones=[ZONE], project="proj", target=TARGET_EMULATE, journal=journal)
    assert [row.run_id for row in view.missing] == ["emulated"]


def test_a_locked_journal_costs_one_short_wait_and_one_warning_per_run(tmp_path: Path) -> None:
    """While another process holds the journal, a run's phase updates must neither stall
    the run (each used to wait the full busy timeout while the VM billed) nor repeat the
    same warning per phase; the final write is still attempted and lands once free."""
    import sqlite3
    import time

    from tpulab.cleanup.journal import RunJournalAdapter

    path = tmp_path / "j.sqlite3"
    journal = Journal(path, busy_timeout=5.0)
    journal.open_run(_row("locked-run"))
    adapter = RunJournalAdapter(journal)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    started = time.monotonic()
    for phase in ("create", "wait-ready", "host-key", "connect", "bootstrap", "stage"):
        adapter.phase_changed("locked-run", phase)
    waited = time.monotonic() - started
    assert len(adapter.warnings) == 1, adapter.warnings
    assert "locked" in adapter.warnings[0]
    assert "skipped" in adapter.warnings[0]
    # One short wait for the first update, not 6 x 5 s.
    assert waited < 4.0, waited
    holder.execute("ROLLBACK")
    holder.close()
    adapter.run_finished("locked-run", "confirmed", "ok")
    row = journal.get("locked-run")
    assert row is not None
    assert row.teardown == "confirmed"
    assert len(adapter.warnings) == 1


_PHASES_WHILE_ANOTHER_READS = """
import sqlite3, sys
from pathlib import Path
from tpulab.cleanup.journal import Journal
path = Path(sys.argv[1])
other = sqlite3.connect(path)  # another process's reader: no close is the last one
other.execute("SELECT count(*) FROM runs").fetchone()
journal = Journal(path)
journal.set_phase("fsync-run", "create")  # the WAL file made (synced) before the trace
print("ready", flush=True)
sys.stdin.readline()
for phase in ("wait-ready", "host-key", "connect", "bootstrap"):
    journal.set_phase("fsync-run", phase)
print(journal.get("fsync-run").phase, flush=True)
sys.stdin.readline()  # the trace ends before this process (and its last close) does
"""


_OPEN_A_ROW = """
import sys
from pathlib import Path
from tpulab.cleanup.journal import Journal, RunRow
Journal(Path(sys.argv[1])).open_run(RunRow.for_this_process(
    run_id="durable-run", project="proj", zone="us-central1-a", node_name="tpulab-durable",
    accelerator="v5litepod-4", target="http://127.0.0.1:1", emulated=True))
"""


def test_a_phase_update_does_not_fsync_while_holding_the_write_lock(tmp_path: Path) -> None:
    """Phase updates commit without an fsync (synchronous=NORMAL under WAL): on a loaded
    disk an fsync inside the write transaction can keep the other runs of one home
    waiting, the likely cause of a phase update that gave up after 1 s in a CI run
    (2026-12-07: a run never said it was in "connect", and its test waited for that).
    Opening a row stays durable."""
    import shutil
    import signal
    import subprocess
    import sys

    from helpers import require_tool

    require_tool(shutil.which("strace") is not None, "strace")
    path = tmp_path / "j.sqlite3"
    Journal(path).open_run(_row("fsync-run"))
    trace = tmp_path / "trace"
    child = subprocess.Popen(
        [sys.executable, "-c", _PHASES_WHILE_ANOTHER_READS, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    assert child.stdin is not None
    try:
        assert child.stdout.readline() == "ready\n"
        tracer = subprocess.Popen(
            ["strace", "-f", "-y", "-e", "trace=fsync,fdatasync", "-o", str(trace),
             "-p", str(child.pid)],
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        assert tracer.stderr is not None
        assert "attached" in tracer.stderr.readline()  # strace says so once it is
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline() == "bootstrap\n"
        tracer.send_signal(signal.SIGINT)  # strace detaches, having written what it saw
        tracer.wait(timeout=30)
    finally:
        child.stdin.close()
        child.wait(timeout=30)
    syncs = [line for line in trace.read_text().splitlines() if "sync(" in line]
    assert syncs == [], syncs
    # The control: a row opened the same way is synced (strace sees the journal's syncs).
    opened = subprocess.run(
        ["strace", "-f", "-e", "trace=fsync,fdatasync", "-o", str(trace), sys.executable,
         "-c", _OPEN_A_ROW, str(path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert opened.returncode == 0, opened.stderr
    assert any("sync(" in line for line in trace.read_text().splitlines())
