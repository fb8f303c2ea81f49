"""`tpulab run --emulate` on the bare image, as a user runs it (a real subprocess).

The emulated node starts like a real TPU VM image (python3 3.10, no jax, no uv), so the
run's bootstrap installs uv user-level, makes the venv with a newer local python (the
emulated default ">=3.11"), installs jax from the package index, and only then does
the verifier prove 10416 on 4 devices. Both SSH backends.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tpulab.emulator.hostenv import find_image_python
from tpulab.exits import EXIT_OK

pytest_plugins = ["emulator_fixtures"]

# One `run --emulate` on the bare image installs jax from the package index: a cold
# cache on a slow network takes minutes. This bound, not pytest-timeout's 300 s
# (pyproject.toml), is what ends a hang, with the run's output: each test's own
# timeout below lets it.
RUN_BOUND = 900


def tpulab(*args: str, timeout: float = RUN_BOUND) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tpulab", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "250"},
        check=False,
    )


def _minor(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


@pytest.mark.slow
@pytest.mark.timeout(RUN_BOUND + 60)
@pytest.mark.parametrize(
    "backend", ["embedded", pytest.param("openssh", marks=pytest.mark.openssh)]
)
def test_run_on_the_bare_image_installs_jax_and_verifies(
    fast_embedded_emulator: Path, backend: str
) -> None:
    if backend == "openssh":
        from helpers import require_tool
        from ssh_fixtures import sshd_available

        require_tool(sshd_available(), "OpenSSH server")
    done = tpulab(
        "run", "--accelerator", "v5litepod-4", "--emulate", "--json", "--ssh-backend", backend
    )  # fmt: skip
    assert done.returncode == EXIT_OK, done.stderr + done.stdout
    result: dict[str, Any] = json.loads(done.stdout)
    boot = result["bootstrap"]
    assert boot["venv"] == "uv venv --python >=3.11"  # the emulated default, via uv
    assert boot["install"] == "uv"  # installed from the index: the image had no jax
    versions = boot["versions"]
    assert _minor(versions["python"]) >= (3, 11)
    assert versions["jax"]
    assert versions["jaxlib"]
    receipt = result["receipt"]
    assert receipt["verdict"] == "verified"
    assert receipt["per_device_sums"] == [140.0, 1100.0, 3084.0, 6092.0]
    assert receipt["observed_total"] == 10416.0
    # The receipt was written by the venv's python and jax, not the image's 3.10.
    written = json.loads(Path(receipt["path"]).read_text())
    assert json.dumps(written).count(versions["python"]) >= 1
    assert json.dumps(written).count(versions["jax"]) >= 1
    assert result["teardown"]["confirmed"] is True
    notes = " ".join(result["notes"])
    _, image_version = find_image_python()
    assert f"image python3 {image_version}" in notes
    assert "installed with uv" in notes


@pytest.mark.slow
@pytest.mark.timeout(RUN_BOUND + 60)
def test_human_summary_names_the_image_python_and_jax(fast_embedded_emulator: Path) -> None:
    done = tpulab("run", "--accelerator", "v5litepod-1", "--emulate")
    assert done.returncode == EXIT_OK, done.stderr + done.stdout
    out = done.stdout
    _, image_version = find_image_python()
    assert f"image     bare (python3 {image_version}, no jax, no uv)" in out
    assert "asked >=3.11: emulated default: the newest local python >= 3.11" in out
    assert f"image python3 {image_version}" in out
    assert "venv      uv venv --python >=3.11; install uv" in out
    assert "VERIFIED" in out
