"""Which python and jax the VM's venv gets: chosen once in config, refused early when
malformed, shown in the dry run, and reported (with a jax-mismatch warning) at the end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tpulab.config import PythonFlags, TargetFlags, build_run_spec
from tpulab.config.python import EMULATED_PYTHON, REAL_PYTHON
from tpulab.errors import ConfigError
from tpulab.exits import EXIT_CONFIG, EXIT_OK
from tpulab.remote import bootstrap as boot
from tpulab.remote.bootstrap import BootstrapResult
from tpulab.run.outcome import RunOutcome
from tpulab.run.summary import summary_lines

if TYPE_CHECKING:
    from emulator_fixtures import EmulatorStarter

    from tpulab.config import RunSpec

pytest_plugins = ["emulator_fixtures"]


def tpulab(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tpulab", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "250"},
        check=False,
    )


def real_spec(**python: str) -> RunSpec:
    return build_run_spec(
        target=TargetFlags(accelerator="v5litepod-4", project="my-project", zone="us-central1-a"),
        python=PythonFlags(**python),
        env={},
    )


def test_real_runs_default_to_a_uv_managed_3_12_and_emulated_ones_to_the_newest_local() -> None:
    real = real_spec()
    assert (real.python, real.jax_version) == (REAL_PYTHON, None)
    assert REAL_PYTHON == "3.12"
    assert "uv-managed" in real.python_source
    emulated = build_run_spec(target=TargetFlags(accelerator="v5litepod-4", emulate=True), env={})
    assert emulated.python == EMULATED_PYTHON == ">=3.11"
    assert "newest local python >= 3.11" in emulated.python_source


@pytest.mark.parametrize("given", ["3.10", "3.13", ">=3.11", "system", " 3.12 "])
def test_accepted_python_requests(given: str) -> None:
    spec = real_spec(python=given)
    assert spec.python == given.strip()
    assert spec.python_source == "--python"


@pytest.mark.parametrize("given", ["3.9", "2.7", "3", "3.12.1", "python3.12", "3.12; rm -rf ~", ""])
def test_malformed_python_requests_are_refused_with_what_to_do(given: str) -> None:
    with pytest.raises(ConfigError) as caught:
        real_spec(python=given)
    assert "--python" in caught.value.message
    assert "system" in (caught.value.hint or "")


def test_jax_version_is_pinned_or_refused() -> None:
    assert real_spec(jax_version="0.6.2").jax_version == "0.6.2"
    assert real_spec(jax_version="0.12.0.1").jax_version == "0.12.0.1"
    for bad in ("jax==0.6.2", ">=0.6", "latest", "0.6.2 numpy"):
        with pytest.raises(ConfigError, match="--jax-version"):
            real_spec(jax_version=bad)


def test_a_bad_python_flag_creates_nothing(start_emulator: EmulatorStarter, tmp_path: Path) -> None:
    emulator = start_emulator(tmp_path / "served")  # no SSH hosts: nothing may get that far
    done = tpulab(
        "run", "--accelerator", "v5litepod-4", "--api-endpoint", emulator.url,
        "--python", "3.8",
    )  # fmt: skip
    assert done.returncode == EXIT_CONFIG, done.stderr
    assert "Invalid --python '3.8'" in done.stderr
    assert sum(emulator.calls.values()) == 0


def test_the_dry_run_shows_the_python_and_the_pin() -> None:
    flags = ("run", "--accelerator", "v5litepod-4", "--project", "p", "--zone", "us-central1-a",
             "--python", "3.11", "--jax-version", "0.6.2", "--dry-run")  # fmt: skip
    done = tpulab(*flags, "--json")
    assert done.returncode == EXIT_OK, done.stderr + done.stdout
    # The remote argv lists the run would send, as it would send them.
    argvs = [step["argv"] or [] for step in json.loads(done.stdout)["steps"]]
    assert any("python3 -m pip install --user uv" in " ".join(argv) for argv in argvs)
    assert [boot.LAB_DIR, boot.VENV_DIR, "3.11", "uv"] in [argv[-4:] for argv in argvs]
    assert ["uv", "jax[tpu]==0.6.2", "numpy"] in [argv[-3:] for argv in argvs]
    human = tpulab(*flags)
    assert human.returncode == EXIT_OK, human.stderr
    assert "The VM's venv: python 3.11 (--python), jax 0.6.2." in human.stdout


def _outcome(jax: str) -> RunOutcome:
    spec = build_run_spec(target=TargetFlags(accelerator="v5litepod-4", emulate=True), env={})
    bootstrap = BootstrapResult(
        "uv venv --python >=3.11",
        "uv",
        {"python": "3.13.0", "jax": jax, "jaxlib": jax, "libtpu": None, "numpy": "2.5"},
        python_request=spec.python,
        image_python="3.10.13",
        image_kind="bare (python3 3.10.13, no jax, no uv)",
        notes=["uv unavailable: the image python3 3.10.13 instead of python 3.12"],
    )
    return RunOutcome(spec, bootstrap=bootstrap)


def _text(outcome: RunOutcome, laptop: str | None) -> str:
    lines = summary_lines(outcome, laptop_jax=lambda: laptop)
    return "\n".join("".join(text for text, _ in line) for line in lines)


def test_summary_warns_when_the_vm_jax_differs_from_the_laptops() -> None:
    text = _text(_outcome("0.12.0.1"), "0.10.2")
    assert "warning   the VM runs jax 0.12.0.1, this laptop has jax 0.10.2" in text
    assert "python    3.13.0 (asked >=3.11: emulated default" in text
    assert "image python3 3.10.13" in text
    assert "jax       jax 0.12.0.1, jaxlib 0.12.0.1, libtpu none" in text
    assert "image     bare (python3 3.10.13, no jax, no uv)" in text
    assert "note      uv unavailable" in text
    same = _text(_outcome("0.10.2"), "0.10.2")
    assert "warning" not in same
    no_laptop_jax = _text(_outcome("0.10.2"), None)
    assert "warning" not in no_laptop_jax
