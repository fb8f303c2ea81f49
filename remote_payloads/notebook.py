"""`tpulab notebook`'s half on the VM: start Jupyter in the background, stop it. Stdlib
only, Python 3.10+; run by the session venv's python as `python -c <this> COMMAND ...`.

    start VENV DIR STATE   reads the token from stdin (never on a command line, where
                           `ps` would show it); starts `jupyter lab` in DIR (the synced
                           workspace), bound to 127.0.0.1 on a free port, in its own
                           session (it outlives this SSH command); waits until it
                           answers; records {"pid", "port"} in STATE and prints
                           `TPULAB_NOTEBOOK {"pid": P, "port": N}`.
    stop STATE             SIGTERM to Jupyter's process group (Jupyter shuts its kernels
                           down on it), SIGKILL after a grace; prints
                           `TPULAB_NOTEBOOK_STOPPED {"pid": P, "how": "..."}` once the
                           process is confirmed gone ("none" when none was running).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

READY_WAIT = 180.0  # a first start compiles JupyterLab's assets' index: slow on a cold VM
STOP_GRACE = 15.0
MARK = "TPULAB_NOTEBOOK "
STOPPED = "TPULAB_NOTEBOOK_STOPPED "


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is gone for our purpose: it holds no port and runs nothing
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def _is_jupyter(pid: int) -> bool:
    """The recorded pid still names Jupyter (not a process that got its number since)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return b"jupyter" in handle.read()
    except OSError:
        return not os.path.isdir("/proc")  # no procfs to ask: trust the record


def _answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api", timeout=5) as reply:
            return bool(reply.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _tail(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()[-2000:]
    except OSError:
        return "(no log)"


def start(venv: str, directory: str, state: str) -> int:
    token = sys.stdin.readline().strip()
    if not token:
        print("tpulab notebook: no token on stdin", file=sys.stderr)
        return 2
    os.makedirs(directory, exist_ok=True)
    os.makedirs(os.path.dirname(os.path.abspath(state)), exist_ok=True)
    stop(state, quiet=True)  # one notebook per session: an earlier one left running goes
    port = _free_port()
    log = os.path.abspath(state) + ".log"
    argv = [
        os.path.join(os.path.abspath(venv), "bin", "jupyter-lab"),
        "--no-browser", "--ip=127.0.0.1", f"--port={port}", "--port-retries=0",
        f"--ServerApp.root_dir={os.path.abspath(directory)}",
    ]  # fmt: skip
    if os.geteuid() == 0:
        argv.append("--allow-root")  # a VM (or a CI container) whose login is root
    env = {**os.environ, "JUPYTER_TOKEN": token}
    with open(log, "wb") as out:
        process = subprocess.Popen(
            argv,
            cwd=directory,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    with open(state, "w", encoding="utf-8") as handle:
        json.dump({"pid": process.pid, "port": port}, handle)
    deadline = time.monotonic() + READY_WAIT
    while not _answers(port):
        if process.poll() is not None or time.monotonic() > deadline:
            stop(state, quiet=True)
            print(f"tpulab notebook: Jupyter did not start:\n{_tail(log)}", file=sys.stderr)
            return 3
        time.sleep(0.25)
    print(MARK + json.dumps({"pid": process.pid, "port": port}), flush=True)
    return 0


def stop(state: str, *, quiet: bool = False) -> int:
    try:
        with open(state, encoding="utf-8") as handle:
            pid = int(json.load(handle)["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        pid = 0
    how = "none"
    if pid > 0 and _alive(pid) and _is_jupyter(pid):
        how = "TERM"
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _alive(pid):
            how = "KILL"
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            deadline = time.monotonic() + STOP_GRACE
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
        if _alive(pid):
            print(f"tpulab notebook: process {pid} survived SIGKILL", file=sys.stderr)
            return 4
    with contextlib.suppress(OSError):
        os.unlink(state)
    if not quiet:
        print(STOPPED + json.dumps({"pid": pid, "how": how}), flush=True)
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["start"] and len(argv) == 4:
        return start(argv[1], argv[2], argv[3])
    if argv[:1] == ["stop"] and len(argv) == 2:
        return stop(argv[1])
    print("usage: start VENV DIR STATE | stop STATE", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
