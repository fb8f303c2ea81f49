"""`tpulab exec` on a session whose node still runs a command an earlier exec started
(that exec SIGKILLed, or running in another terminal): refused in CONNECT, before the
sync or the launcher changes anything. Real subprocesses against a served emulator whose
node is a real SSH server; nothing is mocked."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import advances, group_ended, require_tool, served_emulator, tpulab, wait_until
from test_exec import EXIT_OK, EXIT_REMOTE, PROJECT, _exec_in_background, _wait_for, deletes, up

from tpulab.emulator import Emulator

pytestmark = pytest.mark.slow

# Reads the workspace file by its path each time (a workspace swapped under it would
# show) and keeps rewriting a marker the test watches: written aside and renamed, since
# a file rewritten in place is empty for a moment that a reader can land in.
_LOOP = """\
import os, pathlib, sys, time
source = pathlib.Path(os.getcwd(), "message.txt")
marker = pathlib.Path(sys.argv[1])
aside = marker.with_name(marker.name + ".new")
for tick in range(3000):
    aside.write_text(f"{source.read_text()} {tick}")
    os.replace(aside, marker)
    time.sleep(0.1)
"""


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Emulator]:
    with served_emulator(tmp_path / "emulator") as emulator:
        yield emulator


def test_exec_is_refused_while_an_earlier_command_runs(served: Emulator, tmp_path: Path) -> None:
    up(served, "busy", "--ttl", "1h", "--idle", "10m")
    work = tmp_path / "work"
    work.mkdir()
    (work / "loop.py").write_text(_LOOP)
    (work / "message.txt").write_text("first")
    marker = tmp_path / "marker"
    first = _exec_in_background(
        "busy", "--workdir", str(work), "--out", str(tmp_path / "first"), "--",
        "python", "loop.py", str(marker),
    )  # fmt: skip
    _wait_for(marker, first)
    first.kill()  # SIGKILL: no stop reaches the VM, so its command lives on there
    first.communicate(timeout=60)
    advances(marker)

    # The dry run lists the check, in CONNECT before the lease and the sync (it contacts
    # nothing, so it plans for a node where nothing runs).
    plan = tpulab("exec", "busy", "--workdir", str(work), "--dry-run", "--json", "--", "true")
    assert plan.returncode == EXIT_OK, plan.stderr
    commands = [(s["phase"], s.get("command") or "") for s in json.loads(plan.stdout)["steps"]]
    (check,) = [i for i, (_, line) in enumerate(commands) if "TPULAB_BUSY" in line]
    assert commands[check][0] == "connect"
    lease = next(i for i, (_, line) in enumerate(commands) if "tpulab-lease" in line)
    sync = next(i for i, (phase, _) in enumerate(commands) if phase == "sync")
    assert check < lease < sync

    (work / "message.txt").write_text("second")
    other = tmp_path / "other"
    refused = tpulab(
        "exec", "busy", "--workdir", str(work), "--out", str(tmp_path / "refused"), "--",
        "python", "-c", "import sys; open(sys.argv[1], 'w').write('ran')", str(other),
        timeout=300,
    )  # fmt: skip
    assert refused.returncode == EXIT_REMOTE, refused.stderr + refused.stdout
    said = " ".join(refused.stderr.split())
    found = re.search(
        r"Session busy is busy: .* process group (\d+) \(python loop\.py (\S+)\), "
        r"since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC\. Nothing was synced or started\.",
        said,
    )
    assert found is not None, said
    pgid = found.group(1)
    assert found.group(2) == str(marker)
    stop = f"tpulab ssh busy -- kill -s TERM -- -{pgid}"
    assert f"Wait for it to finish, or stop it with `{stop}`" in said
    # Nothing changed under the running command: no second command, its workspace file
    # not replaced, its marker still advancing.
    assert not other.exists()
    assert advances(marker).startswith("first ")

    stopped = tpulab(*stop.split()[1:], timeout=60)
    assert stopped.returncode == EXIT_OK, stopped.stderr
    # Ended: nothing of its process group is left (the node is this machine).
    wait_until(lambda: group_ended(int(pgid)), f"the command's process group {pgid} to end")

    # Its pid file stays behind (a dead group): stale, it does not block.
    pid_file = tpulab("ssh", "busy", "--", "cat", "jax-tpu-lab/run/command.pid", timeout=60)
    assert pid_file.stdout.strip() == pgid, pid_file.stderr
    again = tpulab(
        "exec", "busy", "--workdir", str(work), "--out", str(tmp_path / "again"), "--",
        "python", "-c", "print('read', open('message.txt').read())", timeout=300,
    )  # fmt: skip
    assert again.returncode == EXIT_OK, again.stderr + again.stdout
    assert "read second" in (tmp_path / "again" / "output.log").read_text()
    assert deletes(served) == []
    down = tpulab("down", "busy", timeout=120)
    assert down.returncode == EXIT_OK, down.stderr
    assert served.node_names(PROJECT) == []


@pytest.mark.parametrize("shell", ["sh", "dash", "bash"])
def test_the_busy_check_and_the_stop_read_a_real_process_group(tmp_path: Path, shell: str) -> None:
    # The VM runs these scripts with its sh: dash on Debian and Ubuntu images, which
    # rejects `kill -0 -- -PGID`. Run here, under each shell, against a real group.
    from tpulab.remote import workload as wl

    require_tool(shutil.which(shell) is not None, shell)
    pid_file, status = tmp_path / "command.pid", tmp_path / "status.json"

    def run(argv: list[str]) -> str:
        argv = [shell, *argv[1:]]
        argv[argv.index(wl.PID_FILE)] = str(pid_file)
        if wl.STATUS_PATH in argv:
            argv[argv.index(wl.STATUS_PATH)] = str(status)
        return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout

    assert wl.parse_busy_report(run(wl.busy_command())) is None  # no pid file: nothing ran
    group = subprocess.Popen(["sleep", "60"], start_new_session=True)
    # Reaped as soon as it ends, as the launcher reaps its command (a zombie would
    # still count as a member of the group).
    reaper = threading.Thread(target=group.wait)
    reaper.start()
    try:
        pid_file.write_text(f"{group.pid}\n")
        status.write_text(json.dumps({"command": ["sleep", "60"], "pgid": group.pid}))
        busy = wl.parse_busy_report(run(wl.busy_command()))
        assert busy == wl.BusyCommand(group.pid, ["sleep", "60"], None)
        assert run(wl.stop_command(grace=1)).strip() == "TPULAB_STOP terminated"
        reaper.join(timeout=10)
        assert group.returncode == -signal.SIGTERM
    finally:
        group.kill()
        reaper.join()
    # The pid file of a dead group stays behind: stale, not busy.
    assert wl.parse_busy_report(run(wl.busy_command())) is None
    assert run(wl.stop_command(grace=1)).strip() == "TPULAB_STOP already ended"


def test_a_stop_returns_once_the_launcher_has_logged_the_last_output(tmp_path: Path) -> None:
    # The real launcher, here, with a command whose grandchild leaves the group but keeps
    # the output pipe: after the group dies the launcher waits for that pipe (5 s), then
    # logs and writes its final status. A stop must not return before that, or the fetch
    # that follows it could miss the log's last lines.
    import sys

    from tpulab import paths
    from tpulab.remote import workload as wl

    run = tmp_path / "run"
    files = {
        "log": run / "output.log", "pid": run / "command.pid", "status": run / "status.json",
    }  # fmt: skip
    work = tmp_path / "work"
    work.mkdir()
    holder = tmp_path / "holder.pid"
    script = f"setsid sleep 30 & echo $! > {holder}; echo before the stop; sleep 60"
    launcher = subprocess.Popen(
        [
            sys.executable, str(paths.payload_path(wl.LAUNCHER_NAME)),
            "--workspace", str(work), "--run-dir", str(run / "out"), "--log", str(files["log"]),
            "--pid-file", str(files["pid"]), "--status", str(files["status"]),
            "--venv", str(tmp_path / "venv"), "--timeout", "120", "--grace", "2",
            "--", "sh", "-c", script,
        ],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while "before the stop" not in (files["log"].read_text() if files["log"].exists() else ""):
            assert time.monotonic() < deadline, "the command never printed"
            time.sleep(0.1)
        argv = wl.stop_command(grace=2)
        argv[argv.index(wl.PID_FILE)] = str(files["pid"])
        argv[argv.index(wl.STATUS_PATH)] = str(files["status"])
        said = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True)
        assert said.stdout.strip() == "TPULAB_STOP terminated"
        # Returned only once the launcher was done: its final status, not "running".
        final = json.loads(files["status"].read_text())
        assert "running" not in final, final
        assert final["signal"] == signal.SIGTERM
        launcher.wait(timeout=30)
    finally:
        launcher.kill()
        launcher.communicate()
        if holder.exists():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(holder.read_text()), signal.SIGKILL)
