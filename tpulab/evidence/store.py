"""Receipts kept on this machine: the evidence of every run, verified or not.

Each receipt is stored byte for byte as it came back (so its sha256 can be rechecked
later) beside a small sidecar with the verdict and the run it belongs to. Ids sort by
time: `20261130T210512Z-1a2b3c4d` (UTC timestamp + the first hex of the bytes' sha256).
Writes are atomic (temporary file + rename) so a crash never leaves half a receipt.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tpulab import paths
from tpulab.errors import ConfigError, JournalError, VerificationError
from tpulab.evidence.receipt import (
    Expectation,
    Receipt,
    RequirementResult,
    evaluate_receipt,
    expectation_for,
    parse_receipt,
    verify_receipt,
)

__all__ = ["VERDICTS", "KeptCheck", "ReceiptStore", "StoredReceipt", "check_and_keep"]

VERDICTS = ("verified", "rejected", "unreadable")
_META_SUFFIX = ".meta.json"
_ID_TIME = "%Y%m%dT%H%M%SZ"


@dataclass(frozen=True)
class StoredReceipt:
    id: str
    path: Path
    meta_path: Path
    verdict: str
    created: datetime
    run_id: str | None
    accelerator: str | None
    emulated: bool
    meta: dict[str, Any] = field(default_factory=dict)

    def read_bytes(self) -> bytes:
        try:
            return self.path.read_bytes()
        except OSError as error:
            raise JournalError(
                f"Cannot read the kept receipt {self.path}: {error.strerror or error}.",
                hint="The receipts directory may have been changed by hand.",
            ) from None

    def expectation(self) -> Expectation | None:
        """What the receipt was checked against: the stored record, or one rebuilt from
        the run's accelerator, mode and nonce; None when neither was kept."""
        stored = self.meta.get("expectation")
        if isinstance(stored, dict):
            return Expectation.from_dict(stored)
        nonce = self.meta.get("nonce")
        if self.accelerator and isinstance(nonce, str):
            try:
                return expectation_for(self.accelerator, emulated=self.emulated, nonce=nonce)
            except ConfigError:
                return None
        return None

    def summary(self) -> dict[str, Any]:
        """JSON-ready description, for `tpulab receipts list --json`."""
        return {
            "id": self.id,
            "verdict": self.verdict,
            "created": self.created.isoformat(),
            "run_id": self.run_id,
            "accelerator": self.accelerator,
            "emulated": self.emulated,
            "path": str(self.path),
            "meta": self.meta,
        }


def _write_atomically(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class ReceiptStore:
    """A directory of receipts; `root` defaults to paths.receipts_dir()."""

    def __init__(
        self, root: Path | None = None, *, clock: Callable[[], datetime] | None = None
    ) -> None:
        self.root = root if root is not None else paths.receipts_dir()
        self._clock = clock or (lambda: datetime.now(timezone.utc))

    def _new_id(self, raw: bytes, created: datetime) -> str:
        base = f"{created.strftime(_ID_TIME)}-{hashlib.sha256(raw).hexdigest()[:8]}"
        candidate, n = base, 1
        while (self.root / f"{candidate}.json").exists():
            n += 1
            candidate = f"{base}-{n}"
        return candidate

    def save(self, raw: bytes, *, verdict: str, meta: Mapping[str, Any]) -> StoredReceipt:
        """Keep `raw` exactly and a sidecar with `verdict` and `meta` (run_id, accelerator,
        emulated and anything else JSON-serialisable)."""
        if verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}, not {verdict!r}")
        created = self._clock().astimezone(timezone.utc)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            receipt_id = self._new_id(raw, created)
            sidecar = {
                **meta,
                "id": receipt_id,
                "verdict": verdict,
                "created": created.isoformat(),
                "sha256_of_file": hashlib.sha256(raw).hexdigest(),
                "bytes": len(raw),
            }
            body = json.dumps(sidecar, sort_keys=True, indent=2, default=str).encode()
            _write_atomically(self.root / f"{receipt_id}.json", raw)
            _write_atomically(self.root / f"{receipt_id}{_META_SUFFIX}", body)
        except OSError as error:
            raise JournalError(
                f"Cannot keep the receipt under {self.root}: {error.strerror or error}.",
                hint="Check that the directory is writable, or set TPULAB_HOME elsewhere.",
            ) from None
        return self._load(self.root / f"{receipt_id}{_META_SUFFIX}")

    def _load(self, meta_path: Path) -> StoredReceipt:
        try:
            data = json.loads(meta_path.read_text(encoding="utf-8"))
            receipt_id = str(data["id"])
            created = datetime.fromisoformat(str(data["created"]))
            return StoredReceipt(
                id=receipt_id,
                path=meta_path.with_name(f"{receipt_id}.json"),
                meta_path=meta_path,
                verdict=str(data["verdict"]),
                created=created,
                run_id=data.get("run_id"),
                accelerator=data.get("accelerator"),
                emulated=bool(data.get("emulated", False)),
                meta=data,
            )
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise JournalError(
                f"The receipt record {meta_path} is unreadable ({error}).",
                hint="Move it out of the receipts directory; other receipts are unaffected.",
            ) from None

    def list(self) -> list[StoredReceipt]:
        """Every kept receipt, newest first."""
        if not self.root.is_dir():
            return []
        found = [self._load(p) for p in self.root.glob(f"*{_META_SUFFIX}")]
        return sorted(found, key=lambda r: (r.created, r.id), reverse=True)

    def get(self, id_or_prefix: str) -> StoredReceipt:
        """The receipt whose id is `id_or_prefix`, or the only one it is a prefix of."""
        wanted = id_or_prefix.strip()
        if not wanted:
            raise ConfigError("No receipt id given.", hint="See `tpulab receipts list`.")
        kept = self.list()
        exact = [r for r in kept if r.id == wanted]
        matches = exact or [r for r in kept if r.id.startswith(wanted)]
        if len(matches) == 1:
            return matches[0]
        if not matches:
            raise ConfigError(
                f"No kept receipt has an id starting with {wanted!r}.",
                hint="See `tpulab receipts list` for the ids on this machine.",
            )
        shown = ", ".join(r.id for r in matches[:5])
        raise ConfigError(
            f"{len(matches)} receipts match {wanted!r}: {shown}.",
            hint="Give more of the id to pick one.",
        )


@dataclass(frozen=True)
class KeptCheck:
    """A receipt checked and kept: `error` is None exactly when it verified."""

    stored: StoredReceipt
    receipt: Receipt | None
    results: list[RequirementResult]
    error: VerificationError | None

    @property
    def verified(self) -> bool:
        return self.error is None

    def raise_for_failure(self) -> None:
        if self.error is not None:
            raise self.error


def check_and_keep(
    raw: bytes,
    expectation: Expectation,
    *,
    store: ReceiptStore | None = None,
    run_id: str | None = None,
    source: str = "run",
    extra_meta: Mapping[str, Any] | None = None,
) -> KeptCheck:
    """Parse and check `raw`, then keep it whatever the verdict (evidence of a failed run
    matters as much as of a good one). Never raises VerificationError: it is returned in
    `.error` so the caller can keep going (e.g. to teardown) and raise it afterwards."""
    store = store or ReceiptStore()
    meta: dict[str, Any] = {
        **(extra_meta or {}),
        "source": source,
        "run_id": run_id,
        "accelerator": expectation.accelerator,
        "emulated": expectation.emulated,
        "expectation": expectation.to_dict(),
    }
    try:
        receipt = parse_receipt(raw)
    except VerificationError as unreadable:
        stored = store.save(raw, verdict="unreadable", meta=meta)
        unreadable.hint = f"{unreadable.hint or ''} The bytes are kept as {stored.id}.".strip()
        return KeptCheck(stored, None, [], unreadable)
    results = evaluate_receipt(receipt, expectation)
    error: VerificationError | None = None
    if not all(r.passed for r in results):
        try:
            verify_receipt(receipt, expectation)
        except VerificationError as rejected:
            error = rejected
    stored = store.save(raw, verdict="rejected" if error else "verified", meta=meta)
    return KeptCheck(stored, receipt, results, error)
