"""The observer protocol: a broken display must not break a run, Ctrl-C must still pass."""

from __future__ import annotations

import pytest

from tpulab.run.progress import FanOut, NullObserver, Phase, Recorder


class Broken(NullObserver):
    def phase_started(self, phase: Phase) -> None:
        raise ValueError("the terminal went away")

    def remote_output(self, stream: str, line: str) -> None:
        raise OSError("broken pipe")


class Interrupting(NullObserver):
    def phase_started(self, phase: Phase) -> None:
        raise KeyboardInterrupt


def test_fan_out_reaches_every_observer_even_past_a_broken_one() -> None:
    recorder = Recorder()
    fan = FanOut([Broken(), recorder])
    fan.phase_started(Phase.CREATE)
    fan.phase_finished(Phase.CREATE, 1.5, "node x")
    fan.phase_failed(Phase.EXECUTE, 2.0, RuntimeError("boom"))
    fan.remote_output("stdout", "hello")
    fan.note("venv: uv venv")
    fan.milestone("delete_sent", 10.0)
    fan.milestone("delete_sent", 11.0)
    assert [(p.phase, p.ok, p.detail) for p in recorder.phases] == [
        (Phase.CREATE, True, "node x"),
        (Phase.EXECUTE, False, "boom"),
    ]
    assert recorder.output == [("stdout", "hello")]
    assert recorder.notes == ["venv: uv venv"]
    assert recorder.milestones == {"delete_sent": 10.0}, "the first time a milestone happened"


def test_fan_out_lets_an_interrupt_through() -> None:
    with pytest.raises(KeyboardInterrupt):
        FanOut([Interrupting(), Recorder()]).phase_started(Phase.BOOTSTRAP)


def test_recorder_bounds_remote_output() -> None:
    recorder = Recorder(max_output_lines=3)
    for n in range(10):
        recorder.remote_output("stdout", str(n))
    assert [line for _, line in recorder.output] == ["0", "1", "2"]


def test_phases_are_in_run_order_with_labels() -> None:
    assert [p.value for p in Phase][:3] == ["validate", "create", "wait-ready"]
    assert Phase.TEARDOWN.label == "Delete VM and confirm"
    assert all(p.label for p in Phase)
