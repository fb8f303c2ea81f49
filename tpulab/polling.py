"""The one wait/retry mechanism: a jittered backoff and a deadline-bounded loop.

    poll_until(probe, done, timeout=...)    probe until done(result); errors that
                                            `retry_if` accepts count as "not yet"
    retry_call(call, retry_if, timeout=...) call until it returns; at the deadline the
                                            last retryable error is raised
    time_left(timeout)                      `timeout`, cut to what the enclosing loop
                                            has left

Every wait in tpulab goes through here: waiting for READY and for operations, the
teardown's delete/list loop, the sweep's listing, the SSH connect wait, the host-key
wait, GoogleTpuApi's retries of idempotent calls, and the jittered gap between passes
over the zone list of `--retry-until-up` (`Backoff.gap`). Clock and sleep are arguments, so
tests drive the schedule with a fake clock.

Deadlines nest (unless a loop says `enclose=False`, as the retry budget around whole
run attempts does: an attempt's teardown keeps its own deadline). While a loop runs its
probe, a loop started inside it (a GoogleTpuApi
call riding out a 503 storm inside the wait for READY) ends no later than the enclosing
one. That is what makes the phase's deadline the only thing that ends the retrying, and
what stops an inner retry budget from overrunning it. The enclosing deadline lives in a
ContextVar as (deadline, clock) because an inner loop may run on a different clock;
threads start with no enclosing deadline.

While a poll's probe runs, `active_wait()` names the loop it belongs to (its schedule
object, timeout and goal): `tpulab run --dry-run` records each polled request once, with
the cadence the real loop would keep, instead of a prose description of it. Retries
(`retry_call`) are not polls and announce nothing.

A leaf module (it imports only `tpulab.errors`) because `tpulab.remote` and
`tpulab.cloud` are sibling layers that may not import each other, and both wait.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Generic, TypeVar

from tpulab.errors import DeadlineError, EndpointDownError

__all__ = [
    "ActiveWait",
    "Backoff",
    "Tries",
    "active_wait",
    "announce_wait",
    "poll_until",
    "retry_call",
    "time_left",
]

T = TypeVar("T")

Clock = Callable[[], float]
Sleep = Callable[[float], None]

# The innermost running loop's deadline, on that loop's clock.
_ENCLOSING: ContextVar[tuple[float, Clock] | None] = ContextVar(
    "tpulab_polling_enclosing_deadline", default=None
)


class Backoff:
    """Delays that start at `initial`, grow by `factor` and never exceed `cap`.

    Each delay is spread by +-`jitter` (a fraction) so that many controllers polling the
    same API do not fall into step; the spread never pushes a delay above `cap`, which is
    what bounds how late a change can be noticed. Iterating again starts over.
    """

    def __init__(
        self,
        initial: float = 1.0,
        cap: float = 10.0,
        factor: float = 1.6,
        jitter: float = 0.2,
        rng: random.Random | None = None,
    ) -> None:
        if initial <= 0 or cap < initial or factor < 1.0 or not 0.0 <= jitter < 1.0:
            raise ValueError(
                f"bad backoff: initial={initial} cap={cap} factor={factor} jitter={jitter}"
            )
        self.initial = initial
        self.cap = cap
        self.factor = factor
        self.jitter = jitter
        self._rng = rng if rng is not None else random.Random()

    @classmethod
    def gap(
        cls,
        seconds: float,
        *,
        cap: float | None = None,
        jitter: float = 0.3,
        rng: random.Random | None = None,
    ) -> Backoff:
        """A pause between retries of something expensive (a pass over the zones): about
        `seconds`, spread by `jitter` so that many waiting users do not retry in step,
        growing slowly to `cap` (default: `seconds`, i.e. steady)."""
        return cls(
            initial=seconds,
            cap=cap if cap is not None else seconds,
            factor=1.3,
            jitter=jitter,
            rng=rng,
        )

    def __iter__(self) -> Iterator[float]:
        base = self.initial
        while True:
            spread = 1.0 + self.jitter * (2.0 * self._rng.random() - 1.0)
            yield min(base * spread, self.cap)
            base = min(base * self.factor, self.cap)

    def __repr__(self) -> str:
        return (
            f"Backoff(initial={self.initial}, cap={self.cap}, factor={self.factor}, "
            f"jitter={self.jitter})"
        )


@dataclass(frozen=True)
class ActiveWait:
    """The poll loop a probe is running in: what it waits for, how often, how long."""

    until: str
    schedule: object  # the delays' iterable itself (a Backoff shows its parameters)
    timeout: float


_ACTIVE_WAIT: ContextVar[ActiveWait | None] = ContextVar("tpulab_active_wait", default=None)


def active_wait() -> ActiveWait | None:
    """The innermost poll loop whose probe is running now, if any."""
    return _ACTIVE_WAIT.get()


@contextmanager
def announce_wait(wait: ActiveWait) -> Iterator[None]:
    """Run a probe as part of the poll loop `wait` (for a probe that polls only in part,
    like the teardown's round, whose list is the poll and whose deletes are not)."""
    token = _ACTIVE_WAIT.set(wait)
    try:
        yield
    finally:
        _ACTIVE_WAIT.reset(token)


@dataclass
class Tries(Generic[T]):
    """What a loop saw before its deadline: handed to `expired` to build the error."""

    timeout: float
    attempts: int = 0
    last: T | None = None
    error: Exception | None = None


def time_left(timeout: float) -> float:
    """`timeout`, or less if the enclosing loop's deadline comes sooner (never < 0)."""
    enclosing = _ENCLOSING.get()
    if enclosing is None:
        return max(0.0, timeout)
    deadline, clock = enclosing
    return max(0.0, min(timeout, deadline - clock()))


def poll_until(
    probe: Callable[[], T],
    done: Callable[[T], bool],
    *,
    timeout: float,
    clock: Clock = time.monotonic,
    sleep: Sleep = time.sleep,
    backoff: Iterable[float] | None = None,
    retry_if: Callable[[Exception], bool] | None = None,
    on_retry: Callable[[Exception, float], None] | None = None,
    describe: Callable[[T | None], str] | None = None,
    expired: Callable[[Tries[T]], Exception] | None = None,
    announce: bool = True,
    enclose: bool = True,
) -> T:
    """Call `probe` until `done(result)`; return that result.

    Probes immediately, then after each backoff delay, cut short so the last probe
    happens exactly at the deadline (`timeout`, or the enclosing loop's, if sooner). An
    exception from `probe` that `retry_if` accepts counts as "not yet" (`on_retry` hears
    it with the coming delay); any other propagates at once -- that is how a caller stops
    early (a preempted node, a failed operation) -- and so does an EndpointDownError,
    whatever `retry_if` says. Past the deadline raises
    `expired(tries)`, by default a DeadlineError worded with `describe(last_result)`.
    With `announce`, each probe runs under this loop's `ActiveWait` (see module doc).
    Without `enclose`, loops inside the probe keep their own deadlines instead of
    ending by this one's: a retry budget around whole runs must never shorten the
    teardown of the run it is retrying.
    """
    if timeout < 0:
        raise ValueError(f"timeout must be >= 0, got {timeout}")
    budget = time_left(timeout)
    deadline = clock() + budget
    schedule = backoff if backoff is not None else Backoff()
    delays = iter(schedule)
    loop = ActiveWait(
        describe(None) if describe is not None else "the awaited condition", schedule, budget
    )
    tries: Tries[T] = Tries(budget)
    while True:
        tries.attempts += 1
        scope = _ENCLOSING.set((deadline, clock) if enclose else _ENCLOSING.get())
        try:
            if announce:
                with announce_wait(loop):
                    result = probe()
            else:
                result = probe()
            finished = done(result)
        except Exception as error:
            # An endpoint that never answered this command at all ends every wait at
            # once: each later call would fail the same way (see EndpointDownError).
            if retry_if is None or not retry_if(error) or isinstance(error, EndpointDownError):
                raise
            tries.error = error
        else:
            if finished:
                return result
            tries.last, tries.error = result, None
        finally:
            _ENCLOSING.reset(scope)
        remaining = deadline - clock()
        if remaining <= 0:
            break
        delay = min(next(delays), remaining)
        if on_retry is not None and tries.error is not None:
            on_retry(tries.error, delay)
        sleep(delay)
    if expired is not None:
        raise expired(tries)
    what = describe(tries.last) if describe is not None else "the awaited condition"
    why = f" (last error: {_said(tries.error)})" if tries.error is not None else ""
    raise DeadlineError(
        f"Gave up after {budget:g}s waiting for {what}{why}.",
        hint="The cloud may just be slow: retry later, and check the resource with `tpulab list`.",
    ) from tries.error


def retry_call(
    call: Callable[[], T],
    *,
    retry_if: Callable[[Exception], bool],
    timeout: float,
    clock: Clock = time.monotonic,
    sleep: Sleep = time.sleep,
    backoff: Iterable[float] | None = None,
    on_retry: Callable[[Exception, float], None] | None = None,
) -> T:
    """Call until it returns, backing off after each error `retry_if` accepts.

    Only the deadline (`timeout`, or the enclosing loop's) ends the retrying; then the
    last retryable error itself is raised, since it says more than "gave up".
    """

    def last_error(tries: Tries[T]) -> Exception:
        assert tries.error is not None  # every attempt failed, or we would have returned
        return tries.error

    return poll_until(
        call,
        lambda _result: True,
        timeout=timeout,
        clock=clock,
        sleep=sleep,
        backoff=backoff,
        retry_if=retry_if,
        on_retry=on_retry,
        expired=last_error,
        announce=False,
    )


def _said(error: Exception) -> str:
    message = getattr(error, "message", None)
    return str(message) if message else f"{type(error).__name__}: {error}"
