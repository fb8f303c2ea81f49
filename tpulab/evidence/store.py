"""Receipts kept on this machine: the evidence of every run, verified or not.

Each receipt is kept byte for byte as it came back, beside ONE sidecar format, a
`ReceiptRecord` (versioned): the judgement, the expectation it was judged against, where
it came from (`Provenance`) and the sha256 of the bytes. Ids sort by time:
`20261130T210512Z-1a2b3c4d` (UTC timestamp + the first hex of the bytes' sha256). Writes
are atomic (temporary file + rename) so a crash never leaves half a receipt.

Reading never trusts the sidecar's verdict alone: `list` compares every receipt's bytes
with the recorded sha256 (`Integrity`), and `recheck` judges the bytes again. A sidecar
that cannot be read damages only its own entry. The store's failures are
ReceiptStoreError (exit 8), never another layer's error.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from enum import Enum
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from tpulab import paths
from tpulab.errors import ConfigError, ReceiptStoreError, RequirementFailure, VerificationError
from tpulab.evidence.judge import Judgement, judge
from tpulab.evidence.receipt import MAX_RECEIPT_BYTES, Expectation
from tpulab.models import DEFER_BUILD

__all__ = [
    "Integrity",
    "KeptReceipt",
    "Provenance",
    "ReceiptRecord",
    "ReceiptStore",
    "Recheck",
    "Source",
    "recheck",
]

_RECORD_SUFFIX = ".meta.json"
_ID_TIME = "%Y%m%dT%H%M%SZ"


class Source(str, Enum):
    """Which command kept the receipt."""

    RUN = "run"
    VERIFY = "verify"

    def __str__(self) -> str:
        return self.value


class Provenance(BaseModel):
    """Where the receipt came from: the run and node, or the local verify."""

    model_config = ConfigDict(defer_build=DEFER_BUILD, extra="forbid", frozen=True)

    source: Source
    run_id: str | None = None
    node_name: str | None = None
    project: str | None = None
    zone: str | None = None
    accelerator_type: str | None = None
    emulated: bool
    payload_exit_status: int | None = None
    duration_seconds: float | None = None
    # A multi-host slice keeps every worker's receipt: which worker this one is (the
    # run's own receipt is worker 0's, kept with the slice's judgement).
    worker: int | None = None


class ReceiptRecord(BaseModel):
    """The sidecar beside each kept receipt (`<id>.meta.json`)."""

    model_config = ConfigDict(defer_build=DEFER_BUILD, extra="forbid", frozen=True)

    record_version: Literal[1] = 1
    id: str
    kept_at: datetime
    size: int
    sha256: str  # of the receipt's bytes exactly as kept
    expectation: Expectation
    judgement: Judgement
    provenance: Provenance


class Integrity(str, Enum):
    """Whether a kept receipt is still what was judged when it was kept."""

    INTACT = "intact"  # the bytes' sha256 is the recorded one
    TAMPERED = "tampered"  # the bytes changed after they were judged
    MISSING = "missing"  # the receipt file is gone or unreadable
    DAMAGED = "damaged"  # the sidecar is unreadable: nothing to judge against

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class KeptReceipt:
    """One entry of the store; `record` is None exactly when the sidecar is DAMAGED."""

    id: str
    path: Path
    record_path: Path
    integrity: Integrity
    record: ReceiptRecord | None
    problem: str | None = None  # what is wrong, in words, unless INTACT

    @property
    def kept_at(self) -> datetime:
        """When it was kept: from the record, else from the id (which starts with it)."""
        if self.record is not None:
            return self.record.kept_at
        try:
            return datetime.strptime(self.id[:16], _ID_TIME).replace(tzinfo=timezone.utc)
        except ValueError:
            return datetime.min.replace(tzinfo=timezone.utc)

    def read_bytes(self) -> bytes:
        """The receipt's bytes as they are now (ReceiptStoreError if they cannot be read)."""
        try:
            return _read_bounded(self.path)
        except OSError as error:
            raise ReceiptStoreError(
                f"Cannot read the kept receipt {self.path}: {error.strerror or error}.",
                hint="The receipts directory may have been changed by hand.",
            ) from None


def _read_bounded(path: Path) -> bytes:
    # A kept receipt larger than any receipt was replaced: read just enough to say so.
    with path.open("rb") as handle:
        return handle.read(MAX_RECEIPT_BYTES + 1)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


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


def _unwritable(root: Path, error: OSError) -> ReceiptStoreError:
    return ReceiptStoreError(
        f"Cannot keep receipts under {root}: {error.strerror or error}.",
        hint="Free space on its disk or make it writable, or point TPULAB_HOME somewhere writable.",
    )


class ReceiptStore:
    """A directory of receipts; `root` defaults to paths.receipts_dir()."""

    def __init__(
        self, root: Path | None = None, *, clock: Callable[[], datetime] | None = None
    ) -> None:
        self.root = root if root is not None else paths.receipts_dir()
        self._clock = clock or (lambda: datetime.now(timezone.utc))

    # -- writing ------------------------------------------------------------------------

    def check_writable(self) -> None:
        """Prove a receipt could be kept here, before a run creates anything to pay for.

        Creates the directory and a throwaway file in it; ReceiptStoreError if either
        fails (a VM whose receipt cannot be kept would be paid for in vain).
        """
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fd, probe = tempfile.mkstemp(prefix=".write-probe.", dir=self.root)
            os.close(fd)
            os.unlink(probe)
        except OSError as error:
            raise _unwritable(self.root, error) from None

    def _new_id(self, raw: bytes, created: datetime) -> str:
        base = f"{created.strftime(_ID_TIME)}-{_sha256(raw)[:8]}"
        candidate, n = base, 1
        while (self.root / f"{candidate}.json").exists():
            n += 1
            candidate = f"{base}-{n}"
        return candidate

    def keep(
        self, raw: bytes, expectation: Expectation, judgement: Judgement, provenance: Provenance
    ) -> KeptReceipt:
        """Keep `raw` exactly, with its record; whatever the verdict (a failed run's
        evidence matters as much as a good one's)."""
        kept_at = self._clock().astimezone(timezone.utc)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            receipt_id = self._new_id(raw, kept_at)
            record = ReceiptRecord(
                id=receipt_id,
                kept_at=kept_at,
                size=len(raw),
                sha256=_sha256(raw),
                expectation=expectation,
                judgement=judgement,
                provenance=provenance,
            )
            path = self.root / f"{receipt_id}.json"
            record_path = self.root / f"{receipt_id}{_RECORD_SUFFIX}"
            _write_atomically(path, raw)
            _write_atomically(record_path, record.model_dump_json(indent=2).encode())
        except OSError as error:
            raise _unwritable(self.root, error) from None
        # Read back, so the caller holds exactly what `list` and `get` will show.
        return self._entry(record_path)

    # -- reading ------------------------------------------------------------------------

    def _entry(self, record_path: Path) -> KeptReceipt:
        receipt_id = record_path.name[: -len(_RECORD_SUFFIX)]
        path = record_path.with_name(f"{receipt_id}.json")
        try:
            record = ReceiptRecord.model_validate_json(record_path.read_bytes())
        except (OSError, ValidationError, ConfigError) as error:
            why = error.strerror if isinstance(error, OSError) else "not a version 1 record"
            return KeptReceipt(
                receipt_id,
                path,
                record_path,
                Integrity.DAMAGED,
                None,
                f"its record {record_path.name} is unreadable ({why})",
            )
        if record.id != receipt_id:
            problem = f"its record names another receipt ({record.id})"
            return KeptReceipt(receipt_id, path, record_path, Integrity.DAMAGED, None, problem)
        try:
            now = _sha256(_read_bounded(path))
        except OSError as error:
            problem = f"the receipt file is unreadable ({error.strerror or error})"
            return KeptReceipt(receipt_id, path, record_path, Integrity.MISSING, record, problem)
        if now != record.sha256:
            problem = (
                f"its bytes changed after they were judged (sha256 {now[:12]}, "
                f"kept as {record.sha256[:12]})"
            )
            return KeptReceipt(receipt_id, path, record_path, Integrity.TAMPERED, record, problem)
        return KeptReceipt(receipt_id, path, record_path, Integrity.INTACT, record)

    def list(self) -> list[KeptReceipt]:
        """Every kept receipt, newest first, each with its integrity checked.

        A store never written to is empty; one that exists but cannot be listed (not a
        directory, no permission) is a ReceiptStoreError, never an empty list.
        """
        try:
            names = sorted(os.listdir(self.root))
        except FileNotFoundError:
            return []
        except OSError as error:
            raise ReceiptStoreError(
                f"Cannot read the receipts directory {self.root}: {error.strerror or error}.",
                hint="Make it a readable directory, or point TPULAB_HOME elsewhere.",
            ) from None
        found = [self._entry(self.root / n) for n in names if n.endswith(_RECORD_SUFFIX)]
        return sorted(found, key=lambda r: (r.kept_at, r.id), reverse=True)

    def get(self, id_or_prefix: str) -> KeptReceipt:
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
class Recheck:
    """A kept receipt judged again now: `error` is None exactly when it still proves
    its run (intact bytes AND a verified verdict)."""

    entry: KeptReceipt
    record: ReceiptRecord
    raw: bytes
    judgement: Judgement
    error: VerificationError | None

    @property
    def ok(self) -> bool:
        return self.error is None


def recheck(entry: KeptReceipt) -> Recheck:
    """Read and re-judge `entry`, comparing its bytes with the recorded sha256.

    ReceiptStoreError when there is nothing to judge (record damaged, file missing).
    """
    if entry.record is None:
        raise ReceiptStoreError(
            f"Receipt {entry.id} cannot be re-checked: {entry.problem}.",
            hint=f"Move {entry.record_path} out of the receipts directory; "
            "other receipts are unaffected.",
        )
    record = entry.record
    raw = entry.read_bytes()
    judgement = judge(raw, record.expectation)
    described = record.expectation.describe()
    error: VerificationError | None = None
    now = _sha256(raw)
    if now != record.sha256:
        altered = RequirementFailure("receipt.file_sha256", record.sha256, now)
        error = VerificationError(
            f"Receipt {entry.id} was altered after it was kept (it was {record.judgement.verdict}"
            f" then, it is {judgement.verdict} now): it proves nothing.",
            [altered, *judgement.failures],
            hint="The bytes on disk are not the ones that were judged; rerun to get a fresh "
            "receipt.",
        )
    elif not judgement.verified:
        error = VerificationError(
            f"Receipt {entry.id} does not prove {described}: it is {judgement.verdict}.",
            judgement.failures,
            hint="Each line names a requirement, what it needed and what the receipt shows.",
        )
    return Recheck(entry, record, raw, judgement, error)
