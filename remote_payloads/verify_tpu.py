"""tpulab's verifier payload: prove a JAX computation ran on the platform that was asked for.

Runs ON the TPU VM (Python 3.10, stdlib + jax + numpy only; it never imports tpulab) and
on this machine for `tpulab verify --local`. It writes one JSON receipt (schema_version 1)
to --out and prints it to stdout as a single line prefixed `TPULAB_RECEIPT `.

Two separate proofs go into the receipt (see the course lessons tpu-04 and welcome-03):
the arithmetic is right (a pmap sum of squares with a closed form, and a small prediction
with a NumPy reference), and the work ran where it was requested (`jax.devices(requested)`
raises when that backend is absent, and the platform of every output array is recorded).
On ANY failure the receipt is still written, with ok=false and the error, and the exit
status is non-zero: an unavailable accelerator must never turn into a CPU "success".

The controller checks every number against its own oracle; the values here are evidence,
not verdicts.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import importlib.metadata
import json
import math
import os
import platform as platform_module
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

SCHEMA_VERSION = 1
RECEIPT_PREFIX = "TPULAB_RECEIPT "
ROW_WIDTH = 8  # device d sums the squares of 8d .. 8d+7
BIAS = 0.125
CHANGED_BIAS = -0.25
WEIGHTS = (0.5, -0.25, 1.0)
# Package names whose installed versions identify the runtime; libtpu has had two names.
VERSIONED_PACKAGES = ("jax", "jaxlib", "libtpu", "libtpu-nightly", "numpy")


class PhaseError(Exception):
    """A failure tagged with the phase it happened in, so the report can name it."""

    def __init__(self, phase: str, error: BaseException) -> None:
        super().__init__(str(error))
        self.phase = phase
        self.error = error


def canonical_json(data: dict[str, Any]) -> str:
    """The one serialisation the sha256 is computed over (the controller recomputes it)."""
    return json.dumps(
        data, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    )


def with_sha256(data: dict[str, Any]) -> dict[str, Any]:
    body = {key: value for key, value in data.items() if key != "sha256"}
    digest = hashlib.sha256(canonical_json(body).encode("ascii")).hexdigest()
    return {**body, "sha256": digest}


def closed_form_sum_of_squares(devices: int, width: int = ROW_WIDTH) -> float:
    n = devices * width
    return float((n - 1) * n * (2 * n - 1) // 6)


def _finite(value: Any) -> float:
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"non-finite value {number!r} in a result")
    return number


def _floats(values: Any) -> list[float]:
    return [_finite(v) for v in list(values)]


def _package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": platform_module.python_version()}
    for name in VERSIONED_PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


class Timer:
    """Milliseconds per phase; callers block_until_ready inside a phase before it ends."""

    def __init__(self) -> None:
        self.ms: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        except Exception as error:
            raise PhaseError(name, error) from error
        finally:
            self.ms[name] = round((time.perf_counter() - start) * 1000.0, 3)


def _empty_receipt(args: argparse.Namespace) -> dict[str, Any]:
    """Every key of schema 1, present from the start so a failure receipt is complete."""
    return {
        "schema_version": SCHEMA_VERSION,
        "ok": False,
        "error": None,
        "nonce": args.nonce,
        "emulated": bool(args.emulated),
        "requested_platform": args.platform,
        "observed": None,
        "pmap": None,
        "placement": None,
        "changed_bias": None,
        "reversal": None,
        "versions": _package_versions(),
        "timings_ms": {},
        "host": {
            "hostname": socket.gethostname(),
            "os": platform_module.platform(),
            "jax_platforms_env": os.environ.get("JAX_PLATFORMS"),
            "xla_flags_env": os.environ.get("XLA_FLAGS"),
        },
        "created_at": datetime.datetime.now(datetime.timezone.utc).isoformat(),
    }


def _measure(receipt: dict[str, Any], requested: str, timer: Timer) -> None:
    """Fill the evidence sections in place; raises PhaseError naming the failed phase."""
    with timer.phase("import"):
        import jax
        import jax.numpy as jnp
        import numpy as np

    with timer.phase("backend"):
        # Asking for the platform by name is what makes an absent TPU an error instead of
        # a silent fallback to CPU.
        devices = jax.devices(requested)
        local = [d for d in devices if d.process_index == jax.process_index(requested)]
        if not local:
            raise RuntimeError(f"no local {requested} devices in {devices!r}")
        receipt["observed"] = {
            "default_backend": jax.default_backend(),
            "device_platforms": [d.platform for d in local],
            "device_kinds": [d.device_kind for d in local],
            "device_ids": [int(d.id) for d in local],
            "local_device_count": jax.local_device_count(requested),
            "global_device_count": jax.device_count(requested),
            "process_index": jax.process_index(requested),
            "process_count": jax.process_count(requested),
        }

    count = len(local)
    with timer.phase("pmap"):
        psum: Any = jax.lax.psum  # untyped in jax's stubs

        def squares(row: Any) -> tuple[Any, Any]:
            mine = jnp.sum(row * row)
            return mine, psum(mine, "devices")

        x = jnp.arange(count * ROW_WIDTH, dtype=jnp.float32).reshape(count, ROW_WIDTH)
        per_device, totals = jax.pmap(squares, axis_name="devices", devices=local)(x)
        per_device.block_until_ready()
        totals.block_until_ready()
        shard_platforms = sorted({shard.device.platform for shard in per_device.addressable_shards})
        receipt["pmap"] = {
            "device_count": count,
            "per_device_sums": _floats(np.asarray(per_device)),
            "psum_totals": _floats(np.asarray(totals)),
            "observed_total": _finite(np.asarray(totals)[0]),
            "closed_form_total": closed_form_sum_of_squares(count),
            "output_platforms": shard_platforms,
        }

    target = local[0]
    x_host = np.arange(24, dtype=np.float32).reshape(8, 3) / np.float32(8)
    w_host = np.array(WEIGHTS, dtype=np.float32)
    reference = x_host @ w_host + np.float32(BIAS)

    def affine(bias: float) -> Any:
        # HIGHEST keeps TPU matmuls in float32 so the comparison tests placement and
        # arithmetic, not bfloat16 rounding.
        return jax.jit(
            lambda a, b: jnp.dot(a, b, precision=jax.lax.Precision.HIGHEST) + jnp.float32(bias)
        )

    def run_on_target(fn: Any, rows: Any) -> tuple[Any, list[str], str]:
        out = fn(jax.device_put(rows, target), jax.device_put(w_host, target))
        out.block_until_ready()
        return out, sorted({d.platform for d in out.devices()}), str(out.dtype)

    with timer.phase("placement"):
        y, y_platforms, y_dtype = run_on_target(affine(BIAS), x_host)
        predictions = np.asarray(y)
        receipt["placement"] = {
            "predictions": _floats(predictions),
            "reference": _floats(reference),
            "max_abs_error": _finite(np.max(np.abs(predictions - reference))),
            "output_platforms": y_platforms,
            "output_device_kind": target.device_kind,
            "shape": [int(n) for n in y.shape],
            "dtype": y_dtype,
        }

    with timer.phase("changed_bias"):
        changed, changed_platforms, _ = run_on_target(affine(CHANGED_BIAS), x_host)
        changed_values = np.asarray(changed)
        receipt["changed_bias"] = {
            "bias": CHANGED_BIAS,
            "predictions": _floats(changed_values),
            "max_abs_error": _finite(np.max(np.abs(changed_values - (reference - 0.375)))),
            "output_platforms": changed_platforms,
        }

    with timer.phase("reversal"):
        reversed_y, reversed_platforms, _ = run_on_target(affine(BIAS), x_host[::-1].copy())
        reversed_values = np.asarray(reversed_y)
        receipt["reversal"] = {
            "predictions": _floats(reversed_values),
            "max_abs_error": _finite(np.max(np.abs(reversed_values - reference[::-1]))),
            "output_platforms": reversed_platforms,
        }


def build_receipt(args: argparse.Namespace) -> dict[str, Any]:
    """The complete receipt, sha256 included. Never raises: failures are recorded."""
    receipt = _empty_receipt(args)
    timer = Timer()
    started = time.perf_counter()
    try:
        _measure(receipt, args.platform, timer)
        receipt["ok"] = True
    except PhaseError as failure:
        receipt["error"] = {
            "phase": failure.phase,
            "type": type(failure.error).__name__,
            "message": str(failure.error)[:4000],
        }
        traceback.print_exception(failure.error, file=sys.stderr)
    receipt["versions"] = _package_versions()
    timer.ms["total"] = round((time.perf_counter() - started) * 1000.0, 3)
    receipt["timings_ms"] = timer.ms
    return with_sha256(receipt)


def _write_atomically(path: str, text: str) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".receipt-", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="ascii") as handle:
            handle.write(text + "\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--platform", choices=("cpu", "tpu", "gpu"), required=True)
    parser.add_argument("--nonce", required=True, help="the controller's per-run value")
    parser.add_argument("--out", required=True, help="where to write the receipt JSON")
    parser.add_argument(
        "--emulated", action="store_true", help="record that this stands in for a TPU"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    receipt = build_receipt(args)
    text = canonical_json(receipt)
    try:
        _write_atomically(args.out, text)
    except OSError as error:
        print(f"verify_tpu: could not write {args.out}: {error}", file=sys.stderr)
        print(RECEIPT_PREFIX + text, flush=True)
        return 3
    print(RECEIPT_PREFIX + text, flush=True)
    return 0 if receipt["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
