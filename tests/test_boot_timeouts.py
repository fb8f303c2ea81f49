"""The hints that say "give it longer" name a flag that exists: --boot-timeout for the
host key and SSH after READY, --bootstrap-timeout for the install."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from helpers import tpulab

from tpulab.exits import EXIT_CONFIG, EXIT_REMOTE

if TYPE_CHECKING:
    from emulator_fixtures import EmulatorStarter

pytest_plugins = ["emulator_fixtures"]


def test_a_host_key_that_comes_too_late_names_the_flag_that_waits_longer(
    start_emulator: EmulatorStarter, tmp_path: Path
) -> None:
    from tpulab.emulator.backends import make_host_backend

    backend = make_host_backend("embedded", tmp_path / "hosts")
    try:
        served = start_emulator(tmp_path / "served", host_backend=backend)
        served.faults.guest_attributes_delay = 600.0  # never within this run's budget
        done = tpulab(
            "run", "--accelerator", "v5litepod-4", "--api-endpoint", served.url,
            "--project", "boot-proj", "--boot-timeout", "2",
        )  # fmt: skip
        assert done.returncode == EXIT_REMOTE, done.stderr
        assert "within 2s" in done.stderr
        assert "--boot-timeout" in done.stderr
        assert served.node_names("boot-proj") == []  # and the node was still deleted
    finally:
        backend.close()


def test_boot_and_bootstrap_timeouts_are_validated_before_any_call(
    start_emulator: EmulatorStarter, tmp_path: Path
) -> None:
    served = start_emulator(tmp_path / "served")
    for flag in ("--boot-timeout", "--bootstrap-timeout"):
        done = tpulab(
            "run", "--accelerator", "v5litepod-4", "--api-endpoint", served.url,
            "--project", "boot-proj", flag, "0",
        )  # fmt: skip
        assert done.returncode == EXIT_CONFIG, done.stderr
        assert flag in done.stderr
    assert sum(served.calls.values()) == 0
