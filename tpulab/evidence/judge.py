"""What a payload's exit status and receipt prove about a run, and how to say it when
they prove nothing.

The receipt checks themselves are `tpulab.evidence.receipt`'; this module combines them with
what the controller saw on the VM: a non-zero exit, a receipt that is stale (another
run's nonce), unreadable or missing, and libtpu's "the TPU is busy" complaint, which gets
its own error (TpuBusyError) because its cure is specific: a stale process holds the TPU.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tpulab.catalog import closed_form_sum_of_squares
from tpulab.errors import (
    CommandFailedError,
    RequirementFailure,
    TpuBusyError,
    TpuLabError,
    VerificationError,
)

if TYPE_CHECKING:
    from tpulab.evidence.receipt import Expectation, Receipt

__all__ = ["TPU_BUSY", "Judgement", "failure_of", "judge", "payload_failure"]

# libtpu's words when another process owns the chips (DESIGN.md §7).
TPU_BUSY = re.compile(
    r"TPU is already in use by process[^\n]*|/dev/vfio/\S*:? Device or resource busy|"
    r"open\(/dev/vfio/\S*\) failed[^\n]*busy",
    re.IGNORECASE,
)
_TAIL_LINES = 20


@dataclass
class Judgement:
    """The receipt as judged against an expectation, before any error is chosen."""

    expectation: Expectation
    verdict: str  # verified | rejected | unreadable
    receipt: Receipt | None = None
    failures: list[RequirementFailure] = field(default_factory=list)
    unreadable: VerificationError | None = None
    per_device_sums: list[float] = field(default_factory=list)
    observed_total: float | None = None

    @property
    def expected_total(self) -> int:
        return closed_form_sum_of_squares(self.expectation.local_devices)

    @property
    def stale(self) -> bool:
        return self.receipt is not None and self.receipt.nonce != self.expectation.nonce


def judge(raw: bytes, expectation: Expectation) -> Judgement:
    """Parse and check `raw`; never raises for a bad receipt (the verdict says so)."""
    from tpulab.evidence.receipt import check_receipt, parse_receipt

    try:
        receipt = parse_receipt(raw)
    except VerificationError as error:
        return Judgement(expectation, "unreadable", failures=error.failures, unreadable=error)
    failures = check_receipt(receipt, expectation)
    judgement = Judgement(expectation, "rejected" if failures else "verified", receipt, failures)
    if receipt.pmap is not None:
        judgement.per_device_sums = list(receipt.pmap.per_device_sums)
        judgement.observed_total = receipt.pmap.observed_total
    return judgement


def payload_failure(
    what: str, why: str, *, exit_status: int | None, output: Sequence[str]
) -> CommandFailedError:
    """The error for a payload that did not produce a usable receipt."""
    status = -1 if exit_status is None else exit_status
    tail = "\n".join(output[-_TAIL_LINES:])
    busy = TPU_BUSY.search(tail) or TPU_BUSY.search(why)
    if busy:
        return TpuBusyError(
            f"The TPU is held by another process: {busy.group(0)}",
            exit_status=status,
            output_tail=tail,
            hint="A stale process from an earlier run owns the TPU. On the VM run "
            "`sudo lsof -w /dev/vfio/*` and kill it, or delete the VM and run again.",
        )
    return CommandFailedError(
        f"The payload {what} (exit {status}): {why}",
        exit_status=status,
        output_tail=tail,
        hint="The payload's output is shown above; run with -v to watch it live.",
    )


def failure_of(
    judgement: Judgement, *, payload_exit: int | None, output: Sequence[str]
) -> TpuLabError | None:
    """The error that ends the run, or None when the receipt proves it.

    A failed payload is reported as such (naming a stale receipt it left behind);
    otherwise a receipt that does not verify is a VerificationError naming each failure.
    """
    receipt = judgement.receipt
    if payload_exit:
        if receipt is None:
            assert judgement.unreadable is not None
            why = judgement.unreadable.message
            return payload_failure(
                "left an unreadable receipt", why, exit_status=payload_exit, output=output
            )
        if judgement.stale:
            why = "the receipt on the VM is stale (nonce mismatch) and was rejected"
        elif receipt.error is not None:
            why = f"{receipt.error.type}: {receipt.error.message}"
        else:
            why = "see its output"
        return payload_failure("failed", why, exit_status=payload_exit, output=output)
    if judgement.unreadable is not None:
        return judgement.unreadable
    if judgement.failures:
        from tpulab.evidence.receipt import verify_receipt

        assert receipt is not None
        try:
            verify_receipt(receipt, judgement.expectation)
        except VerificationError as rejection:
            return rejection
    return None
