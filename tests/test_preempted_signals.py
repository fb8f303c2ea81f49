"""Preemption from the signals that do not lag (issue 23, item 3): a reclaimed spot node's
state can say READY for about a minute after its VM stopped (SkyPilot #849), but the VM
itself knows at once (its metadata server's `instance/preempted`, which its watchdog
publishes as the guest attribute `tpulab/preempted`), and the node's `health` may say so
too. Either one makes a failed spot run "preempted" at once, so `--recover 1` starts the
next attempt without waiting out the lag.

Each run's state lag here is longer than its whole preemption wait: without the signal
the run could only fail (not preempted), so these tests fail on a controller that reads
the state alone."""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from test_failover import _spec

from tpulab.contract import (
    METADATA_FLAVOR,
    METADATA_FLAVOR_HEADER,
    PREEMPTED_ATTRIBUTE,
)
from tpulab.errors import ConnectError
from tpulab.polling import Backoff
from tpulab.run.attempts import Attempts
from tpulab.run.lifecycle import Lifecycle
from tpulab.run.progress import NullObserver, Phase, Recorder

if TYPE_CHECKING:
    from run_rig import Rig

    from tpulab.config import RunSpec

pytest_plugins = ["emulator_fixtures", "ssh_fixtures", "run_rig"]

ZONES = ["us-central1-a", "us-west1-c"]
# The API's state stays READY far longer than the run asks: only a signal that does not
# lag can say "preempted" within PREEMPTION_WAIT.
LAG = 1e6
PREEMPTION_WAIT = 10.0


def _put_guest_attribute(metadata: str, key: str, value: str) -> None:
    """PUT a guest attribute through the node's metadata server, as a VM's process does."""
    request = urllib.request.Request(
        f"http://{metadata}/computeMetadata/v1/instance/guest-attributes/{key}",
        data=value.encode(),
        method="PUT",
        headers={METADATA_FLAVOR_HEADER: METADATA_FLAVOR},
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 200


class _ReclaimAtPayload(NullObserver):
    """Once the first node's payload runs: optionally have its VM publish that it is
    preempted, then stop the VM with the state lagging (and `lag_health` reported)."""

    def __init__(
        self, rig: Rig, *, vm_publishes: bool, lag_health: str = "HEALTHY", notice: float = 0.0
    ) -> None:
        self.rig = rig
        self.vm_publishes = vm_publishes
        self.lag_health = lag_health
        self.notice = notice
        self.done = False

    def phase_started(self, phase: Phase) -> None:
        if phase is not Phase.EXECUTE or self.done:
            return
        self.done = True
        if self.vm_publishes:
            _put_guest_attribute(self._metadata_server(), PREEMPTED_ATTRIBUTE, "TRUE")
        self.rig.emulator.faults.update(
            {
                "preempt_state_lag": LAG,
                "preempt_lag_health": self.lag_health,
                "preempt_notice": self.notice,
                "preempt_nodes": 1,
                "preempt_after": 0.0,
            }
        )

    def _metadata_server(self) -> str:
        (node,) = [
            n for n in self.rig.emulator.snapshot()["nodes"].values() if n["state"] == "READY"
        ]
        return str(node["guest"]["metadata"])


def _recovering_run(
    rig: Rig, tmp_path: Path, observer: NullObserver, **lifecycle: Any
) -> tuple[Attempts, Recorder]:
    from run_rig import sleeps_in_the_first_zone_then_verifies

    wrapper = sleeps_in_the_first_zone_then_verifies(tmp_path, 60, ZONES[0])
    spec = _spec(rig, ZONES, spot=True, recover=1, payload=wrapper)
    recorder = Recorder()

    def new_lifecycle(attempt: RunSpec) -> Lifecycle:
        return rig.lifecycle(
            attempt, recorder, observer, preemption_wait=PREEMPTION_WAIT, **lifecycle
        )[0]

    runner = Attempts(
        spec, new_lifecycle=new_lifecycle, observer=recorder, gap=Backoff.gap(0.3, jitter=0.2)
    )
    return runner, recorder


_RETRIED = "the SSH connection dropped during the verifier's run"


def _assert_recovered_at_once(run: tuple[Attempts, Recorder], rig: Rig, why: str) -> None:
    runner, recorder = run
    outcome = runner.run()
    assert outcome.succeeded, [a.reason for a in runner.attempts]
    assert [(a.zone, a.outcome) for a in runner.attempts] == [
        (ZONES[0], "preempted"),
        (ZONES[1], "verified"),
    ]
    # Preempted by the signal, while the API's state still said READY (LAG >> the wait).
    assert why in runner.attempts[0].reason
    assert "READY" in runner.attempts[0].reason
    assert all(a.teardown_status == "confirmed" for a in runner.attempts)
    # A signal that does not lag is read before any retry of the step: a reconnect to a
    # VM going down would only cost its bound (tpulab.run.dropped).
    assert not any(n.startswith(_RETRIED) for n in recorder.notes), recorder.notes
    assert rig.leftovers() == []


def test_the_vms_own_word_makes_a_ready_spot_node_preempted(
    embedded_rig: Rig, tmp_path: Path
) -> None:
    run = _recovering_run(
        embedded_rig, tmp_path, _ReclaimAtPayload(embedded_rig, vm_publishes=True)
    )
    _assert_recovered_at_once(run, embedded_rig, PREEMPTED_ATTRIBUTE)


def test_the_watchdog_passes_the_preemption_notice_on_and_the_run_recovers(
    embedded_rig: Rig, tmp_path: Path
) -> None:
    """The whole path, with nothing put by the test: the emulated VM is told it is
    preempted (`instance/preempted` TRUE) 8 s before it stops, its watchdog (polling every
    few seconds) publishes `tpulab/preempted`, and the failed run reads it while the
    state still says READY."""
    observer = _ReclaimAtPayload(embedded_rig, vm_publishes=False, notice=8.0)
    run = _recovering_run(embedded_rig, tmp_path, observer)
    _assert_recovered_at_once(run, embedded_rig, PREEMPTED_ATTRIBUTE)


@pytest.mark.longest
def test_a_maintenance_health_makes_a_ready_spot_node_preempted(
    embedded_rig: Rig, tmp_path: Path
) -> None:
    observer = _ReclaimAtPayload(
        embedded_rig, vm_publishes=False, lag_health="UNHEALTHY_MAINTENANCE"
    )
    run = _recovering_run(embedded_rig, tmp_path, observer)
    _assert_recovered_at_once(run, embedded_rig, "UNHEALTHY_MAINTENANCE")


class _AwayForTheLease(_ReclaimAtPayload):
    """Reclaims like `_ReclaimAtPayload`; then, as the step is about to be made again,
    moves the run's clock a whole lease on (the VM silent for ten minutes), so that the
    wait for the link ends at its first refused connect rather than after ten real
    minutes."""

    def __init__(self, rig: Rig) -> None:
        super().__init__(rig, vm_publishes=False)
        self.skipped = 0.0

    def clock(self) -> float:
        return time.monotonic() + self.skipped

    def note(self, message: str) -> None:
        if message.startswith(_RETRIED):
            self.skipped += 600.0  # the default --lease


def test_a_healthy_ready_node_with_a_silent_vm_is_not_called_preempted(
    embedded_rig: Rig, tmp_path: Path
) -> None:
    """The control: no signal, state READY throughout -> the wait for the link runs out
    (the lease) and the run fails with the SSH failure it saw, not as a preemption
    (nothing is recovered)."""
    away = _AwayForTheLease(embedded_rig)
    runner, recorder = _recovering_run(embedded_rig, tmp_path, away, clock=away.clock)
    with pytest.raises(ConnectError, match="dropped"):
        runner.run()
    # No signal: to the controller a drop like a Wi-Fi blip's, so the step was tried again.
    assert any(n.startswith(_RETRIED) for n in recorder.notes), recorder.notes
    assert len(runner.attempts) == 1
    assert runner.attempts[0].outcome != "preempted", runner.attempts[0].reason
    assert embedded_rig.leftovers() == []
