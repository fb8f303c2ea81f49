"""The parent of what an emulated node runs over SSH: one per session command (embedded
host) or one above the node's sshd (OpenSSH host). Stdlib only, run as a script:

    python -I -S holder.py [--status-fd N] -- ARGV...

It is a child subreaper (Linux prctl), so whatever ARGV leaves running -- daemonised
with setsid, double forked, its environment wiped by `env -i`, its working directory
changed -- is re-parented to the holder instead of the machine's init and stays in its
process tree, where the node's cleanup (`processes.kill_tagged`) finds it by ancestry. The
environment tag alone (`NODE_TAG_VAR`) is lost to `env -i`; a process tree is not.

ARGV runs as its child, in a session of its own (as sshd would start it), with the
holder's stdio and environment. When it exits, its status (`os.waitstatus_to_exitcode`,
as text) goes to fd N, which is closed; the holder has already let go of its stdio, so
the session's pipes reach EOF once the command's own children close them. It then stays
while anything it adopted lives, reaping, and exits with the child's status. The
boot-time counterpart for the startup-script is `guest_init.py`.
"""

import ctypes
import os
import sys

_PR_SET_CHILD_SUBREAPER = 36
# Python starts with these two ignored, and an ignored signal stays ignored across exec:
# the command gets them at their defaults, as sshd would give them. Linux's numbers (the
# holder is Linux-only: prctl), so that the holder need not import `signal`, which with
# `contextlib` was most of the holder's start-up (the emulator starts one per command).
_RESET_SIGNALS = (13, 25)  # SIGPIPE, SIGXFSZ
# For the same reason, try/except rather than contextlib.suppress (noqa: SIM105 below).


def _spawn(argv: list[str]) -> int | None:
    """ARGV as a child in a session of its own, or None (and why, on stderr) when it
    cannot be run."""
    try:
        return os.posix_spawnp(argv[0], argv, os.environ, setsid=True, setsigdef=_RESET_SIGNALS)
    except OSError as error:
        try:  # noqa: SIM105
            os.write(2, f"{argv[0]}: {error.strerror}\n".encode())
        except OSError:
            pass
        return None


def _report(status_fd: int | None, code: int) -> None:
    if status_fd is None:
        return
    try:
        os.write(status_fd, str(code).encode())
        os.close(status_fd)
    except OSError:
        pass


def main(argv: list[str]) -> int:
    args = argv[1:]
    status_fd: int | None = None
    if args[:1] == ["--status-fd"]:
        status_fd, args = int(args[1]), args[2:]
        os.set_inheritable(status_fd, False)
    if args[:1] == ["--"]:
        args = args[1:]
    try:  # noqa: SIM105
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    pid = _spawn(args)
    if pid is None:
        _report(status_fd, 127)  # as a shell says a command it cannot run
        return 127
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    code = 0
    while True:
        try:
            done, status = os.waitpid(-1, 0)
        except ChildProcessError:
            break  # nothing left: the command and all it adopted are gone
        if done == pid:
            code = os.waitstatus_to_exitcode(status)
            _report(status_fd, code)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
