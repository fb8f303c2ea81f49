"""`tpulab receipts list|show` never vouch for bytes that changed, and one bad file in the
store spoils only its own entry (issue 10 #5). Real CLI, real receipts, real files."""

from __future__ import annotations

import json

import pytest
from helpers import invoke
from receipt_runs import real_run

from tpulab import paths
from tpulab.evidence.judge import judge
from tpulab.evidence.receipt import expectation_for
from tpulab.evidence.store import KeptReceipt, Provenance, ReceiptStore, Source
from tpulab.exits import EXIT_LOCAL_STATE, EXIT_OK, EXIT_VERIFY


def keep_real_receipt() -> KeptReceipt:
    """A genuine emulated v5litepod-4 receipt, kept in the user's store as `run` would."""
    run = real_run(4, emulated=True)
    expectation = expectation_for("v5litepod-4", emulated=True, nonce=run.nonce)
    provenance = Provenance(
        source=Source.RUN, run_id="run-1", accelerator_type="v5litepod-4", emulated=True
    )
    return ReceiptStore().keep(run.raw, expectation, judge(run.raw, expectation), provenance)


def test_an_intact_verified_receipt_shows_and_lists_as_verified() -> None:
    kept = keep_real_receipt()
    status, out, err = invoke("receipts", "show", kept.id)
    assert status == EXIT_OK, err
    assert "VERIFIED" in out
    assert "TAMPERED" not in out
    status, out, _ = invoke("receipts", "list")
    assert status == EXIT_OK
    row = next(line for line in out.splitlines() if line.startswith(kept.id))
    assert "verified" in row


def test_a_receipt_edited_after_keeping_is_reported_as_tampered() -> None:
    kept = keep_real_receipt()
    document = json.loads(kept.path.read_bytes())
    document["pmap"]["per_device_sums"][0] = 141
    kept.path.write_bytes(json.dumps(document).encode())

    status, out, err = invoke("receipts", "show", kept.id)
    assert status == EXIT_VERIFY
    assert "TAMPERED" in out
    assert "VERIFIED" not in out
    assert "altered after it was kept" in err
    assert "receipt.file_sha256" in err
    assert "pmap.per_device_sums[0]" in err

    status, out, _ = invoke("receipts", "show", kept.id, "--json")
    assert status == EXIT_VERIFY
    shown = json.loads(out)
    assert shown["ok"] is False
    assert shown["receipt_entry"]["integrity"] == "tampered"
    assert shown["kept_judgement"]["verdict"] == "verified"
    assert shown["judgement"]["verdict"] == "rejected"
    assert shown["error"]["exit_status"] == EXIT_VERIFY
    assert shown["error"]["failures"][0]["requirement"] == "receipt.file_sha256"

    status, out, _ = invoke("receipts", "list")
    assert status == EXIT_OK
    row = next(line for line in out.splitlines() if line.startswith(kept.id))
    assert "TAMPERED" in row
    assert "verified" not in row
    status, out, _ = invoke("receipts", "list", "--json")
    (entry,) = json.loads(out)["receipts"]
    assert entry["integrity"] == "tampered"


def test_a_truncated_receipt_is_unreadable_and_fails_show() -> None:
    kept = keep_real_receipt()
    kept.path.write_bytes(kept.path.read_bytes()[:200])
    status, out, err = invoke("receipts", "show", kept.id)
    assert status == EXIT_VERIFY
    assert "UNREADABLE" in out
    assert "truncated" in out
    assert "altered after it was kept" in err
    status, out, _ = invoke("receipts", "show", kept.id, "--json")
    assert status == EXIT_VERIFY
    shown = json.loads(out)
    assert (shown["ok"], shown["judgement"]["verdict"]) == (False, "unreadable")
    assert shown["receipt"] is None


def test_a_receipt_kept_unreadable_does_not_show_as_a_success() -> None:
    run = real_run(4, emulated=True)
    expectation = expectation_for("v5litepod-4", emulated=True, nonce=run.nonce)
    cut = run.raw[:200]
    provenance = Provenance(source=Source.VERIFY, emulated=True)
    kept = ReceiptStore().keep(cut, expectation, judge(cut, expectation), provenance)
    status, out, _ = invoke("receipts", "show", kept.id)
    assert status == EXIT_VERIFY
    assert "UNREADABLE" in out
    assert "TAMPERED" not in out  # kept as it came: unreadable, not altered


def test_a_truncated_sidecar_spoils_only_its_own_entry() -> None:
    good = keep_real_receipt()
    bad = keep_real_receipt()
    text = bad.record_path.read_text()
    bad.record_path.write_text(text[:40])

    status, out, err = invoke("receipts", "list")
    assert status == EXIT_OK, err
    rows = {line.split()[0]: line for line in out.splitlines() if line[:1].isdigit()}
    assert "verified" in rows[good.id]
    assert "DAMAGED" in rows[bad.id]
    assert bad.record_path.name in out  # the damage is named
    status, out, _ = invoke("receipts", "list", "--json")
    assert status == EXIT_OK
    states = {e["id"]: e["integrity"] for e in json.loads(out)["receipts"]}
    assert states == {good.id: "intact", bad.id: "damaged"}

    status, out, err = invoke("receipts", "show", good.id)
    assert status == EXIT_OK, err
    assert "VERIFIED" in out
    status, _, err = invoke("receipts", "show", bad.id)
    assert status == EXIT_LOCAL_STATE
    assert "cannot be re-checked" in err


@pytest.mark.parametrize("as_json", [False, True])
def test_an_unreadable_receipts_directory_is_an_error_not_an_empty_list(as_json: bool) -> None:
    where = paths.receipts_dir()
    where.parent.mkdir(parents=True, exist_ok=True)
    where.write_text("a file where the receipts directory should be")
    status, out, err = invoke("receipts", "list", *(["--json"] if as_json else []))
    assert status == EXIT_LOCAL_STATE
    assert "No receipts kept yet" not in out
    if as_json:
        document = json.loads(out)
        assert document["ok"] is False
        assert document["error"]["type"] == "ReceiptStoreError"
        assert "Cannot read the receipts directory" in document["error"]["message"]
    else:
        assert "Cannot read the receipts directory" in err


def test_verify_local_refuses_an_unwritable_store_before_running_the_payload() -> None:
    where = paths.receipts_dir()
    where.parent.mkdir(parents=True, exist_ok=True)
    where.write_text("a file where the receipts directory should be")
    # A payload that started would be stopped by this timeout (exit 5, "ran past"); the
    # store's probe must answer first.
    status, _out, err = invoke("verify", "--local", "--devices", "1", "--timeout", "0.001")
    assert status == EXIT_LOCAL_STATE, err
    assert "Cannot keep receipts" in err
    assert "ran past" not in err
