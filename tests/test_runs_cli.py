"""`tpulab runs list|show` read back the run.json of `-- CMD` runs through the journal's
pointer (journal schema 5's `records`), and a journal written by schema 1 is migrated in
place (through 2, the queued resource, 3, the "forgotten" teardown, 4, the pointer in
the row, and 5, the `records` table, to 6, the pointer's writer process)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tpulab.cleanup.journal import SCHEMA_VERSION, Journal, RecordPointer, RunJournalAdapter
from tpulab.cli.runs import RunsListEnvelope
from tpulab.exits import EXIT_CONFIG
from tpulab.run.record import RunRecord

if TYPE_CHECKING:
    from run_rig import Rig

pytest_plugins = ["emulator_fixtures", "ssh_fixtures", "run_rig"]


def tpulab(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tpulab", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
        check=False,
    )


# The schema-1 table exactly as the previous release created it.
_V1 = """
CREATE TABLE runs (
    run_id TEXT PRIMARY KEY, project TEXT NOT NULL, zone TEXT NOT NULL,
    node_name TEXT NOT NULL, accelerator TEXT NOT NULL, target TEXT NOT NULL,
    emulated INTEGER NOT NULL, spot INTEGER NOT NULL DEFAULT 0, started TEXT NOT NULL,
    updated TEXT NOT NULL, phase TEXT NOT NULL, pid INTEGER, host TEXT, proc_start TEXT,
    ended TEXT,
    teardown TEXT CHECK (teardown IN ('confirmed', 'unconfirmed', 'not-created')),
    detail TEXT NOT NULL DEFAULT ''
);
INSERT INTO runs VALUES ('old1', 'p', 'us-central1-a', 'tpulab-old1', 'v5litepod-4', 'google',
    0, 0, '2026-01-01T00:00:00+00:00', '2026-01-01T00:00:00+00:00', 'teardown', 1, 'h',
    NULL, '2026-01-01T00:10:00+00:00', 'confirmed', 'ok');
PRAGMA user_version = 1;
"""


def test_a_schema_1_journal_is_migrated_in_place(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite3"
    with sqlite3.connect(path) as conn:
        conn.executescript(_V1)
    journal = Journal(path)
    old = journal.get("old1")
    assert old is not None
    assert old.teardown == "confirmed"
    assert old.queued_resource is None
    assert journal.run_record_of("old1") is None
    journal.set_run_record("old1", tmp_path / "out" / "run.json")
    assert [(p.run_id, p.path) for p in journal.run_records()] == [
        ("old1", tmp_path / "out" / "run.json")
    ]
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 7


# A schema-4 journal: the record's pointer in the run's own row.
_V4_ROW = (
    "INSERT INTO runs (run_id, project, zone, node_name, accelerator, target, emulated, "
    "spot, started, updated, phase, ended, teardown, detail, run_record) VALUES ('r4', 'p', "
    "'us-central1-a', 'tpulab-r4', 'v5litepod-4', 'google', 0, 0, "
    "'2026-11-30T00:00:00+00:00', '2026-11-30T00:00:00+00:00', 'teardown', "
    "'2026-11-30T00:10:00+00:00', 'confirmed', 'ok', '/lab/out/run.json')"
)


def test_a_schema_4_journals_record_pointers_move_to_records(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite3"
    with sqlite3.connect(path) as conn:
        conn.executescript(_V1)
        for statement in (
            "ALTER TABLE runs ADD COLUMN queued_resource TEXT",
            "ALTER TABLE runs ADD COLUMN run_record TEXT",
            _V4_ROW,
            "PRAGMA user_version = 4",
        ):
            conn.execute(statement)
    journal = Journal(path)
    assert journal.run_records() == [RecordPointer("r4", Path("/lab/out/run.json"))]
    assert journal.run_record_of("r4") == RecordPointer("r4", Path("/lab/out/run.json"))
    assert journal.run_record_of("old1") is None
    # An exec has no row of its own (it creates no node): its record is found all the same.
    journal.set_run_record("r4-x", tmp_path / "x" / "run.json", session_run_id="r4")
    newest = journal.run_records()[0]
    assert (newest.run_id, newest.path, newest.session_run_id) == (
        "r4-x",
        tmp_path / "x" / "run.json",
        "r4",
    )
    assert journal.get("r4-x") is None


def test_a_schema_5_journals_pointers_have_no_writer_and_new_ones_name_theirs(
    tmp_path: Path,
) -> None:
    path = tmp_path / "journal.sqlite3"
    with sqlite3.connect(path) as conn:
        conn.executescript(_V1)
        for statement in (
            "ALTER TABLE runs ADD COLUMN queued_resource TEXT",
            "ALTER TABLE runs ADD COLUMN run_record TEXT",
            "CREATE TABLE records (run_id TEXT PRIMARY KEY, path TEXT NOT NULL, "
            "session_run_id TEXT, written TEXT NOT NULL)",
            "INSERT INTO records VALUES ('x5', '/lab/x5/run.json', 'old1', "
            "'2026-11-30T00:00:00+00:00')",
            "PRAGMA user_version = 5",
        ):
            conn.execute(statement)
    journal = Journal(path)
    (old,) = journal.run_records()
    assert old == RecordPointer("x5", Path("/lab/x5/run.json"), session_run_id="old1")
    assert not old.writer_alive  # a schema-5 pointer names no writer: never "still running"
    # A pointer set now names this process, alive; one set by a process that exited is not.
    journal.set_run_record("mine", tmp_path / "mine" / "run.json")
    mine = journal.run_record_of("mine")
    assert mine is not None
    assert (mine.pid, mine.writer_alive) == (os.getpid(), True)
    code = (
        "import sys; from pathlib import Path; from tpulab.cleanup.journal import Journal; "
        "Journal(Path(sys.argv[1])).set_run_record('gone', Path('/lab/gone/run.json'))"
    )
    subprocess.run([sys.executable, "-c", code, str(path)], check=True, timeout=60)
    gone = journal.run_record_of("gone")
    assert gone is not None
    assert gone.pid is not None
    assert gone.pid != os.getpid()
    assert not gone.writer_alive
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


@pytest.mark.slow
def test_runs_list_and_show_read_back_the_record(embedded_rig: Rig, tmp_path: Path) -> None:
    from test_workload_e2e import with_workload, workspace

    work = workspace(tmp_path, {"hello.py": "print('hello from the VM')\n"})
    out = tmp_path / "out"
    spec = with_workload(embedded_rig.spec(), work, out, "python", "hello.py")
    _life, _, error = embedded_rig.run(spec, journal=RunJournalAdapter())
    assert error is None, error
    pointer = Journal().run_record_of(spec.run_id)
    assert pointer is not None
    assert pointer.path == out / "run.json"

    listed = tpulab("runs", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    envelope = RunsListEnvelope.model_validate_json(listed.stdout)
    (record,) = envelope.runs
    assert record.run_id == spec.run_id
    assert record.workload.command == ["python", "hello.py"]
    assert record == RunRecord.model_validate_json((out / "run.json").read_text())

    shown = tpulab("runs", "show", spec.run_id)
    assert shown.returncode == 0, shown.stderr
    assert spec.run_id in shown.stdout
    assert "python hello.py" in shown.stdout
    assert "exit 0" in shown.stdout
    as_json = tpulab("runs", "show", spec.run_id, "--json")
    assert json.loads(as_json.stdout)["workload"]["exit_status"] == 0

    # An earlier run whose --out a later run was given (once emptied): its pointer now
    # leads to the later run's record, which is not shown as the earlier run's.
    Journal().set_run_record("20261207t000000-earlier", out / "run.json")
    listed = tpulab("runs", "list", "--json")
    envelope = RunsListEnvelope.model_validate_json(listed.stdout)
    assert [r.run_id for r in envelope.runs] == [spec.run_id]  # once, as itself
    assert envelope.unreadable["20261207t000000-earlier"] == (
        f"The run record {out / 'run.json'} is run {spec.run_id}'s now: a later run was "
        "given the same --out once this run's was emptied or deleted."
    )
    earlier = tpulab("runs", "show", "20261207t000000-earlier")
    assert earlier.returncode == EXIT_CONFIG
    assert f"is run {spec.run_id}'s now" in earlier.stderr

    # A record that was moved away is said plainly, not a traceback.
    (out / "run.json").rename(out / "moved.json")
    table = tpulab("runs", "list")
    assert table.returncode == 0
    assert "cannot be read" in table.stdout
    missing = tpulab("runs", "show", "no-such-run")
    assert missing.returncode == EXIT_CONFIG
    assert "tpulab runs list" in missing.stderr


@pytest.mark.parametrize("as_json", [True, False])
def test_damaged_records_are_each_named_and_hide_no_other(tmp_path: Path, as_json: bool) -> None:
    """A run.json that is not UTF-8 used to end `runs list` with a UnicodeDecodeError
    traceback, hiding every record; each damaged form is now its own "unreadable" line."""
    damaged = {
        "not-utf8": b"\xff\xfe{\x00",
        "empty": b"",
        "a-list": b"[]",
        "truncated": b'{"schema_version": 1, "command": "run", "run_id": "trunc',
        "a-dir": None,
    }
    journal = Journal()
    for run_id, content in damaged.items():
        out = tmp_path / run_id
        out.mkdir()
        if content is None:
            (out / "run.json").mkdir()
        else:
            (out / "run.json").write_bytes(content)
        journal.set_run_record(run_id, out / "run.json")
    listed = tpulab("runs", "list", *(["--json"] if as_json else []))
    assert listed.returncode == 0, listed.stderr
    assert "Traceback" not in listed.stderr
    if as_json:
        envelope = RunsListEnvelope.model_validate_json(listed.stdout)
        assert sorted(envelope.unreadable) == sorted(damaged)
    else:
        for run_id in damaged:
            assert run_id in listed.stdout
    shown = tpulab("runs", "show", "not-utf8")
    assert shown.returncode == EXIT_CONFIG, shown.stderr
    assert "is not a tpulab run.json" in shown.stderr
