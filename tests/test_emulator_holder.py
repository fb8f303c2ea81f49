"""The holder (tpulab/emulator/holder.py): the parent of every command an emulated node
runs. The command gets what sshd would give it (a session of its own, SIGPIPE and
SIGXFSZ at their defaults), its status comes back on a pipe and as the holder's exit
code, and whatever it leaves running stays in the holder's process tree until it ends.
Real processes throughout: the holder is run exactly as the emulator runs it (`held`)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from helpers import wait_until

from tpulab.emulator.processes import held


def _run_held(argv: list[str]) -> tuple[subprocess.CompletedProcess[str], str]:
    """The holder over `argv`, to the end; what it wrote to its status pipe."""
    read, write = os.pipe()
    try:
        done = subprocess.run(
            held(argv, status_fd=write),
            pass_fds=(write,),
            capture_output=True,
            text=True,
            timeout=30,
        )
    finally:
        os.close(write)
    with os.fdopen(read) as status:
        return done, status.read()


def _proc_stat(pid: int) -> list[str]:
    """/proc/PID/stat's fields after the command name (which may hold spaces)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2 :].split()


def test_the_command_has_a_session_of_its_own_and_the_signals_sshd_leaves_at_default() -> None:
    # dash changes neither signal, so what it reports is what the holder gave it; a
    # Python command would not do: Python ignores SIGPIPE itself at start.
    script = 'echo "$$"; cut -d")" -f2 /proc/$$/stat; grep "^SigIgn:" /proc/$$/status'
    done, status = _run_held(["dash", "-c", script])
    assert (done.returncode, status) == (0, "0"), done.stderr
    pid_line, stat_line, ignored_line = done.stdout.splitlines()
    pid, session = int(pid_line), int(stat_line.split()[3])  # state ppid pgrp session
    assert session == pid, "the command must lead a session of its own, as under sshd"
    ignored = int(ignored_line.split()[1], 16)
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):
        assert not ignored & (1 << (sig - 1)), f"{sig.name} is ignored in the command"


def test_the_status_comes_back_on_the_pipe_and_as_the_exit_code() -> None:
    done, status = _run_held(["sh", "-c", "exit 3"])
    assert (done.returncode, status) == (3, "3")
    done, status = _run_held(["sh", "-c", "kill -TERM $$"])
    assert (done.returncode, status) == (128 + signal.SIGTERM, f"-{int(signal.SIGTERM)}")


def test_a_command_that_cannot_run_says_why_and_ends_127() -> None:
    done, status = _run_held(["tpulab-no-such-command"])
    assert (done.returncode, status) == (127, "127")
    assert "tpulab-no-such-command: No such file or directory" in done.stderr


def test_what_the_command_leaves_running_stays_in_the_holders_tree() -> None:
    # The command daemonises a sleep (its own session, its parent gone) and exits.
    holder = subprocess.Popen(
        held(["sh", "-c", "setsid sleep 60 & echo $! $$"]), stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None
        orphan, command = (int(pid) for pid in holder.stdout.readline().split())
        # The command is gone (the holder reaped it): only now is the sleep an orphan.
        wait_until(lambda: not Path(f"/proc/{command}").exists(), "the command to exit")
        # Adopted by the holder (a child subreaper), not by init: the node's cleanup
        # finds it by ancestry. The holder waits for it before it exits.
        parent = int(_proc_stat(orphan)[1])
        assert parent == holder.pid
        assert holder.poll() is None, "the holder left while its adopted child lives"
        os.kill(orphan, signal.SIGKILL)
        assert holder.wait(timeout=30) == 0  # the command's own status, not the orphan's
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
