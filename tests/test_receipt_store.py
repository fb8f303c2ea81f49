"""The local receipt store: byte-exact keeping, one versioned record, integrity on read,
damage that stays local to its entry, and its own error class."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from receipt_runs import real_run, tamper

from tpulab import paths
from tpulab.errors import ConfigError, JournalError, ReceiptStoreError
from tpulab.evidence.judge import Verdict, judge
from tpulab.evidence.receipt import Expectation, expectation_for
from tpulab.evidence.store import (
    Integrity,
    KeptReceipt,
    Provenance,
    ReceiptRecord,
    ReceiptStore,
    Source,
    recheck,
)

START = datetime(2026, 11, 30, 21, 0, 0, tzinfo=timezone.utc)
LOCAL = Provenance(source=Source.VERIFY, accelerator_type="v5litepod-4", emulated=True)


class SteppingClock:
    """A clock that advances by `step` on every reading, so ordering is deterministic."""

    def __init__(self, step: timedelta) -> None:
        self.now = START
        self.step = step

    def __call__(self) -> datetime:
        reading = self.now
        self.now += self.step
        return reading


def emulated_v5e4(nonce: str) -> Expectation:
    return expectation_for("v5litepod-4", emulated=True, nonce=nonce)


def keep(store: ReceiptStore, raw: bytes, expectation: Expectation | None = None) -> KeptReceipt:
    """Judge and keep `raw` the way verify and run do."""
    expectation = expectation or emulated_v5e4("n" * 16)
    return store.keep(raw, expectation, judge(raw, expectation), LOCAL)


@pytest.fixture(scope="module")
def raw4() -> bytes:
    run = real_run(4, emulated=True)
    assert run.exit_status == 0, run.stderr_tail
    return run.raw


@pytest.fixture(scope="module")
def nonce4() -> str:
    return real_run(4, emulated=True).nonce


def test_default_root_is_under_tpulab_home(tpulab_home: Path) -> None:
    assert ReceiptStore().root == paths.receipts_dir()
    assert ReceiptStore().root.is_relative_to(tpulab_home)
    assert ReceiptStore().list() == []


def test_keep_stores_bytes_exactly_with_one_versioned_record(
    tmp_path: Path, raw4: bytes, nonce4: str
) -> None:
    store = ReceiptStore(tmp_path / "r", clock=SteppingClock(timedelta(seconds=1)))
    expectation = emulated_v5e4(nonce4)
    provenance = Provenance(
        source=Source.RUN,
        run_id="run-1",
        node_name="tpulab-run-1",
        project="p",
        zone="us-central1-a",
        accelerator_type="v5litepod-4",
        emulated=True,
        payload_exit_status=0,
    )
    kept = store.keep(raw4, expectation, judge(raw4, expectation), provenance)
    assert kept.path.read_bytes() == raw4
    assert kept.id == f"20261130T210000Z-{hashlib.sha256(raw4).hexdigest()[:8]}"
    sidecar = json.loads(kept.record_path.read_text())
    assert sidecar["record_version"] == 1
    assert sidecar["sha256"] == hashlib.sha256(raw4).hexdigest()
    assert sidecar["judgement"]["verdict"] == "verified"
    assert sidecar["judgement"]["per_device_sums"] == [140, 1100, 3084, 6092]
    assert sidecar["expectation"]["nonce"] == nonce4
    assert sidecar["provenance"]["accelerator_type"] == "v5litepod-4"
    assert sidecar["provenance"]["zone"] == "us-central1-a"
    # What is read back is what was written, field for field.
    assert ReceiptRecord.model_validate_json(kept.record_path.read_bytes()) == kept.record
    assert store.get(kept.id).integrity is Integrity.INTACT
    # Atomic writes leave no temporary files behind.
    assert sorted(p.name for p in kept.path.parent.iterdir()) == sorted(
        [kept.path.name, kept.record_path.name]
    )


def test_list_is_newest_first_and_get_matches_prefixes(tmp_path: Path) -> None:
    store = ReceiptStore(tmp_path, clock=SteppingClock(timedelta(days=1)))
    first = keep(store, b"one")
    second = keep(store, b"two")
    third = keep(store, b"three")
    assert [r.id for r in store.list()] == [third.id, second.id, first.id]
    assert store.get(second.id) == second
    assert store.get(second.id[:12]).id == second.id  # unique by date
    with pytest.raises(ConfigError, match="3 receipts match") as caught:
        store.get("2026")
    assert "more of the id" in (caught.value.hint or "")
    with pytest.raises(ConfigError, match="No kept receipt"):
        store.get("1999")
    with pytest.raises(ConfigError, match="No receipt id"):
        store.get("  ")


def test_same_bytes_in_the_same_second_get_distinct_ids(tmp_path: Path) -> None:
    store = ReceiptStore(tmp_path, clock=lambda: START)
    a = keep(store, b"same")
    b = keep(store, b"same")
    assert a.id != b.id
    assert b.id == f"{a.id}-2"
    assert store.get(a.id) == a  # an exact id wins over being a prefix of another


def test_every_verdict_is_kept_and_rechecked(tmp_path: Path, raw4: bytes, nonce4: str) -> None:
    store = ReceiptStore(tmp_path, clock=SteppingClock(timedelta(seconds=1)))
    good = keep(store, raw4, emulated_v5e4(nonce4))
    stale = keep(store, raw4, emulated_v5e4("another-run-nonce"))
    cut = keep(store, raw4[:100], emulated_v5e4(nonce4))
    verdicts = {e.id: e.record.judgement.verdict for e in store.list() if e.record}
    assert verdicts == {
        good.id: Verdict.VERIFIED,
        stale.id: Verdict.REJECTED,
        cut.id: Verdict.UNREADABLE,
    }
    assert recheck(store.get(good.id)).ok
    stale_now = recheck(store.get(stale.id))
    assert stale_now.error is not None
    assert [f.requirement for f in stale_now.error.failures] == ["nonce"]
    cut_now = recheck(store.get(cut.id))
    assert cut_now.judgement.verdict is Verdict.UNREADABLE
    assert cut_now.error is not None
    assert store.get(cut.id).read_bytes() == raw4[:100]


def test_bytes_changed_after_keeping_are_tampered_in_list_and_recheck(
    tmp_path: Path, raw4: bytes, nonce4: str
) -> None:
    store = ReceiptStore(tmp_path)
    kept = keep(store, raw4, emulated_v5e4(nonce4))
    document = json.loads(raw4)
    document["pmap"]["per_device_sums"][0] = 141
    kept.path.write_bytes(json.dumps(document).encode())  # internal hash now stale too
    listed = store.get(kept.id)
    assert listed.integrity is Integrity.TAMPERED
    assert listed.problem is not None
    assert "changed after they were judged" in listed.problem
    now = recheck(listed)
    assert not now.ok
    assert now.error is not None
    assert "altered after it was kept" in now.error.message
    names = [f.requirement for f in now.error.failures]
    assert names[0] == "receipt.file_sha256"
    assert "pmap.per_device_sums[0]" in names

    # A forger who recomputes the receipt's own sha256 still changes the file's.
    forged = tamper(raw4, pmap__per_device_sums=[140.0, 1100.0, 3084.0, 6092.0], ok=True)
    kept.path.write_bytes(forged)
    assert store.get(kept.id).integrity is Integrity.TAMPERED


def test_a_damaged_record_damages_only_its_own_entry(tmp_path: Path) -> None:
    store = ReceiptStore(tmp_path, clock=SteppingClock(timedelta(seconds=1)))
    good = keep(store, b"one")
    bad = keep(store, b"two")
    text = bad.record_path.read_text()
    bad.record_path.write_text(text[: len(text) // 2])  # a truncated sidecar
    listed = {e.id: e for e in store.list()}
    assert listed[good.id].integrity is Integrity.INTACT
    assert listed[bad.id].integrity is Integrity.DAMAGED
    assert listed[bad.id].record is None
    assert bad.record_path.name in (listed[bad.id].problem or "")
    assert store.get(good.id).record == good.record
    with pytest.raises(ReceiptStoreError, match="cannot be re-checked") as caught:
        recheck(store.get(bad.id))
    assert "other receipts are unaffected" in (caught.value.hint or "")


def test_a_sidecar_of_the_old_format_is_damaged_not_fatal(tmp_path: Path) -> None:
    store = ReceiptStore(tmp_path)
    good = keep(store, b"one")
    legacy = {"id": "20261101T000000Z-00000000", "verdict": "verified", "created": "2026-11-01"}
    (tmp_path / "20261101T000000Z-00000000.meta.json").write_text(json.dumps(legacy))
    (tmp_path / "20261101T000000Z-00000000.json").write_bytes(b"{}")
    states = [(e.id, e.integrity) for e in store.list()]
    assert states == [(good.id, Integrity.INTACT), (legacy["id"], Integrity.DAMAGED)]


def test_a_missing_receipt_body_is_listed_and_named(tmp_path: Path) -> None:
    store = ReceiptStore(tmp_path)
    kept = keep(store, b"x")
    kept.path.unlink()
    assert store.get(kept.id).integrity is Integrity.MISSING
    with pytest.raises(ReceiptStoreError, match="Cannot read the kept receipt"):
        recheck(store.get(kept.id))


def test_an_unreadable_receipts_directory_is_an_error_not_empty(tmp_path: Path) -> None:
    not_a_directory = tmp_path / "receipts"
    not_a_directory.write_text("a file where the receipts directory should be")
    with pytest.raises(ReceiptStoreError, match="Cannot read the receipts directory") as caught:
        ReceiptStore(not_a_directory).list()
    assert "readable directory" in (caught.value.hint or "")
    assert ReceiptStore(tmp_path / "never-written").list() == []


def test_an_unwritable_store_is_the_stores_own_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    store = ReceiptStore(blocker / "receipts")
    with pytest.raises(ReceiptStoreError, match="Cannot keep receipts") as caught:
        store.check_writable()
    assert not isinstance(caught.value, JournalError)
    with pytest.raises(ReceiptStoreError, match="Cannot keep receipts"):
        keep(store, b"x")


def test_the_write_probe_leaves_nothing_behind(tmp_path: Path) -> None:
    store = ReceiptStore(tmp_path / "fresh")
    store.check_writable()
    assert list(store.root.iterdir()) == []
    assert store.list() == []
