"""Run the verifier payload on this machine, in a fresh interpreter, and judge it.

A fresh process is the point: JAX fixes its platform and device count when it first
initialises, so the reference run must not share an interpreter with tpulab (which also
keeps jax out of tpulab's own imports). Its failures are LocalRunError: nothing here
ran on a VM. `verify_local` is the whole of `tpulab verify --local` (and of the
library's `tpulab.verify_local`): probe the store, run, judge once, keep, pick the error.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tpulab import paths
from tpulab.errors import LocalRunError, TpuLabError
from tpulab.evidence.judge import Judgement, failure_of, judge, payload_failure
from tpulab.evidence.receipt import MAX_RECEIPT_BYTES, Expectation, read_receipt_file
from tpulab.evidence.store import KeptReceipt, Provenance, ReceiptStore, Source
from tpulab.remote.payload import extract_receipt_line, merged_env, payload_command

__all__ = [
    "LocalRunResult",
    "LocalVerification",
    "new_nonce",
    "run_local_payload",
    "verify_local",
]

_STDERR_TAIL = 4000


@dataclass(frozen=True)
class LocalRunResult:
    """The receipt bytes as written (unparsed: validation is the caller's job)."""

    raw: bytes
    exit_status: int
    stderr_tail: str
    duration: float
    nonce: str
    command: tuple[str, ...]


def new_nonce() -> str:
    return secrets.token_hex(16)


def _tail(data: bytes) -> str:
    return data.decode("utf-8", "replace")[-_STDERR_TAIL:]


def run_local_payload(
    *,
    devices: int,
    platform: str = "cpu",
    nonce: str | None = None,
    emulated: bool = False,
    timeout: float = 300,
    python: str = sys.executable,
    payload: Path | None = None,
) -> LocalRunResult:
    """Run the payload with JAX_PLATFORMS=`platform` and `devices` forced on CPU.

    Returns the receipt even when the payload exits non-zero (a failed run still writes
    one that names its error). Raises LocalRunError when the payload cannot start, runs
    past `timeout` or produces no receipt at all.
    """
    nonce = nonce or new_nonce()
    script = payload or paths.payload_path()
    env = merged_env(os.environ, platform, devices)
    with tempfile.TemporaryDirectory(prefix="tpulab-verify-") as scratch:
        out = Path(scratch) / "receipt.json"
        argv = payload_command(
            python, script, platform=platform, nonce=nonce, out=out, emulated=emulated
        )
        started = time.monotonic()
        try:
            done = subprocess.run(
                argv, env=env, capture_output=True, timeout=timeout, check=False, cwd=scratch
            )
        except subprocess.TimeoutExpired as expired:
            raise LocalRunError(
                f"The local payload ran past {timeout:g} s and was stopped.",
                exit_status=-1,
                output_tail=_tail(expired.stderr or b""),
                hint="JAX may be stuck initialising; rerun with more time or fewer devices.",
            ) from expired
        except OSError as error:
            raise LocalRunError(
                f"Cannot start the payload with {python}: {error.strerror or error}.",
                exit_status=127,
                hint="Point --python at an interpreter that has jax and numpy installed.",
            ) from error
        duration = time.monotonic() - started
        if out.is_file():
            raw = read_receipt_file(out, MAX_RECEIPT_BYTES)
        else:
            # The payload writes the file before printing; stdout is the fallback for a
            # read-only scratch directory.
            raw = extract_receipt_line(done.stdout) or b""
    if not raw:
        raise payload_failure(
            "wrote no receipt",
            "see its stderr",
            exit_status=done.returncode,
            output=_tail(done.stderr).splitlines(),
            where="local",
        )
    return LocalRunResult(
        raw=raw,
        exit_status=done.returncode,
        stderr_tail=_tail(done.stderr),
        duration=duration,
        nonce=nonce,
        command=tuple(argv),
    )


@dataclass(frozen=True)
class LocalVerification:
    """One local payload run, judged and kept; `error` is None exactly when it verified."""

    expectation: Expectation
    result: LocalRunResult
    judgement: Judgement
    stored: KeptReceipt
    error: TpuLabError | None

    @property
    def verified(self) -> bool:
        return self.error is None

    def raise_for_failure(self) -> None:
        if self.error is not None:
            raise self.error


def verify_local(
    expectation: Expectation, *, timeout: float = 300, store: ReceiptStore | None = None
) -> LocalVerification:
    """Run the payload for `expectation` here, judge its receipt and keep it.

    The store is probed first (ReceiptStoreError before anything runs); LocalRunError
    when the payload gives no receipt. A receipt that does not verify is returned, its
    error in `.error`, so the caller can report it before raising.
    """
    store = store or ReceiptStore()
    store.check_writable()
    result = run_local_payload(
        devices=expectation.local_devices,
        platform=expectation.platform,
        nonce=expectation.nonce,
        emulated=expectation.emulated,
        timeout=timeout,
    )
    judgement = judge(result.raw, expectation)
    provenance = Provenance(
        source=Source.VERIFY,
        accelerator_type=expectation.accelerator_type,
        emulated=expectation.emulated,
        payload_exit_status=result.exit_status,
        duration_seconds=round(result.duration, 3),
    )
    stored = store.keep(result.raw, expectation, judgement, provenance)
    error = failure_of(
        judgement,
        expectation,
        payload_exit=result.exit_status,
        output=result.stderr_tail.splitlines(),
        where="local",
    )
    if error is not None and judgement.receipt is None:
        error.hint = f"{error.hint or ''} The bytes are kept as {stored.id}.".strip()
    return LocalVerification(expectation, result, judgement, stored, error)
