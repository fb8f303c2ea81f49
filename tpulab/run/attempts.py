"""A run as a sequence of attempts: zone failover, spot recovery and the retry budget.

    for each zone of spec.zone_order (one pass):
        attempt = a whole Lifecycle in that zone (its own run id, journal row, node
                  name and confirmed teardown: docs/architecture.md §3.8)
        verified                       -> done
        TeardownError / a signal       -> stop at once (nothing may start after those)
        preempted, recoveries left     -> start again, from the next zone
        failure scoped "zone"          -> next zone
        failure scoped "region"        -> next zone outside that region
        anything else ("fatal")        -> stop at once
    pass over, --retry-until-up, a capacity failure seen, budget left
                                       -> a jittered gap (tpulab.polling), another pass

The scope of a Cloud TPU API failure comes from the one classification table
(tpulab.cloud.classify.scope_of). Remote and verification failures that are not a
preemption are fatal: another zone would not fix a payload or a receipt.

Attempt N+1 starts only after attempt N's `Lifecycle.run` returned or raised, which it
does only after its teardown: confirmed, or a TeardownError that stops everything. So
at most one attempt's node exists at any moment. Attempt 1 is the run's own id and node
name; attempt N > 1 adds "-aN" to both (checked to fit by tpulab.config.capacity), so a
journal row and a `tpulab-run` label name exactly one attempt and `tpulab teardown
--verify` finds a node of any of them.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from tpulab.catalog import region_of
from tpulab.config import RunSpec
from tpulab.config.capacity import attempt_suffix
from tpulab.errors import (
    CloudError,
    DeadlineError,
    InterruptedRun,
    InvalidArgumentError,
    LocationError,
    PermissionDeniedError,
    PreemptedError,
    QueueExpiredError,
    QuotaError,
    RemoteError,
    StockoutError,
    TeardownError,
    TpuLabError,
    TransientError,
    VerificationError,
)
from tpulab.polling import Backoff, Tries, poll_until
from tpulab.run.progress import NullObserver, RunObserver, TeardownStatus

if TYPE_CHECKING:
    from tpulab.run.lifecycle import Lifecycle
    from tpulab.run.outcome import RunOutcome

__all__ = ["Attempt", "AttemptOutcome", "Attempts", "NewLifecycle", "attempt_spec"]

AttemptOutcome = Literal[
    "verified",
    "stockout",
    "queue-expired",
    "quota",
    "preempted",
    "unavailable",
    "no-access",
    "not-offered",
    "permission-denied",
    "remote-failed",
    "not-verified",
    "interrupted",
    "teardown-unconfirmed",
    "failed",
]
NewLifecycle = Callable[[RunSpec], "Lifecycle"]

# What an attempt's failure is called in the attempts table, most specific first.
_OUTCOME_OF: tuple[tuple[type[BaseException], AttemptOutcome], ...] = (
    (TeardownError, "teardown-unconfirmed"),
    (PreemptedError, "preempted"),
    (QueueExpiredError, "queue-expired"),  # a --valid-for window that ran out
    (StockoutError, "stockout"),
    (QuotaError, "quota"),
    (LocationError, "no-access"),
    (PermissionDeniedError, "permission-denied"),
    (InvalidArgumentError, "not-offered"),
    (TransientError, "unavailable"),
    (DeadlineError, "unavailable"),
    (RemoteError, "remote-failed"),
    (VerificationError, "not-verified"),
)
# Failures that another pass later may not meet again: capacity comes and goes.
_WORTH_ANOTHER_PASS: tuple[type[CloudError], ...] = (
    StockoutError,
    QuotaError,
    PreemptedError,
    TransientError,
    DeadlineError,
)
# How an --retry-until-up pass waits before the next: cloud-paced, or quick locally.
_CLOUD_GAP = 30.0
_CLOUD_GAP_CAP = 120.0
_LOCAL_GAP = 1.0
_REASON_CHARS = 200


@dataclass(frozen=True)
class Attempt:
    """One row of the attempts table."""

    number: int
    run_id: str
    zone: str
    spot: bool
    outcome: AttemptOutcome
    reason: str  # "" for the verified attempt
    seconds: float
    teardown_status: TeardownStatus
    estimated_cost: float

    @property
    def how(self) -> Literal["spot", "on-demand"]:
        return "spot" if self.spot else "on-demand"


def attempt_spec(spec: RunSpec, number: int, zone: str) -> RunSpec:
    """The RunSpec of attempt `number` in `zone` (attempt 1 in the first zone is `spec`).

    A `-- CMD` run's attempt N > 1 fetches into `<out>/attempt-N/`: an earlier attempt
    (a preempted one above all) fetched its artifacts, log and run.json into `<out>`,
    and the next attempt's must not replace them."""
    if number == 1 and zone == spec.zone.value:
        return spec  # a run with one attempt is the run the caller asked for
    source = next((z.source for z in spec.zone_order if z.value == zone), spec.zone.source)
    suffix = attempt_suffix(number)
    workload = spec.workload
    if workload is not None and number > 1:
        workload = dataclasses.replace(workload, out=workload.out / f"attempt-{number}")
    return dataclasses.replace(
        spec,
        run_id=spec.run_id + suffix,
        node_name=spec.node_name + suffix,
        zone=dataclasses.replace(spec.zone, value=zone, source=source),
        workload=workload,
    )


class _PassFailed(Exception):
    """Every zone of a pass failed; `retryable` when capacity may still appear."""

    def __init__(self, last: BaseException, retryable: bool) -> None:
        super().__init__(str(last))
        self.last = last
        self.retryable = retryable


class Attempts:
    """Runs `spec` as attempts until one verifies or the policy says stop.

    `new_lifecycle(attempt_spec)` builds each attempt's Lifecycle (the CLI passes the
    API, journal, observer and shield it would give a single run). `gap` is the pause
    schedule between passes of --retry-until-up; `clock` and `sleep` drive it.
    """

    def __init__(
        self,
        spec: RunSpec,
        *,
        new_lifecycle: NewLifecycle,
        observer: RunObserver | None = None,
        gap: Iterable[float] | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.spec = spec
        self.new_lifecycle = new_lifecycle
        self.observer: RunObserver = observer or NullObserver()
        if gap is None:
            local = spec.emulated
            gap = Backoff.gap(_LOCAL_GAP) if local else Backoff.gap(_CLOUD_GAP, cap=_CLOUD_GAP_CAP)
        self.gap = gap
        self.clock = clock
        self.sleep = sleep
        self.attempts: list[Attempt] = []
        self.last: Lifecycle | None = None
        self._recoveries_left = spec.recover
        self._passes = 0

    @property
    def estimated_cost(self) -> float:
        """The estimated cost of every attempt together (each billed only while it ran)."""
        return sum(attempt.estimated_cost for attempt in self.attempts)

    # -- the policy ---------------------------------------------------------------------

    def run(self) -> RunOutcome:
        """The verified attempt's outcome; otherwise the error that ended the run (the
        last attempt's, or a TeardownError / interrupt at once)."""
        try:
            if not self.spec.retry_until_up:
                return self._one_pass()
            budget = self.spec.retry_for if self.spec.retry_for is not None else math.inf
            return poll_until(
                self._one_pass,
                lambda _outcome: True,
                timeout=budget,
                clock=self.clock,
                sleep=self.sleep,
                backoff=self.gap,
                retry_if=lambda error: isinstance(error, _PassFailed) and error.retryable,
                on_retry=self._announce_gap,
                expired=self._budget_spent,
                announce=False,
                # Each attempt's own deadlines (its teardown's above all) stand: the
                # budget decides only whether another pass starts.
                enclose=False,
            )
        except _PassFailed as failed:
            raise failed.last from None
        except KeyboardInterrupt:
            # Ctrl-C outside any attempt (between passes): nothing of ours exists.
            raise InterruptedRun("SIGINT") from None

    def _one_pass(self) -> RunOutcome:
        """Try each zone once (from where a recovery left off); _PassFailed if none did."""
        self._passes += 1
        order = self._order(start=0)
        blocked: set[str] = set()
        retryable = False
        last: BaseException | None = None
        index = 0
        while index < len(order):
            zone = order[index]
            index += 1
            if region_of(zone) in blocked:
                self.observer.note(f"skipping {zone}: the quota of {region_of(zone)} is used up")
                continue
            try:
                return self._attempt(zone)
            except BaseException as error:  # every failure is weighed, then maybe re-raised
                last = error
                step = self._next_step(error)
                if step == "stop":
                    raise
                if step == "recover":
                    self._recoveries_left -= 1
                    # Start again from the zone after the preempted one, all zones open.
                    order, blocked, index = (
                        self._order(start=order.index(zone) + 1, of=order),
                        set(),
                        0,
                    )
                    continue
                if isinstance(error, _WORTH_ANOTHER_PASS):
                    retryable = True
                if step == "region":
                    blocked.add(region_of(zone))
        assert last is not None  # the first zone of a pass is never skipped
        raise _PassFailed(last, retryable)

    def _order(self, *, start: int, of: list[str] | None = None) -> list[str]:
        zones = of if of is not None else [zone.value for zone in self.spec.zone_order]
        start %= len(zones)
        return zones[start:] + zones[:start]

    def _next_step(self, error: BaseException) -> Literal["stop", "recover", "zone", "region"]:
        from tpulab.cloud.classify import scope_of
        from tpulab.run.signals import SignalInterrupt

        if isinstance(error, TeardownError | InterruptedRun | SignalInterrupt | KeyboardInterrupt):
            return "stop"
        if isinstance(error, PreemptedError):
            # Preemption (code 3 during create, or PREEMPTED later) spends a recovery;
            # with none left the run ends as preempted (exit 7).
            return "recover" if self.spec.spot and self._recoveries_left > 0 else "stop"
        if not isinstance(error, CloudError):
            return "stop"  # remote, verification, config, local failures: fatal
        scope = scope_of(error)
        return "stop" if scope == "fatal" else scope

    # -- one attempt --------------------------------------------------------------------

    def _attempt(self, zone: str) -> RunOutcome:
        number = len(self.attempts) + 1
        spec = attempt_spec(self.spec, number, zone)
        self.observer.note(self._headline(number, zone))
        life = self.last = self.new_lifecycle(spec)
        started = self.clock()
        try:
            outcome = life.run()
        except BaseException as error:
            self._record(number, spec, life, started, error)
            raise
        self._record(number, spec, life, started, None)
        return outcome

    def _headline(self, number: int, zone: str) -> str:
        planned = len(self.spec.zone_order) + self.spec.recover
        if number == 1 and planned == 1 and not self.spec.retry_until_up:
            return f"attempt 1/1 in {zone}"
        count = f"attempt {number}" + ("" if self.spec.retry_until_up else f"/{planned}")
        if self.spec.retry_until_up:
            count += f" (pass {self._passes})"
        if not self.attempts:
            return f"{count} in {zone}"
        previous = self.attempts[-1]
        return f"{count} in {zone} (previous: {previous.outcome} in {previous.zone})"

    def _record(
        self,
        number: int,
        spec: RunSpec,
        life: Lifecycle,
        started: float,
        error: BaseException | None,
    ) -> None:
        outcome = life.outcome
        self.attempts.append(
            Attempt(
                number=number,
                run_id=spec.run_id,
                zone=spec.zone.value,
                spot=spec.spot,
                outcome="verified" if error is None else _outcome_of(error),
                reason="" if error is None else _reason(error),
                seconds=round(self.clock() - started, 3),
                teardown_status=outcome.teardown_status,
                estimated_cost=outcome.estimated_cost,
            )
        )

    # -- the retry budget ---------------------------------------------------------------

    def _announce_gap(self, error: Exception, delay: float) -> None:
        last = self.attempts[-1] if self.attempts else None
        why = f" (last: {last.outcome} in {last.zone})" if last else ""
        self.observer.note(f"no zone had capacity{why}; next pass over the zones in {delay:.0f} s")

    def _budget_spent(self, tries: Tries[RunOutcome]) -> Exception:
        failed = tries.error
        assert isinstance(failed, _PassFailed)
        last = failed.last
        spent = f"--retry-for {self.spec.retry_for:g}s" if self.spec.retry_for else "the budget"
        summary = f"{len(self.attempts)} attempt(s) in {self._passes} pass(es) within {spent}"
        if isinstance(last, CloudError):
            return type(last)(
                f"No zone had capacity: {summary}. Last: {last.message}",
                status=last.status,
                api_message=last.api_message,
                hint=last.hint,
            )
        return last if isinstance(last, Exception) else failed


def _outcome_of(error: BaseException) -> AttemptOutcome:
    from tpulab.run.signals import SignalInterrupt

    if isinstance(error, InterruptedRun | SignalInterrupt | KeyboardInterrupt):
        return "interrupted"
    for kind, outcome in _OUTCOME_OF:
        if isinstance(error, kind):
            return outcome
    return "failed"


def _reason(error: BaseException) -> str:
    text = error.message if isinstance(error, TpuLabError) else (str(error) or type(error).__name__)
    return text if len(text) <= _REASON_CHARS else text[: _REASON_CHARS - 3] + "..."
