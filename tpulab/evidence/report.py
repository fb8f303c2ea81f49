"""Reports about receipts, as data: styled lines for the terminal and JSON envelopes.

Nothing here prints and nothing imports rich: a report is a list of lines, each a list of
(text, style) segments whose style names are rich's ("green", "bold red", ""). `cli/`
turns them into terminal output; tests read them as plain text. The `--json` outputs of
`verify --local` and `receipts list|show` are the Envelope models at the end.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tpulab import catalog
from tpulab.envelope import Envelope
from tpulab.evidence.judge import Judgement, Verdict
from tpulab.evidence.receipt import (
    Expectation,
    Receipt,
    RequirementResult,
    expected_per_device_sums,
)
from tpulab.evidence.store import Integrity, KeptReceipt, Provenance, Recheck, Source
from tpulab.models import DEFER_BUILD

__all__ = [
    "Line",
    "LocalPayload",
    "ReceiptEntry",
    "ReceiptsListEnvelope",
    "ReceiptsShowEnvelope",
    "VerifyEnvelope",
    "bar_chart",
    "plain",
    "receipt_document",
    "receipt_lines",
    "receipts_table",
    "recheck_lines",
    "requirement_lines",
    "stored_lines",
    "verdict_line",
]

Line = list[tuple[str, str]]
_BLOCKS = " ▏▎▍▌▋▊▉█"
# The payload's phases in the order they run (its JSON sorts keys alphabetically).
_PHASES = ("import", "backend", "pmap", "placement", "changed_bias", "reversal", "total")


def plain(lines: Sequence[Line]) -> str:
    """The report without styles (for tests, logs and non-terminal output)."""
    return "\n".join("".join(text for text, _ in line) for line in lines)


def _bar(value: float, maximum: float, width: int) -> str:
    if maximum <= 0 or value <= 0:
        return ""
    eighths = round(min(value / maximum, 1.0) * width * 8)
    full, part = divmod(eighths, 8)
    return "█" * full + (_BLOCKS[part] if part else "")


def bar_chart(
    labels: Sequence[str],
    values: Sequence[float],
    *,
    expected: Sequence[float] | None = None,
    width: int = 32,
) -> list[Line]:
    """One row per value, bars scaled to the largest; ✓/✗ against `expected` if given."""
    if not values:
        return [[("  (no values)", "dim")]]
    top = max(max(values), max(expected or [0.0]))
    label_width = max(len(label) for label in labels)
    number_width = max(len(f"{v:g}") for v in values)
    rows: list[Line] = []
    for i, (label, value) in enumerate(zip(labels, values, strict=True)):
        bar = _bar(value, top, width)
        row: Line = [
            (f"  {label:<{label_width}} ", ""),
            (f"{bar:<{width}}", "cyan"),
            (f" {value:>{number_width}g}", "bold"),
        ]
        if expected is not None:
            ok = i < len(expected) and value == expected[i]
            want = f"{expected[i]:g}" if i < len(expected) else "none"
            row.append(("  ✓" if ok else f"  ✗ expected {want}", "green" if ok else "red"))
        rows.append(row)
    return rows


def _join(values: Sequence[object]) -> str:
    return ", ".join(str(v) for v in values) or "none"


def receipt_lines(receipt: Receipt, expectation: Expectation | None = None) -> list[Line]:
    """What the receipt shows: platform, devices, sums, predictions, versions, timings."""
    lines: list[Line] = []
    if receipt.emulated:
        lines.append([("EMULATED", "bold magenta"), (": CPU devices stand in for a TPU", "")])
    observed = receipt.observed
    seen = observed.default_backend if observed else "not recorded"
    match = expectation is None or seen == expectation.platform
    lines.append(
        [
            ("  requested platform  ", "dim"),
            (receipt.requested_platform, "bold"),
            ("   observed  ", "dim"),
            (seen, "bold green" if match else "bold red"),
        ]
    )
    if not receipt.ok and receipt.error is not None:
        error = receipt.error
        lines.append(
            [("  payload failed in  ", "dim"), (f"{error.phase}: {error.type}", "bold red")]
        )
        lines.append([(f"    {error.message}", "red")])
    if observed is not None:
        kinds = sorted(set(observed.device_kinds))
        lines.append(
            [
                ("  devices             ", "dim"),
                (f"{observed.local_device_count} local", "bold"),
                (f" / {observed.global_device_count} global, kind {_join(kinds)}, ", ""),
                (f"process {observed.process_index} of {observed.process_count}", ""),
            ]
        )
    pmap = receipt.pmap
    if pmap is not None:
        devices = expectation.local_devices if expectation else pmap.device_count
        oracle = [float(v) for v in expected_per_device_sums(devices)]
        lines.append([("  per-device sum of squares (pmap, device d squares 8d..8d+7)", "dim")])
        labels = [f"dev {d}" for d in range(len(pmap.per_device_sums))]
        lines.extend(bar_chart(labels, pmap.per_device_sums, expected=oracle))
        closed = catalog.closed_form_sum_of_squares(devices)
        total_ok = pmap.observed_total == closed
        lines.append(
            [
                ("  total               ", "dim"),
                (f"{pmap.observed_total:g}", "bold green" if total_ok else "bold red"),
                (f"   closed form S({devices}) = {closed}", ""),
                (f"   psum on each device: {_join([f'{t:g}' for t in pmap.psum_totals])}", "dim"),
            ]
        )
    placement = receipt.placement
    if placement is not None:
        lines.append(
            [
                ("  predictions         ", "dim"),
                ("[" + ", ".join(f"{v:g}" for v in placement.predictions) + "]", ""),
                (f" on {_join(placement.output_platforms)}", "bold"),
            ]
        )
        lines.append(
            [
                ("  max abs error       ", "dim"),
                (f"{placement.max_abs_error:g}", "bold"),
                (" against the NumPy reference", ""),
            ]
        )
    if receipt.changed_bias is not None and receipt.changed_bias.predictions:
        first = receipt.changed_bias.predictions[0]
        lines.append([("  changed bias -1/4   ", "dim"), (f"first prediction {first:g}", "")])
    if receipt.reversal is not None and receipt.reversal.predictions:
        values = receipt.reversal.predictions
        lines.append(
            [("  row reversal        ", "dim"), (f"first {values[0]:g}, last {values[-1]:g}", "")]
        )
    versions = receipt.versions
    libtpu = versions.libtpu or versions.libtpu_nightly or "-"
    lines.append(
        [
            ("  versions            ", "dim"),
            (f"python {versions.python}, jax {versions.jax or '-'}, ", ""),
            (f"jaxlib {versions.jaxlib or '-'}, libtpu {libtpu}", ""),
        ]
    )
    order = {phase: i for i, phase in enumerate(_PHASES)}
    phases = sorted(receipt.timings_ms.items(), key=lambda kv: (order.get(kv[0], 99), kv[0]))
    timings = ", ".join(f"{k} {v:.0f} ms" for k, v in phases)
    lines.append([("  timings             ", "dim"), (timings or "none", "")])
    lines.append([("  host                ", "dim"), (receipt.host.hostname, "")])
    return lines


def requirement_lines(results: Sequence[RequirementResult]) -> list[Line]:
    lines: list[Line] = [[("  requirements", "dim")]]
    for result in results:
        if result.passed:
            lines.append(
                [("    PASS ", "green"), (result.name, ""), (f"  {result.observed}", "dim")]
            )
        else:
            lines.append(
                [
                    ("    FAIL ", "bold red"),
                    (result.name, "bold"),
                    (f"  expected {result.expected}, observed {result.observed}", "red"),
                ]
            )
    return lines


def _verdict_style(verdict: Verdict) -> str:
    return "bold green" if verdict is Verdict.VERIFIED else "bold red"


def verdict_line(judgement: Judgement, expectation: Expectation) -> Line:
    """The verdict, spelled from the Verdict enum, with what it is about."""
    verdict = judgement.verdict
    shown = str(verdict).upper()
    total = len(judgement.requirements)
    if verdict is Verdict.VERIFIED:
        detail = f": {expectation.describe()}, {total} requirements hold"
    elif verdict is Verdict.REJECTED:
        failed = len(judgement.failures)
        detail = f": {failed} of {total} requirements failed for {expectation.describe()}"
    else:
        detail = f": {judgement.unreadable_reason}"
    return [(shown, _verdict_style(verdict)), (detail, "")]


def stored_lines(kept: KeptReceipt) -> list[Line]:
    return [[("receipt kept: ", "dim"), (kept.id, "bold"), (f"  {kept.path}", "dim")]]


def _state(entry: KeptReceipt) -> tuple[str, str]:
    """The VERDICT column: the kept verdict when intact, else what is wrong with it."""
    if entry.integrity is Integrity.INTACT and entry.record is not None:
        verdict = entry.record.judgement.verdict
        return str(verdict), "green" if verdict is Verdict.VERIFIED else "red"
    return str(entry.integrity).upper(), "bold red"


def receipts_table(kept: Sequence[KeptReceipt]) -> list[Line]:
    if not kept:
        return [[("No receipts kept yet. `tpulab verify --local` makes one.", "dim")]]
    id_width = max(len(r.id) for r in kept)
    lines: list[Line] = [
        [(f"{'ID':<{id_width}}  {'VERDICT':<10} {'ACCELERATOR':<14} {'SOURCE':<9} RUN", "bold")]
    ]
    for entry in kept:
        text, style = _state(entry)
        origin = entry.record.provenance if entry.record else None
        accelerator = (origin.accelerator_type if origin else None) or "-"
        source = "-" if origin is None else str(origin.source)
        if origin is not None and origin.emulated:
            source += "*"
        lines.append(
            [
                (f"{entry.id:<{id_width}}  ", ""),
                (f"{text:<10} ", style),
                (f"{accelerator:<14} {source:<9} {(origin.run_id if origin else None) or '-'}", ""),
            ]
        )
    problems = [entry for entry in kept if entry.problem]
    for entry in problems:
        lines.append([(f"  {entry.id}: ", "bold red"), (str(entry.problem), "red")])
    if any(e.record and e.record.provenance.emulated for e in kept):
        lines.append([("  * emulated: CPU devices stood in for a TPU", "dim")])
    return lines


def _provenance_text(origin: Provenance) -> str:
    parts = [f"from {origin.source}"]
    if origin.run_id:
        parts.append(f"run {origin.run_id}")
    if origin.node_name:
        parts.append(f"node {origin.node_name}")
    if origin.zone:
        parts.append(f"zone {origin.zone}")
    parts.append(f"accelerator {origin.accelerator_type or '-'}")
    if origin.payload_exit_status is not None:
        parts.append(f"payload exit {origin.payload_exit_status}")
    return ", ".join(parts)


def recheck_lines(checked: Recheck) -> list[Line]:
    """`receipts show`: where the receipt came from, its integrity, and the verdict now."""
    entry, record, judgement = checked.entry, checked.record, checked.judgement
    lines: list[Line] = [
        [("receipt ", "dim"), (entry.id, "bold"), (f"  {judgement.verdict}", "bold")],
        [("  kept ", "dim"), (f"{record.kept_at.isoformat()}  {entry.path}", "")],
        [("  ", ""), (_provenance_text(record.provenance), "")],
    ]
    if entry.integrity is not Integrity.INTACT:
        lines.append(
            [(f"  {str(entry.integrity).upper()}: ", "bold red"), (f"{entry.problem}", "red")]
        )
    kept_verdict = record.judgement.verdict
    if kept_verdict is not judgement.verdict:
        lines.append(
            [
                ("  kept as ", "dim"),
                (str(kept_verdict), _verdict_style(kept_verdict)),
                (", judged again now: ", "dim"),
                (str(judgement.verdict), _verdict_style(judgement.verdict)),
            ]
        )
    receipt = judgement.receipt
    if receipt is not None:
        lines += receipt_lines(receipt, record.expectation)
    lines += requirement_lines(judgement.requirements)
    lines.append(verdict_line(judgement, record.expectation))
    if entry.integrity is Integrity.TAMPERED:
        lines.append([("ALTERED AFTER IT WAS KEPT: this receipt proves nothing", "bold red")])
    return lines


def receipt_document(raw: bytes) -> dict[str, Any] | None:
    """The receipt as JSON for an envelope; None when the bytes are not a JSON object."""
    try:
        document = json.loads(raw)
    except ValueError:
        return None
    return document if isinstance(document, dict) else None


class _Part(BaseModel):
    model_config = ConfigDict(defer_build=DEFER_BUILD, extra="forbid", frozen=True)


class ReceiptEntry(_Part):
    """One kept receipt as listed: its verdict as kept and whether it is still intact."""

    id: str
    integrity: Integrity
    verdict: Verdict | None  # as judged when kept; None when the record is damaged
    kept_at: datetime
    source: Source | None
    run_id: str | None
    accelerator_type: str | None
    emulated: bool | None
    path: str
    problem: str | None

    @classmethod
    def of(cls, entry: KeptReceipt) -> ReceiptEntry:
        record = entry.record
        origin = record.provenance if record else None
        return cls(
            id=entry.id,
            integrity=entry.integrity,
            verdict=record.judgement.verdict if record else None,
            kept_at=entry.kept_at,
            source=origin.source if origin else None,
            run_id=origin.run_id if origin else None,
            accelerator_type=origin.accelerator_type if origin else None,
            emulated=origin.emulated if origin else None,
            path=str(entry.path),
            problem=entry.problem,
        )


class ReceiptsListEnvelope(Envelope):
    """`tpulab receipts list --json`: every kept receipt, newest first."""

    command: Literal["receipts list"] = "receipts list"
    receipts: list[ReceiptEntry] = Field(default_factory=list)


class ReceiptsShowEnvelope(Envelope):
    """`tpulab receipts show ID --json`: one receipt, re-judged now; ok only when its
    bytes are intact AND it verifies."""

    command: Literal["receipts show"] = "receipts show"
    receipt_entry: ReceiptEntry | None = None
    expectation: Expectation | None = None
    provenance: Provenance | None = None
    kept_judgement: Judgement | None = None
    judgement: Judgement | None = None
    receipt: dict[str, Any] | None = None


class LocalPayload(_Part):
    exit_status: int
    duration_seconds: float


class VerifyEnvelope(Envelope):
    """`tpulab verify --local --json`: the local payload run, judged and kept."""

    command: Literal["verify"] = "verify"
    verdict: Verdict | None = None
    expectation: Expectation | None = None
    judgement: Judgement | None = None
    receipt_id: str | None = None
    receipt_path: str | None = None
    payload: LocalPayload | None = None
    receipt: dict[str, Any] | None = None
