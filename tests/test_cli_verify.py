"""`tpulab verify --local` and `tpulab receipts`, through the real CLI and real payload runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import invoke

from tpulab.evidence.judge import Verdict
from tpulab.evidence.store import ReceiptStore, Source
from tpulab.exits import EXIT_CONFIG, EXIT_OK, EXIT_VERIFY


def test_verify_local_accelerator_passes_and_keeps_the_receipt(tpulab_home: Path) -> None:
    status, out, err = invoke("verify", "--local", "--accelerator", "v5litepod-4")
    assert status == EXIT_OK, err
    assert "EMULATED" in out
    assert "closed form S(4) = 10416" in out
    for device, share in enumerate([140, 1100, 3084, 6092]):
        line = next(x for x in out.splitlines() if x.strip().startswith(f"dev {device} "))
        assert f"{share}  ✓" in line
        assert "█" in line or "▏" in line or "▊" in line
    assert "max abs error       0" in out
    assert "FAIL" not in out
    assert "VERIFIED" in out
    kept = ReceiptStore().list()
    assert len(kept) == 1
    record = kept[0].record
    assert record is not None
    assert record.judgement.verdict is Verdict.VERIFIED
    assert record.provenance.source is Source.VERIFY
    assert record.provenance.accelerator_type == "v5litepod-4"
    assert record.provenance.emulated
    assert kept[0].id in out
    assert kept[0].path.is_relative_to(tpulab_home)

    status, out, _ = invoke("receipts", "list")
    assert status == EXIT_OK
    # Its row, column by column ("verified" alone would also match "unverified").
    (row,) = [line.split() for line in out.splitlines() if line.startswith(kept[0].id)]
    assert row == [kept[0].id, "verified", "v5litepod-4", "verify*", "-"], row
    status, out, _ = invoke("receipts", "show", kept[0].id[:20])
    assert status == EXIT_OK
    assert "VERIFIED" in out
    assert "10416" in out
    status, out, _ = invoke("receipts")  # bare group lists too
    assert kept[0].id in out


def test_expect_tpu_on_this_machine_fails_saying_the_backend_is_unavailable() -> None:
    status, out, err = invoke("verify", "--local", "--expect-platform", "tpu", "--devices", "4")
    assert status == EXIT_VERIFY
    assert "TPU backend is unavailable" in err
    assert "VERIFIED" not in out
    assert "REJECTED" in out
    assert "FAIL ok" in out
    kept = ReceiptStore().list()
    assert [r.record.judgement.verdict for r in kept if r.record] == [Verdict.REJECTED]


def test_verify_json_envelope(tpulab_home: Path) -> None:
    status, out, _ = invoke("verify", "--local", "--devices", "1", "--json")
    assert status == EXIT_OK
    document = json.loads(out)
    assert (document["schema_version"], document["command"]) == (1, "verify")
    assert document["ok"] is True
    assert document["verdict"] == "verified"
    assert document["receipt"]["pmap"]["observed_total"] == 140.0
    assert document["expectation"]["local_devices"] == 1
    assert all(item["passed"] for item in document["judgement"]["requirements"])
    assert document["judgement"]["per_device_sums"] == [140.0]
    assert document["error"] is None

    status, out, _ = invoke("receipts", "list", "--json")
    listed = json.loads(out)
    assert listed["command"] == "receipts list"
    assert [r["id"] for r in listed["receipts"]] == [document["receipt_id"]]
    status, out, _ = invoke("receipts", "show", document["receipt_id"], "--json")
    shown = json.loads(out)
    assert status == EXIT_OK
    assert shown["ok"] is True
    assert shown["receipt"] == document["receipt"]
    assert shown["receipt_entry"]["integrity"] == "intact"
    assert all(item["passed"] for item in shown["judgement"]["requirements"])


def test_rejection_json_envelope_names_the_failure() -> None:
    status, out, _ = invoke("verify", "--local", "--expect-platform", "tpu", "--json")
    assert status == EXIT_VERIFY
    document = json.loads(out)
    assert document["ok"] is False
    assert document["verdict"] == "rejected"
    assert "TPU backend is unavailable" in document["error"]["message"]
    assert [f["requirement"] for f in document["error"]["failures"]] == ["ok"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["verify"], "tpulab run"),
        (["verify", "--local", "--accelerator", "v5litepod-3"], "v5litepod-4"),
        (["verify", "--local", "--accelerator", "v4-16"], "single-host types only"),
        (["verify", "--local", "--accelerator", "v6e-4", "--devices", "4"], "both"),
        (["verify", "--local", "--devices", "0"], "out of range"),
        (["verify", "--local", "--expect-platform", "metal"], "Unknown platform"),
        (["verify", "--local", "--accelerator", "v6e-4", "--expect-platform", "gpu"], "TPU"),
        (["verify", "--local", "--timeout", "0"], "positive"),
        (["receipts", "show", "nothing-like-this"], "No kept receipt"),
    ],
)
def test_bad_input_is_refused_before_anything_runs(args: list[str], message: str) -> None:
    status, _out, err = invoke(*args)
    assert status == EXIT_CONFIG
    assert message in err
    assert ReceiptStore().list() == []


def test_config_error_with_json_is_an_envelope_too() -> None:
    status, out, _ = invoke("verify", "--local", "--devices", "999", "--json")
    assert status == EXIT_CONFIG
    document = json.loads(out)
    assert document["ok"] is False
    assert document["error"]["type"] == "ConfigError"
    assert document["error"]["exit_status"] == EXIT_CONFIG


def test_empty_store_lists_helpfully() -> None:
    status, out, _ = invoke("receipts", "list")
    assert status == EXIT_OK
    assert "No receipts kept yet" in out
