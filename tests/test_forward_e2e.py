"""`tpulab ssh -L`, `ssh-config` and `notebook` as a user runs them, against `tpulab
emulator serve --ssh openssh` (its nodes are system sshd servers, as on a real TPU VM)
and the system OpenSSH client: real subprocesses, real HTTP through the forwards. The
emulated VM runs on this machine, so a test can look at its processes and files.
HOME is a temporary directory: the user's own ~/.ssh is never touched."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import require_tool, tpulab, wait_until
from ssh_fixtures import sshd_available

pytestmark = [pytest.mark.slow, pytest.mark.openssh]

PROJECT = "fwd-proj"
ZONE = "us-central1-a"
EXIT_OK = 0
EXIT_REMOTE = 4


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A temporary HOME (tpulab's subprocesses inherit it): ~/.ssh/config is its."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text("Host elsewhere\n  User someone\n")
    monkeypatch.setenv("HOME", str(home))
    return home


@pytest.fixture
def served(tmp_path: Path, home: Path) -> Iterator[str]:
    """`tpulab emulator serve --ssh openssh` in the background: its URL."""
    require_tool(sshd_available(), "OpenSSH server (sshd and sftp-server)")
    require_tool(shutil.which("ssh") is not None, "OpenSSH client (ssh)")
    process = subprocess.Popen(
        [sys.executable, "-m", "tpulab", "emulator", "serve", "--port", "0", "--ssh", "openssh",
         "--state", str(tmp_path / "emulator"), "--create-seconds", "0.3",
         "--delete-seconds", "0.3"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        first = process.stdout.readline()
        assert "listening on" in first, first + (process.stderr.read() if process.stderr else "")
        yield first.split()[-1]
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def up(url: str, name: str, *extra: str) -> dict[str, object]:
    done = tpulab(
        "up", "--accelerator", "v5litepod-4", "--api-endpoint", url, "--project", PROJECT,
        "--zone", ZONE, "--boot-timeout", "60", "--name", name, *extra, timeout=600,
    )  # fmt: skip
    assert done.returncode == EXIT_OK, done.stderr + done.stdout
    return session_state(name)


def session_dir(name: str) -> Path:
    return Path(os.environ["TPULAB_HOME"]) / "state" / "sessions" / name


def session_state(name: str) -> dict[str, object]:
    return json.loads(session_dir(name).joinpath("session.json").read_text())  # type: ignore[no-any-return]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def background(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tpulab", *args],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip


def read_until(
    process: subprocess.Popen[str], marker: str, timeout: float = 600, stream: str = "stdout"
) -> list[str]:
    """`stream`'s lines up to the first containing `marker` (fails if the process ends)."""
    pipe = process.stdout if stream == "stdout" else process.stderr
    assert pipe is not None
    lines: list[str] = []
    result: dict[str, bool] = {}

    def more() -> bool:
        line = pipe.readline()
        if not line:
            result["ended"] = True
            return True
        lines.append(line)
        return marker in line

    wait_until(more, f"{marker!r} on stdout", timeout=timeout, interval=0)
    if result.get("ended"):
        process.wait(timeout=60)
        err = process.stderr.read() if process.stderr else ""
        pytest.fail(f"ended (exit {process.returncode}) before {marker!r}: {lines} {err}")
    return lines


def kill_ssh_connections(node: str) -> int:
    """End every SSH connection to the node's sshd at once, as a network gone does to a
    client (their per-connection sshd processes killed; the listener stays): how many."""
    procs = [p for p in Path("/proc").iterdir() if p.name.isdigit()]

    def read(path: Path) -> str:
        try:
            return path.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            return ""

    listeners = {
        p.name
        for p in procs
        if f"_{node}/sshd_config" in read(p / "cmdline") and "holder.py" not in read(p / "cmdline")
    }
    killed = 0
    for p in procs:
        fields = read(p / "stat").rsplit(")", 1)[-1].split()
        if len(fields) > 1 and fields[1] in listeners:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(p.name), signal.SIGKILL)
                killed += 1
    return killed


def interrupt(process: subprocess.Popen[str], timeout: float = 120) -> tuple[int, str, str]:
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out, err


def lease_file(emulator_state: Path, state: dict[str, object]) -> Path:
    """The lease as worker 0's watchdog reads it: in that worker's own /tmp
    (`Emulator.vm_tmp`, under the emulator's state directory)."""
    vm_tmp = emulator_state / "tmp" / PROJECT / ZONE / str(state["node_name"])
    return vm_tmp / f"tpulab-lease-{state['run_id']}"


@pytest.mark.longest
@pytest.mark.timeout(900)  # an `up` and a `down` on a loaded CI machine
def test_forward_a_page_renew_the_lease_end_with_ctrl_c_then_ssh_config_and_down(
    served: str, home: Path, tmp_path: Path
) -> None:
    # 60 s: the steps after the forward (ssh-config, plain ssh) do not renew the lease.
    state = up(served, "fwd", "--idle", "60s", "--ttl", "1h")
    remote, local = free_port(), free_port()
    www = "www"
    started = tpulab(
        "ssh", "fwd", "--", "sh", "-c",
        f"mkdir -p {www} && echo 'hello through the tunnel' > {www}/index.html && cd {www} && "
        f"(setsid python3 -m http.server {remote} --bind 127.0.0.1 >/dev/null 2>&1 </dev/null &)",
        timeout=120,
    )  # fmt: skip
    assert started.returncode == EXIT_OK, started.stderr
    wait_until(lambda: accepts(remote), "the VM's http.server to listen")

    forward = background("ssh", "fwd", "-L", f"{local}:localhost:{remote}", "-N")
    try:
        said = read_until(forward, "Ctrl-C ends it", timeout=120)
        assert f"http://localhost:{local}/" in "".join(said)
        with urllib.request.urlopen(f"http://127.0.0.1:{local}/index.html", timeout=30) as page:
            assert page.read().decode().strip() == "hello through the tunnel"

        # The lease is renewed while the forward lives: the VM's lease file changes (what
        # its watchdog counts) and the session's renewal time moves, more than once.
        first = session_state("fwd")["renewed_at"]
        seen = {lease_file(tmp_path / "emulator", state).read_text()}

        def renewed_twice() -> bool:
            seen.add(lease_file(tmp_path / "emulator", state).read_text())
            return len(seen) >= 3

        wait_until(renewed_twice, "two more lease renewals on the VM", timeout=120)
        wait_until(
            lambda: session_state("fwd")["renewed_at"] > first,  # type: ignore[operator]
            "the session's renewal time to move",
            timeout=60,
        )

        # The network goes under the forward (its sshd connection killed: ssh exits 255):
        # the forward is opened again, the same local port, and the page is there.
        assert kill_ssh_connections(str(state["node_name"])) >= 1
        said_err = read_until(forward, "the forward is open again", timeout=120, stream="stderr")
        assert any("connection was lost (ssh exit 255); reopening it" in line for line in said_err)
        with urllib.request.urlopen(f"http://127.0.0.1:{local}/index.html", timeout=30) as page:
            assert page.read().decode().strip() == "hello through the tunnel"
    finally:
        status, out, err = interrupt(forward)
    assert status == EXIT_OK, err + out
    assert "closed" in out
    wait_until(lambda: not accepts(local), "the local forward port to close", timeout=30)

    # ssh-config --write, then plain OpenSSH with that config: strict host-key checking.
    config = home / ".ssh" / "config"
    written = tpulab("ssh-config", "fwd", "--write", timeout=60)
    assert written.returncode == EXIT_OK, written.stderr
    text = config.read_text()
    assert text.endswith("Host elsewhere\n  User someone\n")
    assert text.splitlines()[1].startswith("Include ")
    entry = session_dir("fwd") / "ssh_config"
    assert "StrictHostKeyChecking yes" in entry.read_text()
    plain = ["ssh", "-F", str(config), "-o", "BatchMode=yes", "tpulab-fwd"]
    ok = subprocess.run([*plain, "echo", "via-config"], capture_output=True, text=True, timeout=60)
    assert ok.returncode == EXIT_OK, ok.stderr
    assert ok.stdout.strip() == "via-config"

    # A VM answering with another host key is refused, never prompted for.
    pinned = session_dir("fwd") / "known_hosts"
    good = pinned.read_text()
    other = subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(home / "other")],
        capture_output=True, check=True,
    )  # fmt: skip
    assert other.returncode == 0
    fake_key = (home / "other.pub").read_text().split()[1]
    pinned.write_text(good.rsplit(" ", 1)[0] + " " + fake_key + "\n")
    refused = subprocess.run([*plain, "true"], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 255
    assert "host key" in refused.stderr.lower()
    pinned.write_text(good)

    # A forward open while the session is ended from another terminal: it is not
    # reopened to a node that is gone, and says the session ended here, not that
    # someone else deleted its node.
    forward = background("ssh", "fwd", "-L", f"{local}:localhost:{remote}", "-N")
    read_until(forward, "Ctrl-C ends it", timeout=120)
    down = tpulab("down", "fwd", timeout=300)
    assert down.returncode == EXIT_OK, down.stderr + down.stdout
    ended_out, ended_err = forward.communicate(timeout=120)
    assert forward.returncode == EXIT_REMOTE, ended_err + ended_out
    ended = " ".join(ended_err.split())
    assert "Session fwd ended meanwhile: its state was removed on this machine" in ended
    assert "deleted by someone else" not in ended
    assert not entry.exists()
    gone = subprocess.run([*plain, "true"], capture_output=True, text=True, timeout=60)
    assert gone.returncode == 255
    assert "tpulab-fwd" in gone.stderr  # no such host any more: the name does not resolve
    assert config.read_text() == text  # down never edits the user's config


@pytest.mark.longest
@pytest.mark.network
@pytest.mark.timeout(1500)  # an `up`, an exec, JupyterLab from PyPI, a `down`
def test_notebook_serves_the_workspace_and_ctrl_c_stops_jupyter(
    served: str, tmp_path: Path
) -> None:
    up(served, "nb", "--ttl", "1h")
    work = tmp_path / "work"
    work.mkdir()
    (work / "lesson.py").write_text("print('lesson')\n")
    synced = tpulab("exec", "nb", "--workdir", str(work), "--", "true", timeout=300)
    assert synced.returncode == EXIT_OK, synced.stderr + synced.stdout

    port = free_port()
    notebook = background("notebook", "nb", "--port", str(port))
    try:
        said = "".join(read_until(notebook, "/lab?token=", timeout=900))
        url = next(word for word in said.split() if "/lab?token=" in word)
        token = url.split("token=", 1)[1]
        assert url.startswith(f"http://localhost:{port}/")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api", timeout=30) as api:
            assert "version" in json.loads(api.read())
        listing = f"http://127.0.0.1:{port}/api/contents?token={token}"
        with urllib.request.urlopen(listing, timeout=30) as contents:
            names = {item["name"] for item in json.loads(contents.read())["content"]}
        assert "lesson.py" in names  # Jupyter's directory is the synced workspace
    finally:
        status, out, err = interrupt(notebook, timeout=180)
    assert status == EXIT_OK, err + out
    stopped = [line for line in out.splitlines() if line.startswith("Jupyter stopped on the VM")]
    assert stopped, out + err
    pid = int(stopped[0].split("(pid ")[1].split(",")[0])
    assert not _running(pid)  # confirmed on the VM (this machine): gone, or a zombie
    assert not accepts(port)

    down = tpulab("down", "nb", timeout=300)
    assert down.returncode == EXIT_OK, down.stderr + down.stdout


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
