"""A Ctrl-C that lands after the receipt verified asks for what happens anyway -- the
teardown. When that teardown is confirmed, the run has succeeded and says so (it used to
end as "interrupted", exit 130, with no summary and the receipt id never shown)."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import TYPE_CHECKING

from tpulab.run.progress import NullObserver, Phase
from tpulab.run.signals import SignalInterrupt

if TYPE_CHECKING:
    from run_rig import Rig

    from tpulab.config import RunSpec

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


def _with_command(rig: Rig, tmp_path: Path) -> RunSpec:
    import dataclasses

    from tpulab.config.workload import WorkloadSpec

    work = tmp_path / "work"
    work.mkdir()
    (work / "mark.py").write_text("import os\nopen(os.environ['TPULAB_RUN_DIR'] + '/m', 'w')\n")
    workload = WorkloadSpec(
        command=("python", "mark.py"), workdir=work, out=tmp_path / "out", env=(),
        with_packages=(), requirements=None, fetch=(), exclude=(), allow_secrets=(),
    )  # fmt: skip
    return dataclasses.replace(rig.spec(), workload=workload)


def test_with_a_command_a_signal_after_verification_but_before_it_is_130(
    embedded_rig: Rig, tmp_path: Path
) -> None:
    """docs/reference/exit-status.md, 130: with `-- CMD` the run's work is the command and its
    artifacts, so a signal between the verifier and the command is an interruption
    (the README once said any signal after verification ended with 0)."""
    from tpulab.errors import InterruptedRun
    from tpulab.exits import EXIT_INTERRUPTED, exit_status_for

    life, _, error = embedded_rig.run(
        _with_command(embedded_rig, tmp_path), InterruptAfter(Phase.VERIFY, KeyboardInterrupt())
    )
    assert isinstance(error, InterruptedRun), error
    assert exit_status_for(error) == EXIT_INTERRUPTED
    assert life.outcome.workload is not None
    assert not life.outcome.workload.started
    assert life.outcome.teardown_status == "confirmed"
    assert embedded_rig.leftovers() == []


def test_with_a_command_a_signal_after_its_fetch_is_a_successful_run(
    embedded_rig: Rig, tmp_path: Path
) -> None:
    life, _, error = embedded_rig.run(
        _with_command(embedded_rig, tmp_path), InterruptAfter(Phase.FETCH, KeyboardInterrupt())
    )
    assert error is None, error
    assert life.outcome.succeeded
    assert (tmp_path / "out" / "run" / "m").exists()
    assert embedded_rig.leftovers() == []


def test_the_readme_exit_table_says_when_a_signal_is_130() -> None:
    # The whole exit table lives in the docs (the README keeps a summary and links it).
    table = Path(__file__).resolve().parents[1] / "docs" / "reference" / "exit-status.md"
    (row,) = [line for line in table.read_text("utf-8").splitlines() if line.startswith("| 130 |")]
    assert "a Ctrl-C during the command is 130" in row
    assert "once only the teardown is left" in row
