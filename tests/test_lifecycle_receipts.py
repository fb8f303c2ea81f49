"""The run's side of the receipt store: refused before create when it cannot keep a
receipt, and a kept receipt that says where it came from. Real emulator, real SSH."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tpulab.errors import ReceiptStoreError
from tpulab.evidence.judge import Verdict
from tpulab.evidence.store import Integrity, ReceiptStore, Source, recheck

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
