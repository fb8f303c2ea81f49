"""The verifier payload, run for real (jax on CPU, in fresh subprocesses)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from receipt_runs import real_run

from tpulab import paths
from tpulab.errors import ConfigError, VerificationError
from tpulab.evidence.localrun import run_local_payload
from tpulab.evidence.receipt import (
    Expectation,
    check_receipt,
    expectation_for,
    parse_receipt,
    read_receipt_file,
    verify_receipt,
)
from tpulab.remote.payload import (
    RECEIPT_PREFIX,
    check_nonce,
    extract_receipt_line,
    payload_command,
    payload_env,
)

PAYLOAD = paths.payload_path()
# The numbers of the course lessons (tpu-04, welcome-03), written out as the user reads them.
SEED_TOTALS = {1: 140.0, 4: 10416.0, 8: 85344.0}
SEED_PREDICTIONS = [0.34375, 0.8125, 1.28125, 1.75, 2.21875, 2.6875, 3.15625, 3.625]


@pytest.mark.parametrize(
    ("devices", "accelerator"), [(1, "v5litepod-1"), (4, "v5litepod-4"), (8, "v5litepod-8")]
)
def test_emulated_runs_give_the_seed_numbers_and_verify(devices: int, accelerator: str) -> None:
    run = real_run(devices, emulated=True)
    assert run.exit_status == 0, run.stderr_tail
    receipt = parse_receipt(run.raw)
    assert receipt.ok
    assert receipt.emulated
    assert receipt.requested_platform == "cpu"
    assert receipt.pmap is not None
    assert receipt.placement is not None
    assert receipt.pmap.observed_total == SEED_TOTALS[devices]
    assert receipt.pmap.psum_totals == [SEED_TOTALS[devices]] * devices
    assert len(receipt.pmap.per_device_sums) == devices
    assert receipt.placement.predictions == SEED_PREDICTIONS
    assert receipt.placement.output_platforms == ["cpu"]
    assert receipt.observed is not None
    assert receipt.observed.local_device_count == devices
    expectation = expectation_for(accelerator, emulated=True, nonce=run.nonce)
    assert check_receipt(receipt, expectation) == []
    verify_receipt(receipt, expectation)


def test_four_device_run_shows_each_device_share_and_the_side_checks() -> None:
    receipt = parse_receipt(real_run(4, emulated=True).raw)
    assert receipt.pmap is not None
    assert receipt.pmap.per_device_sums == [140.0, 1100.0, 3084.0, 6092.0]
    assert receipt.changed_bias is not None
    assert receipt.reversal is not None
    assert receipt.changed_bias.predictions[0] == -0.03125
    assert receipt.changed_bias.predictions == [v - 0.375 for v in SEED_PREDICTIONS]
    assert receipt.reversal.predictions[0] == 3.625
    assert receipt.reversal.predictions[-1] == 0.34375
    assert set(receipt.timings_ms) >= {"import", "backend", "pmap", "placement", "total"}
    assert receipt.versions.jax
    assert receipt.versions.jaxlib
    assert receipt.host.xla_flags_env == "--xla_force_host_platform_device_count=4"


def test_requesting_an_absent_tpu_writes_a_failed_receipt_and_never_passes() -> None:
    run = real_run(4, platform="tpu")
    assert run.exit_status != 0
    receipt = parse_receipt(run.raw)
    assert not receipt.ok
    assert receipt.error is not None
    assert receipt.error.phase == "backend"
    assert receipt.observed is None
    assert receipt.pmap is None
    expectation = expectation_for("v5litepod-4", emulated=False, nonce=run.nonce)
    failures = check_receipt(receipt, expectation)
    assert [f.requirement for f in failures] == ["ok"]
    with pytest.raises(VerificationError, match="TPU backend is unavailable"):
        verify_receipt(receipt, expectation)


def test_receipt_file_and_stdout_line_are_the_same_document(tmp_path: Path) -> None:
    out = tmp_path / "receipt.json"
    nonce = "stdout-and-file-agree"
    argv = payload_command(
        sys.executable, PAYLOAD, platform="cpu", nonce=nonce, out=out, emulated=False
    )
    env = {**os.environ, **payload_env("cpu", 2)}
    done = subprocess.run(argv, env=env, capture_output=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    from_stdout = extract_receipt_line(done.stdout)
    assert from_stdout is not None
    assert json.loads(from_stdout) == json.loads(read_receipt_file(out))
    receipt = parse_receipt(from_stdout)
    verify_receipt(receipt, Expectation(platform="cpu", local_devices=2, nonce=nonce))


def test_payload_without_jax_still_writes_a_receipt_naming_the_import(tmp_path: Path) -> None:
    # -S drops site-packages: stdlib only, exactly like a VM whose venv lacks jax.
    out = tmp_path / "receipt.json"
    argv = payload_command(
        sys.executable, PAYLOAD, platform="tpu", nonce="no-jax-here", out=out, emulated=False
    )
    done = subprocess.run([argv[0], "-S", *argv[1:]], capture_output=True, timeout=60, check=False)
    assert done.returncode == 1
    receipt = parse_receipt(read_receipt_file(out))
    assert not receipt.ok
    assert receipt.error is not None
    assert (receipt.error.phase, receipt.error.type) == ("import", "ModuleNotFoundError")
    expectation = Expectation(platform="tpu", local_devices=4, nonce="no-jax-here")
    with pytest.raises(VerificationError, match="JAX could not be imported"):
        verify_receipt(receipt, expectation)


def test_payload_is_python_310_and_imports_only_stdlib_jax_numpy() -> None:
    source = PAYLOAD.read_text(encoding="utf-8")
    tree = ast.parse(source, feature_version=(3, 10))
    roots: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    allowed = set(sys.stdlib_module_names) | {"jax", "numpy"}
    assert roots - allowed == set()
    assert "tpulab" not in roots


def test_command_and_environment_builders() -> None:
    argv = payload_command(
        "py", "/p/v.py", platform="tpu", nonce="abcdefgh", out="/o", emulated=True
    )
    assert argv == [
        "py",
        "/p/v.py",
        "--platform",
        "tpu",
        "--nonce",
        "abcdefgh",
        "--out",
        "/o",
        "--emulated",
    ]
    assert payload_env("tpu", 4) == {"JAX_PLATFORMS": "tpu"}
    assert payload_env("cpu", 8)["XLA_FLAGS"] == "--xla_force_host_platform_device_count=8"
    assert extract_receipt_line(f"noise\n{RECEIPT_PREFIX}{{}}\n") == b"{}"


@pytest.mark.parametrize("nonce", ["short", "has space in it", "semi;colon;x", "x" * 200])
def test_unsafe_nonces_are_refused_before_anything_runs(nonce: str) -> None:
    with pytest.raises(ConfigError, match="nonce"):
        check_nonce(nonce)


def test_unknown_platform_is_refused() -> None:
    with pytest.raises(ConfigError, match="platform"):
        payload_env("metal", 1)


def test_payload_on_python_310_with_the_jax_a_tpu_vm_gets() -> None:
    # TPU VM images ship Python 3.10, where the newest jax is 0.6.x. Point
    # TPULAB_TEST_PY310 at such an interpreter (e.g. `uv venv -p 3.10` + `jax[cpu]<0.7`).
    # `nox -s tests` builds one when a python3.10 is on PATH; CI must run this test.
    from helpers import require_tool

    python = os.environ.get("TPULAB_TEST_PY310", "")
    require_tool(bool(python), "a Python 3.10 with jax (TPULAB_TEST_PY310)")
    run = run_local_payload(devices=4, emulated=True, python=python, nonce="python-310-run")
    assert run.exit_status == 0, run.stderr_tail
    receipt = parse_receipt(run.raw)
    assert receipt.versions.python.startswith("3.10.")
    verify_receipt(receipt, expectation_for("v5litepod-4", emulated=True, nonce=run.nonce))
