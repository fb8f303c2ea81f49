"""The init process of one emulated VM: runs its startup-script, then keeps the node's
processes on a leash until the node goes away. Stdlib only, run as a script:

    python -I guest_init.py LOG SCRIPT_DIR TAG_ENTRY      (env: the node's, cwd: HOME)

- Like google_metadata_script_runner: `/bin/bash -c SCRIPT_DIR/startup-script` (the
  kernel honours a `#!` line; without one bash runs it), output appended to LOG, and
  SCRIPT_DIR removed once the script exits (the runner's `defer os.RemoveAll(tmpDir)`).
- It is a child subreaper (Linux prctl), so whatever the script daemonises (setsid,
  double fork) is re-parented to it rather than to the machine's init: it reaps them and
  they stay in its process tree.
- The node is gone when its stdin reaches EOF (the emulator closed the pipe, or died,
  even by SIGKILL) or on SIGTERM: then it SIGKILLs every descendant and every process
  whose environment holds TAG_ENTRY (`TPULAB_EMULATED_NODE=<tag>`), and exits.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

_PR_SET_CHILD_SUBREAPER = 36
_SCRIPT_NAME = "startup-script"


def _become_subreaper() -> None:
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def process_table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, state) for every process /proc shows ({} without /proc).
    Also the emulator's own view of a node's processes (processes.kill_tagged imports it:
    this file stays stdlib only, as the script the VM's init runs)."""
    table: dict[int, tuple[int, str]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return table
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                stat = handle.read().decode("ascii", "replace")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) >= 2 and fields[1].isdigit():
            table[int(entry)] = (int(fields[1]), fields[0])
    return table


def tagged(pid: int, entry: bytes) -> bool:
    """Does process `pid`'s environment hold `entry` (`NAME=value`)?"""
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            return entry in handle.read().split(b"\0")
    except OSError:
        return False  # gone, or not ours to read


def _victims(entry: bytes) -> set[int]:
    me = os.getpid()
    table = process_table()
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    mine: set[int] = set()
    todo = [me]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in mine:
                mine.add(child)
                todo.append(child)
    mine.update(pid for pid in table if pid != me and tagged(pid, entry))
    return {pid for pid in mine if table.get(pid, (0, "Z"))[1] not in {"Z", "X"}}


def _reap() -> list[tuple[int, int]]:
    done: list[tuple[int, int]] = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return done
        if pid == 0:
            return done
        done.append((pid, os.waitstatus_to_exitcode(status)))


def _kill_all(entry: bytes) -> None:
    for _ in range(100):
        victims = _victims(entry)
        if not victims:
            break
        for pid in victims:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)
        _reap()
    # The last of them were re-parented to us as they died: no zombies left behind.
    time.sleep(0.02)
    _reap()


def main(argv: list[str]) -> int:
    log_path, script_dir, tag_entry = argv[1:4]
    entry = tag_entry.encode()
    stop = threading.Event()
    # The handler only appends: calling stop.set() there could run while this thread
    # holds the Event's lock inside stop.wait() and deadlock the init for good (seen: an
    # init left sleeping on a futex for two hours after its test's SIGTERM).
    terminated: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: terminated.append(signum))
    _become_subreaper()

    def watch_stdin() -> None:
        with contextlib.suppress(OSError, ValueError):
            sys.stdin.buffer.read()  # returns at EOF: the emulator is gone
        stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    with open(log_path, "ab", buffering=0) as log:
        script = subprocess.Popen(
            ["/bin/bash", "-c", os.path.join(script_dir, _SCRIPT_NAME)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )
        running = True
        while not stop.is_set() and not terminated:
            for pid, code in _reap():
                if pid == script.pid and running:
                    running = False
                    script.returncode = code
                    log.write(f"{_SCRIPT_NAME} exit status {code}\n".encode())
                    shutil.rmtree(script_dir, ignore_errors=True)
            stop.wait(0.1)
    _kill_all(entry)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
