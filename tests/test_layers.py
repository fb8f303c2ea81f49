"""The layers at run time: importing the controller never loads the emulator.

import-linter (`nox -s lint`, contracts in pyproject.toml) checks the import graph
statically; this checks what a fresh interpreter really loads, which also catches an
import hidden in a function that runs at import time.
"""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import pytest

import tpulab

# Every module of the controller: all but the CLI, the --emulate glue that starts an
# emulator (tpulab.app.embedded) and the emulator itself.
CONTROLLER = sorted(
    info.name
    for info in pkgutil.walk_packages(tpulab.__path__, prefix="tpulab.")
    if not info.name.startswith(("tpulab.cli", "tpulab.emulator", "tpulab.app.embedded"))
)


def _loaded_after(module: str) -> list[str]:
    probe = (
        f"import sys, {module}\n"
        "print('\\n'.join(m for m in sys.modules if m.startswith('tpulab.emulator')"
        " or m == 'http.server'))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    return done.stdout.split()


def test_importing_ssh_loads_no_emulator_and_no_http_server() -> None:
    # Once `tpulab.ssh` loaded `tpulab.emulator.server` (and http.server) through a
    # constant shared by both sides; the shared names now live in tpulab.contract.
    assert _loaded_after("tpulab.remote.ssh") == []


@pytest.mark.parametrize("module", CONTROLLER)
def test_no_controller_module_loads_the_emulator(module: str) -> None:
    assert _loaded_after(module) == []


def test_the_probe_would_notice_the_emulator() -> None:
    assert "tpulab.emulator.server" in _loaded_after("tpulab.emulator.server")
