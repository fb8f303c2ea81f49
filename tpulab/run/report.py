"""What `tpulab run` reports as `--json`: the run's envelope.

A builder only (no printing): the CLI dumps the envelope; the summary lines it prints
for people are tpulab.run.summary. The envelope is a contract (`RunEnvelope`,
schema_version 1, its JSON schema pinned by tests/test_envelopes.py): run id, node,
phases with durations, API call count, receipt path and verdict, teardown confirmation
and the estimated cost.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from tpulab.catalog import PRICE_DATE
from tpulab.config import Mode
from tpulab.envelope import Envelope, ErrorReport
from tpulab.errors import TeardownError
from tpulab.evidence.judge import Verdict
from tpulab.models import DEFER_BUILD
from tpulab.run.attempts import Attempt, AttemptOutcome
from tpulab.run.outcome import RunOutcome
from tpulab.run.progress import Recorder, TeardownStatus
from tpulab.run.record import WorkloadSummary, workload_summary

__all__ = [
    "AttemptSummary",
    "BootstrapSummary",
    "PhaseSummary",
    "ReceiptSummary",
    "RunEnvelope",
    "TeardownSummary",
    "WatchdogSummary",
    "run_envelope",
]


class _Part(BaseModel):
    model_config = ConfigDict(defer_build=DEFER_BUILD, extra="forbid", frozen=True)


class PhaseSummary(_Part):
    phase: str
    seconds: float
    ok: bool
    detail: str


class BootstrapSummary(_Part):
    venv: str  # how the venv came to be ("existing", "uv venv", ...)
    install: str
    versions: dict[str, str | None]


class ReceiptSummary(_Part):
    verdict: Verdict | None  # None: no receipt was collected
    id: str | None
    path: str | None
    failures: list[str]
    per_device_sums: list[float]
    observed_total: float | None
    expected_total: int | None
    payload_exit_status: int | None


class TeardownSummary(_Part):
    status: TeardownStatus
    confirmed: bool
    delete_attempts: int
    seconds: float | None
    manual_command: str | None  # set only when the deletion was NOT confirmed


class WatchdogSummary(_Part):
    """The VM's self-deletion (docs/architecture.md §10) as the run saw it."""

    state: str  # armed, unverified, no-permission, error, firing, unpublished
    armed: bool
    detail: str  # the watchdog's own words (empty for "armed")
    fix: str | None  # what to grant, when it is not armed
    service_account: str | None  # None: the project's default compute service account
    lease_seconds: float
    boot_grace_seconds: float
    max_duration_seconds: float
    lease_renewals: int
    lease_renewal_failures: int


class AttemptSummary(_Part):
    """One attempt of the run (a zone tried, a preempted spot node retried...)."""

    number: int
    run_id: str
    zone: str
    how: Literal["on-demand", "spot"]
    outcome: AttemptOutcome
    reason: str
    seconds: float
    teardown: TeardownStatus
    teardown_confirmed: bool  # deleted and confirmed by list, or nothing was created
    estimated_cost_usd: float


class RunEnvelope(Envelope):
    """`tpulab run --json` (a real or emulated run, not `--dry-run`)."""

    command: Literal["run"] = "run"
    dry_run: Literal[False] = False
    run_id: str
    mode: Mode
    emulated: bool
    project: str
    zone: str
    node_name: str
    accelerator_type: str
    spot: bool
    seconds: float
    api_calls: int
    phases: list[PhaseSummary]
    # A slice: seconds each worker took in every step run on all of them, in worker order
    # ("bootstrap": [41.2, 38.0, ...]); empty for a single host.
    worker_seconds: dict[str, list[float]] = Field(default_factory=dict)
    bootstrap: BootstrapSummary | None
    receipt: ReceiptSummary
    teardown: TeardownSummary
    watchdog: WatchdogSummary | None  # None: --no-watchdog, or the run never got to SSH
    attempts: list[AttemptSummary]  # every attempt in order; the fields above: the last
    estimated_cost_usd: float  # every attempt together
    price_date: str
    notes: list[str]
    # The user's `-- CMD` (None without one): its own exit status, artifacts, run.json.
    workload: WorkloadSummary | None = None
    run_record: str | None = None


def attempt_summaries(attempts: Sequence[Attempt]) -> list[AttemptSummary]:
    return [
        AttemptSummary(
            number=a.number,
            run_id=a.run_id,
            zone=a.zone,
            how=a.how,
            outcome=a.outcome,
            reason=a.reason,
            seconds=round(a.seconds, 3),
            teardown=a.teardown_status,
            teardown_confirmed=a.teardown_status != "unconfirmed",
            estimated_cost_usd=round(a.estimated_cost, 4),
        )
        for a in attempts
    ]


def total_cost(outcome: RunOutcome, attempts: Sequence[Attempt]) -> float:
    """The estimated cost of every attempt (just `outcome`'s for a single one)."""
    return sum(a.estimated_cost for a in attempts) if attempts else outcome.estimated_cost


def run_envelope(
    outcome: RunOutcome,
    recorder: Recorder,
    *,
    attempts: Sequence[Attempt] = (),
    error: ErrorReport | None = None,
) -> RunEnvelope:
    """The envelope of a run, from what it got to (a run that failed early has an
    outcome with nothing created: teardown status "not-created", no receipt). With
    `attempts`, `outcome` is the last attempt's, and the cost covers them all."""
    spec = outcome.spec
    receipt = outcome.receipt
    teardown = outcome.teardown
    boot = outcome.bootstrap
    return RunEnvelope(
        ok=outcome.succeeded and error is None,
        run_id=spec.run_id,
        mode=spec.mode,
        emulated=spec.emulated,
        project=spec.project.value,
        zone=spec.zone.value,
        node_name=spec.node_name,
        accelerator_type=spec.accelerator.name,
        spot=spec.spot,
        seconds=round(outcome.seconds, 3),
        api_calls=outcome.api_calls,
        phases=[
            PhaseSummary(phase=p.phase.value, seconds=round(p.seconds, 3), ok=p.ok, detail=p.detail)
            for p in recorder.phases
        ],
        worker_seconds=dict(outcome.worker_seconds),
        bootstrap=None
        if boot is None
        else BootstrapSummary(venv=boot.venv_path, install=boot.install, versions=boot.versions),
        receipt=ReceiptSummary(
            verdict=outcome.verdict,
            id=receipt.id if receipt else None,
            path=str(receipt.path) if receipt else None,
            failures=outcome.failures,
            per_device_sums=outcome.per_device_sums,
            observed_total=outcome.observed_total,
            expected_total=outcome.expected_total,
            payload_exit_status=outcome.payload_exit,
        ),
        teardown=TeardownSummary(
            status=outcome.teardown_status,
            confirmed=outcome.teardown_status == "confirmed",
            delete_attempts=_delete_attempts(outcome),
            seconds=round(teardown.seconds, 3) if teardown else None,
            manual_command=None
            if outcome.teardown_status != "unconfirmed"
            else spec.leaked_node().manual_delete_command(),
        ),
        watchdog=_watchdog(outcome),
        attempts=attempt_summaries(attempts),
        estimated_cost_usd=round(total_cost(outcome, attempts), 4),
        price_date=PRICE_DATE,
        notes=recorder.notes,
        workload=workload_summary(outcome.workload) if outcome.workload else None,
        run_record=str(outcome.run_record) if outcome.run_record else None,
        error=error,
    )


def _watchdog(outcome: RunOutcome) -> WatchdogSummary | None:
    spec = outcome.spec
    state, settings, deadline = outcome.watchdog, spec.watchdog, spec.max_duration_seconds
    if state is None or settings is None or deadline is None:
        return None
    return WatchdogSummary(
        state=state.kind,
        armed=state.armed,
        detail=state.detail,
        fix=state.fix(spec.service_account),
        service_account=spec.service_account,
        lease_seconds=settings.lease_seconds,
        boot_grace_seconds=settings.boot_grace_seconds,
        max_duration_seconds=deadline,
        lease_renewals=outcome.lease_renewals,
        lease_renewal_failures=outcome.lease_failures,
    )


def _delete_attempts(outcome: RunOutcome) -> int:
    """DeleteNode requests sent: from the confirmed teardown, or from the error of one
    that was not confirmed (which still sent them)."""
    if outcome.teardown is not None:
        return outcome.teardown.delete_attempts
    if isinstance(outcome.error, TeardownError):
        return outcome.error.delete_attempts
    return 0
