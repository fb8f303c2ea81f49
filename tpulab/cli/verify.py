"""`tpulab verify --local`: run the verifier payload here and check its receipt.

The core builds report lines (tpulab.evidence.report) and raises; this module only prints them
and picks the exit status. Imports stay inside the functions so --help stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from tpulab.cli._console import print_lines
from tpulab.cli._exit import error_json, json_or_guarded, print_envelope

if TYPE_CHECKING:
    from tpulab.config import LocalVerifyInputs
    from tpulab.evidence.receipt import Expectation

__all__ = ["verify_command"]

_DEFAULT_LOCAL_DEVICES = 4


def _local_expectation(inputs: LocalVerifyInputs) -> tuple[Expectation, str]:
    from tpulab.evidence.localrun import new_nonce
    from tpulab.evidence.receipt import Expectation, expectation_for

    nonce = new_nonce()
    if inputs.accelerator is not None:
        # Locally, an accelerator is emulated on CPU unless the user insists on the
        # real TPU backend, which must then be present.
        emulated = inputs.expect_platform in (None, "cpu")
        return expectation_for(inputs.accelerator, emulated=emulated, nonce=nonce), nonce
    platform = inputs.expect_platform or "cpu"
    count = inputs.devices if inputs.devices is not None else _DEFAULT_LOCAL_DEVICES
    return Expectation(platform=platform, local_devices=count, nonce=nonce), nonce


def _verify_local(inputs: LocalVerifyInputs, as_json: bool) -> None:
    import json

    from tpulab.evidence import report as render
    from tpulab.evidence.localrun import run_local_payload
    from tpulab.evidence.store import check_and_keep

    expectation, nonce = _local_expectation(inputs)
    result = run_local_payload(
        devices=expectation.local_devices,
        platform=expectation.platform,
        nonce=nonce,
        emulated=expectation.emulated,
        timeout=inputs.timeout,
    )
    checked = check_and_keep(
        result.raw,
        expectation,
        source="local",
        extra_meta={
            "payload_exit_status": result.exit_status,
            "duration_s": round(result.duration, 3),
        },
    )
    receipt, results, kept = checked.receipt, checked.results, checked.stored
    if receipt is None:  # unreadable bytes: kept, and there is nothing to report on
        assert checked.error is not None
        raise checked.error
    if as_json:
        document = render.envelope(
            "verify",
            ok=checked.verified,
            verdict=kept.verdict,
            expectation=expectation.to_dict(),
            requirements=[r.to_dict() for r in results],
            receipt_id=kept.id,
            receipt_path=str(kept.path),
            payload={"exit_status": result.exit_status, "duration_s": result.duration},
            receipt=json.loads(result.raw),
            error=error_json(checked.error) if checked.error else None,
        )
        print_envelope(document, checked.error)
        return
    title = f"tpulab verify --local: {expectation.describe()}"
    print_lines(
        [
            [(title, "bold")],
            *render.receipt_lines(receipt, expectation),
            *render.requirement_lines(results),
            render.verdict_line(results, expectation),
            *render.stored_lines(kept),
        ]
    )
    checked.raise_for_failure()


def verify_command(
    local: Annotated[
        bool, typer.Option("--local", help="Run the payload on this machine (required for now).")
    ] = False,
    accelerator: Annotated[
        str | None,
        typer.Option(
            "--accelerator",
            help="Emulate this accelerator's host on CPU (its device count and sums).",
        ),
    ] = None,
    devices: Annotated[
        int | None,
        typer.Option(
            "--devices", help=f"CPU devices to run on (default {_DEFAULT_LOCAL_DEVICES})."
        ),
    ] = None,
    expect_platform: Annotated[
        str | None,
        typer.Option(
            "--expect-platform",
            help="Platform the run must use: cpu, tpu or gpu. An absent backend fails.",
        ),
    ] = None,
    timeout: Annotated[
        float, typer.Option("--timeout", help="Seconds before the payload is stopped.")
    ] = 300.0,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print a versioned JSON envelope instead.")
    ] = False,
) -> None:
    """Run the verifier payload locally and check its receipt (the CPU reference run)."""

    def action() -> None:
        from tpulab.config import local_verify_inputs

        inputs = local_verify_inputs(
            local=local,
            accelerator=accelerator,
            devices=devices,
            expect_platform=expect_platform,
            timeout=timeout,
        )
        _verify_local(inputs, as_json)

    json_or_guarded("verify", as_json, action)
