"""The run's side of the receipt store: refused before create when it cannot keep a
receipt, and a kept receipt that says where it came from. Real emulator, real SSH."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpulab.errors import ReceiptStoreError
from tpulab.evidence.judge import Verdict
from tpulab.evidence.store import Integrity, KeptReceipt, ReceiptStore, Source, recheck

if TYPE_CHECKING:
    from run_rig import Rig

pytest_plugins = ["emulator_fixtures", "ssh_fixtures", "run_rig"]


def test_an_unwritable_receipt_store_stops_the_run_before_create(
    embedded_rig: Rig, tmp_path: Path
) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("receipts cannot live under a file")
    store = ReceiptStore(blocker / "receipts")
    life, _, error = embedded_rig.run(embedded_rig.spec(), store=store)
    assert isinstance(error, ReceiptStoreError)
    assert "Cannot keep receipts" in error.message
    assert embedded_rig.emulator.calls["create_node"] == 0
    assert not life.outcome.create_sent
    assert life.outcome.teardown_status == "not-created"
    assert embedded_rig.leftovers() == []


class _FillsUp(ReceiptStore):
    """A real store whose directory stops being one once the run is past the store's
    probe, as a disk that fills up meanwhile would refuse it: the real `keep` then fails
    on the real filesystem."""

    def keep(self, *args: Any, **kwargs: Any) -> KeptReceipt:
        shutil.rmtree(self.root)
        self.root.write_text("no room for receipts any more")
        return super().keep(*args, **kwargs)


def test_a_receipt_that_cannot_be_kept_is_judged_all_the_same_and_nothing_is_left(
    embedded_rig: Rig,
) -> None:
    """The run fails (ReceiptStoreError, exit 8), its node deleted; the verdict is the
    judgement's, not "NOT COLLECTED" as the summary said when keeping came first."""
    store = _FillsUp(embedded_rig.tmp / "receipts")
    life, _, error = embedded_rig.run(embedded_rig.spec(), store=store)
    assert isinstance(error, ReceiptStoreError), error
    assert "Cannot keep receipts" in error.message
    outcome = life.outcome
    assert outcome.verdict is Verdict.VERIFIED
    assert outcome.receipt is None
    assert outcome.teardown_status == "confirmed"
    assert embedded_rig.leftovers() == []


def test_a_run_keeps_its_receipt_with_its_provenance(embedded_rig: Rig) -> None:
    spec = embedded_rig.spec()
    store = ReceiptStore(embedded_rig.tmp / "receipts")
    life, _, error = embedded_rig.run(spec, store=store)
    assert error is None, error
    outcome = life.outcome
    assert outcome.verdict is Verdict.VERIFIED
    assert outcome.per_device_sums == [140, 1100, 3084, 6092]
    assert (outcome.observed_total, outcome.expected_total) == (10416, 10416)
    assert outcome.receipt is not None
    (kept,) = store.list()
    assert kept.id == outcome.receipt.id
    assert kept.integrity is Integrity.INTACT
    assert kept.record is not None
    origin = kept.record.provenance
    assert origin.source is Source.RUN
    assert (origin.run_id, origin.node_name, origin.zone) == (
        spec.run_id,
        spec.node_name,
        spec.zone.value,
    )
    assert (origin.accelerator_type, origin.emulated, origin.payload_exit_status) == (
        "v5litepod-4",
        spec.emulated,
        0,
    )
    assert kept.record.expectation.nonce == life.nonce
    assert recheck(kept).ok
