"""`tpulab verify --local`: run the verifier payload here and check its receipt.

The core builds report lines (tpulab.evidence.report) and raises; this module only prints them
and picks the exit status. Imports stay inside the functions so --help stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from tpulab import errors as E
from tpulab.cli._console import print_lines
from tpulab.cli._exit import error_report, guarded

if TYPE_CHECKING:
    from tpulab.envelope import Envelope
    from tpulab.evidence.localrun import LocalVerification
    from tpulab.evidence.receipt import Expectation
    from tpulab.evidence.report import VerifyEnvelope

__all__ = ["verify_command"]

_LOCAL_MAX_DEVICES = 64
_DEFAULT_LOCAL_DEVICES = 4


def _local_expectation(
    accelerator: str | None, devices: int | None, expect_platform: str | None
) -> Expectation:
    from tpulab.evidence.localrun import new_nonce
    from tpulab.evidence.receipt import PLATFORMS, Expectation, expectation_for

    if accelerator is not None and devices is not None:
        raise E.ConfigError(
            "--accelerator and --devices both set the device count.",
            hint="Give one: --accelerator v5litepod-4, or --devices 4.",
        )
    if expect_platform is not None and expect_platform not in PLATFORMS:
        raise E.ConfigError(
            f"Unknown platform {expect_platform!r} for --expect-platform.",
            hint="Use one of: " + ", ".join(PLATFORMS),
        )
    if devices is not None and not 1 <= devices <= _LOCAL_MAX_DEVICES:
        raise E.ConfigError(
            f"--devices {devices} is out of range for a local run.",
            hint=f"Use 1 to {_LOCAL_MAX_DEVICES} devices.",
        )
    nonce = new_nonce()
    if accelerator is not None:
        if expect_platform == "gpu":
            raise E.ConfigError(
                f"{accelerator} is a TPU; it cannot be expected on gpu.",
                hint="Use --expect-platform tpu, or cpu to emulate it (the default).",
            )
        # Locally, an accelerator is emulated on CPU unless the user insists on the
        # real TPU backend, which must then be present.
        emulated = expect_platform in (None, "cpu")
        return expectation_for(accelerator, emulated=emulated, nonce=nonce)
    platform = expect_platform or "cpu"
    count = devices if devices is not None else _DEFAULT_LOCAL_DEVICES
    return Expectation(platform=platform, local_devices=count, nonce=nonce)


def _verify_local(
    accelerator: str | None, devices: int | None, expect_platform: str | None, timeout: float
) -> LocalVerification:
    from tpulab.evidence.localrun import verify_local

    expectation = _local_expectation(accelerator, devices, expect_platform)
    if timeout <= 0:
        raise E.ConfigError(f"--timeout {timeout:g} must be positive.", hint="Try 300.")
    return verify_local(expectation, timeout=timeout)


def _print_report(done: LocalVerification) -> None:
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


def _envelope(done: LocalVerification) -> VerifyEnvelope:
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

    def verified() -> LocalVerification:
        if not local:
            raise E.ConfigError(
                "Only local verification is a separate command: pass --local.",
                hint="Remote verification is `tpulab run --accelerator TYPE`, which checks "
                "the receipt on the TPU VM before deleting it.",
            )
        return _verify_local(accelerator, devices, expect_platform, timeout)

    if not as_json:
        guarded(lambda: _print_report(verified()))
        return
    from tpulab.cli.receipts import emit_envelope
    from tpulab.evidence.report import VerifyEnvelope

    def build() -> tuple[Envelope, E.TpuLabError | None]:
        done = verified()
        return _envelope(done), done.error

    emit_envelope(build, lambda error: VerifyEnvelope(ok=False, error=error))
