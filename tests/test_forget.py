"""`tpulab teardown --forget` (issue 10 #3): close the journal rows of an endpoint that is gone.

A served emulator stopped after a run was killed leaves rows no sweep can close: every
`teardown --verify` for it fails to list and exits 6, and every other sweep points at
it. `--forget` closes them as "forgotten (target gone)" -- only after the endpoint
refused the connection, only after a confirmation (or --yes), and never for Google.
The CLI runs as a user runs it (a subprocess); the endpoint is a real emulator, stopped.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING

from helpers import killed_run, tpulab
from pty_screen import answer_prompts

from tpulab.cleanup.journal import SCHEMA_VERSION, Journal, RunRow

if TYPE_CHECKING:
    from emulator_fixtures import EmulatorStarter

pytest_plugins = ["emulator_fixtures"]

PROJECT = "test-project"
ZONE = "us-central1-a"


def gone_endpoint(start_emulator: EmulatorStarter, tmp_path: Path, *run_ids: str) -> str:
    """Runs killed against a served emulator that was then stopped: its URL."""
    from emulator_fixtures import api_for

    emulator = start_emulator(tmp_path / "served")
    api = api_for(emulator)
    for run_id in run_ids:
        killed_run(api, run_id)
    emulator.stop()
    return emulator.url


def test_forget_closes_the_rows_of_a_stopped_emulator_and_the_nags_stop(
    start_emulator: EmulatorStarter, tmp_path: Path
) -> None:
    url = gone_endpoint(start_emulator, tmp_path, "gone-1", "gone-2")
    forget = f"tpulab teardown --forget --api-endpoint {url} --project {PROJECT}"

    # Before: a sweep of that endpoint cannot list, and its error now says how to close
    # the rows (the sweep itself, with short retries: a dead endpoint never answers).

    from tpulab.cleanup.report import teardown_error
    from tpulab.cleanup.sweep import find_orphans
    from tpulab.cloud.google import GoogleTpuApi

    dead = GoogleTpuApi(PROJECT, api_endpoint=url, retry_for=0.5)
    plan = find_orphans(dead, target=url, list_for=0.5)
    error = teardown_error(plan, None, "")
    assert error is not None
    assert ZONE in plan.list_errors
    assert f"{forget} --run-id gone-1" in (error.hint or "")
    assert {node.name for node in error.leaked} == {"tpulab-gone-1", "tpulab-gone-2"}
    # ...and a sweep of another target points at it, with the way out.
    other = tpulab("teardown", "--verify", "--emulate", "--yes")
    assert other.returncode == 0, other.stderr
    assert f"{forget} --run-id gone-1" in other.stdout

    done = tpulab("teardown", "--forget", "--api-endpoint", url, "--project", PROJECT, "--yes")
    assert done.returncode == 0, done.stderr
    assert "refused" in done.stdout or "Connection refused" in done.stdout
    assert "Nothing can confirm these nodes are gone" in done.stdout
    assert "Forgotten (target gone): gone-1, gone-2." in done.stdout
    journal = Journal()
    for run_id in ("gone-1", "gone-2"):
        row = journal.get(run_id)
        assert row is not None
        assert row.teardown == "forgotten"
        assert not row.needs_teardown
        assert "forgotten (target gone)" in row.detail
        assert "Connection refused" in row.detail
    assert journal.open_runs() == []

    quiet = tpulab("teardown", "--verify", "--emulate", "--yes")
    assert quiet.returncode == 0, quiet.stderr
    assert "another target" not in quiet.stdout
    assert "--forget" not in quiet.stdout


def test_forget_refuses_while_the_endpoint_answers(
    start_emulator: EmulatorStarter, tmp_path: Path
) -> None:
    from emulator_fixtures import api_for

    emulator = start_emulator(tmp_path / "served")
    killed_run(api_for(emulator), "alive-1")
    refused = tpulab(
        "teardown", "--forget", "--api-endpoint", emulator.url, "--project", PROJECT, "--yes"
    )
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "answers" in refused.stderr
    assert "not forgotten" in refused.stderr
    assert "tpulab teardown --verify" in refused.stderr
    row = Journal().get("alive-1")
    assert row is not None
    assert row.needs_teardown
    assert emulator.node_names() == ["tpulab-alive-1"]  # forget never deletes anything


def test_forget_refuses_google_and_the_embedded_emulator_before_any_call() -> None:
    for where in (
        [],
        ["--api-endpoint", "https://tpu.googleapis.com"],
        ["--api-endpoint", "https://us-central1-tpu.googleapis.com"],
        ["--emulate"],
    ):
        refused = tpulab("teardown", "--forget", *where, "--project", PROJECT, "--yes")
        assert refused.returncode == 2, (where, refused.stderr)
        assert "--forget needs the --api-endpoint of a target that no longer exists" in (
            refused.stderr
        ), where
        assert "tpulab teardown --verify" in refused.stderr
    both = tpulab("teardown", "--verify", "--forget", "--emulate")
    assert both.returncode == 2
    assert "not both" in both.stderr


def test_forget_without_a_terminal_or_yes_changes_nothing(
    start_emulator: EmulatorStarter, tmp_path: Path
) -> None:
    url = gone_endpoint(start_emulator, tmp_path, "ask-1")
    refused = tpulab("teardown", "--forget", "--api-endpoint", url, "--project", PROJECT)
    assert refused.returncode == 2
    assert "stdin is not a terminal and --yes was not given" in refused.stderr
    dry = tpulab("teardown", "--forget", "--api-endpoint", url, "--project", PROJECT, "--dry-run")
    assert dry.returncode == 0
    assert "Dry run: nothing was changed." in dry.stdout
    nothing = tpulab("teardown", "--forget", "--api-endpoint", url, "--project", "other-proj")
    assert nothing.returncode == 2
    assert "No open journal row" in nothing.stderr
    row = Journal().get("ask-1")
    assert row is not None
    assert row.needs_teardown


def test_forget_asks_on_a_terminal_and_honours_the_answer(
    start_emulator: EmulatorStarter, tmp_path: Path
) -> None:
    url = gone_endpoint(start_emulator, tmp_path, "tty-1")
    args = ["teardown", "--forget", "--api-endpoint", url, "--project", PROJECT]
    status, screen = answer_prompts(args, ["n"])
    assert status == 0, screen
    assert "Forget 1 journal row(s)? [y/N]" in screen
    assert "Not forgotten (declined): nothing was changed." in screen
    row = Journal().get("tty-1")
    assert row is not None
    assert row.needs_teardown

    status, screen = answer_prompts(args, ["y"])
    assert status == 0, screen
    assert "Forgotten (target gone): tty-1." in screen
    row = Journal().get("tty-1")
    assert row is not None
    assert row.teardown == "forgotten"


# The journal as tpulab before `forget` wrote it (schema 1): its CHECK knew no "forgotten".
_SCHEMA_1 = """
CREATE TABLE runs (
    run_id      TEXT PRIMARY KEY,
    project     TEXT NOT NULL,
    zone        TEXT NOT NULL,
    node_name   TEXT NOT NULL,
    accelerator TEXT NOT NULL,
    target      TEXT NOT NULL,
    emulated    INTEGER NOT NULL,
    spot        INTEGER NOT NULL DEFAULT 0,
    started     TEXT NOT NULL,
    updated     TEXT NOT NULL,
    phase       TEXT NOT NULL,
    pid         INTEGER,
    host        TEXT,
    proc_start  TEXT,
    ended       TEXT,
    teardown    TEXT CHECK (teardown IN ('confirmed', 'unconfirmed', 'not-created')),
    detail      TEXT NOT NULL DEFAULT ''
);
CREATE INDEX runs_by_teardown ON runs (teardown);
CREATE INDEX runs_by_node ON runs (project, zone, node_name);
"""


def test_a_journal_of_the_previous_schema_is_upgraded_with_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite"
    with sqlite3.connect(path) as conn:
        conn.executescript(_SCHEMA_1)
        conn.execute(
            "INSERT INTO runs VALUES ('old-1', 'p', 'us-central1-a', 'tpulab-old-1', "
            "'v5litepod-4', 'http://127.0.0.1:9', 1, 0, '2026-01-01T00:00:00+00:00', "
            "'2026-01-01T00:00:00+00:00', 'execute', NULL, 'h', NULL, "
            "'2026-01-01T00:10:00+00:00', 'unconfirmed', 'Teardown NOT confirmed')"
        )
        conn.execute("PRAGMA user_version = 1")
    conn.close()
    journal = Journal(path)
    (row,) = journal.open_runs()
    assert row.run_id == "old-1"
    assert row.teardown == "unconfirmed"
    journal.close_run("old-1", "forgotten", "forgotten (target gone)")
    reread = Journal(path).get("old-1")
    assert reread is not None
    assert reread.teardown == "forgotten"
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        indexes = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='index'")}
    conn.close()
    assert {"runs_by_teardown", "runs_by_node"} <= indexes
    # A new row still goes in, with every column.
    journal.open_run(
        RunRow.for_this_process(
            run_id="new-1",
            project="p",
            zone=ZONE,
            node_name="tpulab-new-1",
            accelerator="v5litepod-4",
            target="google",
            emulated=False,
        )
    )
    assert [r.run_id for r in journal.open_runs()] == ["new-1"]
