"""Queued resources never outlive their run: real `tpulab run --queued` subprocesses
against an emulator served from this test process, interrupted while the queued
resource waits for capacity (SIGINT: the run deletes it itself and exits 130; SIGKILL:
it stays, as in the cloud, and `tpulab teardown --verify` deletes it), `tpulab list`
showing one that waits, and the journal's schema 1 -> 2 migration keeping old rows."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest
from helpers import tpulab

from tpulab.cleanup.journal import SCHEMA_VERSION, Journal, RunRow
from tpulab.emulator.server import Emulator
from tpulab.emulator.timing import Timing

PROJECT = "qr-proj"
ZONE = "us-central1-a"
EXIT_INTERRUPTED = 130
pytest_plugins = ["emulator_fixtures"]
# Default signal dispositions whatever the runner inherited (see test_interruptions.py).
LAUNCHER = (
    "import os, signal, sys\n"
    "for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):\n"
    "    signal.signal(s, signal.SIG_DFL)\n"
    "os.execv(sys.executable, [sys.executable, '-m', 'tpulab', *sys.argv[1:]])\n"
)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Emulator]:
    emulator = Emulator(tmp_path / "emulator", timing=Timing.fast())
    emulator.start()
    # Capacity never arrives while the test looks: the queued resource stays WAITING.
    emulator.faults.capacity_after = {ZONE: 3600.0}
    try:
        yield emulator
    finally:
        emulator.stop()


def _queued(emulator: Emulator) -> dict[str, dict[str, object]]:
    return emulator.snapshot().get("queued_resources", {})  # type: ignore[no-any-return]


def _start_waiting_run(emulator: Emulator, name: str, tmp: Path) -> subprocess.Popen[str]:
    """A `run --queued` whose queued resource is WAITING_FOR_RESOURCES, with its journal
    row in phase create: where a user's Ctrl-C (or a dead laptop) meets it."""
    process = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, "run", "--accelerator", "v5litepod-4",
         "--api-endpoint", emulator.url, "--project", PROJECT, "--zone", ZONE,
         "--name", name, "--queued", "--valid-for", "10m", "--json"],
        stdin=subprocess.DEVNULL,
        stdout=(tmp / f"{name}.out").open("w"),
        stderr=(tmp / f"{name}.err").open("w"),
        text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert process.poll() is None, (tmp / f"{name}.err").read_text()[-2000:]
        record = _queued(emulator).get(f"{PROJECT}/{ZONE}/{name}")
        rows = Journal().runs_for_node(PROJECT, ZONE, name)
        waiting = bool(record) and record["state"] == "WAITING_FOR_RESOURCES"  # type: ignore[index]
        if waiting and rows and (rows[0].phase, rows[0].queued_resource) == ("create", name):
            return process
        time.sleep(0.05)
    process.kill()
    raise AssertionError(f"{name} never waited for capacity")


def test_sigint_during_the_queue_wait_deletes_everything_exit_130(
    served: Emulator, tmp_path: Path
) -> None:
    name = "tpulab-qr-sigint"
    process = _start_waiting_run(served, name, tmp_path)
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=120) == EXIT_INTERRUPTED
    report = json.loads((tmp_path / f"{name}.out").read_text())
    assert report["error"]["type"] == "InterruptedRun"
    assert report["teardown"]["confirmed"] is True
    assert _queued(served) == {}
    assert served.node_names() == []
    deletes = [r for r in served.requests() if r["method"] == "DELETE"]
    assert [d["path"].rsplit("/", 1)[-1] for d in deletes] == [name]
    assert ["force", "true"] in deletes[0]["query"]
    (row,) = Journal().runs_for_node(PROJECT, ZONE, name)
    assert row.teardown == "confirmed"


def test_sigkill_while_waiting_then_teardown_verify_deletes_the_queued_resource(
    served: Emulator, tmp_path: Path
) -> None:
    name = "tpulab-qr-sigkill"
    process = _start_waiting_run(served, name, tmp_path)
    process.kill()
    process.wait(timeout=30)
    # As in the cloud: the queued resource outlives the controller.
    assert list(_queued(served)) == [f"{PROJECT}/{ZONE}/{name}"]
    (row,) = Journal().runs_for_node(PROJECT, ZONE, name)
    assert row.teardown is None

    listed = tpulab("list", "--api-endpoint", served.url, "--project", PROJECT, "--zone", ZONE,
                    "--json")  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    (shown,) = json.loads(listed.stdout)["nodes"]
    assert shown["name"] == name
    assert shown["queued_resource"] == name
    assert shown["queued_state"] == "WAITING_FOR_RESOURCES"
    assert shown["estimated_cost_usd"] == 0.0  # waiting is not billing

    swept = tpulab("teardown", "--verify", "--yes", "--json", "--run-id", row.run_id,
                   "--api-endpoint", served.url, "--project", PROJECT,
                   "--timeout", "60")  # fmt: skip
    assert swept.returncode == 0, swept.stderr + swept.stdout
    assert _queued(served) == {}
    assert served.node_names() == []
    (closed,) = Journal().runs_for_node(PROJECT, ZONE, name)
    assert closed.teardown == "confirmed"


def test_teardown_verify_force_deletes_an_active_queued_resource_and_its_node(
    served: Emulator, tmp_path: Path
) -> None:
    """Found by labels alone (no journal row): the node spec's labels say it is ours."""
    from emulator_fixtures import api_for, node_request

    from tpulab.cloud.api import QueuedResourceRequest

    served.faults.capacity_after = {}
    api = api_for(served, project=PROJECT)
    request = QueuedResourceRequest(node_id="tpulab-qr-active", node=node_request(run_id="r-9"))
    api.wait_operation(api.create_queued_resource(ZONE, "tpulab-qr-active", request), timeout=20)
    deadline = time.monotonic() + 30
    while api.get_queued_resource(ZONE, "tpulab-qr-active").state != "ACTIVE":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    swept = tpulab("teardown", "--verify", "--yes", "--json", "--api-endpoint", served.url,
                   "--project", PROJECT, "--zone", ZONE, "--timeout", "60")  # fmt: skip
    assert swept.returncode == 0, swept.stderr + swept.stdout
    assert _queued(served) == {}
    assert served.node_names() == []
    kinds = [r["path"].split("/")[-2] for r in served.requests() if r["method"] == "DELETE"]
    assert kinds == ["queuedResources"]  # its node went with it (force), not separately


_SCHEMA_1 = """
CREATE TABLE runs (
    run_id TEXT PRIMARY KEY, project TEXT NOT NULL, zone TEXT NOT NULL,
    node_name TEXT NOT NULL, accelerator TEXT NOT NULL, target TEXT NOT NULL,
    emulated INTEGER NOT NULL, spot INTEGER NOT NULL DEFAULT 0, started TEXT NOT NULL,
    updated TEXT NOT NULL, phase TEXT NOT NULL, pid INTEGER, host TEXT, proc_start TEXT,
    ended TEXT,
    teardown TEXT CHECK (teardown IN ('confirmed', 'unconfirmed', 'not-created')),
    detail TEXT NOT NULL DEFAULT ''
);
"""


def test_a_schema_1_journal_is_migrated_and_keeps_its_open_rows(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite3"
    with sqlite3.connect(path) as conn:
        conn.executescript(_SCHEMA_1)
        now = datetime.now(timezone.utc).isoformat()
        conn.execute(
            "INSERT INTO runs (run_id, project, zone, node_name, accelerator, target, "
            "emulated, started, updated, phase) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            ("old-run", "p", ZONE, "tpulab-old", "v5litepod-4", "google", 0, now, now, "create"),
        )
        conn.execute("PRAGMA user_version = 1")
    journal = Journal(path)
    (old,) = journal.open_runs()
    assert (old.run_id, old.queued_resource) == ("old-run", None)
    journal.open_run(
        RunRow(
            run_id="new-run",
            project="p",
            zone=ZONE,
            node_name="tpulab-new",
            accelerator="v5litepod-4",
            target="google",
            emulated=False,
            started=datetime.now(timezone.utc),
            queued_resource="tpulab-new",
        )
    )
    got = journal.get("new-run")
    assert got is not None
    assert got.queued_resource == "tpulab-new"
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
