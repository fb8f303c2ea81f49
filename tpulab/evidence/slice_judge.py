"""The judgement of a multi-host slice: every worker's receipt, and the slice as a whole.

Each worker's bytes go through `judge` (the one judgement of receipt bytes) against the
slice's Expectation (hosts > 1), so parsing, the digest, the nonce, the platform and the
device counts are checked exactly as for one host. On top of that:

    per worker   its receipt is there, and it is the process of its position
                 (distributed.process_index == its worker index)
    the slice    process indices are exactly 0..H-1; every worker reports the same global
                 psum, the closed form for H x D devices; the per-device sums of all workers
                 at their global positions are, together, expected_per_device_sums(H x D)

Every requirement's name starts with the worker it is about ("worker 2: nonce") or with
"slice:". `slice_failure_of` picks the error that ends the run, through
`judge.failure_of` for the worker at fault.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from tpulab.catalog import closed_form_sum_of_squares
from tpulab.errors import RequirementFailure, TpuLabError, VerificationError
from tpulab.evidence.judge import Judgement, Place, Verdict, failure_of, judge, payload_failure
from tpulab.evidence.receipt import (
    Distributed,
    Expectation,
    RequirementResult,
    expected_per_device_sums,
    global_positions,
    waited_for_peers,
)

__all__ = ["SliceJudgement", "judge_slice", "slice_failure_of"]

_NAMED_IN_MESSAGE = 6


@dataclass(frozen=True)
class SliceJudgement:
    """A slice's receipts judged: `workers[i]` is worker i's Judgement (None when it left
    no receipt); `requirements` every check, each named by its worker or "slice:"."""

    expectation: Expectation
    workers: list[Judgement | None]
    requirements: list[RequirementResult] = field(default_factory=list)

    @property
    def verified(self) -> bool:
        return all(r.passed for r in self.requirements) and all(
            w is not None and w.verified for w in self.workers
        )

    @property
    def failures(self) -> list[RequirementFailure]:
        """What did not hold, each naming its worker ("worker 3: receipt") or the slice."""
        return [r.failure() for r in self.requirements if not r.passed]

    @property
    def missing(self) -> list[int]:
        """The workers that left no receipt."""
        return [i for i, w in enumerate(self.workers) if w is None]

    def as_judgement(self) -> Judgement:
        """The slice as one Judgement (what a run's outcome, summary, --json and the
        kept receipt's sidecar carry): every requirement, the per-device sums of all
        workers in global position order, worker 0's psum (the slice's, when verified)
        and the closed form for the whole slice."""
        sums: dict[int, float] = {}
        for worker in self.workers:
            receipt = worker.receipt if worker is not None else None
            if receipt is not None and receipt.distributed is not None:
                sums.update(global_positions(receipt.distributed) or {})
        first = self.workers[0] if self.workers else None
        return Judgement(
            verdict=Verdict.VERIFIED if self.verified else Verdict.REJECTED,
            requirements=self.requirements,
            stale=any(w is not None and w.stale for w in self.workers),
            per_device_sums=[sums[p] for p in sorted(sums)],
            observed_total=first.observed_total if first is not None else None,
            expected_total=closed_form_sum_of_squares(self.expectation.total_devices),
        )

    def describe(self) -> str:
        """One line for the run's summary."""
        expectation = self.expectation
        if self.verified:
            total = closed_form_sum_of_squares(expectation.total_devices)
            return (
                f"VERIFIED: {expectation.hosts} workers, {expectation.total_devices} devices, "
                f"psum {total} = closed form"
            )
        # A worker that left no receipt first: the others' failures are mostly waiting for it.
        failures = sorted(self.failures, key=lambda f: f.expected != _PRESENT)
        shown = "; ".join(_short(f) for f in failures[:3])
        more = f" (+{len(failures) - 3} more)" if len(failures) > 3 else ""
        return f"REJECTED: {len(failures)} failure(s): {shown}{more}"


def _short(failure: RequirementFailure) -> str:
    if failure.expected == _PRESENT:
        return f"{failure.requirement.split(':')[0]}: {failure.observed}"
    return str(failure)


_PRESENT = "its receipt"


class _Slice:
    """Collects the slice's requirements, each prefixed with what it is about."""

    def __init__(self) -> None:
        self.results: list[RequirementResult] = []

    def add(self, about: str, name: str, passed: bool, expected: str, observed: str) -> None:
        self.results.append(
            RequirementResult(
                name=f"{about}: {name}", passed=passed, expected=expected, observed=observed
            )
        )


def judge_slice(raws: Sequence[bytes | None], expectation: Expectation) -> SliceJudgement:
    """Judge worker i's receipt bytes `raws[i]` (None: it left none) and the slice they
    make. Never raises for a bad receipt: the judgement says what did not hold."""
    checks = _Slice()
    hosts = expectation.hosts
    checks.add("slice", "workers", len(raws) == hosts, f"{hosts} workers", f"{len(raws)}")
    workers: list[Judgement | None] = []
    reports: dict[int, Distributed] = {}
    for index, raw in enumerate(raws):
        about = f"worker {index}"
        if raw is None:
            checks.add(about, "receipt", False, _PRESENT, "no receipt")
            workers.append(None)
            continue
        judgement = judge(raw, expectation)
        workers.append(judgement)
        for result in judgement.requirements:
            checks.add(about, result.name, result.passed, result.expected, result.observed)
        receipt = judgement.receipt
        if receipt is None or receipt.distributed is None:
            continue
        reports[index] = distributed = receipt.distributed
        checks.add(
            about,
            "distributed.process_index",
            distributed.process_index == index,
            f"{index} (its worker position)",
            str(distributed.process_index),
        )
    if reports:
        _check_together(checks, workers, reports, expectation)
    return SliceJudgement(expectation=expectation, workers=workers, requirements=checks.results)


def _check_together(
    checks: _Slice,
    workers: list[Judgement | None],
    reports: dict[int, Distributed],
    expectation: Expectation,
) -> None:
    """What only the workers together show: one psum, every index and position once."""
    hosts, total_devices = expectation.hosts, expectation.total_devices
    indices = sorted(d.process_index for d in reports.values())
    checks.add(
        "slice",
        "process indices",
        indices == list(range(hosts)),
        f"0..{hosts - 1} once each",
        ", ".join(map(str, indices)),
    )
    closed_form = closed_form_sum_of_squares(total_devices)
    totals = {i: w.observed_total for i, w in enumerate(workers) if w is not None and i in reports}
    checks.add(
        "slice",
        "psum",
        len(set(totals.values())) == 1 and closed_form in totals.values(),
        f"{closed_form} on every worker",
        ", ".join(f"w{i}={t:g}" if t is not None else f"w{i}=none" for i, t in totals.items()),
    )
    seen: dict[int, float] = {}
    twice: set[int] = set()
    for distributed in reports.values():
        for position, value in (global_positions(distributed) or {}).items():
            if position in seen:
                twice.add(position)
            seen[position] = value
    oracle = expected_per_device_sums(total_devices)
    absent = [p for p in range(total_devices) if p not in seen]
    wrong = [p for p in range(total_devices) if p in seen and seen[p] != oracle[p]]
    beyond = sorted(p for p in seen if not 0 <= p < total_devices)
    observed = [
        f"absent {absent}" if absent else "",
        f"twice {sorted(twice)}" if twice else "",
        f"wrong at {wrong}" if wrong else "",
        f"beyond {beyond}" if beyond else "",
    ]
    checks.add(
        "slice",
        "per_device_sums",
        not any(observed),
        f"positions 0..{total_devices - 1} once each, = the closed form per device",
        "; ".join(part for part in observed if part) or "as expected",
    )


def slice_failure_of(
    judgement: SliceJudgement,
    *,
    payload_exits: Sequence[int | None],
    outputs: Sequence[Sequence[str]],
    where: Place = "vm",
) -> TpuLabError | None:
    """The error that ends a slice's run, or None when the slice is verified.

    The worker at fault is named: first one that left no receipt (the others only waited
    for it), then one that failed on its own, then one that waited for its peers in vain.
    Its error is `judge.failure_of`'s (or `payload_failure`'s when it has no receipt), so
    a payload failing on a worker is a RemoteError as on one host. When every worker is
    fine on its own but the slice is not, a VerificationError lists what failed.
    """
    if judgement.verified:
        return None
    expectation = judgement.expectation
    for index in _by_blame(judgement):
        exit_status = payload_exits[index] if index < len(payload_exits) else None
        output = outputs[index] if index < len(outputs) else []
        worker = judgement.workers[index]
        if worker is None:
            error: TpuLabError | None = payload_failure(
                "wrote no receipt",
                "none was fetched",
                exit_status=exit_status,
                output=output,
                where=where,
            )
        else:
            error = failure_of(
                worker, expectation, payload_exit=exit_status, output=output, where=where
            )
        if error is not None:
            kept = worker.unreadable_error if worker is not None else None
            if kept is not None and error is kept:
                # The judgement keeps that one; word a new one rather than change it.
                error = VerificationError(kept.message, kept.failures, hint=kept.hint)
            return _named(error, index)
    failures = judgement.failures
    names = ", ".join(f.requirement for f in failures[:_NAMED_IN_MESSAGE])
    more = (
        f" and {len(failures) - _NAMED_IN_MESSAGE} more"
        if len(failures) > _NAMED_IN_MESSAGE
        else ""
    )
    return VerificationError(
        f"The slice's receipts do not prove {expectation.describe()}: {names}{more} failed.",
        failures,
        hint="Each line names a worker (or the slice), what it needed and what it showed.",
    )


def _by_blame(judgement: SliceJudgement) -> list[int]:
    """Workers in the order they are blamed: no receipt, failed alone, waited in vain."""

    def rank(index: int) -> int:
        worker = judgement.workers[index]
        if worker is None:
            return 0
        receipt = worker.receipt
        if receipt is not None and waited_for_peers(receipt.error):
            return 2
        return 1

    return sorted(range(len(judgement.workers)), key=lambda i: (rank(i), i))


def _named(error: TpuLabError, worker: int) -> TpuLabError:
    """`error` (made for this call) with its worker in front of its message."""
    error.message = f"Worker {worker}: {error.message}"
    error.args = (error.message, *error.args[1:])
    if isinstance(error, VerificationError):
        # Named as judge_slice names them, so both lists read the same.
        error.failures = [
            RequirementFailure(f"worker {worker}: {f.requirement}", f.expected, f.observed)
            for f in error.failures
        ]
    return error
