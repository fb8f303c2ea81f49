"""The exec lock: two `tpulab exec` on one session at once, exactly one runs; the lock
lives exactly as long as the SSH connection of the exec that took it (a SIGKILLed laptop
leaves no stale lock). Real subprocess CLIs against a served emulator whose node is a
real SSH server, and `Connection.hold` over both SSH backends (asyncssh and the system
sshd); nothing is mocked."""

from __future__ import annotations

import fcntl
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from helpers import advances, group_ended, served_emulator, tpulab, wait_until
from test_exec import (
    EXIT_OK,
    EXIT_REMOTE,
    PROJECT,
    ZONE,
    _exec_in_background,
    _wait_for,
    deletes,
    up,
)

from tpulab.emulator import Emulator
from tpulab.emulator.sshhost import EmbeddedHostBackend
from tpulab.remote import workload as wl
from tpulab.remote.ssh import Connection

if TYPE_CHECKING:
    from ssh_fixtures import SshHost

pytest_plugins = ["ssh_fixtures"]
pytestmark = pytest.mark.slow

# Says where it runs (the node's sandbox is on this machine), then waits for the test's
# go-ahead and reports the workspace file it finds THEN: a workspace swapped under it by
# a second exec's sync would show in the artifact it leaves.
_WAITER = """\
import os, pathlib, sys, time
started, go = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
started.write_text(os.getcwd())
deadline = time.monotonic() + 240
while not go.exists() and time.monotonic() < deadline:
    time.sleep(0.1)
message = pathlib.Path("message.txt").read_text()
pathlib.Path(os.environ["TPULAB_RUN_DIR"], "result.txt").write_text(message)
print("read", message)
"""

# Keeps rewriting a marker until stopped (an orphan once its exec is SIGKILLed). Each
# file is written aside and renamed: one rewritten in place is empty for a moment that a
# reader can land in.
_LOOP = """\
import os, pathlib, sys, time
def put(path, text):
    aside = pathlib.Path(path + ".new")
    aside.write_text(text)
    os.replace(aside, path)
put(sys.argv[2], f"{os.getcwd()} {os.getpgrp()}")
for tick in range(3000):
    put(sys.argv[1], str(tick))
    time.sleep(0.1)
"""

_HELD = re.compile(
    r"Session (\S+) is busy: another exec holds its lock \(run (\S+) from (\S+) "
    r"\(pid (\d+)\), since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC\)\. "
    r"Nothing was synced or started\."
)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Emulator]:
    with served_emulator(tmp_path / "emulator") as emulator:
        yield emulator


def _lock_is_free(lock_file: Path) -> bool:
    """Can this machine take the VM's exec lock right now (the emulated node's disk)?"""
    with lock_file.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(handle, fcntl.LOCK_UN)
        return True


def _until(condition: object, what: str, seconds: float = 30) -> None:
    assert callable(condition)
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_two_execs_at_once_exactly_one_runs(served: Emulator, tmp_path: Path) -> None:
    node = up(served, "pair", "--ttl", "1h", "--idle", "10m")["node_name"]

    # The dry run shows the lock step: in CONNECT, after the connect and before the busy
    # check, the lease and the sync, with the exact command line the exec sends.
    work = {name: tmp_path / f"work-{name}" for name in ("a", "b")}
    for name, directory in work.items():
        directory.mkdir()
        (directory / "waiter.py").write_text(_WAITER)
        (directory / "message.txt").write_text(f"workspace {name}")
    plan = tpulab("exec", "pair", "--workdir", str(work["a"]), "--dry-run", "--json", "--", "true")
    assert plan.returncode == EXIT_OK, plan.stderr
    steps = json.loads(plan.stdout)["steps"]
    lines = [(s["phase"], s["action"], s.get("command") or "") for s in steps]
    (lock,) = [i for i, (_, _, line) in enumerate(lines) if wl.LOCK_PATH in line]
    assert lines[lock][0] == "connect"
    assert lines[lock][2].startswith("timeout --signal=KILL ")
    assert "fcntl.flock" in lines[lock][2]  # the script itself travels, as `python3 -c`
    assert "exec lock" in (steps[lock]["detail"] or "")
    connect = next(i for i, (_, action, _) in enumerate(lines) if action == "connect")
    busy = next(i for i, (_, _, line) in enumerate(lines) if "TPULAB_BUSY" in line)
    sync = next(i for i, (phase, _, _) in enumerate(lines) if phase == "sync")
    assert connect < lock < busy < sync

    go = tmp_path / "go"
    started = {name: tmp_path / f"started-{name}" for name in work}
    out = {name: tmp_path / f"out-{name}" for name in work}

    def start(name: str) -> subprocess.Popen[str]:
        return _exec_in_background(
            "pair", "--workdir", str(work[name]), "--out", str(out[name]), "--",
            "python", "waiter.py", str(started[name]), str(go),
        )  # fmt: skip

    execs = {name: start(name) for name in work}  # at once, as from two terminals
    # One command starts and waits for `go`; the other exec is refused meanwhile.
    try:
        deadline = time.monotonic() + 240
        while not any(path.exists() for path in started.values()):
            assert time.monotonic() < deadline, "neither command started"
            for name, process in execs.items():
                if process.poll() not in (None, EXIT_REMOTE):
                    pytest.fail(f"exec {name} ended: {process.communicate()}")
            time.sleep(0.1)
        (winner,) = [name for name, path in started.items() if path.exists()]
        loser = "b" if winner == "a" else "a"
        deadline = time.monotonic() + 180
        while execs[loser].poll() is None:
            assert not started[loser].exists(), "both execs started their command"
            assert time.monotonic() < deadline, "the second exec was neither refused nor run"
            time.sleep(0.1)
        _, refused_err = execs[loser].communicate(timeout=60)
        assert execs[loser].returncode == EXIT_REMOTE, refused_err
        lock_file = Path(started[winner].read_text()).parent / "exec.lock"
        assert not _lock_is_free(lock_file)  # held while the winner's command runs
    finally:
        go.write_text("go")
    won_out, won_err = execs[winner].communicate(timeout=240)
    assert execs[winner].returncode == EXIT_OK, won_err + won_out

    said = " ".join(refused_err.split())
    found = _HELD.search(said)
    assert found is not None, said
    record = json.loads((out[winner] / "run.json").read_text())
    assert found.groups() == (
        "pair",
        record["run_id"],
        socket.gethostname(),
        str(execs[winner].pid),
    )
    assert "Wait for that exec to finish, or look at the node with `tpulab ssh pair`" in said
    assert "An exec whose laptop lost power or its network lets go within 60 s." in said
    # The loser's command never ran and its workspace never reached the VM: the winner
    # read its own file when it went on, and only its artifacts came back.
    assert not started[loser].exists()
    assert (out[winner] / "run" / "result.txt").read_text() == f"workspace {winner}"
    assert f"read workspace {winner}" in (out[winner] / "output.log").read_text()
    assert not (out[loser] / "run" / "result.txt").exists()
    assert _lock_is_free(lock_file)  # the winner's end let it go
    # Nothing deleted: the session's node is still there, and the next exec runs.
    assert deletes(served) == []
    assert served.node_names(PROJECT) == [node]
    again = tpulab(
        "exec", "pair", "--workdir", str(work[loser]), "--out", str(tmp_path / "again"), "--",
        "python", "waiter.py", str(started[loser]), str(go), timeout=300,
    )  # fmt: skip
    assert again.returncode == EXIT_OK, again.stderr + again.stdout
    assert (tmp_path / "again" / "run" / "result.txt").read_text() == f"workspace {loser}"
    down = tpulab("down", "pair", timeout=120)
    assert down.returncode == EXIT_OK, down.stderr
    assert served.node_names(PROJECT) == []


def test_a_sigkilled_exec_leaves_no_stale_lock_only_its_orphan(
    served: Emulator, tmp_path: Path
) -> None:
    up(served, "orphan", "--ttl", "1h", "--idle", "10m")
    work = tmp_path / "work"
    work.mkdir()
    (work / "loop.py").write_text(_LOOP)
    marker, where = tmp_path / "marker", tmp_path / "where"
    first = _exec_in_background(
        "orphan", "--workdir", str(work), "--out", str(tmp_path / "first"), "--",
        "python", "loop.py", str(marker), str(where),
    )  # fmt: skip
    _wait_for(marker, first)
    cwd, pgid = where.read_text().rsplit(" ", 1)
    lock_file = Path(cwd).parent / "exec.lock"
    # While the exec runs its command, it holds the lock, and says who it is.
    assert not _lock_is_free(lock_file)
    note = json.loads(lock_file.read_text())
    assert (note["pid"], note["host"]) == (first.pid, socket.gethostname())

    first.kill()  # SIGKILL: no stop, no close; the SSH server sees the connection die
    first.communicate(timeout=60)
    _until(lambda: _lock_is_free(lock_file), "the lock outlived the killed exec's connection")
    advances(marker)  # ... but its command lives on

    # The next exec takes the (free) lock, and the busy check refuses it for the orphan.
    refused = tpulab(
        "exec", "orphan", "--workdir", str(work), "--out", str(tmp_path / "refused"), "--",
        "python", "-c", "open('ran', 'w')", timeout=300,
    )  # fmt: skip
    assert refused.returncode == EXIT_REMOTE, refused.stderr + refused.stdout
    said = " ".join(refused.stderr.split())
    assert "a command an earlier exec started still runs" in said, said
    assert f"process group {pgid} (python loop.py" in said, said
    assert "another exec holds its lock" not in said
    assert not (work / "ran").exists()
    assert not (Path(cwd) / "ran").exists()
    assert _lock_is_free(lock_file)  # the refused exec let go of it too

    os.killpg(int(pgid), signal.SIGTERM)  # the orphan stopped (its node is this machine)
    wait_until(lambda: group_ended(int(pgid)), f"the orphan's process group {pgid} to end")
    again = tpulab(
        "exec", "orphan", "--workdir", str(work), "--out", str(tmp_path / "again"), "--",
        "python", "-c", "print('after the orphan')", timeout=300,
    )  # fmt: skip
    assert again.returncode == EXIT_OK, again.stderr + again.stdout
    assert "after the orphan" in (tmp_path / "again" / "output.log").read_text()
    assert deletes(served) == []
    down = tpulab("down", "orphan", timeout=120)
    assert down.returncode == EXIT_OK, down.stderr
    assert served.node_names(PROJECT) == []


# A laptop-side process holding the lock over its own Connection, to be SIGKILLed.
_HOLDER = """\
import json, sys, time
from pathlib import Path
from tpulab.remote import workload as wl
from tpulab.remote.keys import HostKey, RunKey, SshTarget
from tpulab.remote.ssh import Connection
host, port, user, key_type, key_b64, key_file, silence, beat = sys.argv[1:]
target = SshTarget(host, int(port), user, HostKey(key_type, key_b64))
connection = Connection(target, RunKey.from_openssh_private(Path(key_file).read_bytes()))
answer = connection.hold(
    wl.lock_command(run_id="killed", host="laptop", pid=1, silence=float(silence)),
    timeout=600,
    answer_within=30,
    beat_every=float(beat),
)
print(json.dumps([answer.exit_status, answer.stdout]), flush=True)
time.sleep(600)
"""


def _hold(host: SshHost) -> tuple[int | None, wl.LockHolder | None, Connection]:
    connection = host.connect()
    answer = connection.hold(
        wl.lock_command(run_id="here", host="this", pid=os.getpid()),
        timeout=600,
        answer_within=30,
    )
    return answer.exit_status, wl.parse_lock_report(answer.stdout), connection


def _start_holder(
    ssh_host: SshHost,
    tmp_path: Path,
    silence: float = wl.LOCK_SILENCE_SECONDS,
    beat: float = wl.LOCK_BEAT_SECONDS,
) -> subprocess.Popen[str]:
    key_file = tmp_path / "key"
    key_file.write_bytes(ssh_host.key.openssh_private_bytes())
    target = ssh_host.target()
    return subprocess.Popen(
        [
            sys.executable, "-c", _HOLDER, target.host, str(target.port), target.user,
            target.host_key.key_type, target.host_key.b64, str(key_file), str(silence),
            str(beat),
        ],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def test_the_lock_lives_as_long_as_the_connection_that_took_it(
    ssh_host: SshHost, tmp_path: Path
) -> None:
    holder = _start_holder(ssh_host, tmp_path)
    try:
        assert holder.stdout is not None
        first = holder.stdout.readline()
        assert first, holder.communicate(timeout=30)
        status, said = json.loads(first)
        assert (status, said) == (None, wl.LOCKED_REPORT)
        # Held: another connection is told who holds it (the note the holder wrote).
        _, seen, other = _hold(ssh_host)
        with other:
            assert seen is not None
            assert (seen.run_id, seen.host, seen.pid) == ("killed", "laptop", 1)
            assert seen.since is not None
            assert abs(seen.since - time.time()) < 120
    finally:
        holder.kill()  # SIGKILL: the server closes the session, the lock goes with it
        holder.communicate(timeout=30)

    # Free within moments (the script's own wait covers the server's noticing).
    status, seen, mine = _hold(ssh_host)
    assert (status, seen) == (None, None)
    # A clean close lets go at once: the next exec from this laptop need not wait.
    mine.close()
    began = time.monotonic()
    status, seen, last = _hold(ssh_host)
    assert (status, seen) == (None, None)
    assert time.monotonic() - began < 1.5  # under the script's 2 s wait for a holder
    last.close()


def test_a_laptop_gone_silent_loses_the_lock_after_the_silence(
    ssh_host: SshHost, tmp_path: Path
) -> None:
    # A laptop that loses power or its network sends no FIN: its TCP connection stays
    # open on the VM (here: the holder process stopped, its socket left open), and only
    # the missing heartbeat can tell. Beats every 0.5 s keep a 5 s silence from passing.
    silence = 5.0
    holder = _start_holder(ssh_host, tmp_path, silence=silence, beat=0.5)
    try:
        assert holder.stdout is not None
        first = holder.stdout.readline()
        assert first, holder.communicate(timeout=30)
        assert json.loads(first) == [None, wl.LOCKED_REPORT]
        # Alive and beating: still its lock after more than the silence.
        time.sleep(2 * silence)
        _, seen, other = _hold(ssh_host)
        with other:
            assert seen is not None, "a beating holder lost the lock"
            assert seen.run_id == "killed"
        holder.send_signal(signal.SIGSTOP)  # no beats, no FIN

        def taken() -> bool:
            _, seen, mine = _hold(ssh_host)
            mine.close()
            return seen is None

        wait_until(taken, "the silent holder's lock to be let go")
    finally:
        holder.kill()
        holder.communicate(timeout=30)


def test_the_lock_script_lets_go_after_a_silence(tmp_path: Path) -> None:
    argv = wl.lock_command(run_id="silent", host="laptop", pid=7, silence=1.0)
    argv[0] = sys.executable
    argv[argv.index(wl.LOCK_PATH)] = str(tmp_path / "exec.lock")
    # Its stdin stays open and says nothing: only the silence can end it.
    silent = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert silent.stdout is not None
        assert silent.stdout.readline() == wl.LOCKED_REPORT
        assert silent.wait(timeout=60) == 0
        assert silent.stderr is not None
        assert "no heartbeat from the exec for 1 s: letting go" in silent.stderr.read()
    finally:
        silent.kill()
        silent.communicate()
    again = subprocess.run(argv, input="", capture_output=True, text=True, timeout=60)
    assert wl.parse_lock_report(again.stdout) is None, again.stderr  # free again


@pytest.mark.parametrize("version", ["3", "3.10", "3.12", "3.13"])
def test_the_lock_script_on_each_python(tmp_path: Path, version: str) -> None:
    # The VM's own python3 runs it (Ubuntu 22.04 has 3.10): run it here, the way the
    # exec starts it, with a pipe for the stdin whose EOF ends the hold; under this
    # machine's python3 always, and under each newer one that is installed.
    from helpers import require_python

    python = require_python(version)

    def start(run_id: str) -> subprocess.Popen[str]:
        argv = wl.lock_command(run_id=run_id, host="laptop", pid=7)
        argv[0] = python
        argv[argv.index(wl.LOCK_PATH)] = str(tmp_path / "lab" / "exec.lock")
        return subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    first = start("first")
    try:
        assert first.stdout is not None
        assert first.stdout.readline() == wl.LOCKED_REPORT
        second = start("second")
        said, errors = second.communicate(timeout=30)
        assert second.returncode == 0, errors
        holder = wl.parse_lock_report(said)
        assert holder is not None
        assert (holder.run_id, holder.host, holder.pid) == ("first", "laptop", 7)
        assert first.poll() is None  # still holding
    finally:
        try:
            first.communicate(timeout=30)  # EOF on its stdin: it lets go and ends
        finally:
            first.kill()  # (a no-op once it has ended) never left behind by a failure
    assert first.returncode == 0
    third = start("third")
    said, errors = third.communicate(timeout=30)
    assert wl.parse_lock_report(said) is None, errors  # free again


@pytest.mark.parametrize(
    ("stdout", "holder"),
    [
        (wl.LOCKED_REPORT, None),
        ("noise\nTPULAB_LOCK held {}\n", wl.LockHolder(None, None, None, None)),
        (
            'TPULAB_LOCK held {"run_id": "r", "host": "h", "pid": 3, "since": 1.5}\n',
            wl.LockHolder("r", "h", 3, 1.5),
        ),
    ],
)
def test_the_lock_report_is_read_strictly(stdout: str, holder: wl.LockHolder | None) -> None:
    assert wl.parse_lock_report(stdout) == holder


@pytest.mark.parametrize("stdout", ["", "Traceback ...\n", "TPULAB_LOCK maybe\n"])
def test_an_unreadable_lock_report_is_an_error(stdout: str) -> None:
    with pytest.raises(ValueError, match=r"TPULAB_LOCK|lock script"):
        wl.parse_lock_report(stdout)


def test_an_exec_whose_connection_drops_follows_its_command_and_holds_the_lock_again(
    served: Emulator, tmp_path: Path
) -> None:
    """A network blip under an exec (the VM resets every SSH connection): the command
    runs on, the exec reconnects and follows it to its end, and takes the session's exec
    lock again -- which went with the old connection -- so a `down` or another exec meets
    it meanwhile."""
    from tpulab.emulator.state import node_key
    from tpulab.emulator.workers import worker_key

    node = str(up(served, "blip", "--ttl", "1h", "--idle", "10m")["node_name"])
    work = tmp_path / "work"
    work.mkdir()
    (work / "waiter.py").write_text(_WAITER)
    (work / "message.txt").write_text("after the blip")
    started, go, out = tmp_path / "started", tmp_path / "go", tmp_path / "out"
    execution = _exec_in_background(
        "blip", "--workdir", str(work), "--out", str(out), "--",
        "python", "waiter.py", str(started), str(go),
    )  # fmt: skip
    try:
        _wait_for(started, execution)
        lock_file = Path(started.read_text()).parent / "exec.lock"
        before = json.loads(lock_file.read_text())
        assert not _lock_is_free(lock_file)
        hosts = served.host_backend
        assert isinstance(hosts, EmbeddedHostBackend)
        assert hosts.drop_connections(worker_key(node_key(PROJECT, ZONE, node), 0)) >= 1

        # The exec's new connection holds the lock again: a new holder, since the drop.
        def held_again() -> bool:
            try:
                now = json.loads(lock_file.read_text())
            except ValueError:  # being rewritten
                return False
            return now["since"] > before["since"] and not _lock_is_free(lock_file)

        _until(held_again, "the exec never took its lock again", seconds=120)
        assert execution.poll() is None  # still following its command
    finally:
        go.write_text("go")
    stdout, stderr = execution.communicate(timeout=240)
    assert execution.returncode == EXIT_OK, stderr + stdout
    said = " ".join((stdout + stderr).split())
    assert "dropped while your command ran" in said
    assert "reconnected to the VM; following your command" in said
    assert (out / "run" / "result.txt").read_text() == "after the blip"
    assert _lock_is_free(lock_file)  # the exec's end let it go
    assert deletes(served) == []
    down = tpulab("down", "blip", timeout=120)
    assert down.returncode == EXIT_OK, down.stderr
    assert served.node_names(PROJECT) == []
