"""Runs the user's command on the VM for tpulab (stdlib only, Python 3.10+).

    python workload_launcher.py --workspace W --run-dir R --log L --pid-file P
        --status S --venv V --timeout T --grace G -- CMD ARGS...

Why a launcher rather than `sh -c`: the command must be stoppable as a whole (its own
session, so its process group holds every child it starts, and a stop or a timeout
kills them all), its output must go both to the SSH stream (live) and to a log file on
the VM (fetched with the artifacts), and tpulab must learn its real exit status even
when the SSH session that started it is gone. So:

- R, L, P and S are removed first (successive commands on one kept VM share them);
- the command runs in W with stdin closed, in a new session; its pid (= its process
  group) is written to P before anything else, for `kill -- -PGID` from another session;
- TPULAB_RUN_DIR is R made absolute (created), VIRTUAL_ENV is V and V/bin leads PATH,
  so `python` is the venv's; everything else comes from the environment tpulab set;
- no shell ever sees the argv, so `$TPULAB_RUN_DIR` / `$TPULAB_RUN_ID` (as `$X` or
  `${X}`, single-quoted on the laptop) are substituted here, and nothing else is;
- stdout and stderr are combined, copied to L as they come and, through a bounded
  buffer, to our stdout (the SSH stream): when the laptop reads slower than the command
  writes, whole lines are dropped from the stream -- never from L, and the command is
  never slowed -- and the stream says so where they were: "tpulab: N lines not
  streamed: see output.log"; the result counts them (`unstreamed_lines`);
- after T seconds the group gets SIGTERM, after G more SIGKILL (a timeout); SIGTERM,
  SIGINT or SIGHUP to this launcher do the same (a stop);
- while the command runs S holds its argv, process group and start time (wall clock),
  with "running": true, for tpulab's busy check before a later exec; `launched_at` (the
  log's ctime, stamped just before the command starts) stays in S for the fetch;
- the result goes to S and, as one `TPULAB_WORKLOAD {json}` line, to stderr; the
  launcher exits with the command's status (128+N for a signal N). S also names the run
  (`run_id`, from TPULAB_RUN_ID) and the launcher's own pid (`launcher_pid`).

    python workload_launcher.py --follow --status S --log L --run-id R [--wait W]

follows a launch whose SSH session was lost (the laptop's network dropped; the launcher
and the command run on, the log has every byte): once S names run R (within W seconds,
else exit 3, "TPULAB_FOLLOW not-started" on stderr: that launch never began), it copies
what L gains from its current end ("TPULAB_FOLLOW from N" on stderr: N bytes were
there) to stdout until S holds R's result, then prints that
result as the launcher would (`TPULAB_WORKLOAD {json}` on stderr) and exits 0. A
launcher that died without a result (SIGKILL, the VM's OOM killer) is exit 4,
"TPULAB_FOLLOW launcher-died".
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

MARKER = "TPULAB_WORKLOAD "


class _Stopper:
    """Terminates the command's process group once, then kills it after the grace."""

    def __init__(self, grace: float) -> None:
        self.grace = grace
        self.pgid: int | None = None
        self.reason: str | None = None
        self._lock = threading.Lock()

    def stop(self, reason: str) -> None:
        with self._lock:
            if self.reason is not None or self.pgid is None:
                self.reason = self.reason or reason
                return
            self.reason = reason
        pgid = self.pgid
        _signal_group(pgid, signal.SIGTERM)

        def kill_later() -> None:
            time.sleep(self.grace)
            _signal_group(pgid, signal.SIGKILL)

        threading.Thread(target=kill_later, daemon=True).start()


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


# The stream's buffer: a burst this big rides out a slow link without a drop; past it,
# lines are dropped from the stream (never from the log). At the end, the laptop gets
# DRAIN_SECONDS to take what is buffered before the rest is counted as dropped.
STREAM_BUFFER_BYTES = 4 * 2**20
DRAIN_SECONDS = 10.0
_LONGEST_LINE = 64 * 1024  # a carriage-return progress bar is one "line" past this


class _Stream:
    """The bounded buffer between the copier (never blocked) and the SSH stream (which
    blocks as long as the laptop does not read). Items are blocks of whole lines, or the
    count of lines dropped at that point."""

    def __init__(self, sink) -> None:  # type: ignore[no-untyped-def]
        self.sink = sink
        self.items: list[bytes | int] = []
        self.buffered = 0
        self.dropped = 0
        self.closing = False
        self.cond = threading.Condition()
        self.sender = threading.Thread(target=self._send, daemon=True)
        self.sender.start()

    def put(self, block: bytes) -> None:
        with self.cond:
            if self.buffered + len(block) <= STREAM_BUFFER_BYTES and not self.closing:
                self.items.append(block)
                self.buffered += len(block)
                self.cond.notify()
            else:
                self._drop(block.count(b"\n") or 1)

    def _drop(self, lines: int) -> None:
        self.dropped += lines
        if self.items and isinstance(self.items[-1], int):
            self.items[-1] += lines
        else:
            self.items.append(lines)
            self.cond.notify()

    def _send(self) -> None:
        alive = True
        mid_line = False  # the stream's last byte sent was not a newline
        while True:
            with self.cond:
                while not self.items and not self.closing:
                    self.cond.wait()
                if not self.items:
                    return
                item = self.items.pop(0)
                if isinstance(item, bytes):
                    self.buffered -= len(item)
            data = item if isinstance(item, bytes) else _notice(item, mid_line)
            mid_line = not data.endswith(b"\n") if data else mid_line
            if alive:
                try:
                    self.sink.write(data)
                    self.sink.flush()
                except (OSError, ValueError):
                    alive = False  # the SSH session is gone; the log has everything

    def close(self) -> int:
        """Let the laptop take what is buffered (for at most DRAIN_SECONDS), drop the
        rest; the number of lines never streamed."""
        deadline = time.monotonic() + DRAIN_SECONDS
        with self.cond:
            self.closing = True
            self.cond.notify()
            while self.items and time.monotonic() < deadline:
                self.cond.wait(timeout=0.1)
            late = [item for item in self.items if isinstance(item, bytes)]
            if late:
                self.items = [item for item in self.items if isinstance(item, int)]
                self.buffered = 0
                self._drop(sum(block.count(b"\n") or 1 for block in late))
            self.cond.notify()
        self.sender.join()
        return self.dropped


def _notice(lines: int, mid_line: bool = False) -> bytes:
    """The stream's word for lines it dropped: on a line of its own, even where the
    drop cut a line (its tail went unsent), or it would be lost in that line."""
    return (
        b"\n" if mid_line else b""
    ) + f"tpulab: {lines} lines not streamed: see output.log\n".encode()


def _copy(source: int, log, stream: _Stream) -> None:  # type: ignore[no-untyped-def]
    """Copy the command's output to the log, and to the stream its whole lines, and a
    line being redrawn (a progress bar) as it comes: it must reach the laptop while it
    runs, not once its newline comes."""
    carry = b""
    while True:
        try:
            chunk = os.read(source, 65536)
        except OSError:
            break
        if not chunk:
            break
        log.write(chunk)
        log.flush()
        carry += chunk
        end = carry.rfind(b"\n") + 1
        if b"\r" in carry[end:]:
            end = len(carry)  # a line being redrawn: its states as they come
        elif end == 0:
            if len(carry) < _LONGEST_LINE:
                continue
            end = len(carry)
        block, carry = carry[:end], carry[end:]
        stream.put(block)
    if carry:
        stream.put(carry)


def _write_status(path: str, status: dict[str, object]) -> str:
    """Replace S whole (written aside, then renamed): a reader never sees half of it."""
    text = json.dumps(status, sort_keys=True)
    partial = path + ".partial"
    with open(partial, "w") as status_file:
        status_file.write(text + "\n")
    os.replace(partial, path)
    return text


FOLLOWED = "TPULAB_FOLLOW "
FOLLOW_POLL_SECONDS = 0.5


def _status_of(path: str) -> dict[str, object] | None:
    try:
        with open(path, encoding="utf-8") as handle:
            status = json.load(handle)
    except (OSError, ValueError):
        return None
    return status if isinstance(status, dict) else None


def _alive(pid: object) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is not running: its parent (sshd) has not reaped it yet.
    with contextlib.suppress(OSError), open(f"/proc/{pid}/stat", encoding="utf-8") as stat:
        return stat.read().rsplit(")", 1)[-1].split()[0] != "Z"
    return True


def follow(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="workload_launcher --follow")
    for name in ("--status", "--log", "--run-id"):
        parser.add_argument(name, required=True)
    parser.add_argument("--wait", type=float, default=10.0)
    args = parser.parse_args(argv)

    def ours() -> dict[str, object] | None:
        status = _status_of(args.status)
        return status if status is not None and status.get("run_id") == args.run_id else None

    deadline = time.monotonic() + args.wait
    status = ours()
    while status is None:
        if time.monotonic() >= deadline:
            sys.stderr.write(FOLLOWED + "not-started\n")
            return 3
        time.sleep(0.1)
        status = ours()
    try:
        position = os.path.getsize(args.log)  # what was written meanwhile stays in L
    except OSError:
        position = 0
    sys.stderr.write(f"{FOLLOWED}from {position}\n")  # where it took up the log
    sys.stderr.flush()
    out = sys.stdout.buffer
    while True:
        status = ours() or status
        ended = "exit_status" in status
        with contextlib.suppress(OSError), open(args.log, "rb") as log:
            log.seek(position)
            while chunk := log.read(65536):
                out.write(chunk)
                position += len(chunk)
            out.flush()
        if ended:
            sys.stderr.write(MARKER + json.dumps(status, sort_keys=True) + "\n")
            return 0
        if not _alive(status.get("launcher_pid")):
            # Its result is written before it exits: read once more, then say so.
            status = ours() or status
            if "exit_status" not in status:
                sys.stderr.write(FOLLOWED + "launcher-died\n")
                return 4
            continue
        time.sleep(FOLLOW_POLL_SECONDS)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--follow"]:
        return follow(argv[1:])
    parser = argparse.ArgumentParser(prog="workload_launcher")
    for name in ("--workspace", "--run-dir", "--log", "--pid-file", "--status", "--venv"):
        parser.add_argument(name, required=True)
    parser.add_argument("--timeout", type=float, required=True)
    parser.add_argument("--grace", type=float, default=10.0)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command after --")

    run_dir = os.path.abspath(args.run_dir)
    venv = os.path.abspath(args.venv)
    # A session's successive `tpulab exec`s share R, L, P and S: start from nothing, so
    # the fetch brings back only this command's files and log, never an earlier one's.
    shutil.rmtree(run_dir, ignore_errors=True)
    for path in (args.log, args.pid_file, args.status):
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
    os.makedirs(run_dir, exist_ok=True)
    for path in (args.log, args.pid_file, args.status):
        os.makedirs(os.path.dirname(os.path.abspath(path)) or ".", exist_ok=True)
    env = dict(os.environ)
    env["TPULAB_RUN_DIR"] = run_dir
    env["VIRTUAL_ENV"] = venv
    env["PATH"] = os.path.join(venv, "bin") + os.pathsep + env.get("PATH", "")
    env.pop("PYTHONHOME", None)

    for name in ("TPULAB_RUN_DIR", "TPULAB_RUN_ID"):
        value = env.get(name, "")
        command = [arg.replace("${" + name + "}", value) for arg in command]
        command = [arg.replace("$" + name, value) for arg in command]

    stopper = _Stopper(args.grace)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda s, _f: stopper.stop(f"stopped by {signal.Signals(s).name}"))

    started = time.monotonic()
    result: dict[str, object] = {
        "command": command,
        "run_id": os.environ.get("TPULAB_RUN_ID"),
        "launcher_pid": os.getpid(),
    }
    stream: _Stream | None = None
    with open(args.log, "ab") as log:
        # The new log's ctime, just before the command starts, by the clock the kernel
        # stamps files with (coarser than time.time(), which may run a tick ahead): a file
        # in the workspace whose ctime is not earlier was written by the command (the
        # upload's are older). The fetch names those that nobody asked to bring back.
        result["launched_at"] = os.fstat(log.fileno()).st_ctime
        try:
            process = subprocess.Popen(
                command,
                cwd=os.path.abspath(args.workspace),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as error:
            message = f"tpulab: cannot start {command[0]!r}: {error.strerror or error}\n"
            log.write(message.encode())
            sys.stdout.write(message)
            result.update(exit_status=127, started=False, timed_out=False, stopped=None)
            status = 127
        else:
            stopper.pgid = process.pid
            with open(args.pid_file, "w") as pid_file:
                pid_file.write(f"{process.pid}\n")
            # While it runs, S says what and since when: a later exec that finds the
            # group alive (its busy check) names the command instead of starting another.
            result.update(pgid=process.pid, started_at=round(time.time(), 3))
            _write_status(args.status, dict(result, running=True))
            assert process.stdout is not None
            stream = _Stream(sys.stdout.buffer)
            copier = threading.Thread(
                target=_copy, args=(process.stdout.fileno(), log, stream), daemon=True
            )
            copier.start()
            deadline = started + args.timeout
            while True:
                try:
                    code = process.wait(timeout=max(0.05, min(1.0, deadline - time.monotonic())))
                    break
                except subprocess.TimeoutExpired:
                    if time.monotonic() >= deadline:
                        stopper.stop("timeout")
            # A grandchild that left the group may hold the pipe; do not wait for it.
            copier.join(timeout=5.0)
            timed_out = stopper.reason == "timeout"
            status = code if code >= 0 else 128 - code
            result.update(
                exit_status=status,
                started=True,
                timed_out=timed_out,
                stopped=stopper.reason if stopper.reason and not timed_out else None,
                signal=-code if code < 0 else None,
            )
    result["seconds"] = round(time.monotonic() - started, 3)
    text = _write_status(args.status, result)
    if stream is not None:
        # After the status: the command is over for everyone (a busy check, a stop's
        # settle) while the laptop takes the rest of the stream.
        result["unstreamed_lines"] = stream.close()
        text = json.dumps(result, sort_keys=True)
    sys.stdout.flush()
    sys.stderr.write(MARKER + text + "\n")
    sys.stderr.flush()
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
