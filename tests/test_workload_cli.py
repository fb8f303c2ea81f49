"""`tpulab run --emulate ... -- CMD` as a user types it (a real subprocess, the bare image):
the README's course lab comes back with its checkpoints; a failing command is exit 9 with
its own status in --json and in the summary, its artifacts fetched (a link leading out
of the workspace named, not followed); --quiet keeps its lines out of the terminal
(they stay in the fetched log); the emulator is left with no node either way."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from emulator_fixtures import embedded_nodes_left

from tpulab.exits import EXIT_OK, EXIT_WORKLOAD

pytest_plugins = ["emulator_fixtures"]

pytestmark = pytest.mark.slow

LAB = Path(__file__).resolve().parent.parent / "examples" / "course_lab"


def tpulab(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tpulab", *args],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=cwd,
        env={**os.environ, "COLUMNS": "250"},
        check=False,
    )


def test_the_readme_course_lab_comes_back(
    preloaded_embedded_emulator: Path, tmp_path: Path
) -> None:
    out = tmp_path / "lab-out"
    done = tpulab(
        "run", "--accelerator", "v5litepod-4", "--emulate", "--workdir", str(LAB),
        "--fetch", "train.py", "--out", str(out),
        "--", "python", "train.py", "--run-dir", "$TPULAB_RUN_DIR", "--steps", "20",
    )  # fmt: skip
    assert done.returncode == EXIT_OK, done.stderr + done.stdout
    assert "cmd ┃ training on 4 cpu device(s) for 20 steps" in done.stdout
    assert "image     preloaded (" in done.stdout  # the fixture's image.json reached the node
    # Shown as it could be pasted (shlex.join): the VM substitutes the quoted variable.
    assert "command   python train.py --run-dir '$TPULAB_RUN_DIR' --steps 20  exit 0" in done.stdout
    assert (out / "run" / "checkpoints" / "step_00020.npz").is_file()
    metrics = (out / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(metrics) == 20
    assert json.loads((out / "run" / "device_receipt.json").read_text())["device_count"] == 4
    workload = json.loads((out / "run.json").read_text())["workload"]
    assert workload["exit_status"] == 0
    # It writes only into TPULAB_RUN_DIR (and bytecode, never named): nothing is left.
    assert workload["fetch_left"] == {"files": 0, "bytes": 0, "first": [], "complete": True}
    assert workload["reconnects"] == 0
    assert "  left  " not in done.stdout
    assert embedded_nodes_left() == []


def test_a_failing_command_is_exit_9_with_its_own_status(
    preloaded_embedded_emulator: Path, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "fail.py").write_text(
        "import os\n"
        "os.symlink('/etc', 'etc-link')  # a link out of the workspace, for the fetch\n"
        "print('about to fail', flush=True)\nraise SystemExit(6)\n"
    )
    done = tpulab(
        "run", "--accelerator", "v5litepod-1", "--emulate", "--json", "--quiet",
        "--workdir", str(work), "--out", str(tmp_path / "out"), "--fetch", "**",
        "--", "python", "fail.py",
    )  # fmt: skip
    # The command's own 6 must not read as tpulab's 6 ("teardown NOT confirmed").
    assert done.returncode == EXIT_WORKLOAD, done.stderr + done.stdout
    result: dict[str, Any] = json.loads(done.stdout)
    assert result["ok"] is False
    assert result["workload"]["exit_status"] == 6
    assert result["error"]["type"] == "WorkloadFailedError"
    assert result["error"]["exit_status"] == EXIT_WORKLOAD
    assert result["teardown"]["confirmed"] is True
    assert "about to fail" not in done.stderr  # --quiet: only logged ...
    assert "about to fail" in (tmp_path / "out" / "output.log").read_text()  # ... and fetched
    # A failed command's artifacts come back all the same, never through a link out.
    assert (tmp_path / "out" / "workspace" / "fail.py").is_file()
    assert result["workload"]["fetch_skipped"] == ["workspace/etc-link -> /etc"]
    assert not (tmp_path / "out" / "workspace" / "etc-link").exists()
    assert embedded_nodes_left() == []


def test_sigkill_during_the_command_leaves_a_node_that_teardown_verify_deletes(
    preloaded_embedded_emulator: Path, tmp_path: Path
) -> None:
    from tpulab.cleanup.journal import Journal

    marker = tmp_path / "command-running"
    work = tmp_path / "work"
    work.mkdir()
    (work / "wait.py").write_text(
        f"import time\nopen({str(marker)!r}, 'w').write('1')\ntime.sleep(300)\n"
    )
    run = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tpulab",
            "run",
            "--accelerator",
            "v5litepod-1",
            "--emulate",
            "--workdir",
            str(work),
            "--out",
            str(tmp_path / "out"),
            "--",
            "python",
            "wait.py",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 600
        while not marker.exists() and time.monotonic() < deadline and run.poll() is None:
            time.sleep(0.1)
        assert marker.exists(), "the command never started"
        run.kill()  # SIGKILL: no teardown, exactly like a laptop that died
        run.wait(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
    (row,) = Journal().open_runs()
    assert row.phase == "workload"  # the journal knew where the run was
    assert embedded_nodes_left() == [row.node_name]
    swept = tpulab("teardown", "--verify", "--emulate", "--yes", "--run-id", row.run_id)
    assert swept.returncode == EXIT_OK, swept.stderr + swept.stdout
    assert embedded_nodes_left() == []
    assert Journal().open_runs() == []


_LIST_FILES = (
    "import os\n"
    "for root, dirs, files in os.walk('.'):\n"
    "    dirs[:] = [d for d in dirs if d != '.tpulab']\n"
    "    for name in files:\n"
    "        print('has', os.path.relpath(os.path.join(root, name)))\n"
)


def _excluding_workspace(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    (work / "data").mkdir(parents=True)
    (work / "pyproject.toml").write_text('[tool.tpulab]\nexclude = ["data/"]\n')
    (work / "data" / "big.bin").write_text("bulk")
    (work / "notes.tmp").write_text("scratch")
    (work / "list.py").write_text(_LIST_FILES)
    return work


def test_exclude_adds_to_the_files_patterns_and_nothing_excluded_is_uploaded(
    tmp_path: Path,
) -> None:
    from helpers import served_emulator

    work = _excluding_workspace(tmp_path)
    out = tmp_path / "out"
    with served_emulator(tmp_path / "emulator") as emulator:
        where = ("--api-endpoint", emulator.url, "--project", "p", "--zone", "us-central1-a")
        # The plan says where the patterns came from: the file's and the flag's.
        plan = tpulab(
            "run", "--accelerator", "v5litepod-1", *where, "--workdir", str(work),
            "--exclude", "*.tmp", "--dry-run", "--json", "--", "python", "list.py",
        )  # fmt: skip
        assert plan.returncode == EXIT_OK, plan.stderr
        assert json.loads(plan.stdout)["sources"]["exclude"] == (
            "pyproject.toml [tool.tpulab] + --exclude"
        )
        done = tpulab(
            "run", "--accelerator", "v5litepod-1", *where, "--boot-timeout", "60",
            "--workdir", str(work), "--out", str(out), "--exclude", "*.tmp",
            "--", "python", "list.py",
        )  # fmt: skip
        assert done.returncode == EXIT_OK, done.stderr + done.stdout
        # Neither the file's data/ nor the flag's *.tmp reached the VM.
        seen = sorted(
            line.split(" ", 1)[1]
            for line in (out / "output.log").read_text().splitlines()
            if line.startswith("has ")
        )
        assert seen == ["list.py", "pyproject.toml"]
        record = json.loads((out / "run.json").read_text())
        assert sorted(entry["path"] for entry in record["upload"]) == seen

        # A bad pattern: exit 2, naming it, before any API call; nothing created.
        before = len(emulator.requests())
        refused = tpulab(
            "run", "--accelerator", "v5litepod-1", *where, "--workdir", str(work),
            "--out", str(tmp_path / "refused"), "--exclude", "data/../..", "--",
            "python", "list.py",
        )  # fmt: skip
        assert refused.returncode == 2, refused.stderr + refused.stdout
        assert "--exclude 'data/../..' names nothing inside the workspace" in refused.stderr
        assert len(emulator.requests()) == before
        assert not (tmp_path / "refused").exists()
        assert emulator.node_names("p") == []
