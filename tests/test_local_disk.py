"""What this machine's disk refuses, said as such: a run whose journal cannot be written,
and a `tpulab run -- CMD` whose artifacts do not fit.

The controller runs with RLIMIT_FSIZE (util-linux's prlimit sets it and execs the
command): its files may not grow past the limit, and a write past it fails with EFBIG,
"File too large", as a full disk's fails with ENOSPC (both were tried by hand on a
tmpfs of 1-2 MiB). The emulator and its nodes run in this test's process, without the
limit, so only the laptop's side fails. Python starts with SIGXFSZ ignored, so the write
raises rather than killing the process.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from helpers import require_tool

from tpulab.cleanup.journal import Journal
from tpulab.exits import EXIT_LOCAL_STATE

if TYPE_CHECKING:
    from emulator_fixtures import EmulatorStarter

    from tpulab.emulator import Emulator

pytest_plugins = ["emulator_fixtures"]

PROJECT, ZONE = "disk-project", "us-central1-a"
LIMIT = 2**20  # what the controller may write to any one file


@pytest.fixture
def served(start_emulator: EmulatorStarter, tmp_path: Path) -> Iterator[Emulator]:
    from tpulab.emulator.backends import make_host_backend

    backend = make_host_backend("embedded", tmp_path / "ssh-hosts", image="preloaded")
    try:
        yield start_emulator(tmp_path / "served", host_backend=backend)
    finally:
        backend.close()


def _capped(limit: int, *argv: str) -> subprocess.CompletedProcess[str]:
    """`python -m tpulab ARGV` whose files may not grow past `limit` bytes (a preexec_fn
    would run in a fork of this threaded process; prlimit is a process of its own)."""
    require_tool(shutil.which("prlimit") is not None, "prlimit (util-linux)")
    return subprocess.run(
        ["prlimit", f"--fsize={limit}:unlimited", sys.executable, "-m", "tpulab", *argv],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "COLUMNS": "250"},
        check=False,
    )


def test_a_journal_the_disk_refuses_is_exit_8_not_damage_and_creates_nothing(
    served: Emulator,
) -> None:
    """A disk that refuses the journal's growth is not a damaged journal: the message
    says so, and does not send the user to move a sound journal (and its open rows)
    aside, which a full disk would refuse again. It used to say "is unreadable ... Move
    it aside (mv ... .corrupt)". The run stops before its create."""
    journal = Journal()
    done = _capped(
        4096,  # an SQLite page: the new journal's first write past it is refused
        "run", "--accelerator", "v5litepod-4", "--api-endpoint", served.url,
        "--project", PROJECT, "--zone", ZONE,
    )  # fmt: skip
    said = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == EXIT_LOCAL_STATE, said
    assert "Traceback" not in said
    assert f"The run journal {journal.path} cannot be written (disk I/O error)." in said
    assert "The journal is not damaged: keep it." in said
    assert "Move it aside" not in said
    assert served.calls["create_node"] == 0
    assert served.node_names(PROJECT) == []


def test_artifacts_this_machine_cannot_write_are_exit_8_named_and_nothing_is_left(
    served: Emulator, tmp_path: Path
) -> None:
    """It used to end in a traceback (exit 1), or read as "the SSH connection failed ...
    the VM may have been preempted" (exit 4), depending on when the refusal surfaced."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "big.py").write_text(
        "import os\n"
        "os.makedirs('results', exist_ok=True)\n"
        "open('results/big.bin', 'wb').write(os.urandom(3 * 2**20))\n"
    )
    out = tmp_path / "out"
    done = _capped(
        LIMIT,
        "run", "--accelerator", "v5litepod-4", "--api-endpoint", served.url,
        "--project", PROJECT, "--zone", ZONE, "--workdir", str(work), "--out", str(out),
        "--fetch", "results/", "--", "python", "big.py",
    )  # fmt: skip
    said = done.stdout + done.stderr
    assert done.returncode == EXIT_LOCAL_STATE, said
    assert "Traceback" not in said
    assert f"The artifacts could not be written into {out} on this machine: File too large" in (
        " ".join(done.stderr.split())
    ), done.stderr
    assert "Free space on that disk, or pass --out on another one" in " ".join(said.split())
    # Not the VM's or the connection's failure.
    assert "SSH connection" not in said
    assert "preempted" not in said
    # What fully arrived before the refusal (the log: first in the archive, and small)
    # is kept, checked against the VM's sha256; the file past the limit is not.
    assert "artifacts PARTLY fetched: 1 files" in done.stdout
    assert "deleted, confirmed by list" in done.stdout
    # The record (a small file) still says how the run ended, and why not all came back.
    record = json.loads((out / "run.json").read_text())
    assert record["error"]["type"] == "ArtifactWriteError"
    assert record["error"]["exit_status"] == EXIT_LOCAL_STATE
    assert "could not be written" in record["workload"]["fetch_problem"]
    assert record["workload"]["exit_status"] == 0  # the command itself succeeded
    manifest = json.loads((out / "manifest.json").read_text())
    assert [entry["path"] for entry in manifest["files"]] == ["output.log"]
    assert manifest["complete"] is False
    assert not (out / "workspace").exists()
    assert [p.name for p in out.iterdir() if p.name.startswith(".tpulab-fetch-")] == []
    # Nothing billing, nothing open.
    assert served.node_names(PROJECT) == []
    (row,) = Journal().all_runs()
    assert row.teardown == "confirmed"
