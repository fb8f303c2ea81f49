"""The launcher's --follow: how a run keeps a command its laptop lost the connection to.

remote_payloads/workload_launcher.py run as the VM runs it (real subprocesses, the VM
image's Python 3.10): a launch goes on without its SSH session, and a later
`--follow` copies what its log gains and then reports its result as the launch would
have; it says so, rather than wait, when that launch never began or its launcher died.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from helpers import require_python

from tpulab.remote.workload import follow_failure, parse_launch_report

LAUNCHER = Path(__file__).resolve().parent.parent / "remote_payloads" / "workload_launcher.py"
# Prints one line, waits for the test's go (a file), prints another and exits 5.
WAITS = """
import os, sys, time
print("before the follow", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.02)
print("after the follow began", flush=True)
sys.exit(5)
"""


def _python() -> str:
    return require_python("3.10")


def _layout(tmp_path: Path) -> dict[str, Path]:
    return {name: tmp_path / "run" / name for name in ("out", "output.log", "pid", "status")}


def _launch(tmp_path: Path, run_id: str, *command: str) -> subprocess.Popen[bytes]:
    """A launch whose SSH session is already gone: nobody reads its stdout or stderr."""
    layout = _layout(tmp_path)
    return subprocess.Popen(
        [
            _python(), str(LAUNCHER), "--workspace", str(tmp_path),
            "--run-dir", str(layout["out"]), "--log", str(layout["output.log"]),
            "--pid-file", str(layout["pid"]), "--status", str(layout["status"]),
            "--venv", str(tmp_path / "venv"), "--timeout", "120", "--", *command,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "TPULAB_RUN_ID": run_id},
    )  # fmt: skip


def _follow(tmp_path: Path, run_id: str, wait: float = 10.0) -> subprocess.Popen[bytes]:
    layout = _layout(tmp_path)
    return subprocess.Popen(
        [
            _python(), str(LAUNCHER), "--follow", "--status", str(layout["status"]),
            "--log", str(layout["output.log"]), "--run-id", run_id, "--wait", f"{wait:g}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )  # fmt: skip


def _running(status: Path, within: float = 60) -> dict[str, object]:
    """The launcher's status once it says the command runs."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            said = json.loads(status.read_text())
        except (OSError, ValueError):
            said = {}
        if said.get("running"):
            return said  # type: ignore[no-any-return]
        time.sleep(0.02)
    raise AssertionError("the launcher never said its command runs")


def test_a_follow_copies_what_the_log_gains_then_reports_the_result(tmp_path: Path) -> None:
    go = tmp_path / "go"
    launch = _launch(tmp_path, "run-a", _python(), "-c", WAITS, str(go))
    try:
        status = _running(_layout(tmp_path)["status"])
        assert status["run_id"] == "run-a"
        assert status["launcher_pid"] == launch.pid
        deadline = time.monotonic() + 60
        log = _layout(tmp_path)["output.log"]
        while b"before the follow" not in log.read_bytes():
            assert time.monotonic() < deadline
            time.sleep(0.02)
        follow = _follow(tmp_path, "run-a")
        # It takes up the log at its end, and says where: from there on, what the
        # command writes once it goes on.
        assert follow.stderr is not None
        took_up = follow.stderr.readline()
        assert took_up == f"TPULAB_FOLLOW from {log.stat().st_size}\n".encode()
        go.touch()
        out, rest = follow.communicate(timeout=60)
        err = took_up + rest
    finally:
        launch.wait(timeout=60)
    assert follow.returncode == 0, err
    assert out == b"after the follow began\n"
    report = parse_launch_report(err.decode())
    assert report is not None
    assert (report.exit_status, report.started, report.timed_out) == (5, True, False)
    assert launch.returncode == 5


def test_a_follow_of_a_launch_that_never_began_says_so(tmp_path: Path) -> None:
    # The status file a session's earlier exec left: another run's.
    status = _layout(tmp_path)["status"]
    status.parent.mkdir(parents=True)
    status.write_text(json.dumps({"run_id": "earlier", "exit_status": 0}))
    started = time.monotonic()
    out, err = _follow(tmp_path, "this-run", wait=0.5).communicate(timeout=60)
    assert time.monotonic() - started < 30
    assert out == b""
    assert follow_failure(err.decode()) == "not-started"
    assert parse_launch_report(err.decode()) is None


def test_a_follow_of_a_launcher_that_died_says_so(tmp_path: Path) -> None:
    go = tmp_path / "go"
    launch = _launch(tmp_path, "run-k", _python(), "-c", WAITS, str(go))
    status = _running(_layout(tmp_path)["status"])
    try:
        launch.send_signal(signal.SIGKILL)  # the VM's OOM killer, say: no result written
        launch.wait(timeout=60)
        follow = _follow(tmp_path, "run-k")
        _out, err = follow.communicate(timeout=60)
    finally:
        os.killpg(int(str(status["pgid"])), signal.SIGKILL)  # the command it left
    assert follow.returncode == 4
    assert follow_failure(err.decode()) == "launcher-died"
    assert parse_launch_report(err.decode()) is None
