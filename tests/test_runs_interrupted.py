"""A `tpulab exec` or `tpulab run` SIGKILLed mid-command still leaves its record: the
run.json written when it started ("running"), which `tpulab runs` shows as running while
its process lives and as interrupted, with its out dir, once it is gone. Real
subprocesses against an emulator served from this process, whose nodes are real SSH
servers; nothing is mocked, and each test ends with the emulator empty."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import served_emulator, tpulab
from test_exec import EXIT_OK, PROJECT, ZONE, _exec_in_background, _wait_for, up

from tpulab.cli.runs import RunsListEnvelope
from tpulab.emulator import Emulator

pytestmark = pytest.mark.slow

# Tells the test it started (the emulated node runs on this machine), then outlives it.
_WAIT = (
    "import os, pathlib, sys, time\n"
    "pathlib.Path(os.environ['TPULAB_RUN_DIR'], 'partial.txt').write_text('so far')\n"
    "pathlib.Path(sys.argv[1]).write_text(os.environ['TPULAB_RUN_ID'])\n"
    "time.sleep(300)\n"
)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Emulator]:
    with served_emulator(tmp_path / "emulator") as emulator:
        yield emulator


def _workspace(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    (work / "wait.py").write_text(_WAIT)
    (work / "ok.py").write_text("print('fine')\n")
    return work


def _listed() -> RunsListEnvelope:
    done = tpulab("runs", "list", "--json")
    assert done.returncode == EXIT_OK, done.stderr
    return RunsListEnvelope.model_validate_json(done.stdout)


def _line_of(run_id: str) -> str:
    table = tpulab("runs", "list")
    assert table.returncode == EXIT_OK, table.stderr
    (line,) = [line for line in table.stdout.splitlines() if line.startswith(run_id)]
    return line


def _kill_mid_command(process: subprocess.Popen[str], marker: Path, out: Path) -> str:
    """Wait until the command runs, check the start record says so, SIGKILL; its run id."""
    _wait_for(marker, process)
    run_id = marker.read_text()
    started = json.loads((out / "run.json").read_text())
    assert (started["state"], started["run_id"]) == ("running", run_id)
    assert started["workload"]["out"] == str(out)
    # Its writer is alive: running, not interrupted.
    listed = _listed()
    assert run_id in [record.run_id for record in listed.runs]
    assert run_id not in listed.interrupted
    assert "running" in _line_of(run_id)
    process.kill()
    process.communicate(timeout=60)
    return run_id


def test_a_sigkilled_exec_is_listed_as_interrupted_with_its_out_dir(
    served: Emulator, tmp_path: Path
) -> None:
    up(served, "rec", "--ttl", "1h", "--idle", "10m")
    work = _workspace(tmp_path)
    # A normal exec first (a killed one's command would keep the session busy).
    done = tpulab(
        "exec", "rec", "--workdir", str(work), "--out", str(tmp_path / "ok"), "--",
        "python", "ok.py", timeout=300,
    )  # fmt: skip
    assert done.returncode == EXIT_OK, done.stderr + done.stdout

    out = tmp_path / "killed"
    marker = tmp_path / "marker"
    process = _exec_in_background(
        "rec", "--workdir", str(work), "--out", str(out), "--", "python", "wait.py", str(marker)
    )
    run_id = _kill_mid_command(process, marker, out)

    listed = _listed()
    assert listed.interrupted == [run_id]
    killed = next(record for record in listed.runs if record.run_id == run_id)
    assert (killed.state, killed.command, killed.session) == ("running", "exec", "rec")
    assert killed.workload.out == str(out)
    finished = next(record for record in listed.runs if record.run_id != run_id)
    assert (finished.state, finished.workload.exit_status) == ("finished", 0)
    line = _line_of(run_id)
    assert "interrupted" in line
    assert f"out {out}" in line
    assert "exit 0" in _line_of(finished.run_id)
    shown = tpulab("runs", "show", run_id)
    assert shown.returncode == EXIT_OK, shown.stderr
    said = " ".join(shown.stdout.split())
    assert "interrupted: process" in said
    assert "may still run on session rec's node" in said
    assert str(out) in said

    down = tpulab("down", "rec", timeout=120)
    assert down.returncode == EXIT_OK, down.stderr
    assert served.node_names(PROJECT) == []


def test_a_sigkilled_run_is_listed_as_interrupted_and_its_node_swept(
    served: Emulator, tmp_path: Path
) -> None:
    work = _workspace(tmp_path)
    out = tmp_path / "killed"
    marker = tmp_path / "marker"
    argv = [
        sys.executable, "-m", "tpulab", "run", "--accelerator", "v5litepod-4",
        "--api-endpoint", served.url, "--project", PROJECT, "--zone", ZONE,
        "--boot-timeout", "30", "--workdir", str(work), "--out", str(out), "--",
        "python", "wait.py", str(marker),
    ]  # fmt: skip
    process = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        run_id = _kill_mid_command(process, marker, out)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate(timeout=60)

    listed = _listed()
    assert listed.interrupted == [run_id]
    (killed,) = listed.runs
    assert (killed.state, killed.command, killed.accelerator_type) == (
        "running",
        "run",
        "v5litepod-4",
    )
    assert "interrupted" in _line_of(run_id)
    shown = tpulab("runs", "show", run_id)
    said = " ".join(shown.stdout.split())
    assert "tpulab teardown --verify" in said
    assert "teardown not recorded" in said  # not the start record's "not-created"

    # The node it left is the sweep's, as after any SIGKILL.
    swept = tpulab(
        "teardown", "--verify", "--yes", "--run-id", run_id, "--api-endpoint", served.url,
        "--project", PROJECT, "--timeout", "60", timeout=180,
    )  # fmt: skip
    assert swept.returncode == EXIT_OK, swept.stderr + swept.stdout
    assert served.node_names(PROJECT) == []
