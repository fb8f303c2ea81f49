"""Signals turn into teardown; teardown refuses them; a quick double Ctrl-C force-quits.

Delivery is tested with real signals: in this process via `signal.raise_signal` (the
handler logic, with an injected clock), and in child processes sent by `os.kill` (a real
blocked main thread, stdout as the user would see it, the exit status, os._exit). The
children never sleep a fixed time: their work and their teardown each block on a pipe
that the test releases, so a slow machine changes how long a test takes, never which
phase a signal lands in.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
from helpers import FakeClock

from tpulab.errors import InterruptedRun, TeardownError
from tpulab.run.signals import (
    SignalInterrupt,
    StepSkipped,
    interrupted,
    shield,
    signals_to_teardown,
    skippable,
)


def _guard(notes: list[str], clock: FakeClock | None = None) -> AbstractContextManager[None]:
    return signals_to_teardown(
        notes.append, force_exit_status=6, window=2.0, clock=clock or FakeClock(now=100.0)
    )


def _guarded(body: Callable[[], None], notes: list[str], clock: FakeClock | None = None) -> None:
    with _guard(notes, clock):
        body()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_unwinds_through_finally_and_becomes_interrupted_run(
    signum: signal.Signals,
) -> None:
    notes: list[str] = []
    events: list[str] = []

    def body() -> None:
        try:
            events.append("working")
            signal.raise_signal(signum)
            events.append("not reached")
        except Exception:  # what careless code in a phase might do
            events.append("swallowed")
        finally:
            events.append(f"interrupted by {interrupted()}")
            with shield("deleting node n1"):
                events.append("teardown")

    with pytest.raises(InterruptedRun) as caught:
        _guarded(body, notes)
    assert events == ["working", f"interrupted by {signum.name}", "teardown"]
    assert caught.value.signal_name == signum.name
    assert caught.value.message == f"Interrupted by {signum.name}"
    assert notes == []


class _SignalsWhenCollected:
    """Raises `signum` in its finaliser: the handler runs there, where Python ignores
    whatever it raises, as in the import system's lock cleanup (a weakref callback)
    that once swallowed a SIGTERM sent during "connect"."""

    def __init__(self, signum: signal.Signals) -> None:
        self.signum = signum

    def __del__(self) -> None:
        signal.raise_signal(self.signum)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_first_signal_that_lands_where_python_ignores_exceptions_is_not_lost(
    signum: signal.Signals,
) -> None:
    notes: list[str] = []
    events: list[str] = []

    def body() -> None:
        try:
            _SignalsWhenCollected(signum)  # collected at once: the handler runs in __del__
            events.append("past the finaliser")
            # The run goes on meanwhile, as the connect loop did; the signal must reach it.
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                time.sleep(0.01)
            events.append("never interrupted")
        finally:
            with shield("deleting node n1"):
                events.append("teardown")

    with pytest.raises(InterruptedRun) as caught:
        _guarded(body, notes)
    assert caught.value.signal_name == signum.name
    assert events == ["past the finaliser", "teardown"]
    assert notes == []  # not refused as "already tearing down": it had not begun


def test_a_second_ctrl_c_that_lands_where_python_ignores_exceptions_still_skips() -> None:
    notes: list[str] = []
    events: list[str] = []

    def body() -> None:
        try:
            signal.raise_signal(signal.SIGINT)
        finally:
            try:
                with skippable("fetching artifacts"):
                    _SignalsWhenCollected(signal.SIGINT)  # the second Ctrl-C, in __del__
                    deadline = time.monotonic() + 10
                    while time.monotonic() < deadline:
                        time.sleep(0.01)
                    events.append("fetched to the end")
            except StepSkipped as skipped:
                events.append(f"skipped {skipped.step}")
            with shield("deleting node n1"):
                events.append("teardown")

    with pytest.raises(InterruptedRun):
        _guarded(body, notes)
    assert events == ["skipped fetching artifacts", "teardown"]
    # Said when it was raised, and again when it landed; never refused.
    assert notes == ["SIGINT: skipping fetching artifacts; tearing down next."] * 2


def test_signals_during_teardown_are_refused_with_what_is_being_deleted() -> None:
    notes: list[str] = []
    clock = FakeClock(now=100.0)
    events: list[str] = []

    def body() -> None:
        try:
            signal.raise_signal(signal.SIGINT)
        finally:
            with shield("deleting node tpulab-x in us-central1-a", manual="gcloud ... delete"):
                signal.raise_signal(signal.SIGINT)  # refused
                clock.now += 5.0  # slower than the window: refused again, no force
                signal.raise_signal(signal.SIGINT)
                signal.raise_signal(signal.SIGTERM)  # never counts towards forcing
                events.append("teardown finished")

    with pytest.raises(InterruptedRun):
        _guarded(body, notes, clock)
    assert events == ["teardown finished"]
    assert len(notes) == 3
    assert all("deleting node tpulab-x in us-central1-a" in note for note in notes)
    assert "Ctrl-C again within 2 s" in notes[0]
    assert notes[2].startswith("SIGTERM ignored")
    assert "Ctrl-C again" not in notes[2]


def test_after_the_first_signal_nothing_raises_even_before_the_shield() -> None:
    notes: list[str] = []

    def body() -> None:
        try:
            signal.raise_signal(signal.SIGTERM)
        finally:
            # The window between the interrupt and the shield: a second signal is refused.
            signal.raise_signal(signal.SIGINT)
            with shield("deleting node n1"):
                pass

    with pytest.raises(InterruptedRun) as caught:
        _guarded(body, notes)
    assert caught.value.signal_name == "SIGTERM"
    assert len(notes) == 1
    assert "starting teardown" in notes[0]


@pytest.mark.parametrize("keeps_node", [False, True], ids=["run", "exec"])
def test_an_exec_never_says_it_tears_down(keeps_node: bool) -> None:
    notes: list[str] = []

    def body() -> None:
        try:
            signal.raise_signal(signal.SIGINT)
        finally:
            signal.raise_signal(signal.SIGTERM)  # refused: what comes next?
            with contextlib.suppress(StepSkipped), skippable("fetching your artifacts"):
                signal.raise_signal(signal.SIGINT)

    with (
        pytest.raises(InterruptedRun),
        signals_to_teardown(notes.append, force_exit_status=130, keeps_node=keeps_node),
    ):
        body()
    if keeps_node:  # once "skipping fetching your artifacts; tearing down next."
        assert notes[0].startswith("SIGTERM ignored: ending the exec;")
        assert notes[1] == (
            "SIGINT: skipping fetching your artifacts; the exec ends next (the session stays up)."
        )
        assert not any("tear" in note for note in notes)
    else:
        assert notes[0].startswith("SIGTERM ignored: starting teardown;")
        assert notes[1] == "SIGINT: skipping fetching your artifacts; tearing down next."


def test_a_failed_teardown_outranks_the_interruption() -> None:
    def body() -> None:
        try:
            signal.raise_signal(signal.SIGTERM)
        finally:
            raise TeardownError("not confirmed", [])

    with pytest.raises(TeardownError):
        _guarded(body, [])


def test_a_broken_notify_never_breaks_teardown() -> None:
    def broken(_message: str) -> None:
        raise OSError("terminal is gone")

    reached = []

    def body() -> None:
        with signals_to_teardown(broken, force_exit_status=6):
            try:
                signal.raise_signal(signal.SIGHUP)
            finally:
                with shield("deleting node n1"):
                    signal.raise_signal(signal.SIGHUP)
                    reached.append(True)

    with pytest.raises(InterruptedRun):
        body()
    assert reached == [True]


def test_handlers_are_restored_and_a_quiet_run_is_untouched() -> None:
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    with _guard([]):
        assert signal.getsignal(signal.SIGTERM) is not before[signal.SIGTERM]
        assert interrupted() is None
        with shield("deleting"):
            pass
    assert {s: signal.getsignal(s) for s in before} == before
    assert interrupted() is None


def test_an_ignored_signal_stays_ignored() -> None:
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with _guard([]):
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            signal.raise_signal(signal.SIGHUP)  # nohup: nothing happens
    finally:
        signal.signal(signal.SIGHUP, previous)


def test_off_the_main_thread_both_are_no_ops() -> None:
    errors: list[BaseException] = []

    def body() -> None:
        try:
            with _guard([]), shield("deleting"):
                pass
        except BaseException as error:  # pragma: no cover - reported below
            errors.append(error)

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert errors == []


def test_signal_interrupt_is_not_an_exception() -> None:
    # `except Exception` in a phase must never swallow the request to stop.
    assert not issubclass(SignalInterrupt, Exception)


CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from tpulab.errors import InterruptedRun
    from tpulab.run.signals import shield, signals_to_teardown

    window = float(sys.argv[1])
    work_gate, teardown_gate = int(sys.argv[2]), int(sys.argv[3])
    # A foreground process, whatever the test runner inherited (a background job in a
    # non-interactive shell starts with SIGINT ignored, which tpulab rightly respects).
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)
    if "ignore-hup" in sys.argv:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    def notify(message):
        print("NOTIFY " + message.replace("\\n", " | "), flush=True)

    def wait_for_release(gate):
        # Blocks until the test writes a byte (or dies: EOF). A signal whose handler
        # returns (a refusal) resumes the read (PEP 475); one that raises ends it.
        os.read(gate, 1)

    try:
        with signals_to_teardown(notify, force_exit_status=6, window=window):
            try:
                print("WORKING", flush=True)
                if "fail" in sys.argv:  # teardown begun by an error, not by a signal
                    raise RuntimeError("payload failed")
                wait_for_release(work_gate)
                print("WORK-DONE", flush=True)
            finally:
                with shield("deleting node n1 in us-central1-a",
                            manual="gcloud compute tpus tpu-vm delete n1 --quiet"):
                    print("TEARDOWN-START", flush=True)
                    wait_for_release(teardown_gate)
                    print("TEARDOWN-DONE", flush=True)
    except InterruptedRun as error:
        print("INTERRUPTED " + error.signal_name, flush=True)
        sys.exit(130)
    except RuntimeError as error:
        print("FAILED " + str(error), flush=True)
        sys.exit(1)
    """
)

# Long enough that a loaded machine never lets three quick presses drift apart: whether
# a press forces is then decided by the counting rule alone (the window itself is
# tested in-process above, with an injected clock).
WIDE_WINDOW = "60"


class Child:
    """A child process whose work and teardown each block until the test releases them,
    so every signal lands in the phase the test names, however slow the machine."""

    def __init__(self, window: str, *flags: str) -> None:
        work_read, self._work = os.pipe()
        teardown_read, self._teardown = os.pipe()
        self.process = subprocess.Popen(
            [sys.executable, "-c", CHILD, window, str(work_read), str(teardown_read), *flags],
            stdout=subprocess.PIPE,
            text=True,
            pass_fds=(work_read, teardown_read),
        )
        os.close(work_read)
        os.close(teardown_read)
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        self._pump_thread = threading.Thread(target=self._pump, daemon=True)
        self._pump_thread.start()

    def _pump(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))

    def wait_for(self, prefix: str) -> str:
        while True:
            try:
                line = self.lines.get(timeout=60)  # a bound: the child starts Python first
            except queue.Empty:
                raise AssertionError(self._stuck(prefix)) from None
            self.seen.append(line)
            if line.startswith(prefix):
                return line

    def _stuck(self, prefix: str) -> str:
        """What a wait that ran out knows: the child's lines so far, and whether it
        still runs (its /proc state: "T" is stopped) or how it ended."""
        status = self.process.poll()
        if status is None:
            try:
                stat = Path(f"/proc/{self.process.pid}/stat").read_text()
                state = "running, /proc state " + stat.rsplit(")", 1)[1].split()[0]
            except OSError:
                state = "running"
        else:
            state = f"ended with status {status}"
        return f"no {prefix!r} line in 60 s; the child is {state}; it printed {self.seen}"

    def send(self, signum: signal.Signals) -> None:
        self.process.send_signal(signum)

    def release_work(self) -> None:
        os.write(self._work, b"w")

    def release_teardown(self) -> None:
        os.write(self._teardown, b"t")

    def finish(self) -> tuple[int, list[str]]:
        status = self.process.wait(timeout=60)
        # Every line is queued once the pump has read EOF: wait for that, not for a quiet
        # 0.5 s, which a starved pump thread can outlast and lose the last lines.
        self._pump_thread.join(timeout=60)
        while True:
            try:
                self.seen.append(self.lines.get_nowait())
            except queue.Empty:
                return status, self.seen

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        for gate in (self._work, self._teardown):
            with contextlib.suppress(OSError):
                os.close(gate)


@pytest.fixture
def children() -> Iterator[list[Child]]:
    started: list[Child] = []
    yield started
    for child in started:
        child.close()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_real_signal_mid_phase_tears_down_and_exits_130(
    signum: signal.Signals, children: list[Child]
) -> None:
    child = Child(WIDE_WINDOW)
    children.append(child)
    child.wait_for("WORKING")
    child.send(signum)  # the work is never released: only the signal can end it
    child.wait_for("TEARDOWN-START")
    child.release_teardown()
    status, lines = child.finish()
    assert status == 130
    assert "WORK-DONE" not in lines
    assert lines[-3:] == ["TEARDOWN-START", "TEARDOWN-DONE", f"INTERRUPTED {signum.name}"]


def test_real_second_ctrl_c_is_refused_and_teardown_completes(children: list[Child]) -> None:
    child = Child(WIDE_WINDOW)
    children.append(child)
    child.wait_for("WORKING")
    child.send(signal.SIGINT)
    child.wait_for("TEARDOWN-START")
    child.send(signal.SIGINT)  # well inside the window, and still refused
    refusal = child.wait_for("NOTIFY")
    assert "deleting node n1 in us-central1-a" in refusal
    child.release_teardown()
    status, lines = child.finish()
    assert status == 130
    assert lines[-2:] == ["TEARDOWN-DONE", "INTERRUPTED SIGINT"]


def test_real_third_ctrl_c_in_the_window_force_quits_with_the_manual_command(
    children: list[Child],
) -> None:
    child = Child(WIDE_WINDOW)
    children.append(child)
    child.wait_for("WORKING")
    child.send(signal.SIGINT)
    child.wait_for("TEARDOWN-START")
    child.send(signal.SIGINT)
    child.wait_for("NOTIFY")
    child.send(signal.SIGINT)  # the teardown is never released: only forcing ends it
    status, lines = child.finish()
    assert status == 6
    assert "TEARDOWN-DONE" not in lines
    forced = lines[-1]
    assert forced.startswith("NOTIFY Forced quit while deleting node n1 in us-central1-a")
    assert "gcloud compute tpus tpu-vm delete n1 --quiet" in forced
    assert "journal row is still open" in forced


def test_real_two_ctrl_c_cannot_abort_a_teardown_begun_by_an_error(
    children: list[Child],
) -> None:
    # A failed payload (or `teardown --verify`) starts teardown with no Ctrl-C: the user's
    # first two presses, however quick, are both refused and the node is still deleted.
    child = Child(WIDE_WINDOW, "fail")
    children.append(child)
    child.wait_for("TEARDOWN-START")
    child.send(signal.SIGINT)
    first = child.wait_for("NOTIFY")
    child.send(signal.SIGINT)
    second = child.wait_for("NOTIFY")
    child.release_teardown()
    status, lines = child.finish()
    assert status == 1
    assert lines[-2:] == ["TEARDOWN-DONE", "FAILED payload failed"]
    assert first.startswith("NOTIFY SIGINT ignored: deleting node n1 in us-central1-a")
    # Only the refusal after which one more quick Ctrl-C really forces says so.
    assert "force quit" not in first
    assert f"Ctrl-C again within {WIDE_WINDOW} s to force quit" in second


def test_real_third_ctrl_c_force_quits_a_teardown_begun_by_an_error(
    children: list[Child],
) -> None:
    child = Child(WIDE_WINDOW, "fail")
    children.append(child)
    child.wait_for("TEARDOWN-START")
    for _ in range(2):
        child.send(signal.SIGINT)
        child.wait_for("NOTIFY SIGINT ignored")
    child.send(signal.SIGINT)
    status, lines = child.finish()
    assert status == 6
    assert "TEARDOWN-DONE" not in lines
    assert lines[-1].startswith("NOTIFY Forced quit while deleting node n1 in us-central1-a")


def test_real_sigterm_then_two_ctrl_c_does_not_force(children: list[Child]) -> None:
    # A supervisor's SIGTERM began teardown; it is not a Ctrl-C press, so two more do not
    # add up to three, even well inside the window.
    child = Child(WIDE_WINDOW)
    children.append(child)
    child.wait_for("WORKING")
    child.send(signal.SIGTERM)
    child.wait_for("TEARDOWN-START")
    for _ in range(2):
        child.send(signal.SIGINT)
        child.wait_for("NOTIFY SIGINT ignored")
    child.release_teardown()
    status, lines = child.finish()
    assert status == 130
    assert lines[-2:] == ["TEARDOWN-DONE", "INTERRUPTED SIGTERM"]


def test_real_repeated_sigterm_never_forces(children: list[Child]) -> None:
    child = Child(WIDE_WINDOW)
    children.append(child)
    child.wait_for("WORKING")
    child.send(signal.SIGTERM)
    child.wait_for("TEARDOWN-START")
    for _ in range(3):
        child.send(signal.SIGTERM)
        child.wait_for("NOTIFY SIGTERM ignored")
    child.release_teardown()
    status, lines = child.finish()
    assert status == 130
    assert lines[-2:] == ["TEARDOWN-DONE", "INTERRUPTED SIGTERM"]


def test_real_sighup_under_nohup_is_ignored(children: list[Child]) -> None:
    child = Child(WIDE_WINDOW, "ignore-hup")
    children.append(child)
    child.wait_for("WORKING")
    # Sent while the work is blocked: were SIGHUP caught, it would end the read at once
    # (the kernel marks it pending before kill() returns), long before the release.
    child.send(signal.SIGHUP)
    child.release_work()
    child.wait_for("TEARDOWN-START")
    child.release_teardown()
    status, lines = child.finish()
    assert status == 0
    assert lines[-3:] == ["WORK-DONE", "TEARDOWN-START", "TEARDOWN-DONE"]
