"""Spot, as Google reports it (issue 23, item 3): the state of a reclaimed TPU VM can lag
the VM stopping by about a minute (SkyPilot #849) and need not be PREEMPTED: TERMINATED
and STOPPED are real (SkyPilot #1468). The emulator models both (`preempt_as`,
`preempt_state_lag`); the controller polls the node, bounded, after a spot run's SSH or
remote failure, and `--recover N` then fires."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from emulator_fixtures import api_for, node_request
from test_failover import _attempts, _spec

from tpulab.cloud.polling import wait_for_state
from tpulab.errors import PreemptedError
from tpulab.models import NodeState
from tpulab.run.progress import NullObserver, Phase

if TYPE_CHECKING:
    from helpers import FakeClock
    from run_rig import Rig

    from tpulab.emulator import Emulator

pytest_plugins = ["emulator_fixtures", "ssh_fixtures", "run_rig"]

ZONE = "us-central1-a"
# Seconds of the emulator's clock the API keeps saying READY after the VM stopped (the
# real lag is about a minute; the controller's bound is PREEMPTION_WAIT_SECONDS = 120 s).
# Longer than one connect's bound (the rig's 15 s), as the real lag is: the controller
# meets READY when it first asks after the drop, and keeps asking between its
# reconnects (tpulab.run.dropped). TPULAB_TEST_SPOT_LAG=60 runs the real-world figure.
LAG = float(os.environ.get("TPULAB_TEST_SPOT_LAG", "30"))


class _TerminateAtPayload(NullObserver):
    """Stop the first node's VM once its payload starts; the API says READY for LAG s
    more, then TERMINATED."""

    def __init__(self, rig: Rig) -> None:
        self.faults = rig.emulator.faults
        self.done = False

    def phase_started(self, phase: Phase) -> None:
        if phase is Phase.EXECUTE and not self.done:
            self.done = True
            self.faults.update(
                {"preempt_as": "TERMINATED", "preempt_state_lag": LAG, "preempt_nodes": 1}
            )
            self.faults.preempt_after = 0.0


def test_a_spot_node_terminated_with_a_lagging_state_is_recovered(
    embedded_rig: Rig, tmp_path: Path
) -> None:
    from run_rig import sleeps_in_the_first_zone_then_verifies

    wrapper = sleeps_in_the_first_zone_then_verifies(tmp_path, 60, "us-central1-a")
    spec = _spec(
        embedded_rig, ["us-central1-a", "us-west1-c"], spot=True, recover=1, payload=wrapper
    )
    runner, recorder = _attempts(embedded_rig, spec, _TerminateAtPayload(embedded_rig))
    outcome = runner.run()
    assert outcome.succeeded
    assert [(a.zone, a.outcome, a.how) for a in runner.attempts] == [
        ("us-central1-a", "preempted", "spot"),
        ("us-west1-c", "verified", "spot"),
    ]
    first = runner.attempts[0]
    assert "TERMINATED" in first.reason
    # It asked, saw READY (the lag: only a node GetNode shows up is reconnected to, and
    # the step made again), and went on asking until the state told (the reason).
    asked = [n for n in recorder.notes if "whether it was preempted" in n]
    assert asked, recorder.notes
    retried = "the SSH connection dropped during the verifier's run"
    assert any(n.startswith(retried) for n in recorder.notes), recorder.notes
    assert all(a.teardown_status == "confirmed" for a in runner.attempts)
    assert embedded_rig.leftovers() == []


def test_waiting_for_ready_a_terminated_spot_node_is_preempted_at_once(
    held_emulator: tuple[Emulator, FakeClock],
) -> None:
    emulator, clock = held_emulator
    emulator.faults.update({"preempt_as": "TERMINATED", "preempt_after": 0.0})
    api = api_for(emulator)
    api.create_node(ZONE, "spot-t", node_request(spot=True))
    clock.now += 1  # READY, and reclaimed at once
    assert api.get_node(ZONE, "spot-t").state is NodeState.TERMINATED
    with pytest.raises(PreemptedError, match="TERMINATED"):
        wait_for_state(api, ZONE, "spot-t", {NodeState.READY}, timeout=30)


def test_the_emulator_refuses_an_unknown_preempted_state(emulator: Emulator) -> None:
    with pytest.raises(ValueError, match="preempt_as"):
        emulator.faults.update({"preempt_as": "READY"})


def test_a_preempted_spot_slice_is_recovered_whole(embedded_rig: Rig, tmp_path: Path) -> None:
    """A slice is one node: its preemption takes every worker at once (the fault stops all
    four VMs), and `--recover 1` brings up a new slice whose four workers verify."""
    from run_rig import sleeps_in_the_first_zone_then_verifies

    wrapper = sleeps_in_the_first_zone_then_verifies(tmp_path, 60, "us-central1-a")
    spec = _spec(
        embedded_rig,
        ["us-central1-a", "us-west1-c"],
        accelerator="v5litepod-16",
        spot=True,
        recover=1,
        payload=wrapper,
    )
    runner, _recorder = _attempts(embedded_rig, spec, _TerminateAtPayload(embedded_rig))
    outcome = runner.run()
    assert outcome.succeeded, [a.reason for a in runner.attempts]
    assert [(a.zone, a.outcome) for a in runner.attempts] == [
        ("us-central1-a", "preempted"),
        ("us-west1-c", "verified"),
    ]
    assert outcome.observed_total == outcome.expected_total  # the closed form for 16 devices
    assert len(outcome.per_device_sums) == 16
    assert all(a.teardown_status == "confirmed" for a in runner.attempts)
    assert embedded_rig.leftovers() == []
