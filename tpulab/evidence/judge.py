"""The one judgement of receipt bytes, and the error a judged run ends with.

`judge(raw, expectation)` is the only place receipt bytes become a verdict: `run` (the
lifecycle), `verify --local` and `receipts list|show` (re-judging what was kept) all call
it. It never raises for a bad receipt; the `Judgement` says what held and what did not:

    Verdict.VERIFIED     parsed, and every requirement held
    Verdict.REJECTED     parsed, and at least one requirement failed (named, with
                         expected and observed)
    Verdict.UNREADABLE   not a schema 1 receipt at all (truncated, not JSON, too big...)

`failure_of` then picks the error that ends the run, in the layer where it happened:
the payload failing ON THE VM is a RemoteError (CommandFailedError / TpuBusyError), the
payload failing HERE (`verify --local`) a LocalRunError, and a receipt that does not
prove the run a VerificationError. libtpu's "the TPU is busy" words are recognised by
`TpuBusyError.evidence_in`, the one copy of that pattern.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from tpulab.catalog import closed_form_sum_of_squares
from tpulab.errors import (
    CommandFailedError,
    LocalRunError,
    RequirementFailure,
    TpuBusyError,
    TpuLabError,
    VerificationError,
)
from tpulab.evidence.receipt import (
    Expectation,
    Receipt,
    RequirementResult,
    evaluate_receipt,
    parse_receipt,
    rejection,
)
from tpulab.models import DEFER_BUILD

__all__ = ["Judgement", "Place", "Verdict", "failure_of", "judge", "payload_failure"]

# Where the payload ran: on the TPU VM over SSH, or on this machine (`verify --local`).
Place = Literal["vm", "local"]
_TAIL_LINES = 20


class Verdict(str, Enum):
    """What a receipt proves; the only spelling of the verdicts anywhere in tpulab."""

    VERIFIED = "verified"
    REJECTED = "rejected"
    UNREADABLE = "unreadable"

    def __str__(self) -> str:  # "verified", not "Verdict.VERIFIED", in f-strings
        return self.value


class Judgement(BaseModel):
    """Receipt bytes judged against an Expectation (kept in the receipt's sidecar).

    `requirements` lists every check in report order, passed or not; an unreadable
    receipt lists what made it unreadable. The sums are what the receipt reported, the
    expected total the closed form for the EXPECTED device count.
    """

    model_config = ConfigDict(defer_build=DEFER_BUILD, extra="forbid", frozen=True)

    verdict: Verdict
    requirements: list[RequirementResult]
    unreadable_reason: str | None = None
    stale: bool = False
    per_device_sums: list[float] = Field(default_factory=list)
    observed_total: float | None = None
    expected_total: int
    # In memory only (never kept): what `failure_of` needs to word its error.
    _receipt: Receipt | None = PrivateAttr(default=None)
    _unreadable: VerificationError | None = PrivateAttr(default=None)

    @property
    def verified(self) -> bool:
        return self.verdict is Verdict.VERIFIED

    @property
    def failures(self) -> list[RequirementFailure]:
        """The requirements that did not hold, by name, with expected and observed."""
        return [r.failure() for r in self.requirements if not r.passed]

    @property
    def receipt(self) -> Receipt | None:
        """The parsed receipt, when this judgement was made in this process."""
        return self._receipt

    @property
    def unreadable_error(self) -> VerificationError | None:
        """Why the bytes are no receipt, with its hint, when judged in this process."""
        return self._unreadable


def judge(raw: bytes, expectation: Expectation) -> Judgement:
    """Parse and check `raw` once; never raises for a bad receipt (the verdict says so)."""
    expected_total = closed_form_sum_of_squares(expectation.local_devices)
    try:
        receipt = parse_receipt(raw)
    except VerificationError as error:
        unreadable = Judgement(
            verdict=Verdict.UNREADABLE,
            requirements=[
                RequirementResult(
                    name=f.requirement, passed=False, expected=f.expected, observed=f.observed
                )
                for f in error.failures
            ],
            unreadable_reason=error.message,
            expected_total=expected_total,
        )
        unreadable._unreadable = error
        return unreadable
    results = evaluate_receipt(receipt, expectation)
    pmap = receipt.pmap
    judgement = Judgement(
        verdict=Verdict.VERIFIED if all(r.passed for r in results) else Verdict.REJECTED,
        requirements=results,
        stale=receipt.nonce != expectation.nonce,
        per_device_sums=list(pmap.per_device_sums) if pmap else [],
        observed_total=pmap.observed_total if pmap else None,
        expected_total=expected_total,
    )
    judgement._receipt = receipt
    return judgement


def payload_failure(
    what: str, why: str, *, exit_status: int | None, output: Sequence[str], where: Place
) -> CommandFailedError | LocalRunError:
    """The error for a payload that did not produce a usable receipt, in its layer."""
    status = -1 if exit_status is None else exit_status
    tail = "\n".join(output[-_TAIL_LINES:])
    busy = TpuBusyError.evidence_in(tail, why)
    if where == "local":
        if busy:
            return LocalRunError(
                f"The TPU on this machine is held by another process: {busy}",
                exit_status=status,
                output_tail=tail,
                hint=TpuBusyError.HINT.replace("On the VM run", "Run"),
            )
        return LocalRunError(
            f"The local payload {what} (exit {status}): {why}",
            exit_status=status,
            output_tail=tail,
            hint="Its stderr is shown above; the interpreter may lack jax.",
        )
    if busy:
        return TpuBusyError(
            f"The TPU is held by another process: {busy}",
            exit_status=status,
            output_tail=tail,
            hint=TpuBusyError.HINT,
        )
    return CommandFailedError(
        f"The payload {what} (exit {status}): {why}",
        exit_status=status,
        output_tail=tail,
        hint="The payload's output is shown above; run with -v to watch it live.",
    )


def failure_of(
    judgement: Judgement,
    expectation: Expectation,
    *,
    payload_exit: int | None,
    output: Sequence[str],
    where: Place,
) -> TpuLabError | None:
    """The error that ends the run, or None when the receipt proves it.

    A payload that exited non-zero without a readable receipt failed where it ran. On
    the VM any non-zero exit is the payload's failure (naming a stale receipt it left
    behind). Locally a readable receipt speaks for itself: it names the missing backend,
    which is what `verify --local --expect-platform tpu` on a laptop is asking about.
    Otherwise a receipt that does not prove the run is a VerificationError by name.
    """
    receipt = judgement.receipt
    if payload_exit and (receipt is None or where == "vm"):
        if receipt is None:
            why = judgement.unreadable_reason or "no receipt"
            return payload_failure(
                "left an unreadable receipt",
                why,
                exit_status=payload_exit,
                output=output,
                where=where,
            )
        if judgement.stale:
            why = "the receipt on the VM is stale (nonce mismatch) and was rejected"
        elif receipt.error is not None:
            why = f"{receipt.error.type}: {receipt.error.message}"
        else:
            why = "see its output"
        return payload_failure("failed", why, exit_status=payload_exit, output=output, where=where)
    if judgement.verified:
        return None
    if receipt is None:
        return judgement.unreadable_error or VerificationError(
            judgement.unreadable_reason or "The receipt is unreadable.", judgement.failures
        )
    return rejection(receipt, expectation, judgement.failures)
