"""The receipt (schema_version 1) and the checks that decide whether it proves a run.

The payload (`remote_payloads/verify_tpu.py`) reports what it observed; nothing it says
is trusted as a verdict. Here the receipt is parsed strictly and within a size bound, and
every number is compared with an oracle computed independently in plain Python: the
closed-form sums for the EXPECTED device count (so four TPU chips silently falling back
to one CPU device fail), the eight predictions from the formula, and the platform the
catalog says the run must have used. Each requirement is named, with what was expected
and what the receipt shows.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tpulab import catalog
from tpulab.errors import ConfigError, RequirementFailure, VerificationError
from tpulab.models import DEFER_BUILD, PLATFORMS

__all__ = [
    "MAX_RECEIPT_BYTES",
    "PLATFORMS",
    "SLICE_WAIT_PHASES",
    "ChangedBias",
    "Distributed",
    "Expectation",
    "Host",
    "Observed",
    "PayloadError",
    "Placement",
    "Platform",
    "PmapResult",
    "Receipt",
    "RequirementResult",
    "Reversal",
    "Versions",
    "canonical_json",
    "check_receipt",
    "evaluate_receipt",
    "expectation_for",
    "expected_per_device_sums",
    "expected_predictions",
    "global_positions",
    "parse_receipt",
    "read_receipt_file",
    "receipt_digest",
    "rejection",
    "verify_raw",
    "verify_receipt",
    "waited_for_peers",
]

MAX_RECEIPT_BYTES = 1024 * 1024
# The payload's phases that wait on a slice's other workers (remote_payloads/verify_tpu.py):
# a failure there is usually a peer's, not this worker's.
SLICE_WAIT_PHASES = ("distributed_init", "pmap", "distributed_run")
Platform = Literal["cpu", "tpu", "gpu"]
_ROW_WIDTH = 8
_MAX_SCHEMA_PROBLEMS = 20


class _Strict(BaseModel):
    # strict: no "4" -> 4 coercion; forbid: an unknown field is a different schema;
    # no NaN/inf: a non-finite number is never evidence.
    model_config = ConfigDict(
        defer_build=DEFER_BUILD, strict=True, extra="forbid", frozen=True, allow_inf_nan=False
    )


class PayloadError(_Strict):
    phase: str
    type: str
    message: str


class Observed(_Strict):
    default_backend: str
    device_platforms: list[str]
    device_kinds: list[str]
    device_ids: list[int]
    local_device_count: int
    global_device_count: int
    process_index: int
    process_count: int


class PmapResult(_Strict):
    device_count: int
    per_device_sums: list[float]
    psum_totals: list[float]
    observed_total: float
    closed_form_total: float
    output_platforms: list[str]


class Placement(_Strict):
    predictions: list[float]
    reference: list[float]
    max_abs_error: float
    output_platforms: list[str]
    output_device_kind: str
    shape: list[int]
    dtype: str


class ChangedBias(_Strict):
    bias: float
    predictions: list[float]
    max_abs_error: float
    output_platforms: list[str]


class Reversal(_Strict):
    predictions: list[float]
    max_abs_error: float
    output_platforms: list[str]


class Versions(_Strict):
    python: str
    jax: str | None
    jaxlib: str | None
    libtpu: str | None
    libtpu_nightly: str | None = Field(alias="libtpu-nightly")
    numpy: str | None


class Distributed(_Strict):
    """One worker of a multi-host slice: what jax.distributed showed it, and its devices'
    sums keyed by GLOBAL position (the index in jax.devices(), as a decimal string)."""

    process_index: int
    process_count: int
    local_device_count: int
    global_device_count: int
    coordinator: str = Field(max_length=300)
    init_seconds: float | None
    per_device_sums: dict[str, float]


class Host(_Strict):
    hostname: str
    os: str
    jax_platforms_env: str | None
    xla_flags_env: str | None


class Receipt(_Strict):
    """What one payload run reports. Every key is required; absent evidence is null."""

    schema_version: Literal[1]
    ok: bool
    error: PayloadError | None
    nonce: str = Field(max_length=512)
    emulated: bool
    requested_platform: Platform
    observed: Observed | None
    pmap: PmapResult | None
    placement: Placement | None
    changed_bias: ChangedBias | None
    reversal: Reversal | None
    versions: Versions
    timings_ms: dict[str, float]
    host: Host
    created_at: str
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    # Only a slice worker's receipt has the key; single-host receipts (and those older
    # than slices) have none, and their digest is over the keys they have.
    distributed: Distributed | None = None


def canonical_json(data: dict[str, Any]) -> str:
    """The serialisation the payload hashes; keep in step with verify_tpu.canonical_json."""
    return json.dumps(
        data, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    )


def receipt_digest(receipt: Receipt) -> str:
    """sha256 of the canonical JSON of the receipt without its sha256 field."""
    # exclude_unset: an absent optional key stays absent, so the digest is over exactly
    # the document the payload hashed (every other field is required, hence set).
    body = receipt.model_dump(mode="json", by_alias=True, exclude={"sha256"}, exclude_unset=True)
    return hashlib.sha256(canonical_json(body).encode("ascii")).hexdigest()


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number a receipt may contain")


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _schema_failures(error: ValidationError) -> list[RequirementFailure]:
    failures = []
    for item in error.errors(include_url=False)[:_MAX_SCHEMA_PROBLEMS]:
        where = ".".join(str(part) for part in item["loc"]) or "(top level)"
        if item["type"] == "missing":
            expected, observed = "field present", "missing"
        elif item["type"] == "extra_forbidden":
            expected, observed = "no such field in schema 1", _short(item.get("input"))
        else:
            expected, observed = item["msg"], _short(item.get("input"))
        failures.append(RequirementFailure(f"receipt.{where}", expected, observed))
    return failures


def parse_receipt(data: bytes) -> Receipt:
    """Parse receipt bytes strictly; anything else raises VerificationError by name."""
    if len(data) > MAX_RECEIPT_BYTES:
        raise VerificationError(
            "The receipt is too large to be one of ours.",
            [RequirementFailure("receipt.size", f"<= {MAX_RECEIPT_BYTES} bytes", f"{len(data)}")],
            hint="A schema 1 receipt is a few kilobytes; this file is not a tpulab receipt.",
        )
    if not data.strip():
        raise VerificationError(
            "The receipt is empty.",
            [RequirementFailure("receipt.json", "a JSON object", "0 bytes")],
            hint="The payload did not write its receipt; look at its stderr.",
        )
    try:
        document = json.loads(data, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as error:
        raise VerificationError(
            "The receipt is not valid JSON (truncated or corrupted).",
            [RequirementFailure("receipt.json", "complete JSON", _short(str(error), 160))],
            hint="The file was cut short or altered; rerun the payload to get a fresh receipt.",
        ) from None
    if isinstance(document, dict) and document.get("schema_version") not in (1, None):
        raise VerificationError(
            "The receipt uses a schema this tpulab does not know.",
            [
                RequirementFailure(
                    "receipt.schema_version", "1", _short(document.get("schema_version"))
                )
            ],
            hint="Use the payload shipped with this tpulab version.",
        )
    try:
        return Receipt.model_validate(document)
    except ValidationError as error:
        raise VerificationError(
            f"The receipt does not match schema_version 1 ({error.error_count()} problem(s)).",
            _schema_failures(error),
            hint="The receipt was altered or written by another payload version.",
        ) from None


def read_receipt_file(path: Path, max_bytes: int = MAX_RECEIPT_BYTES) -> bytes:
    """At most max_bytes+1 bytes of `path`: enough to know it is too big, never more."""
    try:
        with path.open("rb") as handle:
            data = handle.read(max_bytes + 1)
    except OSError as error:
        raise VerificationError(
            f"Cannot read the receipt {path}: {error.strerror or error}.",
            [RequirementFailure("receipt.file", "a readable file", str(path))],
            hint="The payload may have failed before writing it; look at its stderr.",
        ) from None
    if len(data) > max_bytes:
        raise VerificationError(
            f"The receipt {path} is larger than {max_bytes} bytes.",
            [RequirementFailure("receipt.size", f"<= {max_bytes} bytes", f"> {max_bytes}")],
            hint="A schema 1 receipt is a few kilobytes; this file is not a tpulab receipt.",
        )
    return data


@dataclass(frozen=True)
class Expectation:
    """What a receipt must show for the run to count."""

    platform: str
    local_devices: int
    nonce: str
    emulated: bool = False
    accelerator_type: str | None = None
    tolerance: float = 1e-5
    # Workers of the slice; each worker's receipt shows local_devices of hosts x that.
    hosts: int = 1

    def __post_init__(self) -> None:
        if self.platform not in PLATFORMS:
            raise ConfigError(
                f"Unknown platform {self.platform!r}.", hint="Use one of: " + ", ".join(PLATFORMS)
            )
        if not 1 <= self.local_devices <= 4096:
            raise ConfigError(
                f"Invalid device count {self.local_devices}.",
                hint="Ask for between 1 and 4096 devices.",
            )
        # An emulated node is a CPU machine standing in for a TPU; anything else would
        # let a CPU receipt pass as TPU evidence.
        if self.emulated and self.platform != "cpu":
            raise ConfigError(
                f"An emulated run executes on cpu, not {self.platform}.",
                hint="Drop the emulation, or expect platform cpu.",
            )
        if not 1 <= self.hosts <= 1024:
            raise ConfigError(f"Invalid host count {self.hosts}.", hint="Use 1 or more hosts.")
        if not 0.0 < self.tolerance < 1.0:
            raise ConfigError(
                f"Invalid tolerance {self.tolerance}.", hint="Use a small positive number."
            )

    @property
    def total_devices(self) -> int:
        return self.hosts * self.local_devices

    def describe(self) -> str:
        what = f"{self.local_devices} {self.platform} device(s)"
        if self.hosts > 1:
            what = f"{self.hosts} workers x {what}"
        if self.accelerator_type:
            what += f" of {self.accelerator_type}"
        return what + (" (EMULATED)" if self.emulated else "")


def expectation_for(accelerator: str, *, emulated: bool, nonce: str) -> Expectation:
    """What each worker of `accelerator` must show (one worker for a single host);
    emulated workers run on cpu."""
    entry = catalog.lookup(accelerator)
    return Expectation(
        platform="cpu" if emulated else "tpu",
        local_devices=entry.devices_per_host,
        nonce=nonce,
        emulated=emulated,
        accelerator_type=entry.name,
        hosts=entry.hosts,
    )


def expected_per_device_sums(devices: int) -> list[int]:
    """Device d squares 8d .. 8d+7; computed here, never read from a receipt."""
    return [sum(k * k for k in range(d * _ROW_WIDTH, (d + 1) * _ROW_WIDTH)) for d in range(devices)]


def expected_predictions(bias: Fraction = Fraction(1, 8)) -> list[float]:
    """X = arange(24)/8 as 8x3, w = [1/2, -1/4, 1], exactly, plus `bias`."""
    weights = (Fraction(1, 2), Fraction(-1, 4), Fraction(1))
    rows = [[Fraction(3 * i + j, 8) for j in range(3)] for i in range(8)]
    return [float(sum(x * w for x, w in zip(row, weights, strict=True)) + bias) for row in rows]


class RequirementResult(BaseModel):
    """One named requirement, passed or not, with both sides as text for the report."""

    model_config = ConfigDict(defer_build=DEFER_BUILD, extra="forbid", frozen=True)

    name: str
    passed: bool
    expected: str
    observed: str

    def failure(self) -> RequirementFailure:
        return RequirementFailure(self.name, self.expected, self.observed)


def _num(value: float) -> str:
    return f"{value:g}" if math.isfinite(value) else str(value)


def _nums(values: Sequence[float]) -> str:
    return "[" + ", ".join(_num(v) for v in values) + "]"


def _close(observed: Sequence[float], expected: Sequence[float], tolerance: float) -> bool:
    return len(observed) == len(expected) and all(
        abs(a - b) <= tolerance for a, b in zip(observed, expected, strict=True)
    )


class _Checks:
    """Collects results so each check reads as one line in evaluate_receipt."""

    def __init__(self) -> None:
        self.results: list[RequirementResult] = []

    def add(self, name: str, passed: bool, expected: str, observed: str) -> None:
        self.results.append(
            RequirementResult(name=name, passed=passed, expected=expected, observed=observed)
        )

    def platforms(self, name: str, observed: Sequence[str], platform: str) -> None:
        self.add(name, list(observed) == [platform], platform, ", ".join(observed) or "none")

    def values(
        self, name: str, observed: Sequence[float], expected: Sequence[float], tolerance: float
    ) -> None:
        passed = _close(observed, expected, tolerance)
        self.add(name, passed, f"{_nums(expected)} ± {tolerance:g}", _nums(observed))


def _check_identity(checks: _Checks, receipt: Receipt, expectation: Expectation) -> None:
    if receipt.ok:
        checks.add("ok", True, "true", "true")
    else:
        cause = receipt.error
        detail = f" ({cause.phase}: {cause.type}: {cause.message})" if cause else ""
        checks.add("ok", False, "true", "false" + detail)
    mode = {True: "emulated", False: "not emulated"}
    checks.add(
        "emulated",
        receipt.emulated == expectation.emulated,
        mode[expectation.emulated],
        mode[receipt.emulated],
    )
    checks.add(
        "nonce", receipt.nonce == expectation.nonce, repr(expectation.nonce), repr(receipt.nonce)
    )
    digest = receipt_digest(receipt)
    checks.add("sha256", digest == receipt.sha256, digest, receipt.sha256)
    checks.add(
        "requested_platform",
        receipt.requested_platform == expectation.platform,
        expectation.platform,
        receipt.requested_platform,
    )


def _check_observed(checks: _Checks, observed: Observed, expectation: Expectation) -> None:
    platform, devices = expectation.platform, expectation.local_devices
    checks.add(
        "observed_platform.default_backend",
        observed.default_backend == platform,
        platform,
        observed.default_backend,
    )
    kinds = sorted(set(observed.device_platforms))
    checks.add("observed_platform.devices", kinds == [platform], platform, ", ".join(kinds))
    checks.add(
        "local_device_count",
        observed.local_device_count == devices and len(observed.device_platforms) == devices,
        str(devices),
        f"{observed.local_device_count} ({len(observed.device_platforms)} listed)",
    )
    # A receipt from a runtime of another shape is not the node we created: one process
    # for a single host, every worker's process for a slice.
    hosts, total = expectation.hosts, expectation.total_devices
    checks.add(
        "single_host" if hosts == 1 else "slice",
        observed.process_count == hosts and observed.global_device_count == total,
        f"{hosts} process{'es' if hosts > 1 else ''}, {total} devices in total",
        f"{observed.process_count} process(es), {observed.global_device_count} devices",
    )


def _check_pmap(checks: _Checks, pmap: PmapResult, expectation: Expectation) -> None:
    devices = expectation.local_devices
    checks.platforms("pmap.output_platform", pmap.output_platforms, expectation.platform)
    if expectation.hosts == 1:
        _check_local_sums(checks, pmap, devices)
    # On a slice the psum spans every worker's devices: the closed form of them all.
    total = catalog.closed_form_sum_of_squares(expectation.total_devices)
    checks.add("pmap.total", pmap.observed_total == total, _num(total), _num(pmap.observed_total))
    collective = bool(pmap.psum_totals) and all(t == total for t in pmap.psum_totals)
    checks.add(
        "pmap.psum_totals",
        collective and len(pmap.psum_totals) == devices,
        f"{devices} x {_num(total)}",
        _nums(pmap.psum_totals),
    )


def _check_local_sums(checks: _Checks, pmap: PmapResult, devices: int) -> None:
    oracle = expected_per_device_sums(devices)
    for d in range(max(devices, len(pmap.per_device_sums))):
        expected = _num(oracle[d]) if d < devices else f"absent ({devices} devices)"
        seen = pmap.per_device_sums[d] if d < len(pmap.per_device_sums) else None
        passed = d < devices and seen is not None and seen == oracle[d]
        checks.add(
            f"pmap.per_device_sums[{d}]",
            passed,
            expected,
            "missing" if seen is None else _num(seen),
        )


def global_positions(distributed: Distributed) -> dict[int, float] | None:
    """The per-device sums by global position, or None when a key is no position
    (a canonical decimal: "07" or "+7" would let one position be claimed twice)."""
    found: dict[int, float] = {}
    for key, value in distributed.per_device_sums.items():
        if not key.isdecimal() or str(int(key)) != key:
            return None
        found[int(key)] = value
    return found


def _check_distributed(
    checks: _Checks, distributed: Distributed, pmap: PmapResult | None, expectation: Expectation
) -> None:
    """One worker's slice evidence on its own; the slice judgement checks the workers
    together (positions, indices, agreement)."""
    hosts, devices, total = expectation.hosts, expectation.local_devices, expectation.total_devices
    checks.add(
        "distributed.process_count",
        distributed.process_count == hosts,
        str(hosts),
        str(distributed.process_count),
    )
    checks.add(
        "distributed.device_counts",
        distributed.local_device_count == devices and distributed.global_device_count == total,
        f"{devices} local of {total}",
        f"{distributed.local_device_count} local of {distributed.global_device_count}",
    )
    sums = global_positions(distributed)
    if sums is None:
        keys = ", ".join(sorted(distributed.per_device_sums))
        checks.add("distributed.per_device_sums", False, "decimal global positions", keys)
        return
    checks.add(
        "distributed.per_device_sums",
        len(sums) == devices and all(0 <= p < total for p in sums),
        f"{devices} positions in 0..{total - 1}",
        ", ".join(str(p) for p in sorted(sums)) or "none",
    )
    oracle = expected_per_device_sums(total)
    for position in sorted(sums):
        expected = _num(oracle[position]) if 0 <= position < total else "no such position"
        passed = 0 <= position < total and sums[position] == oracle[position]
        checks.add(f"per_device_sums[{position}]", passed, expected, _num(sums[position]))
    if pmap is not None:
        in_order = [sums[p] for p in sorted(sums)]
        checks.add(
            "pmap.per_device_sums",
            list(pmap.per_device_sums) == in_order,
            f"the distributed sums in position order {_nums(in_order)}",
            _nums(pmap.per_device_sums),
        )


def _check_predictions(checks: _Checks, receipt: Receipt, expectation: Expectation) -> None:
    platform, tolerance = expectation.platform, expectation.tolerance
    oracle = expected_predictions()
    if receipt.placement is not None:
        placement = receipt.placement
        checks.platforms("placement.output_platform", placement.output_platforms, platform)
        checks.add(
            "placement.shape",
            placement.shape == [8] and placement.dtype == "float32",
            "[8] float32",
            f"{placement.shape} {placement.dtype}",
        )
        checks.values("placement.predictions", placement.predictions, oracle, tolerance)
        checks.add(
            "placement.max_abs_error",
            0.0 <= placement.max_abs_error <= tolerance,
            f"<= {tolerance:g}",
            _num(placement.max_abs_error),
        )
    if receipt.changed_bias is not None:
        changed = receipt.changed_bias
        checks.platforms("changed_bias.output_platform", changed.output_platforms, platform)
        shifted = expected_predictions(Fraction(-1, 4))
        checks.values("changed_bias.predictions", changed.predictions, shifted, tolerance)
    if receipt.reversal is not None:
        reversal = receipt.reversal
        checks.platforms("reversal.output_platform", reversal.output_platforms, platform)
        checks.values("reversal.predictions", reversal.predictions, oracle[::-1], tolerance)


def evaluate_receipt(receipt: Receipt, expectation: Expectation) -> list[RequirementResult]:
    """Every requirement, passed or failed, in report order."""
    checks = _Checks()
    _check_identity(checks, receipt, expectation)
    sections: dict[str, object | None] = {
        "observed_platform": receipt.observed,
        "pmap": receipt.pmap,
        "placement": receipt.placement,
        "changed_bias": receipt.changed_bias,
        "reversal": receipt.reversal,
    }
    if expectation.hosts > 1:
        sections["distributed"] = receipt.distributed
    if receipt.ok:
        # A receipt claiming success must carry all its evidence; a failed one is already
        # rejected by "ok", so its missing sections would only repeat that.
        for name, section in sections.items():
            if section is None:
                checks.add(name, False, "recorded", "missing")
    if receipt.observed is not None:
        _check_observed(checks, receipt.observed, expectation)
    if receipt.pmap is not None:
        _check_pmap(checks, receipt.pmap, expectation)
    if receipt.distributed is not None and expectation.hosts > 1:
        _check_distributed(checks, receipt.distributed, receipt.pmap, expectation)
    _check_predictions(checks, receipt, expectation)
    return checks.results


def check_receipt(receipt: Receipt, expectation: Expectation) -> list[RequirementFailure]:
    """The failed requirements only; an empty list means the receipt proves the run."""
    return [r.failure() for r in evaluate_receipt(receipt, expectation) if not r.passed]


def waited_for_peers(error: PayloadError | None) -> bool:
    """The payload failed waiting on the other workers (its own phases were fine)."""
    if error is None or error.phase not in SLICE_WAIT_PHASES:
        return False
    return error.phase == "distributed_init" or error.type in ("TimeoutError", "Aborted")


def rejection(
    receipt: Receipt, expectation: Expectation, failures: Sequence[RequirementFailure]
) -> VerificationError:
    """The error for a parsed receipt whose `failures` (all of them, already checked)
    keep it from proving the run; a payload that could not reach JAX says so first."""
    error = receipt.error
    if not receipt.ok and error is not None and error.phase in ("import", "backend"):
        platform = expectation.platform.upper()
        where = receipt.host.hostname
        if error.phase == "import":
            message = f"JAX could not be imported on {where}: {error.type}: {error.message}"
            hint = "Install jax in the interpreter that runs the payload."
        else:
            message = f"The {platform} backend is unavailable on {where}: {error.message}"
            hint = (
                "This machine has no usable TPU. Run on a Cloud TPU VM with `tpulab run "
                "--accelerator TYPE`, or rehearse with --emulate / --expect-platform cpu."
                if expectation.platform == "tpu"
                else f"Check that the {expectation.platform} backend is installed."
            )
        return VerificationError(message, failures, hint=hint)
    if expectation.hosts > 1 and not receipt.ok and error is not None and waited_for_peers(error):
        return VerificationError(
            f"{receipt.host.hostname} waited for the other workers of the slice in vain: "
            f"{error.message}",
            failures,
            hint="Every worker must start the payload within the init timeout and reach "
            "worker 0's coordinator port; the slice's judgement names a worker that did not.",
        )
    names = ", ".join(f.requirement for f in failures[:6])
    more = f" and {len(failures) - 6} more" if len(failures) > 6 else ""
    return VerificationError(
        f"The receipt does not prove {expectation.describe()}: {names}{more} failed.",
        failures,
        hint="Each line names a requirement, what it needed and what the receipt shows.",
    )


def verify_receipt(receipt: Receipt, expectation: Expectation) -> None:
    """Raise VerificationError naming every failed requirement; return if all hold."""
    failures = check_receipt(receipt, expectation)
    if failures:
        raise rejection(receipt, expectation, failures)


def verify_raw(data: bytes, expectation: Expectation) -> Receipt:
    """parse_receipt then verify_receipt: the one call a caller holding bytes needs."""
    receipt = parse_receipt(data)
    verify_receipt(receipt, expectation)
    return receipt
