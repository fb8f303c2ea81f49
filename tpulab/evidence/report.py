"""Reports about receipts, as data: styled lines for the terminal and JSON envelopes.

Nothing here prints and nothing imports rich: a report is a list of lines, each a list of
(text, style) segments whose style names are rich's ("green", "bold red", ""). `cli.py`
turns them into terminal output; tests read them as plain text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tpulab import catalog
from tpulab.evidence.receipt import (
    Expectation,
    Receipt,
    RequirementResult,
    expected_per_device_sums,
)
from tpulab.evidence.store import StoredReceipt

__all__ = [
    "ENVELOPE_SCHEMA_VERSION",
    "Line",
    "bar_chart",
    "envelope",
    "plain",
    "receipt_lines",
    "receipts_table",
    "requirement_lines",
    "stored_lines",
    "verdict_line",
]

ENVELOPE_SCHEMA_VERSION = 1
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


def verdict_line(results: Sequence[RequirementResult], expectation: Expectation) -> Line:
    failed = sum(not r.passed for r in results)
    if results and not failed:
        return [
            ("VERIFIED", "bold green"),
            (f": {expectation.describe()}, {len(results)} requirements hold", ""),
        ]
    return [
        ("REJECTED", "bold red"),
        (f": {failed} of {len(results)} requirements failed for {expectation.describe()}", ""),
    ]


def stored_lines(stored: StoredReceipt) -> list[Line]:
    return [[("receipt kept: ", "dim"), (stored.id, "bold"), (f"  {stored.path}", "dim")]]


def receipts_table(kept: Sequence[StoredReceipt]) -> list[Line]:
    if not kept:
        return [[("No receipts kept yet. `tpulab verify --local` makes one.", "dim")]]
    id_width = max(len(r.id) for r in kept)
    lines: list[Line] = [
        [(f"{'ID':<{id_width}}  {'VERDICT':<10} {'ACCELERATOR':<14} {'MODE':<9} RUN", "bold")]
    ]
    for r in kept:
        style = "green" if r.verdict == "verified" else "red"
        mode = "emulated" if r.emulated else str(r.meta.get("source") or "real")
        lines.append(
            [
                (f"{r.id:<{id_width}}  ", ""),
                (f"{r.verdict:<10} ", style),
                (f"{r.accelerator or '-':<14} {mode:<9} {r.run_id or '-'}", ""),
            ]
        )
    return lines


def envelope(command: str, *, ok: bool, **fields: Any) -> dict[str, Any]:
    """The versioned JSON result every `--json` output is wrapped in."""
    return {"schema_version": ENVELOPE_SCHEMA_VERSION, "command": command, "ok": ok, **fields}
