"""`tpulab verify --local`: run the verifier payload here and check its receipt.

The core builds report lines (tpulab.evidence.report) and raises; this module only prints them
and picks the exit status. Imports stay inside the functions so --help stays light.
"""

from typing import TYPE_CHECKING, Annotated

import typer

from tpulab import errors as E
from tpulab.cli._console import print_lines
from tpulab.cli._exit import error_report, guarded

if TYPE_CHECKING:
    from tpulab.config import LocalVerifyInputs
    from tpulab.envelope import Envelope
    from tpulab.evidence.localrun import LocalVerification
    from tpulab.evidence.receipt import Expectation
    from tpulab.evidence.report import VerifyEnvelope

__all__ = ["verify_command"]

_DEFAULT_LOCAL_DEVICES = 4


def _local_expectation(inputs: "LocalVerifyInputs") -> "Expectation":
    """The expectation of validated inputs (tpulab.config.local_verify_inputs)."""
    from tpulab.evidence.localrun import new_nonce
    from tpulab.evidence.receipt import Expectation, expectation_for

    nonce = new_nonce()
    if inputs.accelerator is not None:
        # Locally, an accelerator is emulated on CPU unless the user insists on the
        # real TPU backend, which must then be present.
        emulated = inputs.expect_platform in (None, "cpu")
        return expectation_for(inputs.accelerator, emulated=emulated, nonce=nonce)
    platform = inputs.expect_platform or "cpu"
    count = inputs.devices if inputs.devices is not None else _DEFAULT_LOCAL_DEVICES
    return Expectation(platform=platform, local_devices=count, nonce=nonce)


def _print_report(done: "LocalVerification") -> None:
    from tpulab.evidence import report as render

    expectation, judgement = done.expectation, done.judgement
    lines = [[(f"tpulab verify --local: {expectation.describe()}", "bold")]]
    if judgement.receipt is not None:
        lines += render.receipt_lines(judgement.receipt, expectation)
    lines += [
        *render.requirement_lines(judgement.requirements),
        render.verdict_line(judgement, expectation),
        *render.stored_lines(done.stored),
    ]
    print_lines(lines)
    if done.error is not None:
        raise done.error


def _envelope(done: "LocalVerification") -> "VerifyEnvelope":
    from tpulab.evidence import report as render

    return render.VerifyEnvelope(
        ok=done.error is None,
        error=error_report(done.error) if done.error else None,
        verdict=done.judgement.verdict,
        expectation=done.expectation,
        judgement=done.judgement,
        receipt_id=done.stored.id,
        receipt_path=str(done.stored.path),
        payload=render.LocalPayload(
            exit_status=done.result.exit_status, duration_seconds=round(done.result.duration, 3)
        ),
        receipt=render.receipt_document(done.result.raw),
    )


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

    def verified() -> "LocalVerification":
        from tpulab.config import local_verify_inputs
        from tpulab.evidence.localrun import verify_local

        inputs = local_verify_inputs(
            local=local,
            accelerator=accelerator,
            devices=devices,
            expect_platform=expect_platform,
            timeout=timeout,
        )
        return verify_local(_local_expectation(inputs), timeout=inputs.timeout)

    if not as_json:
        guarded(lambda: _print_report(verified()))
        return
    from tpulab.cli.receipts import emit_envelope
    from tpulab.evidence.report import VerifyEnvelope

    def build() -> "tuple[Envelope, E.TpuLabError | None]":
        done = verified()
        return _envelope(done), done.error

    emit_envelope(build, lambda error: VerifyEnvelope(ok=False, error=error))
