"""The sweep against the emulator through the real Google client: find by journal and by
label, delete only tpulab's nodes, close rows only on evidence, never claim false success."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from delegating_api import DelegatingTpuApi
from helpers import create_ready_node, killed_run

from tpulab.cleanup.journal import TARGET_EMULATE, Journal, RunRow, target_for
from tpulab.cleanup.sweep import (
    SweepPlan,
    SweepResult,
    find_orphans,
    sweep,
    sweep_command_for,
    verify_clean,
)
from tpulab.cloud.google import GoogleTpuApi
from tpulab.emulator.server import Emulator
from tpulab.emulator.timing import Timing
from tpulab.errors import ConfigError, PermissionDeniedError
from tpulab.models import MANAGED_BY_LABEL, MANAGED_BY_VALUE, tpulab_labels

PROJECT = "sweep-proj"
ZONE = "us-central1-a"
ZONE_B = "us-west1-c"
ACCEL = "v5litepod-4"
RUNTIME = "v2-alpha-tpuv5-lite"


@pytest.fixture(scope="module")
def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.fixture
def emulator(tmp_path: Path) -> Iterator[Emulator]:
    with Emulator(tmp_path / "emulator", timing=Timing.fast()) as emu:
        yield emu


@pytest.fixture
def api(emulator: Emulator) -> GoogleTpuApi:
    return GoogleTpuApi(PROJECT, api_endpoint=emulator.url)


@pytest.fixture
def journal(tmp_path: Path) -> Journal:
    return Journal(tmp_path / "journal.sqlite3")


def _short_sleep(seconds: float) -> None:
    time.sleep(min(seconds, 0.05))  # keep the sweep's retry and poll schedule, not its waits


# How long the sweep rides out a failing list: long enough for a short 503 burst.
_LIST_FOR = 2.0


def _fast_sweep(
    api: GoogleTpuApi,
    journal: Journal,
    *,
    zones: Sequence[str] = (),
    run_id: str | None = None,
    include_live: bool = False,
    list_for: float = _LIST_FOR,
) -> tuple[SweepPlan, SweepResult]:
    plan = find_orphans(
        api,
        target=target_for(api.api_endpoint),
        zones=zones,
        run_id=run_id,
        journal=journal,
        include_live=include_live,
        list_for=list_for,
        sleep=_short_sleep,
    )
    result = sweep(
        api,
        plan,
        journal=journal,
        timeout=20,
        poll=0.05,
        max_poll=0.2,
        list_for=list_for,
        sleep=_short_sleep,
    )
    return plan, result


def test_journal_and_labels_find_orphans_and_foreign_nodes_survive(
    api: GoogleTpuApi, journal: Journal, emulator: Emulator, dead_pid: int
) -> None:
    killed = killed_run(api, "killed-1", journal=journal, pid=dead_pid)
    create_ready_node(api, "tpulab-from-laptop-2", tpulab_labels("elsewhere-1"))  # no row here
    create_ready_node(api, "tpulab-lookalike", {"team": "research"})  # our naming, not our labels
    create_ready_node(api, "users-own-node", {})
    plan, result = _fast_sweep(api, journal, zones=[ZONE])
    assert {c.node.name: c.source for c in plan.candidates} == {
        killed: "journal+labels",
        "tpulab-from-laptop-2": "labels",
    }
    assert [n.name for n in plan.lookalikes] == ["tpulab-lookalike"]
    assert all(c.age_seconds is not None and c.age_seconds >= 0 for c in plan.candidates)
    assert all(c.estimated_cost is not None for c in plan.candidates)
    assert result.ok, result
    assert sorted(c.node.name for c in result.deleted) == sorted([killed, "tpulab-from-laptop-2"])
    assert result.closed_rows == ["killed-1"]
    assert emulator.node_names(PROJECT) == ["tpulab-lookalike", "users-own-node"]
    row = journal.get("killed-1")
    assert row is not None
    assert row.teardown == "confirmed"
    assert journal.open_runs() == []


def test_run_id_touches_exactly_one_run(
    api: GoogleTpuApi, journal: Journal, emulator: Emulator, dead_pid: int
) -> None:
    first = killed_run(api, "run-a", journal=journal, pid=dead_pid)
    second = killed_run(api, "run-b", journal=journal, pid=dead_pid)
    plan, result = _fast_sweep(api, journal, run_id="run-a")  # zone comes from the journal
    assert plan.zones == [ZONE]
    assert [c.node.name for c in plan.candidates] == [first]
    assert result.ok
    assert emulator.node_names(PROJECT) == [second]
    assert [row.run_id for row in journal.open_runs()] == ["run-b"]


def test_journal_zones_are_searched_beyond_the_configured_one(
    api: GoogleTpuApi, journal: Journal, emulator: Emulator, dead_pid: int
) -> None:
    killed_run(api, "east-run", journal=journal, pid=dead_pid, zone=ZONE_B)
    plan, result = _fast_sweep(api, journal, zones=[ZONE])
    assert plan.zones == [ZONE, ZONE_B]
    assert result.ok
    assert emulator.node_names(PROJECT) == []


def test_a_live_run_is_left_to_tear_itself_down(
    api: GoogleTpuApi, journal: Journal, emulator: Emulator
) -> None:
    live = killed_run(api, "live-run", journal=journal, pid=os.getpid())  # this process is alive
    journal.open_run(
        RunRow.for_this_process(
            run_id="live-creating",
            project=PROJECT,
            zone=ZONE,
            node_name="tpulab-live-creating",
            accelerator=ACCEL,
            target=target_for(api.api_endpoint),
            emulated=True,
        )
    )
    plan, result = _fast_sweep(api, journal, zones=[ZONE])
    assert [c.node.name for c in plan.live] == [live]
    assert plan.candidates == []
    assert plan.stale_rows == []  # "live-creating" may not have its node yet
    # Its own process is tearing it down: live, not left behind (issue: live runs skipped
    # are not "unconfirmed").
    assert result.ok
    assert result.remaining == []
    assert [n.name for n in result.live] == [live]
    assert {row.run_id for row in journal.open_runs()} == {"live-run", "live-creating"}
    plan, result = _fast_sweep(api, journal, zones=[ZONE], include_live=True)
    assert result.ok
    assert emulator.node_names(PROJECT) == []
    assert journal.open_runs() == []


def test_rows_without_nodes_are_closed_only_when_their_zone_was_listed(
    api: GoogleTpuApi, journal: Journal, emulator: Emulator, dead_pid: int
) -> None:
    killed_run(api, "never-created", journal=journal, pid=dead_pid, create=False)
    api = GoogleTpuApi(PROJECT, api_endpoint=emulator.url, retry_for=0)  # fail fast
    emulator.faults.update({"transient": {"list_nodes": 1000}})
    # A list that never answers: any ride-out ends in failure, so a short one will do.
    plan, result = _fast_sweep(api, journal, zones=[ZONE], list_for=0.3)
    assert ZONE in plan.list_errors
    assert plan.stale_rows == []
    assert not result.ok
    assert ZONE in result.list_errors
    assert [row.run_id for row in journal.open_runs()] == ["never-created"]
    emulator.faults.reset()
    plan, result = _fast_sweep(api, journal, zones=[ZONE])
    assert [row.run_id for row in plan.stale_rows] == ["never-created"]
    assert result.ok
    assert result.closed_rows == ["never-created"]
    assert journal.open_runs() == []


def test_transient_errors_on_list_and_delete_still_converge(
    api: GoogleTpuApi, journal: Journal, emulator: Emulator, dead_pid: int
) -> None:
    killed_run(api, "flaky", journal=journal, pid=dead_pid)
    emulator.faults.update({"transient": {"list_nodes": 3, "delete_node": 2}, "delete_failures": 1})
    _plan, result = _fast_sweep(api, journal, zones=[ZONE])
    assert result.ok, (result.failed, result.list_errors)
    assert emulator.node_names(PROJECT) == []
    assert journal.open_runs() == []


def test_a_hanging_delete_is_never_reported_as_success(
    api: GoogleTpuApi, journal: Journal, emulator: Emulator, dead_pid: int
) -> None:
    name = killed_run(api, "stuck", journal=journal, pid=dead_pid)
    emulator.faults.update({"delete_hangs": True})
    plan = find_orphans(api, target=target_for(api.api_endpoint), zones=[ZONE], journal=journal)
    result = sweep(api, plan, journal=journal, timeout=1.5, poll=0.05, max_poll=0.2)
    assert not result.ok
    assert [c.node.name for c, _ in result.failed] == [name]
    assert [n.name for n in result.remaining] == [name]
    leaked = result.leaked(plan.target)
    assert [n.name for n in leaked] == [name]
    assert f"delete {name} --project={PROJECT} --zone={ZONE}" in leaked[0].manual_delete_command()
    row = journal.get("stuck")
    assert row is not None
    assert row.teardown == "unconfirmed"
    assert [r.run_id for r in journal.open_runs()] == ["stuck"]  # still needs a sweep


class RefusingDeletes(DelegatingTpuApi):
    """The real client for everything except DeleteNode, which is always refused with a
    non-transient error (here 403 on delete alone, as a too-narrow IAM role gives)."""

    def __init__(self, api: GoogleTpuApi) -> None:
        super().__init__(api)
        self.refused = 0

    def delete_node(self, zone: str, node_id: str) -> str:
        self.refused += 1
        raise PermissionDeniedError("tpu.nodes.delete denied", status="PERMISSION_DENIED")


@pytest.mark.parametrize("run_label", [True, False], ids=["run-label", "managed-by-only"])
def test_a_refused_delete_is_a_leak_with_its_command_not_an_api_error(
    api: GoogleTpuApi, journal: Journal, emulator: Emulator, dead_pid: int, run_label: bool
) -> None:
    if run_label:
        name = killed_run(api, "refused", journal=journal, pid=dead_pid)
    else:
        name = "tpulab-unlabelled-run"
        create_ready_node(api, name, {MANAGED_BY_LABEL: MANAGED_BY_VALUE})
    plan = find_orphans(api, target=target_for(api.api_endpoint), zones=[ZONE], journal=journal)
    assert [c.node.name for c in plan.candidates] == [name]
    refusing = RefusingDeletes(api)
    result = sweep(refusing, plan, journal=journal, timeout=0.6, poll=0.05, sleep=_short_sleep)
    assert refusing.refused >= 2  # retried until the deadline, not given up at once
    assert not result.ok
    assert result.deleted == []
    assert [c.node.name for c, _ in result.failed] == [name]
    assert "PERMISSION_DENIED" in result.failed[0][1].message
    # The node lives behind a served emulator: the command must reach that endpoint.
    assert [n.manual_delete_command() for n in result.leaked(plan.target)] == [
        f"CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU={emulator.url.rstrip('/')}/ "
        "CLOUDSDK_AUTH_DISABLE_CREDENTIALS=true "
        f"gcloud compute tpus tpu-vm delete {name} --project={PROJECT} --zone={ZONE} --quiet"
    ]
    assert emulator.node_names(PROJECT) == [name]
    if run_label:
        row = journal.get("refused")
        assert row is not None
        assert row.teardown == "unconfirmed"


def test_a_node_that_lost_our_labels_before_the_sweep_is_spared(
    api: GoogleTpuApi, journal: Journal, emulator: Emulator
) -> None:
    name = "tpulab-renamed-away"
    create_ready_node(
        api, name, {MANAGED_BY_LABEL: MANAGED_BY_VALUE}
    )  # no run label: matched by name
    plan = find_orphans(api, target=target_for(api.api_endpoint), zones=[ZONE], journal=journal)
    assert [c.node.name for c in plan.candidates] == [name]
    # Between the look and the delete, the node goes and a stranger's takes its name.
    api.wait_operation(api.delete_node(ZONE, name), timeout=30)
    create_ready_node(api, name, {"team": "research"})
    result = sweep(api, plan, journal=journal, timeout=5, poll=0.05, sleep=_short_sleep)
    assert emulator.node_names(PROJECT) == [name]
    assert [c.node.name for c in result.spared] == [name]
    assert result.deleted == []
    assert result.failed == []


def test_a_corrupted_journal_still_finds_nodes_by_label(
    api: GoogleTpuApi, journal: Journal, emulator: Emulator, dead_pid: int
) -> None:
    name = killed_run(api, "before-corruption", journal=journal, pid=dead_pid)
    for suffix in ("", "-wal", "-shm"):
        Path(f"{journal.path}{suffix}").unlink(missing_ok=True)
    journal.path.write_bytes(b"not sqlite at all " * 64)
    plan, result = _fast_sweep(api, journal, zones=[ZONE])
    assert plan.journal_error is not None
    assert "unreadable" in plan.journal_error
    assert [c.node.name for c in plan.candidates] == [name]
    assert plan.candidates[0].source == "labels"
    assert result.ok
    assert emulator.node_names(PROJECT) == []


def test_rows_of_other_targets_are_reported_not_touched(
    api: GoogleTpuApi, journal: Journal, emulator: Emulator, dead_pid: int
) -> None:
    name = killed_run(
        api, "emulated-elsewhere", journal=journal, pid=dead_pid, target=TARGET_EMULATE
    )
    plan, result = _fast_sweep(api, journal, zones=[ZONE_B])
    assert [row.run_id for row in plan.other_rows] == ["emulated-elsewhere"]
    assert "--emulate" in sweep_command_for(plan.other_rows[0])
    assert plan.candidates == []
    assert result.ok
    assert emulator.node_names(PROJECT) == [name]
    assert [row.run_id for row in journal.open_runs()] == ["emulated-elsewhere"]


def test_no_zone_anywhere_is_a_config_error(
    api: GoogleTpuApi, journal: Journal, dead_pid: int
) -> None:
    with pytest.raises(ConfigError, match="No zone to search") as caught:
        find_orphans(api, target="google", journal=journal)
    assert caught.value.hint is not None
    assert "--zone" in caught.value.hint
    killed_run(
        api, "emulated-run", journal=journal, pid=dead_pid, create=False, target=TARGET_EMULATE
    )
    with pytest.raises(ConfigError, match="no open run emulated-run") as caught:
        find_orphans(api, target="google", journal=journal, run_id="emulated-run")
    assert caught.value.hint is not None
    assert "--emulate" in caught.value.hint


def test_verify_clean_counts_only_tpulab_nodes(api: GoogleTpuApi) -> None:
    create_ready_node(api, "tpulab-x", tpulab_labels("x"))
    create_ready_node(api, "other", {})
    remaining, errors = verify_clean(api, [ZONE])
    assert [n.name for n in remaining] == ["tpulab-x"]
    assert errors == {}
    remaining, _ = verify_clean(api, [ZONE], run_id="y")
    assert remaining == []


def test_age_and_cost_come_from_the_node(
    api: GoogleTpuApi, journal: Journal, dead_pid: int
) -> None:
    killed_run(api, "aged", journal=journal, pid=dead_pid)
    later = datetime.now(timezone.utc) + timedelta(hours=2)
    plan = find_orphans(
        api, target=target_for(api.api_endpoint), zones=[ZONE], journal=journal, now=later
    )
    (candidate,) = plan.candidates
    assert candidate.age_seconds is not None
    assert 7190 < candidate.age_seconds < 7300
    # v5litepod-4: 4 chips at the catalog's v5e price, for about two hours.
    from tpulab.catalog import lookup

    expected = lookup(ACCEL).estimated_cost(candidate.age_seconds)
    assert candidate.estimated_cost == pytest.approx(expected)
    assert 9.0 < expected < 10.0
