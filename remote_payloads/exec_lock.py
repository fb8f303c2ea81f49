"""The exec lock of a tpulab session's VM, held for as long as this process's stdin is open.

`tpulab exec` starts this over its own SSH connection (as `python3 -I -S -c SOURCE LOCK
HOLDER SILENCE`, stdlib only, Python 3.10+), before it checks for a running command and
before it syncs:

    TPULAB_LOCK locked                  the lock is ours; who holds it is in the lock file
    TPULAB_LOCK held {"run_id": ...}    another exec holds it (what it wrote there)

and then, when locked, reads stdin. The lock is an `flock` on an open file, so the kernel
drops it when this process ends, and this process ends
- at stdin's EOF: the exec closed its connection, or the laptop was killed and its
  kernel closed the TCP connection, so the SSH server closed the session's pipes;
- after SILENCE seconds with nothing on stdin: the exec writes a heartbeat byte every
  few seconds, so silence means a laptop that lost power or its network. No FIN ever
  reaches the VM then, and sshd (ClientAliveInterval 0, TCP keepalive after 2 h, as on
  Google's images) would keep the session's pipes open for hours: without the
  heartbeat the lock would outlive its exec by that long.
So no lock outlives its exec by more than SILENCE seconds: there is no stale lock to break.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
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
    if len(argv) != 3:
        print("usage: exec_lock.py LOCK_FILE HOLDER_JSON SILENCE_SECONDS", file=sys.stderr)
        return 2
    path, holder_json, silence_text = argv
    holder = json.loads(holder_json)
    silence = float(silence_text)
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
    # Until EOF (the end of the exec, or of its connection) or a silence (a laptop gone
    # without a word). The lock goes with us.
    while True:
        ready, _, _ = select.select([0], [], [], silence)
        if not ready:
            print(f"no heartbeat from the exec for {silence:g} s: letting go", file=sys.stderr)
            return 0
        if not os.read(0, 65536):
            return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
