"""A reader that goes away (`tpulab run | head -1`, a killed `tee`) is not a failure.

The run is a real subprocess against a served emulator; its stdout is a pipe whose
reading end the test closes after the first line. The run must still finish every phase,
delete its node (confirmed by the emulator) and exit with its real status, 0.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from tpulab.exits import EXIT_OK

if TYPE_CHECKING:
    from emulator_fixtures import EmulatorStarter

    from tpulab.emulator.hosts import HostBackend

pytest_plugins = ["emulator_fixtures", "ssh_fixtures"]


def test_a_run_whose_stdout_reader_leaves_still_succeeds_and_deletes(
    start_emulator: EmulatorStarter, tmp_path: Path
) -> None:
    from tpulab.emulator.backends import make_host_backend

    backend = make_host_backend("embedded", tmp_path / "hosts", image="preloaded")
    try:
        _run_and_close_stdout_early(start_emulator, backend, tmp_path)
    finally:
        backend.close()


def _run_and_close_stdout_early(
    start_emulator: EmulatorStarter, backend: HostBackend, tmp_path: Path
) -> None:
    served = start_emulator(tmp_path / "served", host_backend=backend)
    stderr_path = tmp_path / "stderr.txt"
    with stderr_path.open("w") as stderr:
        child = subprocess.Popen(
            [sys.executable, "-m", "tpulab", "run", "--accelerator", "v5litepod-4",
             "--api-endpoint", served.url, "--project", "pipe-project"],
            stdout=subprocess.PIPE,
            stderr=stderr,
            env={**os.environ, "COLUMNS": "200"},
        )  # fmt: skip
        assert child.stdout is not None
        first = child.stdout.readline()
        child.stdout.close()  # what `head -1` does after its line
        status = child.wait(timeout=180)
    assert first.strip(), "the run printed nothing before the reader left"
    log = stderr_path.read_text()
    assert status == EXIT_OK, log
    assert "Traceback" not in log
    assert served.node_names() == []
    assert served.calls["delete_node"] >= 1
