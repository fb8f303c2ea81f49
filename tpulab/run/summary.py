"""What a run says at its end: the summary lines the CLI prints after `tpulab run`
(and, for the user's command, after `tpulab exec`).

Builders only (no printing): each line is (text, rich style) segments; the CLI prints
them with rich. The run's `--json` envelope is tpulab.run.report.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from tpulab.catalog import PRICE_DATE, vm_kind
from tpulab.config.resolve import format_duration
from tpulab.run.attempts import Attempt
from tpulab.run.outcome import RunOutcome
from tpulab.run.report import total_cost

if TYPE_CHECKING:
    from tpulab.config import RunSpec

__all__ = ["Line", "laptop_jax_version", "summary_lines", "workload_lines"]

Line = list[tuple[str, str]]  # (text, rich style) segments, as tpulab.evidence.report uses


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
    lines = _heading(outcome.spec)
    if len(attempts) > 1:
        lines.extend(_attempt_lines(attempts))
    if outcome.bootstrap is not None:
        lines.extend(_bootstrap_lines(outcome, laptop_jax))
    lines.extend(_worker_lines(outcome))
    lines.extend(_receipt_lines(outcome))
    lines.extend(_watchdog_lines(outcome))
    if outcome.workload is not None:
        lines.extend(workload_lines(outcome))
    lines.append(_teardown_line(outcome))
    lines.append(_cost_line(outcome, attempts))
    return lines


def _heading(spec: RunSpec) -> list[Line]:
    tag = " EMULATED" if spec.emulated else ""
    return [
        [("Run ", "bold"), (spec.run_id, "bold cyan"), (tag, "bold magenta")],
        # What its provider calls it: a Compute Engine instance, a Cloud TPU API node.
        [
            (f"  {vm_kind(spec.provider):<10}", "dim"),
            (f"{spec.node_name} ({spec.accelerator.name})", ""),
        ],
        [("  where     ", "dim"), (f"project {spec.project.value}, zone {spec.zone.value}", "")],
    ]


def _receipt_lines(outcome: RunOutcome) -> list[Line]:
    """The verdict, the per-device sums against the closed form, why it failed, where
    the receipt is kept."""
    verdict = outcome.verdict
    style = "bold green" if outcome.judgement and outcome.judgement.verified else "bold red"
    shown = str(verdict).upper() if verdict else "NOT COLLECTED"
    lines: list[Line] = [[("  receipt   ", "dim"), (shown, style)]]
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
    return lines


def _teardown_line(outcome: RunOutcome) -> Line:
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
        return [("  teardown  ", "dim"), (done, "bold green")]
    if status == "not-created":
        return [("  teardown  ", "dim"), ("nothing was created", "")]
    return [("  teardown  ", "dim"), ("NOT CONFIRMED: may still be billing", "bold red")]


def _cost_line(outcome: RunOutcome, attempts: Sequence[Attempt]) -> Line:
    spec = outcome.spec
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
    return [
        ("  cost      ", "dim"),
        (cost, ""),
        (f" ({rate}; {outcome.api_calls} API calls)", "dim"),
    ]


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


def workload_lines(outcome: RunOutcome) -> list[Line]:
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
    if workload.reconnects:
        times = "once" if workload.reconnects == 1 else f"{workload.reconnects} times"
        lines.append(
            [
                ("  link      ", "dim"),
                (f"the SSH connection dropped {times} while it ran; it ran on, followed", ""),
                (" (what it wrote while the link was down is in output.log)", "dim"),
            ]
        )
    upload = workload.upload
    if upload is not None and upload.replaced_count:
        # The laptop's copy won over an edit made on the VM (Jupyter, an editor): where
        # that edit is kept must not be lost in the upload's long step line.
        lines.append([("  replaced  ", "dim"), (upload.describe_replaced(), "yellow")])
    if workload.fetch is not None:
        fetched = workload.fetch
        lines.append(
            [
                ("  artifacts ", "dim"),
                (f"{fetched.count} files, {fetched.total_bytes / 2**20:.1f} MiB", ""),
                (f" in {workload.out}", "dim"),
            ]
        )
        if fetched.left is not None and fetched.left.files:
            # On a run the VM is deleted: what the command wrote and no pattern asked for
            # is gone, which the user learns here rather than when looking for it.
            gone = outcome.teardown_status == "confirmed"
            lines.append([("  left      ", "dim"), (fetched.left.describe(gone=gone), "yellow")])
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
