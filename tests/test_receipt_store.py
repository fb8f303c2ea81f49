"""The local receipt store: byte-exact keeping, ordering, prefix lookup, bad records."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from receipt_runs import real_run

from tpulab import paths
from tpulab.errors import ConfigError, JournalError, VerificationError
from tpulab.evidence.receipt import Expectation, expectation_for
from tpulab.evidence.store import ReceiptStore, check_and_keep

START = datetime(2026, 11, 30, 21, 0, 0, tzinfo=timezone.utc)


class SteppingClock:
    """A clock that advances by `step` on every reading, so ordering is deterministic."""

    def __init__(self, step: timedelta) -> None:
        self.now = START
        self.step = step

    def __call__(self) -> datetime:
        reading = self.now
        self.now += self.step
        return reading


def test_default_root_is_under_tpulab_home(tpulab_home: Path) -> None:
    assert ReceiptStore().root == paths.receipts_dir()
    assert ReceiptStore().root.is_relative_to(tpulab_home)
    assert ReceiptStore().list() == []


def test_save_keeps_bytes_exactly_with_a_sidecar(tmp_path: Path) -> None:
    store = ReceiptStore(tmp_path / "r", clock=SteppingClock(timedelta(seconds=1)))
    raw = b'{"exact": "bytes", "spacing":  kept}\n'
    kept = store.save(
        raw, verdict="rejected", meta={"run_id": "run-1", "accelerator": "v6e-4", "emulated": True}
    )
    assert kept.path.read_bytes() == raw
    assert kept.id == f"20261130T210000Z-{hashlib.sha256(raw).hexdigest()[:8]}"
    sidecar = json.loads(kept.meta_path.read_text())
    assert sidecar["verdict"] == "rejected"
    assert sidecar["sha256_of_file"] == hashlib.sha256(raw).hexdigest()
    assert (kept.run_id, kept.accelerator, kept.emulated) == ("run-1", "v6e-4", True)
    # Atomic writes leave no temporary files behind.
    assert sorted(p.name for p in kept.path.parent.iterdir()) == sorted(
        [kept.path.name, kept.meta_path.name]
    )


def test_list_is_newest_first_and_get_matches_prefixes(tmp_path: Path) -> None:
    store = ReceiptStore(tmp_path, clock=SteppingClock(timedelta(days=1)))
    first = store.save(b"one", verdict="verified", meta={})
    second = store.save(b"two", verdict="verified", meta={})
    third = store.save(b"three", verdict="rejected", meta={})
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
    a = store.save(b"same", verdict="verified", meta={})
    b = store.save(b"same", verdict="verified", meta={})
    assert a.id != b.id
    assert b.id == f"{a.id}-2"
    assert store.get(a.id) == a  # an exact id wins over being a prefix of another


def test_unknown_verdict_is_a_programming_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="verdict"):
        ReceiptStore(tmp_path).save(b"x", verdict="probably", meta={})


def test_corrupt_sidecar_is_named(tmp_path: Path) -> None:
    store = ReceiptStore(tmp_path)
    kept = store.save(b"x", verdict="verified", meta={})
    kept.meta_path.write_text("{not json")
    with pytest.raises(JournalError, match=kept.meta_path.name):
        store.list()


def test_unwritable_store_is_a_local_state_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(JournalError, match="Cannot keep the receipt"):
        ReceiptStore(blocker / "receipts").save(b"x", verdict="verified", meta={})


def test_missing_receipt_body_is_named(tmp_path: Path) -> None:
    store = ReceiptStore(tmp_path)
    kept = store.save(b"x", verdict="verified", meta={})
    kept.path.unlink()
    with pytest.raises(JournalError, match="Cannot read the kept receipt"):
        store.get(kept.id).read_bytes()


def test_check_and_keep_keeps_every_verdict(tmp_path: Path) -> None:
    run = real_run(4, emulated=True)
    store = ReceiptStore(tmp_path, clock=SteppingClock(timedelta(seconds=1)))
    good = check_and_keep(run.raw, good_expectation(run.nonce), store=store, run_id="run-a")
    assert good.verified
    assert good.stored.verdict == "verified"
    assert good.stored.run_id == "run-a"
    good.raise_for_failure()

    stale = check_and_keep(run.raw, good_expectation("another-run"), store=store)
    assert stale.stored.verdict == "rejected"
    assert stale.error is not None
    assert [f.requirement for f in stale.error.failures] == ["nonce"]
    with pytest.raises(VerificationError):
        stale.raise_for_failure()

    cut = check_and_keep(run.raw[:100], good_expectation(run.nonce), store=store)
    assert cut.stored.verdict == "unreadable"
    assert cut.receipt is None
    assert cut.error is not None
    assert cut.stored.id in (cut.error.hint or "")
    assert cut.stored.read_bytes() == run.raw[:100]

    assert [r.verdict for r in store.list()] == ["unreadable", "rejected", "verified"]
    # The stored expectation lets a kept receipt be re-checked later.
    kept = store.get(good.stored.id)
    assert Expectation.from_dict(kept.meta["expectation"]).nonce == run.nonce


def good_expectation(nonce: str) -> Expectation:
    return expectation_for("v5litepod-4", emulated=True, nonce=nonce)


def test_expectation_is_rebuilt_from_run_metadata(tmp_path: Path) -> None:
    # Receipts kept by the lifecycle carry accelerator, mode and nonce, not the record.
    store = ReceiptStore(tmp_path)
    kept = store.save(
        b"{}", verdict="verified", meta={"accelerator": "v6e-8", "emulated": False, "nonce": "n1"}
    )
    expectation = kept.expectation()
    assert expectation is not None
    assert (expectation.platform, expectation.local_devices, expectation.nonce) == ("tpu", 8, "n1")
    assert store.save(b"{}", verdict="verified", meta={}).expectation() is None
