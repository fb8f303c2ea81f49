"""Signals become an orderly teardown, and teardown cannot be interrupted by accident.

Inside `signals_to_teardown()` the first SIGINT, SIGTERM or SIGHUP raises
`SignalInterrupt` in the main thread. It is a BaseException, so no `except Exception`
on the way can swallow it; it unwinds into the lifecycle's `finally`, which tears the
node down. When it leaves the context it becomes `errors.InterruptedRun`, which the CLI
maps to its exit status.

From then on (and inside any `shield(...)`, i.e. while a node is being deleted) signals
no longer raise: each is refused with a message, through the `notify` callback, saying
what is being deleted. The rule for forcing: the user's THIRD Ctrl-C of the run, if it
comes within `window` seconds of the previous (refused) one, exits with
`force_exit_status` after printing the manual delete command; the journal row stays open
so `tpulab teardown --verify` finishes the job. Counting presses rather than refusals
makes it three presses however teardown began: by a Ctrl-C (1st starts teardown, 2nd is
refused, 3rd forces) or by an error or `teardown --verify` (1st and 2nd are refused, 3rd
forces), so a second Ctrl-C never aborts a teardown. The refusal offers the way out only
when the next quick Ctrl-C would really take it. Only Ctrl-C can force: SIGTERM and
SIGHUP come from supervisors and closing terminals, which should not abandon a node.

One step may be skippable instead: inside `skippable(describe)` (the fetch of the user's
artifacts after a first Ctrl-C), the next signal raises `StepSkipped` rather than being
refused, so a second Ctrl-C skips that step and the run goes straight on to teardown.
A shield inside it still wins: nothing skips a teardown. With `finish_within=S` the
step is one a FIRST signal must not cut short either (the fetch of a command that has
ended: raising there would drop artifacts that are already on their way): that signal
is recorded as the run's interrupt without raising, the user is told the step goes on
for at most S seconds and that another Ctrl-C skips it, and from then on the step is
skippable; past S seconds a SIGALRM skips it as a second Ctrl-C would. The body then
ends normally and its caller decides (`interrupted()` names the signal).

A signal whose exception lands where Python ignores exceptions (a weakref callback or
a `__del__`, e.g. the import system's lock cleanup) would be lost: the guard hears of it
through `sys.unraisablehook`, undoes what raising it recorded and sends the signal
again, so it lands in the run.

A signal the process inherited as ignored (e.g. SIGHUP under `nohup`) stays ignored.
Outside the main thread both context managers do nothing (Python delivers signals only
to the main thread), so library callers and threaded tests are unaffected.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext, suppress
from dataclasses import dataclass, field
from types import FrameType
from typing import NoReturn, Protocol

from tpulab.errors import InterruptedRun

__all__ = [
    "DEFAULT_SIGNALS",
    "Shield",
    "SignalInterrupt",
    "Skippable",
    "StepSkipped",
    "interrupted",
    "is_skip",
    "no_shield",
    "no_skip",
    "shield",
    "signals_to_teardown",
    "skippable",
]

DEFAULT_SIGNALS: tuple[signal.Signals, ...] = (
    signal.SIGINT,
    signal.SIGTERM,
    *((signal.SIGHUP,) if hasattr(signal, "SIGHUP") else ()),
)


class SignalInterrupt(BaseException):
    """A signal asked the run to stop; raised once, in the main thread."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.signal_name = signal.Signals(signum).name
        super().__init__(f"interrupted by {self.signal_name}")


class StepSkipped(BaseException):
    """A signal arrived inside `skippable(...)`: skip that step (not the teardown)."""

    def __init__(self, signum: int, step: str, *, why: str | None = None) -> None:
        self.signum = signum
        self.signal_name = signal.Signals(signum).name
        self.step = step
        # What skipped it, for the user: "SIGINT", or the bound that ran out.
        self.why = why or self.signal_name
        super().__init__(f"{step} skipped by {self.why}")


# The Ctrl-C that may force a quit: never the 2nd, so a second Ctrl-C cannot abort teardown.
_FORCING_PRESS = 3
# How long after Python ignored what the guard raised its signal is sent again (time
# for the callback it landed in to return), once the hook that heard of it returned
# (waited for at most _REDELIVER_WAIT).
_REDELIVER_AFTER = 0.01
_REDELIVER_WAIT = 5.0


@dataclass
class _Guard:
    notify: Callable[[str], None]
    force_exit_status: int
    window: float
    clock: Callable[[], float]
    interrupt: SignalInterrupt | None = None
    shield_depth: int = 0
    describe: str = "tearing down"
    # An exec's interrupt ends the exec and leaves its session's node up: its messages
    # must not promise a teardown that never comes.
    keeps_node: bool = False
    manual: str | None = None
    skippable: str | None = None  # the step a signal would skip now, if any
    # The step a first signal must let finish, and for at most how many seconds.
    deferring: tuple[str, float] | None = None
    bounded: tuple[str, float] | None = None  # the deferred step whose SIGALRM is armed
    last_refusal: float | None = None
    ctrl_c_presses: int = 0  # every SIGINT of the run, including one that began teardown
    refused: list[str] = field(default_factory=list)
    # What the guard raised last: the exception, how to undo what raising it recorded,
    # and the signal that raises it again (see `redeliver`).
    raised: tuple[BaseException, Callable[[], None], int] | None = None
    # Set when the unraisable hook that redelivers a signal has returned (redeliver).
    hook_returned: threading.Event = field(default_factory=threading.Event)

    def say(self, text: str) -> None:
        # A closed terminal (SIGHUP) must not turn a message into a failed teardown.
        with suppress(Exception):
            self.notify(text)

    def handle(self, signum: int, frame: FrameType | None) -> None:
        del frame
        if signum == signal.SIGINT:
            self.ctrl_c_presses += 1
        if self.interrupt is None and self.shield_depth == 0:
            self.interrupt = SignalInterrupt(signum)
            if self.deferring is not None:
                self._defer(signum, *self.deferring)
                return
            self._raise(self.interrupt, self._unpress(signum, self._forget_interrupt), signum)
        if self.skippable is not None and self.shield_depth == 0:
            step, self.skippable = self.skippable, None  # one skip per step
            then = (
                "the exec ends next (the session stays up)"
                if self.keeps_node
                else "tearing down next"
            )
            self.say(f"{signal.Signals(signum).name}: skipping {step}; {then}.")

            def skippable_again() -> None:
                self.skippable = step

            self._raise(StepSkipped(signum, step), self._unpress(signum, skippable_again), signum)
        name = signal.Signals(signum).name
        self.refused.append(name)
        now = self.clock()
        repeated = self.last_refusal is not None and now - self.last_refusal <= self.window
        if signum == signal.SIGINT and repeated and self.ctrl_c_presses >= _FORCING_PRESS:
            self._force_exit()
        if signum == signal.SIGINT:
            self.last_refusal = now
        starting = "ending the exec" if self.keeps_node else "starting teardown"
        what = self.describe if self.shield_depth else starting
        more = (
            f" Press Ctrl-C again within {self.window:g} s to force quit "
            "(the node may keep billing)."
            if signum == signal.SIGINT and self.ctrl_c_presses + 1 >= _FORCING_PRESS
            else ""
        )
        self.say(f"{name} ignored: {what}; tpulab will exit when it is done.{more}")

    def _raise(self, error: BaseException, undo: Callable[[], None], signum: int) -> NoReturn:
        self.raised = (error, undo, signum)
        raise error

    def _unpress(self, signum: int, undo: Callable[[], None]) -> Callable[[], None]:
        """`undo`, and for a Ctrl-C also its press: it is counted again when it lands."""

        def both() -> None:
            undo()
            if signum == signal.SIGINT:
                self.ctrl_c_presses -= 1

        return both

    def _forget_interrupt(self) -> None:
        self.interrupt = None

    def redeliver(self, error: BaseException | None) -> bool:
        """Whether `error` is what this guard raised last, raised where Python ignores
        exceptions (a weakref callback or `__del__` the signal happened to land in).
        Lost, a first interrupt left the run going as if never signalled, refusing every
        later signal as "already tearing down"; a lost skip left its step unskippable.
        If so, the guard undoes what raising it recorded and the same signal is sent
        again a moment later, to land in the run itself."""
        if self.raised is None or error is not self.raised[0]:
            return False
        _, undo, signum = self.raised
        self.raised = None
        undo()
        before = (self.interrupt, self.skippable, self.bounded)

        returned = self.hook_returned = threading.Event()

        def again() -> None:
            # Not before the hook has returned: a signal landing in it (or in this
            # thread's start, which the hook waits for) is ignored again, and lost; on
            # a loaded machine a fixed pause alone let it land there (CI, 2026-12-07).
            returned.wait(_REDELIVER_WAIT)
            time.sleep(_REDELIVER_AFTER)
            # Only into the same state: not once the guard has ended, nor after another
            # signal (or the end of the step) has changed what a signal would do.
            if _active is self and (self.interrupt, self.skippable, self.bounded) == before:
                os.kill(os.getpid(), signum)

        # From another thread, after this hook and the callback it reports have
        # returned: a signal raised here would land in the same ignoring context.
        threading.Thread(target=again, name="tpulab-redeliver", daemon=True).start()
        return True

    def _defer(self, signum: int, step: str, bound: float) -> None:
        """A first signal inside `skippable(step, finish_within=bound)`: the step goes
        on, now skippable, for at most `bound` seconds (then SIGALRM skips it)."""
        self.deferring = None
        self.skippable = step
        if hasattr(signal, "setitimer"):
            self.bounded = (step, bound)
            signal.setitimer(signal.ITIMER_REAL, bound)
        self.say(
            f"{signal.Signals(signum).name}: letting {step} finish (at most {bound:g} s); "
            f"press Ctrl-C again to skip {step}."
        )

    def expire(self, signum: int, frame: FrameType | None) -> None:
        """SIGALRM: a deferred step ran past its bound; skip it like a second Ctrl-C."""
        del signum, frame
        bounded, self.bounded = self.bounded, None
        if bounded is None or self.skippable != bounded[0] or self.shield_depth:
            return  # the step is over (or shielded): nothing to cut short
        step, bound = bounded
        self.skippable = None
        assert self.interrupt is not None
        why = f"its {bound:g} s bound after {self.interrupt.signal_name}"
        self.say(f"{step[:1].upper() + step[1:]} ran past {why}: skipping it.")

        def undo() -> None:
            self.skippable, self.bounded = step, bounded

        self._raise(StepSkipped(self.interrupt.signum, step, why=why), undo, signal.SIGALRM)

    def _force_exit(self) -> None:
        lines = [f"Forced quit while {self.describe}: the node may still exist and bill."]
        if self.manual:
            lines.append(f"Finish it by hand (the journal row is still open):\n  {self.manual}")
        else:
            lines.append("Run `tpulab teardown --verify` (the journal row is still open).")
        self.say("\n".join(lines))
        for stream in (sys.stdout, sys.stderr):
            with suppress(Exception):
                stream.flush()
        os._exit(self.force_exit_status)


_active: _Guard | None = None


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextmanager
def signals_to_teardown(
    notify: Callable[[str], None],
    *,
    force_exit_status: int,
    window: float = 2.0,
    clock: Callable[[], float] = time.monotonic,
    signals: Sequence[signal.Signals] = DEFAULT_SIGNALS,
    keeps_node: bool = False,
) -> Iterator[None]:
    """Turn `signals` into SignalInterrupt for the body, then into InterruptedRun.

    `notify` receives the user-facing messages (the core never prints); the CLI passes
    something that writes to stderr. If teardown itself raised (TeardownError), that
    error propagates instead: an unconfirmed teardown outranks the interruption.
    `keeps_node`: an exec's, whose interrupt ends the exec and leaves the session's node
    up (its messages say so, not "tearing down").
    """
    global _active
    if not _in_main_thread():
        yield
        return
    guard = _Guard(notify, force_exit_status, window, clock, keeps_node=keeps_node)
    previous_guard, _active = _active, guard
    installed: dict[signal.Signals, object] = {}
    previous_hook = sys.unraisablehook

    def unraisable(report: sys.UnraisableHookArgs) -> None:
        try:
            if not guard.redeliver(report.exc_value):
                previous_hook(report)
        finally:
            guard.hook_returned.set()  # the redelivery may go now

    sys.unraisablehook = unraisable
    try:
        for signum in signals:
            if signal.getsignal(signum) is signal.SIG_IGN:
                continue  # respect nohup and friends
            installed[signum] = signal.signal(signum, guard.handle)
        yield
    except SignalInterrupt as interrupt:
        raise InterruptedRun(interrupt.signal_name) from None
    finally:
        for signum, handler in installed.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]
        sys.unraisablehook = previous_hook
        _active = previous_guard


@contextmanager
def shield(describe: str, *, manual: str | None = None) -> Iterator[None]:
    """Refuse signals for the body (the teardown): `describe` says what is going on
    ("deleting node X in us-central1-a"), `manual` is the command a forced quit prints.

    Nests; does nothing outside `signals_to_teardown` or off the main thread.
    """
    guard = _active
    if guard is None or not _in_main_thread():
        yield
        return
    saved = (guard.describe, guard.manual)
    guard.describe, guard.manual = describe, manual
    guard.shield_depth += 1
    try:
        yield
    finally:
        guard.shield_depth -= 1
        guard.describe, guard.manual = saved


@contextmanager
def skippable(describe: str, *, finish_within: float | None = None) -> Iterator[None]:
    """Let the next signal skip the body (raising StepSkipped) instead of being refused.

    For a bounded, optional step between an interrupt and the teardown: fetching the
    user's artifacts after a first Ctrl-C. With `finish_within`, a step that runs before
    any interrupt (the fetch of a command that ended by itself): a first signal there is
    recorded but lets the body go on for at most that many seconds (module docstring).
    Does nothing outside `signals_to_teardown` or off the main thread (there a
    KeyboardInterrupt does the skipping).
    """
    guard = _active
    if guard is None or not _in_main_thread():
        yield
        return
    saved = guard.skippable, guard.deferring
    alarm = finish_within is not None and guard.interrupt is None and hasattr(signal, "SIGALRM")
    previous_alarm = signal.signal(signal.SIGALRM, guard.expire) if alarm else None
    if finish_within is not None and guard.interrupt is None:
        guard.deferring = (describe, finish_within)
    else:
        guard.skippable = describe
    try:
        yield
    finally:
        # The step is over: first make a late alarm a no-op, then disarm it.
        guard.skippable, guard.deferring = saved
        if alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            guard.bounded = None
            signal.signal(signal.SIGALRM, previous_alarm or signal.SIG_DFL)


def interrupted() -> str | None:
    """The name of the signal that interrupted the current run, if one did."""
    guard = _active
    if guard is None or guard.interrupt is None:
        return None
    return guard.interrupt.signal_name


class Shield(Protocol):
    """`shield`'s shape, as the run's context holds it (a seam): refuse interrupts while
    the body (the teardown) runs."""

    def __call__(
        self, describe: str, *, manual: str | None = None
    ) -> AbstractContextManager[object]: ...


def no_shield(describe: str, *, manual: str | None = None) -> AbstractContextManager[object]:
    """The context's default seam: no signal guard, nothing to refuse."""
    del describe, manual
    return nullcontext()


class Skippable(Protocol):
    """`skippable`'s shape, as the run's context holds it (a seam): a step a second
    signal may skip (and, with `finish_within`, one a first signal lets finish, bounded)."""

    def __call__(
        self, describe: str, *, finish_within: float | None = None
    ) -> AbstractContextManager[object]: ...


def no_skip(describe: str, *, finish_within: float | None = None) -> AbstractContextManager[object]:
    """The context's default seam: no signal guard, nothing to skip with."""
    del describe, finish_within
    return nullcontext()


def is_skip(error: BaseException) -> bool:
    """A second signal (or the bound after the first) skipping a step; or, with no
    signal guard installed, the KeyboardInterrupt that does the same."""
    return isinstance(error, StepSkipped | KeyboardInterrupt)
