"""`tpulab teardown --verify` as a user runs it: a subprocess against a served emulator."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tpulab import paths
from tpulab.app.embedded import emulated_target
from tpulab.cleanup.journal import TARGET_EMULATE, Journal, RunRow, target_for
from tpulab.cleanup.report import TeardownEnvelope
from tpulab.cloud.google import GoogleTpuApi
from tpulab.emulator.server import Emulator
from tpulab.emulator.timing import Timing
from tpulab.models import NodeRequest, tpulab_labels

PROJECT = "cli-proj"
ZONE = "us-central1-a"
EXIT_TEARDOWN = 6


@pytest.fixture
def emulator(tmp_path: Path) -> Iterator[Emulator]:
    with Emulator(tmp_path / "served", timing=Timing.fast()) as emu:
        yield emu


def _create(api: GoogleTpuApi, name: str, labels: dict[str, str]) -> None:
    request = NodeRequest(
        accelerator_type="v5litepod-4", runtime_version="v2-alpha-tpuv5-lite", labels=labels
    )
    api.wait_operation(api.create_node(ZONE, name, request), timeout=30)


def _killed_run(api: GoogleTpuApi, run_id: str, target: str) -> str:
    name = f"tpulab-{run_id}"
    row = RunRow.for_this_process(
        run_id=run_id,
        project=api.project,
        zone=ZONE,
        node_name=name,
        accelerator="v5litepod-4",
        target=target,
        emulated=True,
        phase="bootstrap",
    )
    Journal().open_run(RunRow(**{**row.__dict__, "pid": None}))  # its process is gone
    _create(api, name, tpulab_labels(run_id))
    return name


def tpulab(*args: str, stdin: int | None = subprocess.DEVNULL) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "TPULAB_ZONE": ZONE}
    return subprocess.run(
        [sys.executable, "-m", "tpulab", *args],
        stdin=stdin,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def _json(done: subprocess.CompletedProcess[str]) -> TeardownEnvelope:
    """The printed `--json` document, parsed by its model (the printed output is the
    contract; its schema is pinned by test_envelopes)."""
    data = TeardownEnvelope.model_validate_json(done.stdout)
    assert data.schema_version == 1
    assert data.command == "teardown"
    return data


def test_teardown_without_verify_is_a_usage_error() -> None:
    done = tpulab("teardown")
    assert done.returncode == 2
    assert "teardown needs --verify" in done.stderr


def test_verify_deletes_orphans_closes_rows_and_spares_foreign_nodes(emulator: Emulator) -> None:
    api = GoogleTpuApi(PROJECT, api_endpoint=emulator.url)
    orphan = _killed_run(api, "killed-cli", target_for(emulator.url))
    _create(api, "tpulab-not-ours", {})
    done = tpulab(
        "teardown", "--verify", "--api-endpoint", emulator.url, "--project", PROJECT,
        "--yes", "--json", "--timeout", "30",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    data = _json(done)
    assert data.ok is True
    assert data.error is None
    assert data.deleted == [orphan]
    assert data.remaining == []
    assert data.closed_journal_rows == ["killed-cli"]
    assert data.untouched_unlabelled == ["tpulab-not-ours"]
    [found] = data.found
    assert (found.name, found.run_id, found.source) == (orphan, "killed-cli", "journal+labels")
    assert found.accelerator_type == "v5litepod-4"
    assert found.estimated_cost_usd is not None
    assert emulator.node_names(PROJECT) == ["tpulab-not-ours"]
    assert Journal().open_runs() == []
    # The delete's wait is said (on stderr: --json keeps stdout for the envelope).
    assert (
        f"Deleting 1 node(s) ({orphan}); waiting until a list confirms each gone..."
    ) in done.stderr
    again = tpulab("teardown", "--verify", "--api-endpoint", emulator.url, "--project", PROJECT)
    assert again.returncode == 0, again.stderr
    assert "Verified: no tpulab node remains in us-central1-a" in again.stdout


def test_without_a_terminal_and_without_yes_nothing_is_deleted(emulator: Emulator) -> None:
    api = GoogleTpuApi(PROJECT, api_endpoint=emulator.url)
    orphan = _killed_run(api, "needs-yes", target_for(emulator.url))
    done = tpulab("teardown", "--verify", "--api-endpoint", emulator.url, "--project", PROJECT)
    assert done.returncode == EXIT_TEARDOWN
    assert orphan in done.stdout  # shown in the table, with its age and cost
    assert "stdin is not a terminal" in done.stderr
    assert f"gcloud compute tpus tpu-vm delete {orphan} --project={PROJECT}" in done.stderr
    assert emulator.node_names(PROJECT) == [orphan]
    assert [row.run_id for row in Journal().open_runs()] == ["needs-yes"]


def test_dry_run_reports_and_touches_nothing(emulator: Emulator) -> None:
    api = GoogleTpuApi(PROJECT, api_endpoint=emulator.url)
    orphan = _killed_run(api, "dry", target_for(emulator.url))
    done = tpulab(
        "teardown", "--verify", "--dry-run", "--yes", "--json",
        "--api-endpoint", emulator.url, "--project", PROJECT,
    )  # fmt: skip
    assert done.returncode == EXIT_TEARDOWN
    data = _json(done)
    assert data.ok is False
    assert data.dry_run is True
    assert data.deleted == []
    assert data.remaining is None
    assert [node.name for node in data.found] == [orphan]
    manual = f"gcloud compute tpus tpu-vm delete {orphan} --project={PROJECT} --zone={ZONE} --quiet"
    endpoint = f"CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU={emulator.url.rstrip('/')}/ "
    assert data.manual_commands == [endpoint + "CLOUDSDK_AUTH_DISABLE_CREDENTIALS=true " + manual]
    assert data.error is not None
    assert data.error.type == "TeardownError"
    assert data.error.exit_status == EXIT_TEARDOWN
    assert emulator.node_names(PROJECT) == [orphan]


def test_a_hanging_delete_exits_with_the_teardown_status(emulator: Emulator) -> None:
    api = GoogleTpuApi(PROJECT, api_endpoint=emulator.url)
    orphan = _killed_run(api, "hangs", target_for(emulator.url))
    emulator.faults.update({"delete_hangs": True})
    done = tpulab(
        "teardown", "--verify", "--yes", "--timeout", "2",
        "--api-endpoint", emulator.url, "--project", PROJECT,
    )  # fmt: skip
    assert done.returncode == EXIT_TEARDOWN
    assert "Teardown NOT confirmed" in done.stderr
    assert f"gcloud compute tpus tpu-vm delete {orphan}" in done.stderr
    assert "Verified" not in done.stdout
    row = Journal().get("hangs")
    assert row is not None
    assert row.teardown == "unconfirmed"


def test_a_corrupted_journal_falls_back_to_labels(emulator: Emulator) -> None:
    api = GoogleTpuApi(PROJECT, api_endpoint=emulator.url)
    orphan = _killed_run(api, "corrupt", target_for(emulator.url))
    journal = paths.journal_path()
    for suffix in ("-wal", "-shm"):
        Path(f"{journal}{suffix}").unlink(missing_ok=True)
    journal.write_bytes(b"\x13garbage" * 500)
    done = tpulab(
        "teardown", "--verify", "--yes", "--zone", ZONE,
        "--api-endpoint", emulator.url, "--project", PROJECT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Journal unreadable; searched by labels only" in done.stdout
    assert "Traceback" not in done.stderr
    assert f"Deleted and confirmed gone: {orphan}" in done.stdout
    assert emulator.node_names(PROJECT) == []


def test_emulate_sweeps_the_embedded_emulators_state() -> None:
    state = paths.emulator_state_dir()
    state.mkdir(parents=True)
    (state / "timing.json").write_text(json.dumps({"create_seconds": 0.1, "delete_seconds": 0.1}))
    with emulated_target(PROJECT) as target:
        orphan = _killed_run(target.api, "emulated", TARGET_EMULATE)
        _create(target.api, "foreign", {})
    done = tpulab("teardown", "--verify", "--emulate", "--project", PROJECT, "--yes", "--json")
    assert done.returncode == 0, done.stderr
    assert _json(done).deleted == [orphan]
    with emulated_target(PROJECT) as target:
        assert target.emulator.node_names(PROJECT) == ["foreign"]


def test_a_live_run_is_skipped_not_reported_as_billing(emulator: Emulator) -> None:
    """A run still in progress here tears its own node down: skipping it is not a leak,
    so no exit 6, no "may still be billing", no delete command for its node."""
    api = GoogleTpuApi(PROJECT, api_endpoint=emulator.url)
    name = "tpulab-live-cli"
    Journal().open_run(
        RunRow.for_this_process(  # this test process is the run's (live) owner
            run_id="live-cli",
            project=PROJECT,
            zone=ZONE,
            node_name=name,
            accelerator="v5litepod-4",
            target=target_for(emulator.url),
            emulated=True,
            phase="execute",
        )
    )
    _create(api, name, tpulab_labels("live-cli"))
    done = tpulab("teardown", "--verify", "--yes", "--api-endpoint", emulator.url,
                  "--project", PROJECT)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "still in progress" in done.stdout
    assert "billing" not in done.stdout + done.stderr
    assert "gcloud compute tpus tpu-vm delete" not in done.stdout + done.stderr
    assert emulator.node_names(PROJECT) == [name]  # left to its own run


def test_include_sessions_with_forget_is_refused_before_anything_is_contacted() -> None:
    from helpers import invoke

    status, _, err = invoke(
        "teardown", "--forget", "--include-sessions", "--api-endpoint", "http://127.0.0.1:9"
    )
    assert status == 2
    assert "--include-sessions applies to --verify, not --forget." in err
