"""Zone failover, spot recovery and the retry budget (tpulab.run.attempts), end to end
against the emulator: real REST client, real SSH hosts, the real verifier. Each attempt
is a whole Lifecycle, so each test also checks that nothing is left in the emulator."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tpulab import errors as E
from tpulab.config import CapacityFlags, RunSpec, TargetFlags, build_run_spec
from tpulab.polling import Backoff
from tpulab.run.attempts import Attempts
from tpulab.run.progress import NullObserver, Phase, Recorder

if TYPE_CHECKING:
    from run_rig import Rig

    from tpulab.run.lifecycle import Lifecycle

pytest_plugins = ["emulator_fixtures", "ssh_fixtures", "run_rig"]

PROJECT = "test-project"


def _spec(
    rig: Rig,
    zones: Sequence[str],
    accelerator: str = "v5litepod-4",
    payload: Path | None = None,
    **capacity: Any,
) -> RunSpec:
    from run_rig import FAST

    return build_run_spec(
        target=TargetFlags(
            accelerator=accelerator, api_endpoint=rig.emulator.url, project=PROJECT, zones=zones
        ),
        capacity=CapacityFlags(**capacity),
        timeouts=FAST,
        payload=payload,
        env={},
    )


def _attempts(
    rig: Rig, spec: RunSpec, *observers: Any, gap: float = 0.3
) -> tuple[Attempts, Recorder]:
    recorder = Recorder()

    def new_lifecycle(attempt: RunSpec) -> Lifecycle:
        return rig.lifecycle(attempt, recorder, *observers)[0]

    runner = Attempts(
        spec, new_lifecycle=new_lifecycle, observer=recorder, gap=Backoff.gap(gap, jitter=0.2)
    )
    return runner, recorder


def _creates(rig: Rig) -> list[str]:
    """The zones CreateNode was sent to, in order, from the emulator's request log."""
    return [
        r["path"].split("/locations/")[1].split("/")[0]
        for r in rig.emulator.requests()
        if r["method"] == "POST" and r["path"].endswith("/nodes")
    ]


def _table(runner: Attempts) -> list[tuple[str, str, str, str]]:
    return [(a.run_id, a.zone, a.outcome, a.teardown_status) for a in runner.attempts]


def test_stockout_then_quota_then_capacity_runs_in_the_third_zone(embedded_rig: Rig) -> None:
    faults = embedded_rig.emulator.faults
    faults.stockout_zones = ["us-central1-a"]
    faults.quota_zones = ["us-south1-a"]
    spec = _spec(embedded_rig, ["us-central1-a,us-south1-a", "us-west1-c"])
    runner, recorder = _attempts(embedded_rig, spec)
    outcome = runner.run()
    assert outcome.succeeded
    assert outcome.spec.zone.value == "us-west1-c"
    rid = spec.run_id
    assert _table(runner) == [
        (rid, "us-central1-a", "stockout", "confirmed"),  # the create operation ran
        (f"{rid}-a2", "us-south1-a", "quota", "not-created"),  # refused synchronously
        (f"{rid}-a3", "us-west1-c", "verified", "confirmed"),
    ]
    assert "capacity" in runner.attempts[0].reason
    assert runner.attempts[1].reason.startswith("Could not create")
    assert outcome.spec.node_name == f"{spec.node_name}-a3"
    assert _creates(embedded_rig) == ["us-central1-a", "us-south1-a", "us-west1-c"]
    assert embedded_rig.leftovers() == []
    notes = recorder.notes
    assert "attempt 2/3 in us-south1-a (previous: stockout in us-central1-a)" in notes
    assert runner.estimated_cost == pytest.approx(sum(a.estimated_cost for a in runner.attempts))
    assert runner.estimated_cost >= outcome.estimated_cost > 0


def test_region_quota_skips_the_regions_other_zones(embedded_rig: Rig) -> None:
    embedded_rig.emulator.faults.quota_regions = ["us-east5"]
    spec = _spec(embedded_rig, ["us-east5-a", "us-east5-b", "us-central1-b"], "v6e-1")
    runner, recorder = _attempts(embedded_rig, spec)
    assert runner.run().succeeded
    assert [(a.zone, a.outcome) for a in runner.attempts] == [
        ("us-east5-a", "quota"),
        ("us-central1-b", "verified"),
    ]
    assert _creates(embedded_rig) == ["us-east5-a", "us-central1-b"]  # never us-east5-b
    assert "skipping us-east5-b: the quota of us-east5 is used up" in recorder.notes
    assert embedded_rig.leftovers() == []


def test_permission_denied_in_the_first_zone_stops_at_once(embedded_rig: Rig) -> None:
    embedded_rig.emulator.faults.deny_zones = ["us-central1-a"]
    spec = _spec(embedded_rig, ["us-central1-a", "us-south1-a", "us-west1-c"])
    runner, _recorder = _attempts(embedded_rig, spec)
    with pytest.raises(E.PermissionDeniedError):
        runner.run()
    assert [(a.zone, a.outcome) for a in runner.attempts] == [
        ("us-central1-a", "permission-denied")
    ]
    assert _creates(embedded_rig) == ["us-central1-a"]
    assert embedded_rig.leftovers() == []


def test_a_type_no_zone_offers_ends_after_one_pass_even_when_retrying(
    embedded_rig: Rig,
) -> None:
    # v6e-1 in two zones the table says host no v6e: each zone answers "invalid
    # AcceleratorType" (zone scope), and capacity arriving cannot fix that.
    spec = _spec(
        embedded_rig, ["us-west4-a", "us-south1-a"], "v6e-1", retry_until_up=True, retry_for="30"
    )
    runner, _recorder = _attempts(embedded_rig, spec)
    started = time.monotonic()
    with pytest.raises(E.InvalidArgumentError):
        runner.run()
    assert time.monotonic() - started < 10
    assert [a.outcome for a in runner.attempts] == ["not-offered", "not-offered"]
    assert embedded_rig.leftovers() == []


def test_retry_until_up_waits_for_capacity(embedded_rig: Rig) -> None:
    faults = embedded_rig.emulator.faults
    faults.stockout_zones = ["us-central1-a", "us-west1-c"]
    # Only the first zone gains capacity (2 s after the first stockout): the second never
    # does, so whatever the machine's load, the first pass fails in both zones and the
    # success comes on a later pass (with "*", a loaded first pass could reach the second
    # zone after its capacity came, and succeed there on attempt 2).
    faults.capacity_after = {"us-central1-a": 2.0}
    spec = _spec(embedded_rig, ["us-central1-a", "us-west1-c"], retry_until_up=True, retry_for="20")
    runner, recorder = _attempts(embedded_rig, spec)
    assert runner.run().succeeded
    outcomes = [a.outcome for a in runner.attempts]
    assert outcomes[-1] == "verified"
    assert set(outcomes[:-1]) == {"stockout"}
    assert len(runner.attempts) >= 3  # at least one full pass failed before capacity came
    assert runner.attempts[-1].zone == "us-central1-a"
    notes = recorder.notes
    assert any("next pass over the zones in" in note for note in notes)
    assert embedded_rig.leftovers() == []


def test_retry_until_up_gives_up_with_a_capacity_error_when_the_budget_ends(
    embedded_rig: Rig,
) -> None:
    embedded_rig.emulator.faults.stockout = True
    spec = _spec(embedded_rig, ["us-central1-a", "us-west1-c"], retry_until_up=True, retry_for="2")
    runner, _recorder = _attempts(embedded_rig, spec)
    started = time.monotonic()
    with pytest.raises(E.StockoutError) as caught:
        runner.run()
    assert time.monotonic() - started < 15
    assert "No zone had capacity" in caught.value.message
    assert "--retry-for 2s" in caught.value.message
    assert caught.value.hint
    assert len(runner.attempts) >= 4  # two passes at least
    assert all(a.teardown_status == "confirmed" for a in runner.attempts)
    assert embedded_rig.leftovers() == []


class _PreemptAtPayload(NullObserver):
    """Preempt the node once the payload starts, for the first `times` payloads."""

    def __init__(self, rig: Rig, times: int) -> None:
        self.faults = rig.emulator.faults
        self.left = times

    def phase_started(self, phase: Phase) -> None:
        if phase is Phase.EXECUTE and self.left > 0:
            self.left -= 1
            self.faults.preempt_nodes = 1
            self.faults.preempt_after = 0.0


def test_spot_preempted_during_the_payload_recovers_on_a_new_node(
    embedded_rig: Rig, tmp_path: Path
) -> None:
    from run_rig import sleeps_in_the_first_zone_then_verifies

    # The first node's payload sleeps, so the preemption lands while it runs.
    wrapper = sleeps_in_the_first_zone_then_verifies(tmp_path, 30, "us-central1-a")
    spec = _spec(
        embedded_rig, ["us-central1-a", "us-west1-c"], spot=True, recover=1, payload=wrapper
    )
    runner, _recorder = _attempts(embedded_rig, spec, _PreemptAtPayload(embedded_rig, times=1))
    outcome = runner.run()
    assert outcome.succeeded
    assert [(a.zone, a.outcome, a.how) for a in runner.attempts] == [
        ("us-central1-a", "preempted", "spot"),
        ("us-west1-c", "verified", "spot"),  # next zone first
    ]
    assert all(a.teardown_status == "confirmed" for a in runner.attempts)
    assert outcome.receipt is not None  # the verifier re-ran on the new node
    assert embedded_rig.leftovers() == []


def test_spot_preempted_twice_with_one_recovery_ends_preempted(embedded_rig: Rig) -> None:
    spec = _spec(embedded_rig, ["us-central1-a"], spot=True, recover=1)
    runner, _recorder = _attempts(embedded_rig, spec, _PreemptAtPayload(embedded_rig, times=2))
    with pytest.raises(E.PreemptedError):
        runner.run()
    assert [(a.run_id, a.outcome) for a in runner.attempts] == [
        (spec.run_id, "preempted"),
        (f"{spec.run_id}-a2", "preempted"),  # same zone: it is the only one
    ]
    assert all(a.teardown_status == "confirmed" for a in runner.attempts)
    assert embedded_rig.leftovers() == []


def test_preempted_during_create_spends_a_recovery(embedded_rig: Rig) -> None:
    embedded_rig.emulator.faults.create_preempted = 1  # create-operation code 3
    spec = _spec(embedded_rig, ["us-central1-a", "us-west1-c"], spot=True, recover=1)
    runner, _recorder = _attempts(embedded_rig, spec)
    assert runner.run().succeeded
    assert [(a.zone, a.outcome) for a in runner.attempts] == [
        ("us-central1-a", "preempted"),
        ("us-west1-c", "verified"),
    ]
    assert embedded_rig.leftovers() == []


def test_a_failed_verification_is_fatal_not_a_reason_to_move(
    embedded_rig: Rig, tmp_path: Path
) -> None:
    from run_rig import payload_script

    broken = payload_script(tmp_path, "import sys\nsys.exit(3)\n")
    spec = _spec(embedded_rig, ["us-central1-a", "us-west1-c"], payload=broken)
    runner, _recorder = _attempts(embedded_rig, spec)
    with pytest.raises(E.TpuLabError) as caught:
        runner.run()
    assert not isinstance(caught.value, E.CloudError)
    assert [a.zone for a in runner.attempts] == ["us-central1-a"]
    assert embedded_rig.leftovers() == []
