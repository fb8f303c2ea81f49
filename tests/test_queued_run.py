"""`--queued`: a run whose node comes through a QueuedResource, against a served emulator
whose READY nodes are real SSH servers (tests/run_rig.py). Capacity arrives after a
delay (the emulator's `capacity_after` fault) or never within `--valid-for`; either way
the queued resource and its node must be gone afterwards, confirmed by list."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import pytest

from tpulab.config import CapacityFlags, TargetFlags, Timeouts, build_run_spec
from tpulab.errors import CloudError, ConfigError, QueueExpiredError, StockoutError
from tpulab.run.attempts import Attempts
from tpulab.run.progress import NullObserver, Phase

if TYPE_CHECKING:
    from run_rig import Rig

    from tpulab.config import CapacityFlags, RunSpec, TargetFlags

pytest_plugins = ["emulator_fixtures", "ssh_fixtures", "run_rig"]

# As emulator_fixtures / run_rig have them (their names are imported only for typing:
# pytest rewrites plugin modules, which a module-level import would defeat).
PROJECT = "test-project"
ZONE = "us-central1-a"
FAST = Timeouts(
    create=20, ready=20, host_key=10, connect=15, bootstrap=120, payload=60, collect=20, teardown=8
)


def queued_spec(rig: Rig, valid_for: str | None = "30s", *, spot: bool = False) -> RunSpec:
    return build_run_spec(
        target=TargetFlags(
            accelerator="v5litepod-4", api_endpoint=rig.emulator.url, project=PROJECT, zone=ZONE
        ),
        capacity=CapacityFlags(spot=spot, queued=True, valid_for=valid_for),
        timeouts=FAST,
        env={},
    )


class QueueWatch(NullObserver):
    """What the emulated cloud held when the run reached `phase` (its queued resource)."""

    def __init__(self, rig: Rig, phase: Phase) -> None:
        self.rig = rig
        self.phase = phase
        self.seen: dict[str, object] = {}

    def phase_started(self, phase: Phase) -> None:
        if phase is self.phase:
            self.seen = self.rig.emulator.snapshot()


def queued_resources(rig: Rig) -> list[str]:
    return sorted(rig.emulator.snapshot().get("queued_resources", {}))


def test_capacity_after_a_delay_run_succeeds_and_both_are_gone(embedded_rig: Rig) -> None:
    rig = embedded_rig
    # WAITING_FOR_RESOURCES lasts until capacity comes: long enough that a loaded
    # machine's polls (0.1 s apart when idle) cannot all miss it.
    rig.emulator.faults.capacity_after = {ZONE: 3.0}
    spec = queued_spec(rig, "30s")
    watch = QueueWatch(rig, Phase.CONNECT)
    life, recorder, error = rig.run(spec, watch)
    assert error is None, error
    assert life.outcome.succeeded
    assert life.outcome.verdict == "verified"
    # It waited through the states, and said so as it went.
    states = [n.split(": ", 1)[1] for n in recorder.notes if n.startswith("queued resource")]
    assert states[-1] == "ACTIVE"
    assert "WAITING_FOR_RESOURCES" in states
    # While it ran, the queued resource held our node spec: labels, our key, the window.
    (record,) = watch.seen["queued_resources"].values()  # type: ignore[attr-defined]
    assert record["node"]["labels"] == spec.labels
    assert record["node"]["metadata"]["ssh-keys"].startswith("tpulab:ssh-ed25519 ")
    assert record["queueing_policy"] == {"validUntilDuration": "30s"}
    (node,) = watch.seen["nodes"].values()  # type: ignore[attr-defined]
    assert node["queued_resource"] == spec.node_name
    # Teardown went through the queued resource, with force, and confirmed both gone.
    deletes = [r for r in rig.emulator.requests() if r["method"] == "DELETE"]
    assert [d["path"].rsplit("/", 2)[-2] for d in deletes] == ["queuedResources"]
    assert ["force", "true"] in deletes[0]["query"]
    lists = {r["path"].rsplit("/", 1)[-1] for r in rig.emulator.requests() if r["method"] == "GET"}
    assert {"nodes", "queuedResources"} <= lists
    assert life.outcome.teardown_status == "confirmed"
    assert rig.leftovers() == []
    assert queued_resources(rig) == []


def test_window_passes_failed_reported_and_nothing_left(embedded_rig: Rig) -> None:
    rig = embedded_rig
    rig.emulator.faults.capacity_after = {ZONE: 3600.0}  # never within the window
    spec = queued_spec(rig, "2s")
    runner = Attempts(spec, new_lifecycle=lambda attempt: rig.lifecycle(attempt)[0])
    with pytest.raises(QueueExpiredError) as raised:
        runner.run()
    error = raised.value
    assert isinstance(error, StockoutError)  # still a capacity failure: exit 3
    assert error.status == "DEADLINE_EXCEEDED"  # failedData.error.code 4, as classified
    assert "expired: no capacity came within --valid-for 2s" in error.message
    assert "valid until" in error.message  # the API's own words follow
    # The attempts table says what happened: the window ran out (once "stockout").
    (attempt,) = runner.attempts
    assert attempt.outcome == "queue-expired"
    assert attempt.teardown_status == "confirmed"
    assert rig.leftovers() == []
    assert queued_resources(rig) == []


@pytest.mark.longest
def test_suspended_spot_node_ends_the_run_and_nothing_left(embedded_rig: Rig) -> None:
    """A spot node preempted before the run could use it: the service suspends the
    queued resource, the run ends with that reason, and nothing is left."""
    rig = embedded_rig
    rig.emulator.faults.preempt_after = 0.0
    life, _, error = rig.run(queued_spec(rig, None, spot=True))
    assert isinstance(error, CloudError)
    assert error.status in {"SUSPENDED", "PREEMPTED"}
    assert life.outcome.teardown_status == "confirmed"
    assert rig.leftovers() == []
    assert queued_resources(rig) == []


def test_valid_for_needs_queued_and_a_sane_window(embedded_rig: Rig) -> None:
    rig = embedded_rig
    target = TargetFlags(accelerator="v5litepod-4", api_endpoint=rig.emulator.url)
    with pytest.raises(ConfigError, match="--valid-for applies only"):
        build_run_spec(target=target, capacity=CapacityFlags(valid_for="30s"), env={})
    for bad in ("soon", "0s", "-5m", "8d"):
        with pytest.raises(ConfigError, match="--valid-for"):
            build_run_spec(
                target=target, capacity=CapacityFlags(queued=True, valid_for=bad), env={}
            )
    queued = CapacityFlags(queued=True, valid_for="1m30s")
    spec = build_run_spec(target=target, capacity=queued, env={})
    assert spec.valid_for == 90
    # A leak of a queued run is finished by deleting the queued resource with --force
    # (the command tests/test_gcloud_queued.py runs against the emulator).
    manual = spec.leaked_node().manual_delete_command()
    assert f"gcloud compute tpus queued-resources delete {spec.node_name} --force" in manual
    assert rig.emulator.requests() == []  # validation sends nothing


@pytest.mark.parametrize(
    ("zones", "flags", "words"),
    [
        (["us-central1-a,us-central1-b"], {}, "2 zones (us-central1-a, us-central1-b)"),
        (["auto"], {}, "zones ("),
        ([], {"spot": True, "recover": 2}, "--recover 2"),
        ([], {"retry_until_up": True}, "--retry-until-up"),
    ],
)
def test_queued_refuses_failover_before_any_api_call(
    embedded_rig: Rig, zones: list[str], flags: dict[str, Any], words: str
) -> None:
    # These were accepted, and a --valid-for expiry then failed over to the next zone
    # ("previous: stockout"), one whole window per zone.
    target = TargetFlags(
        accelerator="v5litepod-4", api_endpoint=embedded_rig.emulator.url, zones=zones
    )
    capacity = CapacityFlags(queued=True, valid_for="1m", **flags)
    with pytest.raises(ConfigError) as refused:
        build_run_spec(target=target, capacity=capacity, env={})
    assert refused.value.message.startswith("--queued takes one zone and waits there")
    assert words in refused.value.message
    assert refused.value.hint is not None
    assert "--valid-for" in refused.value.hint
    assert embedded_rig.emulator.requests() == []


def test_teardown_timeout_is_kept_for_the_queue(embedded_rig: Rig) -> None:
    """The laptop's wait is bounded by the window it gave the service."""
    from tpulab.run.queued import queue_wait_seconds

    spec = queued_spec(embedded_rig, "30s")
    assert queue_wait_seconds(spec) == 30 + FAST.ready
    longer = dataclasses.replace(spec, valid_for=None)
    assert queue_wait_seconds(longer) == FAST.create + FAST.ready
