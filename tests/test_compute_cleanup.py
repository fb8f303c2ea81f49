"""Cleanup finds Compute Engine instances too: the journal row's provider decides which API
checks and deletes its VM (the Cloud TPU API answers NOT_FOUND for an instance, which must
never close a row whose VM bills), `list` shows instances beside nodes and survives a
Compute it cannot ask, `teardown --verify` deletes leaked instances and names the gcloud
command that works for them, and `costs` never prices an unpriced type at $0.

Every instance is created through the served emulator's real Compute API (the provider's
own create); `tpulab` runs as a subprocess, as a user runs it."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from tpulab import catalog
from tpulab.app.target import compute_api
from tpulab.cleanup.costs import costs_envelope, ledger_from_rows
from tpulab.cleanup.journal import Journal, RunRow, target_for
from tpulab.cleanup.report import ListEnvelope, TeardownEnvelope
from tpulab.cloud.api import TpuApi
from tpulab.cloud.google import GoogleTpuApi
from tpulab.emulator.server import Emulator
from tpulab.emulator.timing import Timing
from tpulab.models import NodeRequest, tpulab_labels

PROJECT = "compute-clean"
ZONE = "us-central1-a"
EXIT_TEARDOWN = 6
# The emulator boots any image; the Compute provider only needs one to create.
IMAGE = "projects/ml-images/global/images/family/tpu-vm"


@pytest.fixture
def emulator(tmp_path: Path) -> Iterator[Emulator]:
    with Emulator(tmp_path / "served", timing=Timing.fast()) as emu:
        yield emu


def _instances(emulator: Emulator) -> TpuApi:
    return compute_api(PROJECT, api_endpoint=emulator.url, image=IMAGE, retry_for=10)


def _create(api: TpuApi, name: str, run_id: str, accelerator: str) -> None:
    runtime = catalog.lookup(accelerator).runtime_version  # the Cloud TPU API needs one
    request = NodeRequest(
        accelerator_type=accelerator, runtime_version=runtime, labels=tpulab_labels(run_id)
    )
    api.wait_operation(api.create_node(ZONE, name, request), timeout=30)


def _journal_dead_run(run_id: str, name: str, *, target: str, provider: str, acc: str) -> None:
    row = RunRow.for_this_process(
        run_id=run_id,
        project=PROJECT,
        zone=ZONE,
        node_name=name,
        accelerator=acc,
        target=target,
        emulated=True,
        phase="bootstrap",
        provider=provider,
    )
    Journal().open_run(RunRow(**{**row.__dict__, "pid": None}))  # its process is gone


def tpulab(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "TPULAB_ZONE": ZONE}
    return subprocess.run(
        [sys.executable, "-m", "tpulab", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
    )


def _where(emulator: Emulator) -> tuple[str, ...]:
    return ("--api-endpoint", emulator.url, "--project", PROJECT, "--zone", ZONE)


def test_a_journalled_instance_is_deleted_through_compute_not_the_tpu_api(
    emulator: Emulator,
) -> None:
    target = target_for(emulator.url)
    _create(_instances(emulator), "tpulab-vm-run", "vm-run", "v6e-4")
    _journal_dead_run("vm-run", "tpulab-vm-run", target=target, provider="compute", acc="v6e-4")
    # A Cloud TPU API orphan beside it: both providers are swept in one go.
    nodes = GoogleTpuApi(PROJECT, api_endpoint=emulator.url)
    _create(nodes, "tpulab-node-run", "node-run", "v5litepod-4")
    _journal_dead_run(
        "node-run", "tpulab-node-run", target=target, provider="tpu-api", acc="v5litepod-4"
    )
    emulator.clear_requests()

    done = tpulab("teardown", "--verify", *_where(emulator), "--yes", "--json", "--timeout", "30")

    assert done.returncode == 0, done.stderr
    report = TeardownEnvelope.model_validate_json(done.stdout)
    assert sorted(report.deleted) == ["tpulab-node-run", "tpulab-vm-run"]
    assert {found.name: found.provider for found in report.found} == {
        "tpulab-vm-run": "compute",
        "tpulab-node-run": "tpu-api",
    }
    assert sorted(report.closed_journal_rows) == ["node-run", "vm-run"]
    assert emulator.instance_names(PROJECT) == []
    assert emulator.node_names(PROJECT) == []
    assert Journal().open_runs() == []
    sent = [(r["method"], r["path"]) for r in emulator.requests()]
    vm_path = f"/compute/v1/projects/{PROJECT}/zones/{ZONE}/instances/tpulab-vm-run"
    assert ("DELETE", vm_path) in sent
    # The instance was never asked of the Cloud TPU API (which would say NOT_FOUND).
    assert not [path for _, path in sent if path.endswith("/nodes/tpulab-vm-run")]


def test_another_machines_instance_is_listed_and_deleted_by_its_label(
    emulator: Emulator,
) -> None:
    _create(_instances(emulator), "tpulab-elsewhere", "from-elsewhere", "v6e-1")

    listed = tpulab("list", *_where(emulator), "--json")
    assert listed.returncode == 0, listed.stderr
    envelope = ListEnvelope.model_validate_json(listed.stdout)
    assert [(n.name, n.provider, n.run_id) for n in envelope.nodes] == [
        ("tpulab-elsewhere", "compute", "from-elsewhere")
    ]
    assert envelope.nodes[0].journal == "not in this machine's journal"
    assert envelope.providers_unasked == {}
    table = tpulab("list", *_where(emulator))
    assert "PROVIDER" in table.stdout
    assert "compute" in table.stdout

    done = tpulab("teardown", "--verify", *_where(emulator), "--yes", "--json", "--timeout", "30")

    assert done.returncode == 0, done.stderr
    report = TeardownEnvelope.model_validate_json(done.stdout)
    assert report.deleted == ["tpulab-elsewhere"]
    assert [(f.source, f.provider) for f in report.found] == [("labels", "compute")]
    assert report.remaining == []
    assert emulator.instance_names(PROJECT) == []


def test_a_leaked_instance_is_named_with_the_compute_gcloud_command(emulator: Emulator) -> None:
    _create(_instances(emulator), "tpulab-kept", "kept-run", "v6e-4")
    _journal_dead_run(
        "kept-run", "tpulab-kept", target=target_for(emulator.url), provider="compute", acc="v6e-4"
    )

    done = tpulab("teardown", "--verify", *_where(emulator))  # no --yes, no terminal

    assert done.returncode == EXIT_TEARDOWN
    assert (
        f"gcloud compute instances delete tpulab-kept --project={PROJECT} --zone={ZONE}"
        in done.stderr
    )
    assert f"CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE={emulator.url}/compute/v1/" in done.stderr
    assert "tpu-vm delete tpulab-kept" not in done.stderr
    assert emulator.instance_names(PROJECT) == ["tpulab-kept"]


def test_list_and_teardown_with_compute_disabled_still_handle_tpu_nodes(
    emulator: Emulator,
) -> None:
    nodes = GoogleTpuApi(PROJECT, api_endpoint=emulator.url)
    _create(nodes, "tpulab-node-only", "node-only", "v5litepod-4")
    emulator.faults.disabled_services = ["compute.googleapis.com"]

    listed = tpulab("list", *_where(emulator), "--json")
    assert listed.returncode == 0, listed.stderr
    envelope = ListEnvelope.model_validate_json(listed.stdout)
    assert [(n.name, n.provider) for n in envelope.nodes] == [("tpulab-node-only", "tpu-api")]
    assert list(envelope.providers_unasked) == ["compute"]
    table = tpulab("list", *_where(emulator))
    assert table.returncode == 0, table.stderr
    assert "tpulab-node-only" in table.stdout
    said = [line for line in table.stderr.splitlines() if "could not be asked" in line]
    assert len(said) == 1, table.stderr
    assert "Compute Engine" in said[0]

    # No journal row needs Compute: the sweep deletes the node and says Compute was not asked.
    done = tpulab("teardown", "--verify", *_where(emulator), "--yes", "--json", "--timeout", "30")
    assert done.returncode == 0, done.stderr
    report = TeardownEnvelope.model_validate_json(done.stdout)
    assert report.deleted == ["tpulab-node-only"]
    assert list(report.providers_unasked) == ["compute"]
    assert emulator.node_names(PROJECT) == []


def test_a_compute_row_is_never_closed_when_compute_cannot_be_asked(emulator: Emulator) -> None:
    _create(_instances(emulator), "tpulab-hidden", "hidden-run", "v6e-4")
    _journal_dead_run(
        "hidden-run",
        "tpulab-hidden",
        target=target_for(emulator.url),
        provider="compute",
        acc="v6e-4",
    )
    emulator.faults.disabled_services = ["compute.googleapis.com"]

    listed = tpulab("list", *_where(emulator), "--json")
    assert listed.returncode == 0, listed.stderr
    assert ListEnvelope.model_validate_json(listed.stdout).journal_missing == []
    done = tpulab("teardown", "--verify", *_where(emulator), "--yes", "--json", "--timeout", "30")

    assert done.returncode == EXIT_TEARDOWN
    report = TeardownEnvelope.model_validate_json(done.stdout)
    assert f"{ZONE} (compute)" in report.list_errors
    assert any("gcloud compute instances delete tpulab-hidden" in c for c in report.manual_commands)
    [row] = Journal().open_runs()
    assert (row.run_id, row.teardown, row.provider) == ("hidden-run", None, "compute")
    assert emulator.instance_names(PROJECT) == ["tpulab-hidden"]


# Schema 6, as tpulab wrote it before rows carried their provider (a frozen copy).
_SCHEMA_6 = """
CREATE TABLE runs (
    run_id TEXT PRIMARY KEY, project TEXT NOT NULL, zone TEXT NOT NULL,
    node_name TEXT NOT NULL, accelerator TEXT NOT NULL, target TEXT NOT NULL,
    emulated INTEGER NOT NULL, spot INTEGER NOT NULL DEFAULT 0, started TEXT NOT NULL,
    updated TEXT NOT NULL, phase TEXT NOT NULL, pid INTEGER, host TEXT, proc_start TEXT,
    ended TEXT,
    teardown TEXT CHECK (teardown IN ('confirmed', 'unconfirmed', 'not-created', 'forgotten')),
    detail TEXT NOT NULL DEFAULT '', queued_resource TEXT, run_record TEXT
);
CREATE INDEX runs_by_teardown ON runs (teardown);
CREATE INDEX runs_by_node ON runs (project, zone, node_name);
CREATE TABLE records (
    run_id TEXT PRIMARY KEY, path TEXT NOT NULL, session_run_id TEXT, written TEXT NOT NULL,
    pid INTEGER, host TEXT, proc_start TEXT
);
PRAGMA user_version = 6;
"""


def test_an_old_journal_reads_its_rows_as_tpu_api_nodes_and_sweeps_them(
    emulator: Emulator,
) -> None:
    path = Journal().path
    path.parent.mkdir(parents=True, exist_ok=True)
    started = datetime.now(timezone.utc).isoformat()
    with sqlite3.connect(path) as old:
        old.executescript(_SCHEMA_6)
        old.execute(
            "INSERT INTO runs (run_id, project, zone, node_name, accelerator, target, "
            "emulated, started, updated, phase) VALUES (?, ?, ?, ?, ?, ?, 1, ?, ?, ?)",
            ("old-run", PROJECT, ZONE, "tpulab-old-run", "v5litepod-4",
             target_for(emulator.url), started, started, "bootstrap"),
        )  # fmt: skip
    old.close()
    _create(
        GoogleTpuApi(PROJECT, api_endpoint=emulator.url), "tpulab-old-run", "old-run", "v5litepod-4"
    )

    [row] = Journal().open_runs()
    assert (row.run_id, row.provider) == ("old-run", "tpu-api")
    with sqlite3.connect(path) as migrated:
        assert migrated.execute("PRAGMA user_version").fetchone()[0] >= 7
    migrated.close()
    done = tpulab("teardown", "--verify", *_where(emulator), "--yes", "--json", "--timeout", "30")
    assert done.returncode == 0, done.stderr
    assert TeardownEnvelope.model_validate_json(done.stdout).closed_journal_rows == ["old-run"]
    assert emulator.node_names(PROJECT) == []


def test_a_compute_row_round_trips_its_provider() -> None:
    journal = Journal()
    row = RunRow.for_this_process(
        run_id="vm-row", project=PROJECT, zone=ZONE, node_name="tpulab-vm-row",
        accelerator="tpu7x-8", target="google", emulated=False, provider="compute",
    )  # fmt: skip
    journal.open_run(row)
    stored = journal.get("vm-row")
    assert stored is not None
    assert stored.provider == "compute"


def test_costs_counts_instances_and_says_an_unpriced_type_is_unknown() -> None:
    now = datetime.now(timezone.utc)
    rows = [
        RunRow(
            run_id=run_id,
            project=PROJECT,
            zone=ZONE,
            node_name=f"tpulab-{run_id}",
            accelerator=acc,
            target="google",
            emulated=False,
            started=now - timedelta(hours=1),
            provider="compute",
        )
        for run_id, acc in (("ironwood", "tpu7x-8"), ("trillium", "v6e-4"))
    ]
    found = ledger_from_rows(rows, now=now)
    by_run = {entry.row.run_id: entry for entry in found.entries}
    assert by_run["ironwood"].estimated_cost is None  # no cited price: unknown, not $0
    assert by_run["ironwood"].price_per_hour is None
    assert by_run["trillium"].estimated_cost is not None
    assert by_run["trillium"].estimated_cost > 0
    assert found.total.unpriced == 1
    report = json.loads(costs_envelope(found).model_dump_json())
    assert {e["run_id"]: e["provider"] for e in report["entries"]} == {
        "ironwood": "compute",
        "trillium": "compute",
    }
