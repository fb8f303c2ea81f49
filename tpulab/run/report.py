"""What `tpulab run` reports: the `--json` envelope and the end-of-run summary lines.

Builders only (no printing): the CLI prints the lines with rich and dumps the envelope.
The envelope is a contract (schema_version 1, pinned by a test): run id, node, phases
with durations, API call count, receipt path and verdict, teardown confirmation and the
estimated cost.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tpulab.catalog import PRICE_DATE
from tpulab.run.lifecycle import RunOutcome
from tpulab.run.progress import Recorder
from tpulab.run.teardown import manual_delete_command

__all__ = ["Line", "laptop_jax_version", "run_envelope", "summary_lines"]

Line = list[tuple[str, str]]  # (text, rich style) segments, as tpulab.evidence.report uses


def run_envelope(
    outcome: RunOutcome, recorder: Recorder, *, error: dict[str, Any] | None = None
) -> dict[str, Any]:
    from tpulab.evidence.report import envelope

    spec = outcome.spec
    receipt = outcome.receipt
    teardown = outcome.teardown
    boot = outcome.bootstrap
    return envelope(
        "run",
        ok=outcome.succeeded and error is None,
        run_id=spec.run_id,
        mode=spec.mode,
        emulated=spec.emulated,
        project=spec.project.value,
        zone=spec.zone.value,
        node=spec.node_name,
        accelerator=spec.accelerator.name,
        spot=spec.spot,
        seconds=round(outcome.seconds, 3),
        api_calls=outcome.api_calls,
        phases=[
            {"phase": p.phase.value, "seconds": round(p.seconds, 3), "ok": p.ok, "detail": p.detail}
            for p in recorder.phases
        ],
        bootstrap=None
        if boot is None
        else {"venv": boot.venv_path, "install": boot.install, "versions": boot.versions},
        receipt={
            "verdict": outcome.verdict,
            "id": receipt.id if receipt else None,
            "path": str(receipt.path) if receipt else None,
            "failures": outcome.failures,
            "per_device_sums": outcome.per_device_sums,
            "observed_total": outcome.observed_total,
            "expected_total": outcome.expected_total,
            "payload_exit_status": outcome.payload_exit,
        },
        teardown={
            "status": outcome.teardown_status,
            "confirmed": outcome.teardown_status == "confirmed",
            "delete_attempts": teardown.delete_attempts if teardown else 0,
            "seconds": round(teardown.seconds, 3) if teardown else None,
            "manual_command": None
            if outcome.teardown_status != "unconfirmed"
            else manual_delete_command(spec.project.value, spec.zone.value, spec.node_name),
        },
        estimated_cost_usd=round(outcome.estimated_cost, 4),
        price_date=PRICE_DATE,
        notes=recorder.notes,
        error=error,
    )


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


def summary_lines(
    outcome: RunOutcome, *, laptop_jax: Callable[[], str | None] = laptop_jax_version
) -> list[Line]:
    """The end-of-run summary: node, zone, verdict, per-device sums, teardown, cost.

    `laptop_jax` tells which jax is installed here (a seam for tests)."""
    spec = outcome.spec
    tag = " EMULATED" if spec.emulated else ""
    lines: list[Line] = [
        [("Run ", "bold"), (spec.run_id, "bold cyan"), (tag, "bold magenta")],
        [("  node      ", "dim"), (f"{spec.node_name} ({spec.accelerator.name})", "")],
        [("  where     ", "dim"), (f"project {spec.project.value}, zone {spec.zone.value}", "")],
    ]
    if outcome.bootstrap is not None:
        lines.extend(_bootstrap_lines(outcome, laptop_jax))
    verdict = outcome.verdict or "not collected"
    style = "bold green" if verdict == "verified" else "bold red"
    lines.append([("  receipt   ", "dim"), (verdict.upper(), style)])
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
    status = outcome.teardown_status
    if status == "confirmed":
        lines.append([("  teardown  ", "dim"), ("deleted, confirmed by list", "bold green")])
    elif status == "not-created":
        lines.append([("  teardown  ", "dim"), ("nothing was created", "")])
    else:
        lines.append([("  teardown  ", "dim"), ("NOT CONFIRMED: may still be billing", "bold red")])
    price = spec.accelerator.price_per_hour(spot=spec.spot)
    cost = f"~${outcome.estimated_cost:.4f}"
    if spec.emulated:
        cost = f"$0 (a real {spec.accelerator.name} would have cost {cost})"
    lines.append(
        [
            ("  cost      ", "dim"),
            (cost, ""),
            (
                f" (est. ${price:.2f}/h list price {PRICE_DATE}; {outcome.api_calls} API calls)",
                "dim",
            ),
        ]
    )
    return lines
