"""A Ctrl-C that lands after the receipt verified asks for what happens anyway -- the
teardown. When that teardown is confirmed, the run has succeeded and says so (it used to
end as "interrupted", exit 130, with no summary and the receipt id never shown)."""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING

from tpulab.run.progress import NullObserver, Phase
from tpulab.run.signals import SignalInterrupt

if TYPE_CHECKING:
    from run_rig import Rig

pytest_plugins = ["emulator_fixtures", "ssh_fixtures", "run_rig"]


class InterruptAfter(NullObserver):
    """Raises, as the signal handler would, the moment a phase has finished."""

    def __init__(self, phase: Phase, interrupt: BaseException) -> None:
        self.phase = phase
        self.interrupt = interrupt

    def phase_finished(self, phase: Phase, seconds: float, detail: str) -> None:
        if phase is self.phase:
            raise self.interrupt


def test_ctrl_c_right_after_verification_is_a_successful_run(embedded_rig: Rig) -> None:
    life, _, error = embedded_rig.run(
        embedded_rig.spec(), InterruptAfter(Phase.VERIFY, KeyboardInterrupt())
    )
    assert error is None, error
    assert life.outcome.succeeded
    assert life.outcome.receipt is not None
    assert embedded_rig.leftovers() == []


def test_sigterm_right_after_verification_is_a_successful_run(embedded_rig: Rig) -> None:
    life, _, error = embedded_rig.run(
        embedded_rig.spec(), InterruptAfter(Phase.VERIFY, SignalInterrupt(signal.SIGTERM))
    )
    assert error is None, error
    assert life.outcome.teardown_status == "confirmed"


def test_ctrl_c_before_verification_is_still_an_interruption(embedded_rig: Rig) -> None:
    from tpulab.errors import InterruptedRun

    life, _, error = embedded_rig.run(
        embedded_rig.spec(), InterruptAfter(Phase.COLLECT, KeyboardInterrupt())
    )
    assert isinstance(error, InterruptedRun)
    assert life.outcome.teardown_status == "confirmed"
    assert embedded_rig.leftovers() == []
