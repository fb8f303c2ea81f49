"""A `-- CMD` run that is preempted during the command and recovers (`--spot --recover
1`): each attempt's artifacts, log and run.json stay apart, attempt N > 1 under
`<out>/attempt-N/`, so nothing the preempted attempt fetched is overwritten. A real
subprocess against a served emulator whose nodes are real SSH hosts on loopback."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tpulab.emulator.backends import make_host_backend
from tpulab.exits import EXIT_OK
from tpulab.run.record import read_run_record
from tpulab.run.report import RunEnvelope

if TYPE_CHECKING:
    from emulator_fixtures import EmulatorStarter

    from tpulab.emulator import Emulator

pytest_plugins = ["emulator_fixtures"]

# Attempt 1 ("<id>") writes its run dir, says it started, then outlives its preemption;
# attempt 2 ("<id>-a2") writes its own and ends at once.
COMMAND = """
import os, pathlib, sys, time
run_id = os.environ["TPULAB_RUN_ID"]
pathlib.Path(os.environ["TPULAB_RUN_DIR"], "who.txt").write_text(run_id)
print("command of", run_id, flush=True)
if not run_id.endswith("-a2"):
    pathlib.Path(os.environ["MARK"]).write_text(run_id)
    time.sleep(90)
"""


@pytest.fixture
def served(start_emulator: EmulatorStarter, tmp_path: Path) -> Iterator[Emulator]:
    backend = make_host_backend("embedded", tmp_path / "ssh-hosts", image="preloaded")
    emulator = start_emulator(tmp_path / "served", host_backend=backend)
    try:
        yield emulator
    finally:
        emulator.stop()
        backend.close()


@pytest.mark.slow
def test_a_recovered_run_keeps_each_attempts_artifacts_apart(
    served: Emulator, tmp_path: Path
) -> None:
    work = tmp_path / "lab"
    work.mkdir()
    (work / "job.py").write_text(COMMAND, encoding="utf-8")
    out = tmp_path / "out"
    mark = tmp_path / "started"
    args = [
        sys.executable, "-m", "tpulab", "run", "--accelerator", "v5litepod-4",
        "--api-endpoint", served.url, "--project", "artifacts", "--teardown-timeout", "30",
        "--zone", "us-central1-a,us-west4-a", "--spot", "--recover", "1", "--json",
        "--workdir", str(work), "--out", str(out), "--env", f"MARK={mark}",
        "--", "python", "job.py",
    ]  # fmt: skip
    process = subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    try:
        deadline = time.monotonic() + 180
        while not mark.exists():
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the command never started"
            time.sleep(0.2)
        # Reclaim exactly the node running the command, now.
        served.faults.preempt_nodes = 1
        served.faults.preempt_after = 0.0
        stdout, stderr = process.communicate(timeout=240)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == EXIT_OK, stdout + stderr
    result = RunEnvelope.model_validate_json(stdout)
    first_id = result.attempts[0].run_id
    assert [(a.run_id, a.outcome) for a in result.attempts] == [
        (first_id, "preempted"),
        (f"{first_id}-a2", "verified"),
    ]
    # The preempted attempt's record stays in <out>; the recovery's is its own.
    first = read_run_record(out / "run.json")
    second = read_run_record(out / "attempt-2" / "run.json")
    assert (first.run_id, second.run_id) == (first_id, f"{first_id}-a2")
    assert first.workload.out == str(out)
    assert second.workload.out == str(out / "attempt-2")
    assert (out / "attempt-2" / "run" / "who.txt").read_text() == f"{first_id}-a2"
    assert result.workload is not None
    assert result.workload.out == str(out / "attempt-2")
    assert served.node_names() == []
