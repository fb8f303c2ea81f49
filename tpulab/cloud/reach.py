"""Has the endpoint answered this command yet? How long one that never has is retried.

An endpoint where nothing listens, a host that never answers, a name that does not
resolve, a laptop that went offline: each used to cost every wait its whole deadline
(two minutes for `teardown --verify`, ten for a run's teardown), in silence. `Reach`
follows one `GoogleTpuApi`, shared by all its calls and threads:

    unproven   no request has had an answer yet. A request that failed on the network
               is tried again on a short `ReachSchedule` (cloud: after 1, 2, 4, 8 s;
               loopback: not at all), each try's timeout cut to what the schedule has left,
               and the caller hears "cannot reach ..., retrying (2 of 5)". When the
               schedule runs out the endpoint is declared down: an EndpointDownError,
               which every later call of the command raises again at once and every
               wait stops on (`tpulab.polling`).
    answered   any HTTP answer (an error too) proves something is there. From then on
               Reach changes nothing: losing the endpoint later (a network blip after a
               node was created) stays a TransientError that the waits and the run's
               teardown ride out under their own deadlines, exactly as before.

A request that was sent and not answered is only tried again where resending is safe
(an idempotent call): a CreateNode whose reply was lost keeps its OutcomeUnknownError,
so the run's teardown looks for the node it may have made.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from tpulab.errors import (
    CloudError,
    EndpointDownError,
    EndpointSilentError,
    EndpointUnreachableError,
    OutcomeUnknownError,
    UnreachableError,
)

__all__ = [
    "CLOUD_SCHEDULE",
    "LOOPBACK_SCHEDULE",
    "Reach",
    "ReachSchedule",
    "is_network_failure",
    "reach_of",
    "retry_backoff",
    "send_through",
]

T = TypeVar("T")


@dataclass(frozen=True)
class ReachSchedule:
    """The pauses between tries of an endpoint that has not answered yet, and the least
    time a try is given to answer however little of the schedule is left."""

    delays: tuple[float, ...]
    min_try: float

    @property
    def budget(self) -> float:
        """Seconds from the first try until the endpoint is declared down."""
        return sum(self.delays)

    @property
    def tries(self) -> int:
        return len(self.delays) + 1


# Google's API (or any remote endpoint) is reached over the user's network, whose blips
# (Wi-Fi reassociating, a VPN reconnecting) last seconds: retried for 15 s. A live API
# answers even a CreateNode in a few seconds, so no try waits less than 5 s.
CLOUD_SCHEDULE = ReachSchedule((1.0, 2.0, 4.0, 8.0), min_try=5.0)
# On loopback there is no network in between: a refused connection is the kernel saying
# nothing listens, final at once. Only a listener that never answers costs time, bounded
# generously because a loaded machine's emulator may be slow to answer its first request.
LOOPBACK_SCHEDULE = ReachSchedule((), min_try=10.0)


def reach_of(
    api_endpoint: str | None,
    google_host: str,
    *,
    api: str,
    clock: Callable[[], float],
    notify: Callable[[str], None] | None,
    schedule: ReachSchedule | None = None,
) -> Reach:
    """The Reach of one transport's endpoint (`api_endpoint`, None: Google's
    `google_host`): the loopback schedule for a local one, the cloud's otherwise.
    ConfigError for a malformed endpoint (tpulab.config.endpoint's one rule)."""
    from tpulab.config.endpoint import classify_endpoint

    endpoint = classify_endpoint(api_endpoint)
    return Reach(
        api_endpoint or google_host,
        schedule or (LOOPBACK_SCHEDULE if endpoint.is_loopback else CLOUD_SCHEDULE),
        clock=clock,
        notify=notify or (lambda _line: None),
        google=endpoint.kind == "google",
        api=api,
    )


def retry_backoff(api_endpoint: str | None) -> Iterable[float]:
    """The pauses between an idempotent request's ordinary retries: short on loopback (an
    emulator answers in milliseconds), the cloud's otherwise."""
    from tpulab.config.endpoint import classify_endpoint
    from tpulab.polling import Backoff

    if classify_endpoint(api_endpoint).is_loopback:
        return Backoff(initial=0.05, cap=0.5)
    return Backoff(0.5, 8.0)


def is_network_failure(error: Exception) -> bool:
    """No HTTP answer came: never sent, or sent and unanswered (not an EndpointDownError)."""
    return isinstance(error, UnreachableError | OutcomeUnknownError) and not isinstance(
        error, EndpointDownError
    )


class Reach:
    """Whether `endpoint` has answered, and when to stop trying one that has not."""

    def __init__(
        self,
        endpoint: str,
        schedule: ReachSchedule,
        *,
        clock: Callable[[], float],
        notify: Callable[[str], None],
        google: bool,
        api: str = "the Cloud TPU API",
    ) -> None:
        self.endpoint = endpoint
        self.api = api  # what the messages call it ("Compute Engine")
        self.schedule = schedule
        self._clock = clock
        self._notify = notify
        self._google = google
        self._lock = threading.Lock()
        self._answered = False
        self._started: float | None = None
        self._down: str | None = None  # why it was declared down, once it was
        self._last_notice = ""

    @property
    def answered(self) -> bool:
        return self._answered

    @property
    def down(self) -> str | None:
        """What went wrong, once the endpoint was declared down ("Connection refused; no
        answer in 15 s"); None until then."""
        return self._down

    def heard(self) -> None:
        """An HTTP answer arrived (success or an API error): the endpoint is there."""
        with self._lock:
            self._answered = True

    def raise_if_down(self, what: str) -> None:
        """Once declared down, every later call fails at once, unsent."""
        if self._down is not None:
            raise EndpointUnreachableError(
                f"Could not {what}: {self.api} at {self.endpoint} is not reachable "
                f"({self._down}); the request was not sent.",
                status="UNAVAILABLE",
                hint=self._hint(),
            )

    def timeout(self, full: float) -> float:
        """A try's timeout: `full` once the endpoint answered; before that, what the
        schedule has left (never under its `min_try`), so a listener that never answers
        cannot hold a try longer than the whole schedule."""
        with self._lock:
            if self._answered:
                return full
            now = self._clock()
            if self._started is None:
                self._started = now
            left = self._started + self.schedule.budget - now
        return min(full, max(left, self.schedule.min_try))

    def delays(self, then: Iterator[float]) -> Iterator[float]:
        """The reach schedule's pauses while unproven, then `then` (ordinary retries)."""
        for delay in self.schedule.delays:
            if self._answered:
                break
            yield delay
        yield from then

    def failed(
        self,
        error: CloudError,
        *,
        tries: int,
        sent: bool,
        what: str,
        resendable: bool,
        words: str,
    ) -> CloudError:
        """What a try that failed with `error` raises: the error itself (to be retried,
        or not, by the ordinary rules), or an EndpointDownError once the schedule is
        spent without a single answer. `tries` and `sent` (some try reached the server)
        are the call's own; `words` say what went wrong ("connection refused")."""
        if not is_network_failure(error):
            return error
        with self._lock:
            if self._answered or not resendable:
                return error
            started = self._started if self._started is not None else self._clock()
            elapsed = max(0.0, self._clock() - started)
            if tries < self.schedule.tries and elapsed < self.schedule.budget:
                return error
            if self._down is None:
                self._down = f"{words}; no answer in {elapsed:.0f} s"
        plural = "try" if tries == 1 else "tries"
        kind: type[EndpointDownError] = EndpointSilentError if sent else EndpointUnreachableError
        outcome = "" if sent else "; the request was never sent"
        return kind(
            f"Could not {what}: cannot reach {self.api} at {self.endpoint} "
            f"({words}; no answer in {elapsed:.0f} s, {tries} {plural}){outcome}.",
            status=error.status,
            api_message=error.api_message,
            hint=self._hint(),
        )

    def should_retry(self, error: Exception, *, resendable: bool) -> bool:
        """Whether `failed` kept a network failure of an unproven endpoint for retrying."""
        return resendable and not self._answered and is_network_failure(error)

    def retrying(self, error: Exception, *, tries: int, words: str) -> None:
        """Tell the user, once per distinct line, that a try failed and another follows."""
        if self._answered or not is_network_failure(error):
            return
        line = (
            f"cannot reach {self.endpoint} ({words}), "
            f"retrying ({tries + 1} of {self.schedule.tries})"
        )
        with self._lock:
            if line == self._last_notice:
                return
            self._last_notice = line
        self._notify(line)

    def _hint(self) -> str:
        if self._google:
            return (
                "Check this machine's network connection (and any proxy or VPN), then "
                "retry; offline, rehearse with --emulate."
            )
        return (
            f"Check the network and the --api-endpoint URL ({self.endpoint}); for a "
            "local emulator, check that `tpulab emulator serve` is still running (or use "
            "--emulate). Then retry."
        )


def send_through(
    reach: Reach,
    send: Callable[[float], T],
    *,
    what: str,
    idempotent: bool,
    translate: Callable[[Exception], Exception],
    network_words: Callable[[Exception], str],
    worth_retrying: Callable[[Exception], bool],
    request_timeout: float,
    retry_for: float,
    backoff: Iterable[float],
    clock: Callable[[], float],
    sleep: Callable[[float], None],
    counted: Callable[[], None],
) -> T:
    """One request of a transport, `send(timeout)`, through `reach` (every provider's
    transport uses this one loop): each try counted and its timeout cut while the
    endpoint is unproven; `translate` turns what the client raised into tpulab's error
    (or leaves an unknown exception be, which then propagates as it is); an idempotent
    request is retried while `worth_retrying` says so, for up to `retry_for` s; any
    request that may safely be resent (idempotent, or never sent) rides the reach
    schedule of an endpoint that has not answered yet, and then fails as an
    EndpointDownError (module doc)."""
    from tpulab.polling import retry_call

    tries = 0
    sent = False  # some try of this call reached the server (and got no answer)
    words = ""  # what went wrong on the network on the last try

    def resendable(error: Exception) -> bool:
        return idempotent or isinstance(error, UnreachableError)

    def attempt() -> T:
        nonlocal tries, sent, words
        reach.raise_if_down(what)
        tries += 1
        timeout = reach.timeout(request_timeout)
        counted()
        try:
            result = send(timeout)
        except Exception as raw:
            error = translate(raw)
            if not isinstance(error, CloudError):
                raise
            if not is_network_failure(error):
                reach.heard()  # an API error is an answer: something is there
                if error is raw:
                    raise
                raise error from None
            sent = sent or isinstance(error, OutcomeUnknownError)
            words = network_words(raw)
            raise reach.failed(
                error,
                tries=tries,
                sent=sent,
                what=what,
                resendable=resendable(error),
                words=words,
            ) from None
        reach.heard()
        return result

    def retry_if(error: Exception) -> bool:
        if reach.should_retry(error, resendable=resendable(error)):
            return True
        return idempotent and worth_retrying(error)

    def on_retry(error: Exception, _delay: float) -> None:
        reach.retrying(error, tries=tries, words=words)

    budget = retry_for if idempotent else 0.0
    if not reach.answered:
        # The reach schedule ends itself; it must not be cut by a shorter budget.
        budget = max(budget, reach.schedule.budget + 1.0)
    return retry_call(
        attempt,
        retry_if=retry_if,
        timeout=budget,
        clock=clock,
        sleep=sleep,
        backoff=reach.delays(iter(backoff)),
        on_retry=on_retry,
    )
