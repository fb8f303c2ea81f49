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

With --hosts H (one worker of a multi-host slice, all H started at once) the payload first
joins the others through jax.distributed.initialize, then the pmap spans every device of
every worker: each local device takes the rows of its GLOBAL position (its index in
jax.devices()) and the psum runs across the slice. The receipt then gains a `distributed`
section. A worker that cannot join within --init-timeout seconds records that in its
receipt and exits non-zero; XLA aborts a process whose init or peers fail, so the
receipt on disk always says what this worker was doing if it dies without a word.

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
import threading
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
# XLA's own init deadline is ours plus this: our watchdog fires first and exits with a
# receipt and status 1; XLA's abort (SIGABRT, no Python exception) is only the fallback.
INIT_GRACE_SECONDS = 5
INIT_PHASE = "distributed_init"
# The phase a receipt on disk names while the measurement runs after joining: if XLA
# aborts the process then (a peer died), that is what the receipt says.
JOINED_PHASE = "distributed_run"
EXIT_FAILED = 1


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
    receipt: dict[str, Any] = {
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
    # Single-host receipts keep exactly their keys; only a slice worker has this one.
    if args.hosts is not None:
        receipt["distributed"] = None
    return receipt


def _snapshot(
    receipt: dict[str, Any], timer: Timer, phase: str, kind: str, message: str
) -> dict[str, Any]:
    """A complete, hashed failure receipt for "if this process ends now, in `phase`"."""
    failed = {
        **receipt,
        "ok": False,
        "error": {"phase": phase, "type": kind, "message": message},
        "timings_ms": dict(timer.ms),
    }
    return with_sha256(failed)


def _give_up(failure: dict[str, Any]) -> None:
    """A peer deadline passed: the receipt naming it is already on disk; say it on
    stdout too and end the process, whatever XLA is blocking the main thread on."""
    text = canonical_json(failure)
    print(f"verify_tpu: {failure['error']['message']}", file=sys.stderr, flush=True)
    print(RECEIPT_PREFIX + text, flush=True)
    os._exit(EXIT_FAILED)


@contextmanager
def _peer_deadline(
    args: argparse.Namespace, receipt: dict[str, Any], timer: Timer, phase: str, message: str
) -> Iterator[None]:
    """Wait on the other workers for at most --init-timeout seconds.

    The receipt naming `phase` and `message` goes on disk first (XLA aborts a process
    whose peers fail, with no Python exception: jax 0.6.2 and 0.10.2 both abort on an
    init timeout, and after ~100 s of missed heartbeats when a joined peer dies); a timer
    then ends the process with it. Afterwards the receipt on disk says "ended after
    joining", which is what it should say if XLA aborts later.
    """
    if args.hosts is None:
        yield
        return
    failure = _snapshot(receipt, timer, phase, "TimeoutError", message)
    _write_atomically(args.out, canonical_json(failure))
    watchdog = threading.Timer(args.init_timeout, _give_up, (failure,))
    watchdog.daemon = True
    watchdog.start()
    try:
        yield
    finally:
        watchdog.cancel()
    joined = _snapshot(
        receipt,
        timer,
        JOINED_PHASE,
        "Aborted",
        "the process ended after joining the slice (a peer died, or the runtime "
        "aborted); see its stderr",
    )
    _write_atomically(args.out, canonical_json(joined))


def _join_slice(jax: Any, args: argparse.Namespace, receipt: dict[str, Any], timer: Timer) -> float:
    """jax.distributed.initialize within --init-timeout seconds, or a receipt that says
    it did not and exit status 1. Returns the seconds the join took."""
    if args.platform == "cpu":
        # Cross-process collectives on CPU need gloo (emulated workers); jax 0.6.2 and
        # 0.10.2 both default to it, but naming it keeps a changed default from turning
        # the psum into a local one.
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    message = (
        f"jax.distributed.initialize did not join {args.hosts} processes within "
        f"{args.init_timeout} s (coordinator {args.coordinator}, this is process "
        f"{args.process_id}): a peer is missing, late, or cannot reach the coordinator"
    )
    started = time.perf_counter()
    with _peer_deadline(args, receipt, timer, INIT_PHASE, message):
        jax.distributed.initialize(
            coordinator_address=args.coordinator,
            num_processes=args.hosts,
            process_id=args.process_id,
            # Ours fires first (exit 1 with the receipt); XLA's abort is the fallback.
            initialization_timeout=args.init_timeout + INIT_GRACE_SECONDS,
        )
    return round(time.perf_counter() - started, 3)


def _leave_slice(seconds: float) -> bool:
    """jax.distributed.shutdown, bounded: it waits at a barrier for every peer, which
    never comes when one died. True when it finished in time."""
    jax = sys.modules.get("jax")
    if jax is None or not jax.distributed.is_initialized():
        return True
    done = threading.Event()

    def shutdown() -> None:
        try:
            jax.distributed.shutdown()
        except Exception as error:  # a dead peer's error; the receipt is already written
            print(f"verify_tpu: jax.distributed.shutdown: {error}", file=sys.stderr)
        done.set()

    threading.Thread(target=shutdown, name="jax-shutdown", daemon=True).start()
    return done.wait(seconds)


def _global_rows(np: Any, positions: list[int]) -> Any:
    """Row p is 8p .. 8p+7: each device squares the numbers of its global position."""
    starts = np.asarray(positions, dtype=np.float32)[:, None] * np.float32(ROW_WIDTH)
    return starts + np.arange(ROW_WIDTH, dtype=np.float32)[None, :]


def _devices_and_pmap(
    receipt: dict[str, Any], args: argparse.Namespace, timer: Timer, init_seconds: float | None
) -> list[Any]:
    """The backend and pmap phases (the ones a slice's peers take part in); returns this
    process's devices."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    requested = args.platform
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

        if args.hosts is None:
            x = jnp.arange(count * ROW_WIDTH, dtype=jnp.float32).reshape(count, ROW_WIDTH)
            per_device, totals = jax.pmap(squares, axis_name="devices", devices=local)(x)
        else:
            # Every device of the slice is mapped; this process feeds its local ones, in
            # the order they appear in the global list, the rows of their positions (on
            # multi-process CPU the ids are not 0..N-1, so the position, not .id).
            positions = [devices.index(d) for d in local]
            x = jnp.asarray(_global_rows(np, positions))
            per_device, totals = jax.pmap(squares, axis_name="devices", devices=devices)(x)
        per_device.block_until_ready()
        totals.block_until_ready()
        shard_platforms = sorted({shard.device.platform for shard in per_device.addressable_shards})
        if args.hosts is None:
            receipt["pmap"] = {
                "device_count": count,
                "per_device_sums": _floats(np.asarray(per_device)),
                "psum_totals": _floats(np.asarray(totals)),
                "observed_total": _finite(np.asarray(totals)[0]),
                "closed_form_total": closed_form_sum_of_squares(count),
                "output_platforms": shard_platforms,
            }
        else:
            _record_slice(receipt, args, jax, np, devices, per_device, totals, init_seconds)
            receipt["pmap"]["output_platforms"] = shard_platforms

    return local


def _measure(receipt: dict[str, Any], args: argparse.Namespace, timer: Timer) -> None:
    """Fill the evidence sections in place; raises PhaseError naming the failed phase."""
    with timer.phase("import"):
        import jax
        import jax.numpy as jnp
        import numpy as np

    init_seconds = None
    if args.hosts is not None:
        # Before anything touches devices: the backend must be created knowing the slice.
        with timer.phase(INIT_PHASE):
            init_seconds = _join_slice(jax, args, receipt, timer)

    psum_wait = (
        f"the slice-wide psum did not finish within {args.init_timeout} s: a peer died "
        "or stalled after joining"
    )
    with _peer_deadline(args, receipt, timer, "pmap", psum_wait):
        local = _devices_and_pmap(receipt, args, timer, init_seconds)

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


def _local_values(np: Any, devices: list[Any], array: Any) -> dict[int, float]:
    """{global position: value} for this process's shards of a pmap output (a slice's
    output is not fully addressable, so it is read shard by shard)."""
    return {
        devices.index(shard.device): _finite(np.asarray(shard.data).reshape(-1)[0])
        for shard in array.addressable_shards
    }


def _record_slice(
    receipt: dict[str, Any],
    args: argparse.Namespace,
    jax: Any,
    np: Any,
    devices: list[Any],
    per_device: Any,
    totals: Any,
    init_seconds: float | None,
) -> None:
    """The pmap and distributed sections of a slice worker, in global-position order."""
    sums = _local_values(np, devices, per_device)
    psums = _local_values(np, devices, totals)
    order = sorted(sums)
    receipt["pmap"] = {
        "device_count": len(order),
        "per_device_sums": [sums[p] for p in order],
        "psum_totals": [psums[p] for p in order],
        "observed_total": psums[order[0]],
        "closed_form_total": closed_form_sum_of_squares(len(devices)),
    }
    receipt["distributed"] = {
        "process_index": int(jax.process_index()),
        "process_count": int(jax.process_count()),
        "local_device_count": int(jax.local_device_count()),
        "global_device_count": int(jax.device_count()),
        "coordinator": args.coordinator,
        "init_seconds": init_seconds,
        "per_device_sums": {str(p): sums[p] for p in order},
    }


def build_receipt(args: argparse.Namespace) -> dict[str, Any]:
    """The complete receipt, sha256 included. Never raises: failures are recorded."""
    receipt = _empty_receipt(args)
    timer = Timer()
    started = time.perf_counter()
    try:
        _measure(receipt, args, timer)
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
    slice_args = parser.add_argument_group("one worker of a multi-host slice")
    slice_args.add_argument("--hosts", type=int, help="workers in the slice (2 or more)")
    slice_args.add_argument("--process-id", type=int, help="this worker's index, 0..hosts-1")
    slice_args.add_argument("--coordinator", help="host:port of worker 0's coordinator")
    slice_args.add_argument(
        "--init-timeout", type=int, help="seconds to wait for every worker to join"
    )
    args = parser.parse_args(argv)
    _check_slice_args(parser, args)
    return args


def _check_slice_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    given = [args.process_id, args.coordinator, args.init_timeout]
    if args.hosts is None:
        if any(value is not None for value in given):
            parser.error("--process-id, --coordinator and --init-timeout need --hosts")
        return
    if any(value is None for value in given):
        parser.error("--hosts needs --process-id, --coordinator and --init-timeout")
    if args.hosts < 2 or not 0 <= args.process_id < args.hosts:
        parser.error(f"--process-id {args.process_id} is not a worker of {args.hosts} hosts")
    if args.init_timeout < 1:
        parser.error("--init-timeout must be at least 1 second")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    status = _write_receipt(args, build_receipt(args))
    if args.hosts is not None and not _leave_slice(args.init_timeout):
        # A peer never reached the shutdown barrier; the receipt is written, so end now
        # rather than let jax's exit handler wait for it again.
        print("verify_tpu: jax.distributed.shutdown did not finish; exiting", file=sys.stderr)
        sys.stderr.flush()
        os._exit(status)
    return status


def _write_receipt(args: argparse.Namespace, receipt: dict[str, Any]) -> int:
    text = canonical_json(receipt)
    try:
        _write_atomically(args.out, text)
    except OSError as error:
        print(f"verify_tpu: could not write {args.out}: {error}", file=sys.stderr)
        print(RECEIPT_PREFIX + text, flush=True)
        return 3
    print(RECEIPT_PREFIX + text, flush=True)
    return 0 if receipt["ok"] else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
