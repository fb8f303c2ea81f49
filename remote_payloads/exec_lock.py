"""The exec lock of a tpulab session's VM, held for as long as this process's stdin is open.

`tpulab exec` starts this over its own SSH connection (as `python3 -I -S -c SOURCE LOCK HOLDER`,
stdlib only, Python 3.10+), before it checks for a running command and before it syncs:

    TPULAB_LOCK locked                  the lock is ours; who holds it is in the lock file
    TPULAB_LOCK held {"run_id": ...}    another exec holds it (what it wrote there)

and then, when locked, blocks reading stdin. The lock is an `flock` on an open file, so
the kernel drops it when this process ends, and this process ends when its stdin reaches
EOF: the exec closed its connection, or the laptop was killed or cut off and the SSH
server closed the session's pipes. No lock outlives the connection that took it, so
there is no stale lock to break, ever.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time

MARKER = "TPULAB_LOCK "
# How long a refusal waits for the lock first: an exec that has just ended (or a client
# just killed) lets go as soon as the SSH server closes its session, within moments.
LET_GO_SECONDS = 2.0
# How long a refusal waits for the holder's note: it writes it just after taking the lock.
NOTE_SECONDS = 2.0


def _alive(pid: object) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _holder_note(fd: int) -> dict[str, object]:
    """What the holder wrote into the lock file. A note whose writer is gone is the last
    holder's (the new one is between taking the lock and writing): wait for the new one."""
    deadline = time.monotonic() + NOTE_SECONDS
    while True:
        raw = os.pread(fd, 65536, 0)
        try:
            note = json.loads(raw.decode("utf-8"))
        except ValueError:
            note = None
        if isinstance(note, dict) and _alive(note.get("vm_pid")):
            return note
        if time.monotonic() >= deadline:
            return {}
        time.sleep(0.05)


def _take(fd: int) -> bool:
    deadline = time.monotonic() + LET_GO_SECONDS
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: exec_lock.py LOCK_FILE HOLDER_JSON", file=sys.stderr)
        return 2
    path, holder_json = argv
    holder = json.loads(holder_json)
    directory = os.path.dirname(path)
    if directory:
        os.makedirs(directory, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)  # not inherited (PEP 446)
    if not _take(fd):
        print(MARKER + "held " + json.dumps(_holder_note(fd)), flush=True)
        return 0
    holder.update(vm_pid=os.getpid(), since=time.time())
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(holder) + "\n").encode("utf-8"), 0)
    print(MARKER + "locked", flush=True)
    # Until EOF: the end of the exec, or of its connection. The lock goes with us.
    while os.read(0, 65536):
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
