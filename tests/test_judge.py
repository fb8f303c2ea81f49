"""The one judgement of receipt bytes, and the error chosen in the layer that failed."""

from __future__ import annotations

import json

import pytest
from receipt_runs import real_run, tamper

from tpulab.errors import (
    CommandFailedError,
    LocalRunError,
    RemoteError,
    TpuBusyError,
    VerificationError,
)
from tpulab.evidence.judge import (
    Judgement,
    Place,
    Verdict,
    failure_of,
    judge,
    payload_failure,
)
from tpulab.evidence.receipt import Expectation, expectation_for

BUSY = "RuntimeError: ABORTED: The TPU is already in use by process with pid 4242."


@pytest.fixture(scope="module")
def raw4() -> bytes:
    run = real_run(4, emulated=True)
    assert run.exit_status == 0, run.stderr_tail
    return run.raw


@pytest.fixture(scope="module")
def expected4() -> Expectation:
    return expectation_for("v5litepod-4", emulated=True, nonce=real_run(4, emulated=True).nonce)


def test_a_genuine_receipt_is_verified_with_its_numbers(
    raw4: bytes, expected4: Expectation
) -> None:
    judgement = judge(raw4, expected4)
    assert judgement.verdict is Verdict.VERIFIED
    assert judgement.failures == []
    assert len(judgement.requirements) == 24
    assert judgement.per_device_sums == [140, 1100, 3084, 6092]
    assert (judgement.observed_total, judgement.expected_total) == (10416, 10416)
    assert failure_of(judgement, expected4, payload_exit=0, output=[], where="vm") is None


def test_a_rejection_names_each_failed_requirement(raw4: bytes, expected4: Expectation) -> None:
    forged = tamper(raw4, pmap__per_device_sums=[141.0, 1100.0, 3084.0, 6092.0])
    judgement = judge(forged, expected4)
    assert judgement.verdict is Verdict.REJECTED
    (failure,) = judgement.failures
    assert (failure.requirement, failure.expected, failure.observed) == (
        "pmap.per_device_sums[0]",
        "140",
        "141",
    )
    error = failure_of(judgement, expected4, payload_exit=0, output=[], where="vm")
    assert isinstance(error, VerificationError)
    assert [f.requirement for f in error.failures] == ["pmap.per_device_sums[0]"]


def test_four_devices_expected_one_observed_fails_against_the_expected_total(
    expected4: Expectation,
) -> None:
    one = real_run(1, emulated=True)
    judgement = judge(one.raw, expectation_for("v5litepod-4", emulated=True, nonce=one.nonce))
    assert judgement.verdict is Verdict.REJECTED
    assert judgement.expected_total == 10416
    assert judgement.observed_total == 140
    assert "local_device_count" in {f.requirement for f in judgement.failures}


def test_truncated_bytes_are_unreadable_never_an_exception(
    raw4: bytes, expected4: Expectation
) -> None:
    judgement = judge(raw4[:120], expected4)
    assert judgement.verdict is Verdict.UNREADABLE
    assert judgement.receipt is None
    assert "truncated" in (judgement.unreadable_reason or "")
    assert [r.name for r in judgement.requirements] == ["receipt.json"]
    error = failure_of(judgement, expected4, payload_exit=0, output=[], where="vm")
    assert isinstance(error, VerificationError)


def test_the_judgement_survives_json_as_kept_in_a_sidecar(
    raw4: bytes, expected4: Expectation
) -> None:
    judgement = judge(tamper(raw4, ok=False), expected4)
    again = Judgement.model_validate_json(judgement.model_dump_json())
    assert again.model_dump() == judgement.model_dump()
    assert again.verdict is Verdict.REJECTED
    assert json.loads(judgement.model_dump_json())["verdict"] == "rejected"


def test_the_verdict_reads_as_its_word() -> None:
    assert f"{Verdict.VERIFIED}" == "verified"
    assert str(Verdict.UNREADABLE).upper() == "UNREADABLE"
    assert Verdict("rejected") is Verdict.REJECTED


@pytest.mark.parametrize("where", ["vm", "local"])
def test_a_payload_without_a_receipt_fails_in_its_own_layer(
    where: Place, expected4: Expectation
) -> None:
    judgement = judge(b"", expected4)
    error = failure_of(
        judgement, expected4, payload_exit=3, output=["Traceback", "boom"], where=where
    )
    if where == "vm":
        assert isinstance(error, CommandFailedError)
    else:
        # Nothing ran on a VM: not a RemoteError (which would mean exit 4).
        assert isinstance(error, LocalRunError)
        assert not isinstance(error, RemoteError)
    assert error.exit_status == 3
    assert "boom" in error.output_tail


def test_the_busy_tpu_is_recognised_by_the_one_pattern_in_both_layers() -> None:
    remote = payload_failure("wrote no receipt", "-", exit_status=1, output=[BUSY], where="vm")
    assert isinstance(remote, TpuBusyError)
    assert "pid 4242" in remote.message
    local = payload_failure("wrote no receipt", "-", exit_status=1, output=[BUSY], where="local")
    assert isinstance(local, LocalRunError)
    assert "held by another process" in local.message
    assert "pid 4242" in local.message
    assert TpuBusyError.evidence_in("open(/dev/vfio/0) failed: Device busy") is not None
    assert TpuBusyError.evidence_in("an unrelated failure") is None


def test_a_stale_receipt_left_by_a_failing_payload_is_named_on_the_vm(
    raw4: bytes,
) -> None:
    other_run = expectation_for("v5litepod-4", emulated=True, nonce="another-run-nonce")
    judgement = judge(raw4, other_run)
    assert judgement.stale
    error = failure_of(judgement, other_run, payload_exit=1, output=[], where="vm")
    assert isinstance(error, CommandFailedError)
    assert "stale" in error.message


def test_locally_a_readable_receipt_explains_a_failed_payload() -> None:
    run = real_run(4, platform="tpu")  # no TPU here: the payload fails and says why
    assert run.exit_status != 0
    expectation = Expectation(platform="tpu", local_devices=4, nonce=run.nonce)
    judgement = judge(run.raw, expectation)
    error = failure_of(
        judgement,
        expectation,
        payload_exit=run.exit_status,
        output=run.stderr_tail.splitlines(),
        where="local",
    )
    assert isinstance(error, VerificationError)
    assert "TPU backend is unavailable" in error.message
