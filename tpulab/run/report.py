"""What `tpulab run` reports: the `--json` envelope and the end-of-run summary lines.

Builders only (no printing): the CLI prints the lines with rich and dumps the envelope.
The envelope is a contract (`RunEnvelope`, schema_version 1, its JSON schema pinned by
tests/test_envelopes.py): run id, node, phases with durations, API call count, receipt
path and verdict, teardown confirmation and the estimated cost.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from tpulab.catalog import PRICE_DATE, vm_kind
from tpulab.config import Mode
from tpulab.config.resolve import format_duration
from tpulab.envelope import Envelope, ErrorReport
from tpulab.errors import TeardownError
from tpulab.evidence.judge import Verdict
from tpulab.run.attempts import Attempt, AttemptOutcome
from tpulab.run.outcome import RunOutcome
from tpulab.run.progress import Recorder, TeardownStatus
from tpulab.run.record import WorkloadSummary, workload_summary

__all__ = [
    "AttemptSummary",
    "BootstrapSummary",
    "Line",
    "PhaseSummary",
    "ReceiptSummary",
    "RunEnvelope",
    "TeardownSummary",
    "WatchdogSummary",
    "laptop_jax_version",
    "run_envelope",
    "summary_lines",
]

Line = list[tuple[str, str]]  # (text, rich style) segments, as tpulab.evidence.report uses


class _Part(BaseModel):
    model_config = ConfigDict(defer_build=True, extra="forbid", frozen=True)


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


def _watchdog_lines(outcome: RunOutcome) -> list[Line]:
    """How the VM's own deletion was set up: armed, or plainly not, with the fix."""
    spec = outcome.spec
    if spec.watchdog is None:
        return [[("  watchdog  ", "dim"), ("off (--no-watchdog)", "yellow")]]
    state = outcome.watchdog
    if state is None:
        return []  # the run ended before SSH: the watchdog was never asked
    terms = (
        f" (lease {format_duration(spec.watchdog.lease_seconds)}, deadline "
        f"{format_duration(spec.max_duration_seconds or 0)} after boot; "
        f"{outcome.lease_renewals} renewals)"
    )
    if state.armed:
        return [[("  watchdog  ", "dim"), (state.describe(), "green"), (terms, "dim")]]
    lines: list[Line] = [
        [("  watchdog  ", "dim"), ("watchdog not armed: ", "bold yellow"), (state.reason, "yellow")]
    ]
    fix = state.fix(spec.service_account)
    if fix:
        lines.append([("            ", "dim"), (fix, "yellow")])
    return lines


def _sums(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:g}" for v in values) + "]"


def laptop_jax_version() -> str | None:
    """The jax installed next to tpulab here, from its metadata (importing jax is slow)."""
    import importlib.metadata

    try:
        return importlib.metadata.version("jax")
    except importlib.metadata.PackageNotFoundError:
        return None


def _bootstrap_lines(outcome: RunOutcome, laptop_jax: Callable[[], str | None]) -> list[Line]:
    """venv, python (asked vs resolved), jax/jaxlib/libtpu, the image, and a warning when
    the VM's jax is not the laptop's (code tested here may behave differently there)."""
    boot = outcome.bootstrap
    assert boot is not None
    spec = outcome.spec
    versions = boot.versions
    jax = versions.get("jax")
    lines: list[Line] = [
        [("  venv      ", "dim"), (f"{boot.venv_path}; install {boot.install}", "")],
        [
            ("  python    ", "dim"),
            (f"{versions.get('python') or '?'}", ""),
            (f" (asked {boot.python_request}: {spec.python_source}", "dim"),
            (f"; image python3 {boot.image_python or '?'})", "dim"),
        ],
        [
            ("  jax       ", "dim"),
            (f"jax {jax or '?'}, jaxlib {versions.get('jaxlib') or '?'}", ""),
            (f", libtpu {versions.get('libtpu') or 'none'}", ""),
            (f" (pinned {spec.jax_version})" if spec.jax_version else "", "dim"),
        ],
    ]
    if spec.emulated:
        kind = boot.image_kind or "not an emulated image (no name given)"
        lines.append([("  image     ", "dim"), (kind, "")])
    for note in boot.notes:
        lines.append([("  note      ", "dim"), (note, "yellow")])
    here = laptop_jax()
    if jax and here and jax != here:
        lines.append(
            [
                ("  warning   ", "bold yellow"),
                (f"the VM runs jax {jax}, this laptop has jax {here}", "yellow"),
            ]
        )
    return lines


def _attempt_lines(attempts: Sequence[Attempt]) -> list[Line]:
    """The attempts table: one line per attempt, the last one the run's own."""
    lines: list[Line] = [[("  attempts  ", "dim"), (f"{len(attempts)}", "")]]
    for a in attempts:
        style = "green" if a.outcome == "verified" else "yellow"
        teardown = {
            "confirmed": "deleted, confirmed",
            "not-created": "nothing created",
            "unconfirmed": "NOT CONFIRMED",
        }[a.teardown_status]
        reason = f"  {a.reason}" if a.reason else ""
        lines.append(
            [
                (f"    {a.number:>2}. {a.zone:<18} {a.how:<9} ", ""),
                (f"{a.outcome:<20}", style),
                (f" {a.seconds:6.1f}s  {teardown}", "dim"),
                (reason, "dim"),
            ]
        )
    return lines


def summary_lines(
    outcome: RunOutcome,
    *,
    attempts: Sequence[Attempt] = (),
    laptop_jax: Callable[[], str | None] = laptop_jax_version,
) -> list[Line]:
    """The end-of-run summary: node, zone, verdict, per-device sums, teardown, cost;
    with more than one attempt, the attempts table (`outcome` is the last attempt's).

    `laptop_jax` tells which jax is installed here (a seam for tests)."""
    spec = outcome.spec
    tag = " EMULATED" if spec.emulated else ""
    lines: list[Line] = [
        [("Run ", "bold"), (spec.run_id, "bold cyan"), (tag, "bold magenta")],
        # What its provider calls it: a Compute Engine instance, a Cloud TPU API node.
        [
            (f"  {vm_kind(spec.provider):<10}", "dim"),
            (f"{spec.node_name} ({spec.accelerator.name})", ""),
        ],
        [("  where     ", "dim"), (f"project {spec.project.value}, zone {spec.zone.value}", "")],
    ]
    if len(attempts) > 1:
        lines.extend(_attempt_lines(attempts))
    if outcome.bootstrap is not None:
        lines.extend(_bootstrap_lines(outcome, laptop_jax))
    lines.extend(_worker_lines(outcome))
    verdict = outcome.verdict
    style = "bold green" if outcome.judgement and outcome.judgement.verified else "bold red"
    shown = str(verdict).upper() if verdict else "NOT COLLECTED"
    lines.append([("  receipt   ", "dim"), (shown, style)])
    if outcome.per_device_sums:
        total = f"{outcome.observed_total:g}" if outcome.observed_total is not None else "?"
        lines.append(
            [
                ("  sums      ", "dim"),
                (f"{_sums(outcome.per_device_sums)} total {total}", ""),
                (f" (closed form {outcome.expected_total})", "dim"),
            ]
        )
    for failure in outcome.failures[:8]:
        lines.append([("    - ", "red"), (failure, "red")])
    if outcome.receipt is not None:
        lines.append(
            [("  kept as   ", "dim"), (f"{outcome.receipt.id}  {outcome.receipt.path}", "")]
        )
    lines.extend(_watchdog_lines(outcome))
    if outcome.workload is not None:
        lines.extend(_workload_lines(outcome))
    status = outcome.teardown_status
    if status == "confirmed":
        gone = outcome.teardown is not None and outcome.teardown.already_gone
        # A stockout or a node deleted under us left nothing to delete: say that, not
        # "deleted", though the list still proved nothing of this run remains.
        done = (
            "nothing to delete (already gone), confirmed by list"
            if gone
            else ("deleted, confirmed by list")
        )
        lines.append([("  teardown  ", "dim"), (done, "bold green")])
    elif status == "not-created":
        lines.append([("  teardown  ", "dim"), ("nothing was created", "")])
    else:
        lines.append([("  teardown  ", "dim"), ("NOT CONFIRMED: may still be billing", "bold red")])
    accelerator = spec.accelerator
    price = accelerator.price_per_hour(spot=spec.spot)
    cost = f"~${total_cost(outcome, attempts):.4f}" if accelerator.priced else "unknown"
    if len(attempts) > 1:
        cost += f" over {len(attempts)} attempts"
    if spec.emulated:
        real = f"would have cost {cost}" if accelerator.priced else "has no known cost"
        cost = f"$0 (a real {accelerator.name} {real})"
    # No list price is cited for some generations (TPU7x): unknown, never "$0.00/h".
    rate = f"est. ${price:.2f}/h list price {PRICE_DATE}" if accelerator.priced else "no list price"
    lines.append(
        [
            ("  cost      ", "dim"),
            (cost, ""),
            (f" ({rate}; {outcome.api_calls} API calls)", "dim"),
        ]
    )
    return lines


def _worker_lines(outcome: RunOutcome) -> list[Line]:
    """A slice's workers: per step run on all of them, the slowest worker and the spread
    (a worker far behind the others is what a user looks for); nothing for one host."""
    if not outcome.worker_seconds:
        return []
    steps = []
    for step, seconds in outcome.worker_seconds.items():
        slowest = max(range(len(seconds)), key=seconds.__getitem__)
        steps.append(f"{step} w{slowest} {seconds[slowest]:.1f}s (fastest {min(seconds):.1f}s)")
    hosts = max(len(seconds) for seconds in outcome.worker_seconds.values())
    return [
        [("  workers   ", "dim"), (f"{hosts}", ""), ("; slowest per step: ", "dim")],
        *([("              ", ""), (step, "")] for step in steps),
    ]


def _delete_attempts(outcome: RunOutcome) -> int:
    """DeleteNode requests sent: from the confirmed teardown, or from the error of one
    that was not confirmed (which still sent them)."""
    if outcome.teardown is not None:
        return outcome.teardown.delete_attempts
    if isinstance(outcome.error, TeardownError):
        return outcome.error.delete_attempts
    return 0


def _workload_lines(outcome: RunOutcome) -> list[Line]:
    """The user's command: its own status (never tpulab's exit code), what came back."""
    workload = outcome.workload
    assert workload is not None
    command = shlex.join(workload.command)  # as typed: "sh -c 'a && b'"
    if not workload.started:
        state, style = "not started (the run stopped before it)", "yellow"
    elif workload.timed_out:
        state, style = "killed at its --timeout", "bold red"
    elif workload.stopped:
        state, style = f"stopped ({workload.stopped})", "yellow"
    elif workload.exit_status == 0:
        state, style = "exit 0", "bold green"
    else:
        state, style = f"exit {workload.exit_status}", "bold red"
    lines: list[Line] = [[("  command   ", "dim"), (command, ""), ("  ", ""), (state, style)]]
    if workload.fetch is not None:
        fetched = workload.fetch
        lines.append(
            [
                ("  artifacts ", "dim"),
                (f"{fetched.count} files, {fetched.total_bytes / 2**20:.1f} MiB", ""),
                (f" in {workload.out}", "dim"),
            ]
        )
    elif workload.kept is not None:
        kept = workload.kept
        lines.append(
            [
                ("  artifacts ", "dim"),
                (
                    f"PARTLY fetched: {kept.count} files, {kept.total_bytes / 2**20:.1f} MiB",
                    "yellow",
                ),
                (f" in {workload.out} ({workload.fetch_problem})", "dim"),
            ]
        )
    elif workload.started:
        why = f": {workload.fetch_problem}" if workload.fetch_problem else ""
        lines.append([("  artifacts ", "dim"), (f"NOT fetched{why}", "yellow")])
    if outcome.run_record is not None:
        lines.append([("  record    ", "dim"), (str(outcome.run_record), "")])
    return lines
