"""Receipt parsing and validation: each way a receipt can fail to prove a run, by name.

Tampered receipts start from a REAL payload run (tests/receipt_runs.py) and change one
thing, usually re-hashing so the check that catches them is the one named.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter
from receipt_runs import real_run, rehash, tamper

from tpulab import catalog
from tpulab.errors import ConfigError, VerificationError
from tpulab.evidence.receipt import (
    MAX_RECEIPT_BYTES,
    Expectation,
    Receipt,
    check_receipt,
    evaluate_receipt,
    expectation_for,
    expected_per_device_sums,
    expected_predictions,
    parse_receipt,
    read_receipt_file,
    verify_raw,
    verify_receipt,
)


@pytest.fixture(scope="module")
def raw4() -> bytes:
    run = real_run(4, emulated=True)
    assert run.exit_status == 0, run.stderr_tail
    return run.raw


@pytest.fixture(scope="module")
def nonce4() -> str:
    return real_run(4, emulated=True).nonce


def emulated_v5e4(nonce: str) -> Expectation:
    return expectation_for("v5litepod-4", emulated=True, nonce=nonce)


def failed_names(raw: bytes, expectation: Expectation) -> set[str]:
    return {f.requirement for f in check_receipt(parse_receipt(raw), expectation)}


def test_real_receipt_verifies(raw4: bytes, nonce4: str) -> None:
    receipt = verify_raw(raw4, emulated_v5e4(nonce4))
    assert all(r.passed for r in evaluate_receipt(receipt, emulated_v5e4(nonce4)))


def test_platform_mismatch_cpu_observed_tpu_requested(raw4: bytes, nonce4: str) -> None:
    # A forger flips every flag the payload wrote itself and re-hashes: the observed
    # platforms still say cpu, and a TPU expectation refuses them.
    forged = tamper(raw4, emulated=False, requested_platform="tpu")
    tpu = expectation_for("v5litepod-4", emulated=False, nonce=nonce4)
    names = failed_names(forged, tpu)
    assert {
        "observed_platform.default_backend",
        "observed_platform.devices",
        "pmap.output_platform",
        "placement.output_platform",
    } <= names
    assert "requested_platform" not in names
    assert "emulated" not in names
    with pytest.raises(VerificationError) as caught:
        verify_raw(forged, tpu)
    failure = next(
        f for f in caught.value.failures if f.requirement == "observed_platform.default_backend"
    )
    assert (failure.expected, failure.observed) == ("tpu", "cpu")


def test_cpu_receipt_never_passes_a_tpu_expectation_as_is(raw4: bytes, nonce4: str) -> None:
    tpu = expectation_for("v5litepod-4", emulated=False, nonce=nonce4)
    assert {"emulated", "requested_platform", "observed_platform.default_backend"} <= (
        failed_names(raw4, tpu)
    )


def test_emulated_and_real_expectations_never_cross(raw4: bytes, nonce4: str) -> None:
    plain_cpu = Expectation(platform="cpu", local_devices=4, nonce=nonce4, emulated=False)
    assert failed_names(raw4, plain_cpu) == {"emulated"}
    not_emulated = tamper(raw4, emulated=False)
    assert failed_names(not_emulated, emulated_v5e4(nonce4)) == {"emulated"}
    with pytest.raises(ConfigError, match="emulated run executes on cpu"):
        Expectation(platform="tpu", local_devices=4, nonce=nonce4, emulated=True)


def test_one_device_observed_when_four_expected(nonce4: str) -> None:
    one = real_run(1, emulated=True)
    expectation = Expectation(platform="cpu", local_devices=4, nonce=one.nonce, emulated=True)
    with pytest.raises(VerificationError) as caught:
        verify_raw(one.raw, expectation)
    by_name = {f.requirement: f for f in caught.value.failures}
    assert {"local_device_count", "pmap.total", "pmap.per_device_sums[1]"} <= set(by_name)
    assert by_name["pmap.total"].expected == "10416"
    assert by_name["pmap.total"].observed == "140"
    assert by_name["pmap.per_device_sums[3]"].observed == "missing"


def test_wrong_totals_are_caught_by_the_oracle_not_the_hash(raw4: bytes, nonce4: str) -> None:
    forged = tamper(raw4, pmap__observed_total=10417.0)
    assert failed_names(forged, emulated_v5e4(nonce4)) == {"pmap.total"}
    receipt = json.loads(raw4)
    receipt["pmap"]["per_device_sums"][2] = 3085.0
    receipt["pmap"]["psum_totals"] = [10417.0] * 4
    assert failed_names(rehash(receipt), emulated_v5e4(nonce4)) == {
        "pmap.per_device_sums[2]",
        "pmap.psum_totals",
    }


def test_receipt_closed_form_claims_are_not_trusted(raw4: bytes, nonce4: str) -> None:
    # A receipt that ran on 1 device but claims the 4-device numbers in its own
    # closed_form_total field still fails: the oracle comes from the expectation.
    one = json.loads(real_run(1, emulated=True).raw)
    one["pmap"]["closed_form_total"] = 10416.0
    expectation = Expectation(platform="cpu", local_devices=4, nonce=one["nonce"], emulated=True)
    assert "pmap.total" in failed_names(rehash(one), expectation)


def test_tampered_hash(raw4: bytes, nonce4: str) -> None:
    forged = tamper(raw4, keep_hash=True, placement__max_abs_error=0.0, host__hostname="elsewhere")
    assert failed_names(forged, emulated_v5e4(nonce4)) == {"sha256"}
    assert failed_names(tamper(raw4, keep_hash=True, sha256="0" * 64), emulated_v5e4(nonce4)) == {
        "sha256"
    }


def test_wrong_nonce(raw4: bytes) -> None:
    failures = check_receipt(parse_receipt(raw4), emulated_v5e4("a-different-run-nonce"))
    assert [f.requirement for f in failures] == ["nonce"]
    assert "a-different-run-nonce" in failures[0].expected


def test_predictions_are_checked_within_tolerance(raw4: bytes, nonce4: str) -> None:
    document = json.loads(raw4)
    document["placement"]["predictions"][5] += 1e-3
    assert failed_names(rehash(document), emulated_v5e4(nonce4)) == {"placement.predictions"}
    document = json.loads(raw4)
    document["placement"]["predictions"][5] += 1e-7
    assert failed_names(rehash(document), emulated_v5e4(nonce4)) == set()
    swapped = tamper(raw4, reversal__predictions=expected_predictions())
    assert failed_names(swapped, emulated_v5e4(nonce4)) == {"reversal.predictions"}
    unchanged = tamper(raw4, changed_bias__predictions=expected_predictions())
    assert failed_names(unchanged, emulated_v5e4(nonce4)) == {"changed_bias.predictions"}


def test_ok_receipt_missing_evidence_fails(raw4: bytes, nonce4: str) -> None:
    assert failed_names(tamper(raw4, placement=None), emulated_v5e4(nonce4)) == {"placement"}


@pytest.mark.parametrize(
    ("field", "value", "requirement"),
    [
        ("observed__local_device_count", "4", "receipt.observed.local_device_count"),
        ("observed__local_device_count", True, "receipt.observed.local_device_count"),
        ("observed__local_device_count", 4.0, "receipt.observed.local_device_count"),
        ("ok", "true", "receipt.ok"),
        ("nonce", 12345678, "receipt.nonce"),
        ("requested_platform", "metal", "receipt.requested_platform"),
        ("pmap__per_device_sums", "140,1100", "receipt.pmap.per_device_sums"),
        ("sha256", "not-a-digest", "receipt.sha256"),
        ("surprise", 1, "receipt.surprise"),
    ],
)
def test_mistyped_fields_are_named(raw4: bytes, field: str, value: Any, requirement: str) -> None:
    with pytest.raises(VerificationError) as caught:
        parse_receipt(tamper(raw4, keep_hash=field == "sha256", **{field: value}))
    assert requirement in {f.requirement for f in caught.value.failures}


@pytest.mark.parametrize("field", ["pmap", "nonce", "versions", "sha256", "schema_version"])
def test_missing_fields_are_named(raw4: bytes, field: str) -> None:
    document = json.loads(raw4)
    del document[field]
    with pytest.raises(VerificationError) as caught:
        parse_receipt(json.dumps(document).encode())
    failure = next(f for f in caught.value.failures if f.requirement == f"receipt.{field}")
    assert failure.observed == "missing"


def test_unknown_schema_version_is_named(raw4: bytes) -> None:
    with pytest.raises(VerificationError) as caught:
        parse_receipt(tamper(raw4, schema_version=2))
    assert [f.requirement for f in caught.value.failures] == ["receipt.schema_version"]


def test_truncated_file(raw4: bytes, tmp_path: Path) -> None:
    path = tmp_path / "receipt.json"
    path.write_bytes(raw4[: len(raw4) // 2])
    with pytest.raises(VerificationError, match="truncated") as caught:
        parse_receipt(read_receipt_file(path))
    assert [f.requirement for f in caught.value.failures] == ["receipt.json"]


def test_huge_file_is_refused_without_reading_it_all(tmp_path: Path) -> None:
    huge = tmp_path / "huge.json"
    huge.write_bytes(b" " * (MAX_RECEIPT_BYTES + 10))
    with pytest.raises(VerificationError) as caught:
        read_receipt_file(huge)
    assert [f.requirement for f in caught.value.failures] == ["receipt.size"]
    # An endless file only terminates if the read is bounded.
    with pytest.raises(VerificationError, match="larger than"):
        read_receipt_file(Path("/dev/zero"), max_bytes=4096)
    with pytest.raises(VerificationError, match="too large"):
        parse_receipt(b"{" + b" " * MAX_RECEIPT_BYTES + b"}")


def test_missing_file_and_empty_bytes(tmp_path: Path) -> None:
    with pytest.raises(VerificationError, match="Cannot read"):
        read_receipt_file(tmp_path / "absent.json")
    with pytest.raises(VerificationError, match="empty"):
        parse_receipt(b"")


def test_nan_and_infinity_are_not_numbers_a_receipt_may_hold(raw4: bytes) -> None:
    text = raw4.decode().replace('"max_abs_error":0.0', '"max_abs_error":NaN', 1)
    assert "NaN" in text
    with pytest.raises(VerificationError, match="not valid JSON"):
        parse_receipt(text.encode())


def test_oracle_is_independent_of_the_payload() -> None:
    for devices in range(1, 17):
        assert sum(expected_per_device_sums(devices)) == catalog.closed_form_sum_of_squares(devices)
    assert expected_per_device_sums(4) == [140, 1100, 3084, 6092]
    first, last = expected_predictions()[0], expected_predictions()[-1]
    assert (first, last) == (11 / 32, 3.625)
    assert all(math.isclose(b - a, 15 / 32) for a, b in itertools.pairwise(expected_predictions()))


# schema_version 1, pinned: renaming, retyping or dropping a field is a new schema.
SCHEMA_1: dict[str, Any] = {
    "schema_version": "int",
    "ok": "bool",
    "error": "null|object",
    "nonce": "str",
    "emulated": "bool",
    "requested_platform": "str",
    "observed": {
        "default_backend": "str",
        "device_platforms": ["str"],
        "device_kinds": ["str"],
        "device_ids": ["int"],
        "local_device_count": "int",
        "global_device_count": "int",
        "process_index": "int",
        "process_count": "int",
    },
    "pmap": {
        "device_count": "int",
        "per_device_sums": ["float"],
        "psum_totals": ["float"],
        "observed_total": "float",
        "closed_form_total": "float",
        "output_platforms": ["str"],
    },
    "placement": {
        "predictions": ["float"],
        "reference": ["float"],
        "max_abs_error": "float",
        "output_platforms": ["str"],
        "output_device_kind": "str",
        "shape": ["int"],
        "dtype": "str",
    },
    "changed_bias": {
        "bias": "float",
        "predictions": ["float"],
        "max_abs_error": "float",
        "output_platforms": ["str"],
    },
    "reversal": {"predictions": ["float"], "max_abs_error": "float", "output_platforms": ["str"]},
    "versions": {
        "python": "str",
        "jax": "str",
        "jaxlib": "str",
        "libtpu": "null|str",
        "libtpu-nightly": "null|str",
        "numpy": "str",
    },
    "timings_ms": "object",
    "host": {"hostname": "str", "os": "str", "jax_platforms_env": "str", "xla_flags_env": "str"},
    "created_at": "str",
    "sha256": "str",
}
PAYLOAD_ERROR_1 = {"phase": "str", "type": "str", "message": "str"}


def _shape(value: Any, pinned: Any) -> Any:
    names = {bool: "bool", int: "int", float: "float", str: "str", type(None): "null"}
    if isinstance(pinned, dict):
        assert isinstance(value, dict)
        return {key: _shape(value[key], pinned.get(key)) for key in value}
    if isinstance(pinned, list):
        assert isinstance(value, list)
        assert value
        return [next(iter({names.get(type(v), "object") for v in value}))]
    found = names.get(type(value), "object")
    return pinned if found in str(pinned).split("|") else found


def test_schema_1_json_contract_is_pinned(raw4: bytes) -> None:
    document = json.loads(raw4)
    assert _shape(document, SCHEMA_1) == SCHEMA_1
    failed = json.loads(real_run(4, platform="tpu").raw)
    assert set(failed) == set(SCHEMA_1)
    assert _shape(failed["error"], PAYLOAD_ERROR_1) == PAYLOAD_ERROR_1
    # A slice worker's receipt adds one optional key; a single host's never has it.
    assert set(Receipt.model_fields) == set(SCHEMA_1) | {"distributed"}
    assert "distributed" not in document
    assert Receipt.model_config.get("strict")
    assert Receipt.model_config.get("extra") == "forbid"


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(_json_values)
def test_arbitrary_json_only_ever_gives_a_verification_error(value: Any) -> None:
    with pytest.raises(VerificationError):
        parse_receipt(json.dumps(value).encode())


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=2048))
def test_arbitrary_bytes_only_ever_give_a_verification_error(data: bytes) -> None:
    with pytest.raises(VerificationError):
        parse_receipt(data)


def _paths(document: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = [prefix] if prefix else []
    if isinstance(document, dict):
        for key, value in document.items():
            found.extend(_paths(value, (*prefix, key)))
    return found


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_real_receipt_with_any_field_replaced_is_rejected_or_checked(
    raw4: bytes, nonce4: str, data: st.DataObject
) -> None:
    document = json.loads(raw4)
    path = data.draw(st.sampled_from(_paths(document)))
    value = data.draw(_json_values)
    target = document
    for key in path[:-1]:
        target = target[key]
    original = target[path[-1]]
    target[path[-1]] = value
    try:
        receipt = parse_receipt(rehash(document))
    except VerificationError:
        return
    failures = check_receipt(receipt, emulated_v5e4(nonce4))
    if path in _CHECKED and json.dumps(value) != json.dumps(original):
        assert failures, f"changing {'.'.join(path)} to {value!r} went unnoticed"


# Fields whose every change must be caught (the rest is context: versions, timings...).
_CHECKED = {
    ("ok",),
    ("nonce",),
    ("emulated",),
    ("requested_platform",),
    ("observed",),
    ("observed", "default_backend"),
    ("observed", "device_platforms"),
    ("observed", "local_device_count"),
    ("observed", "global_device_count"),
    ("observed", "process_count"),
    ("pmap",),
    ("pmap", "per_device_sums"),
    ("pmap", "psum_totals"),
    ("pmap", "observed_total"),
    ("pmap", "output_platforms"),
    ("placement",),
    ("placement", "predictions"),
    ("placement", "output_platforms"),
    ("placement", "shape"),
    ("placement", "dtype"),
    ("changed_bias",),
    ("changed_bias", "predictions"),
    ("changed_bias", "output_platforms"),
    ("reversal",),
    ("reversal", "predictions"),
    ("reversal", "output_platforms"),
}


def test_expectation_for_uses_the_catalog() -> None:
    real = expectation_for("v5litepod-8", emulated=False, nonce="n" * 8)
    assert (real.platform, real.local_devices, real.emulated) == ("tpu", 8, False)
    emulated = expectation_for("v2-8", emulated=True, nonce="n" * 8)
    assert (emulated.platform, emulated.local_devices, emulated.emulated) == ("cpu", 8, True)
    # Kept beside stored receipts (inside their record), so it must survive JSON.
    adapter = TypeAdapter(Expectation)
    assert adapter.validate_json(adapter.dump_json(real)) == real
    # A slice: each worker shows its host's devices, the slice hosts x that.
    v4 = expectation_for("v4-16", emulated=True, nonce="n" * 8)
    assert (v4.hosts, v4.local_devices, v4.total_devices) == (2, 4, 8)
    assert adapter.validate_json(adapter.dump_json(v4)) == v4
    assert (real.hosts, emulated.hosts) == (1, 1)


def test_failed_receipt_reports_only_its_cause(nonce4: str) -> None:
    run = real_run(4, platform="tpu")
    receipt = parse_receipt(run.raw)
    results = evaluate_receipt(
        receipt, Expectation(platform="tpu", local_devices=4, nonce=run.nonce)
    )
    assert [r.name for r in results if not r.passed] == ["ok"]
    assert "backend" in results[0].observed
    with pytest.raises(VerificationError) as caught:
        verify_receipt(receipt, Expectation(platform="tpu", local_devices=4, nonce=run.nonce))
    assert "tpulab run" in (caught.value.hint or "")
