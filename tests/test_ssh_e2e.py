"""End-to-end SSH: the real paramiko client against real servers, over BOTH host backends
(the embedded asyncssh server and the system's OpenSSH sshd)."""

from __future__ import annotations

import hashlib
import logging
import os
import shlex
import socket
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from helpers import FakeClock, group_ended, wait_until

from tpulab.emulator.hostenv import NETWORK_VARS
from tpulab.errors import (
    AuthError,
    CommandFailedError,
    ConnectError,
    HostKeyMismatchError,
    RemoteError,
    RemoteTimeoutError,
    TpuBusyError,
)
from tpulab.remote.ssh import RECONNECT_TIMEOUT, Connection, HostKey, RunKey, SshTarget

if TYPE_CHECKING:
    from ssh_fixtures import HostStarter, SshHost

pytest_plugins = ["ssh_fixtures"]

NASTY = [
    "; touch pwned",
    "$(touch pwned)",
    "`touch pwned`",
    "' ; touch pwned ; '",
    '" ; touch pwned ; "',
    "a\ntouch pwned",
    "&& touch pwned || touch pwned | touch pwned > pwned",
    "-n",
    "*",
]


def _refuses(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


def _pid_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")  # a zombie has already been killed


def test_run_streams_lines_and_returns_exit_status(ssh_host: SshHost) -> None:
    lines: list[tuple[str, str]] = []
    script = "echo one; echo warn >&2; printf 'two\\nthree'; exit 7"
    with ssh_host.connect() as conn:
        result = conn.run(
            ["sh", "-c", script],
            timeout=20,
            on_line=lambda stream, line: lines.append((stream, line)),
        )
        assert result.exit_status == 7
        assert result.stdout == "one\ntwo\nthree"
        assert result.stderr == "warn\n"
        assert [line for stream, line in lines if stream == "stdout"] == ["one", "two", "three"]
        assert [line for stream, line in lines if stream == "stderr"] == ["warn"]
        with pytest.raises(CommandFailedError) as failed:
            conn.run(["sh", "-c", script], timeout=20, check=True)
        assert failed.value.exit_status == 7
        assert "three" in failed.value.output_tail
        ok = conn.run(["true"], timeout=20, check=True)
        assert ok.exit_status == 0


def test_a_redrawn_progress_bar_is_streamed_as_a_terminal_shows_it(ssh_host: SshHost) -> None:
    # A tqdm-style bar on stderr, its states arriving in separate reads (the sleeps),
    # then a line ended Windows-style: each line as a terminal shows it, not its states
    # run together; the raw text is kept whole.
    script = (
        "echo start; for i in 1 2 3 4 5; do printf '\\r%s0%%|bar' $i >&2; sleep 0.05; done; "
        "printf '\\n' >&2; printf 'dos line\\r\\nend\\n'"
    )
    lines: list[tuple[str, str]] = []
    with ssh_host.connect() as conn:
        result = conn.run(
            ["sh", "-c", script],
            timeout=20,
            on_line=lambda stream, line: lines.append((stream, line)),
        )
    assert [line for stream, line in lines if stream == "stdout"] == ["start", "dos line", "end"]
    assert [line for stream, line in lines if stream == "stderr"] == ["50%|bar"]
    assert result.stderr == "".join(f"\r{i}0%|bar" for i in range(1, 6)) + "\n"
    assert result.stdout == "start\ndos line\r\nend\n"


def test_stdin_is_closed_and_home_is_the_sandbox(ssh_host: SshHost) -> None:
    with ssh_host.connect() as conn:
        # `cat` would wait forever on an open stdin; `read` fails on EOF.
        result = conn.run("cat; read x; echo read=$?; pwd; echo $HOME", timeout=10)
    sandbox = str(ssh_host.sandbox.resolve())
    assert result.stdout.splitlines() == ["read=1", sandbox, sandbox]


def test_environment_is_passed_verbatim(ssh_host: SshHost) -> None:
    value = "a b'c\"$(touch pwned)`touch pwned`;\nline2"
    with ssh_host.connect() as conn:
        result = conn.run(
            ["printenv", "TPULAB_X", "JAX_PLATFORMS"],
            env={"TPULAB_X": value, "JAX_PLATFORMS": "cpu"},
            timeout=10,
            check=True,
        )
    assert result.stdout == f"{value}\ncpu\n"
    assert not (ssh_host.sandbox / "pwned").exists()


def test_timeout_kills_the_remote_process_group(ssh_host: SshHost) -> None:
    marker = ssh_host.sandbox / "finished"
    # A background child that would write the marker later: it must die with its parent.
    # The command names its process group first (field 5 of /proc/PID/stat).
    command = (
        "awk '{print $5}' /proc/$$/stat > group.id; "
        "(sleep 2.5; touch finished) & echo $! > child.pid; sleep 30"
    )
    # A long client grace (30 s) keeps "killed remotely at the deadline" and "the client
    # gave up after the grace" far apart, so a loaded CI machine cannot blur them.
    with ssh_host.connect(kill_grace=30.0) as conn:
        conn.open()
        started = time.monotonic()
        with pytest.raises(RemoteTimeoutError, match="was killed"):
            conn.run(command, timeout=1.0)
        elapsed = time.monotonic() - started
        assert 0.9 <= elapsed < 10.0
        child = int((ssh_host.sandbox / "child.pid").read_text())
        # SIGKILL reaches the group as the status comes back; the child may still be on
        # its way out for a moment (CI, 2026-12-07, openssh, loaded). It must be gone
        # before it could write the marker (2.5 s in): the marker's absence proves it.
        wait_until(lambda: not _pid_alive(child), f"the background child {child} to die")
        # The connection is still usable afterwards.
        assert conn.run(["echo", "still here"], timeout=10).stdout == "still here\n"
    # Every process of the command's group is gone (the host runs on this machine), so
    # nothing is left that could still write the marker: its absence now is final.
    group = int((ssh_host.sandbox / "group.id").read_text())
    wait_until(lambda: group_ended(group), f"the command's process group {group} to end")
    assert not marker.exists()


def test_put_and_read_10_mb_with_matching_sha256(ssh_host: SshHost, tmp_path: Path) -> None:
    data = os.urandom(10 * 1024 * 1024)
    expected = hashlib.sha256(data).hexdigest()
    local = tmp_path / "up.bin"
    local.write_bytes(data)
    with ssh_host.connect() as conn:
        assert conn.put(local, "~/jax-tpu-lab/data/blob.bin") == expected
        on_host = ssh_host.sandbox / "jax-tpu-lab" / "data" / "blob.bin"
        assert hashlib.sha256(on_host.read_bytes()).hexdigest() == expected
        assert conn.put(b"small", "rel.txt") == hashlib.sha256(b"small").hexdigest()
        assert (ssh_host.sandbox / "rel.txt").read_bytes() == b"small"
        assert conn.read("~/jax-tpu-lab/data/blob.bin", max_bytes=len(data)) == data
        with pytest.raises(RemoteError, match="over the"):
            conn.read("~/jax-tpu-lab/data/blob.bin", max_bytes=len(data) - 1)
        with pytest.raises(RemoteError, match="Cannot read"):
            conn.read("~/missing.json", max_bytes=100)


@pytest.mark.parametrize("nasty", NASTY)
def test_shell_metacharacters_are_arguments_not_code(ssh_host: SshHost, nasty: str) -> None:
    with ssh_host.connect() as conn:
        result = conn.run(["printf", "%s|", nasty, "x"], timeout=10, check=True)
        assert result.stdout == f"{nasty}|x|"
        name = f"f {nasty}".replace("/", "_")  # a file name, so no path separators
        digest = conn.put(b"payload", f"~/{name}")
        assert (ssh_host.sandbox / name).read_bytes() == b"payload"
        assert digest == hashlib.sha256(b"payload").hexdigest()
    created = {p.name for p in ssh_host.sandbox.iterdir()}
    assert not created & {"pwned", "|"}, created


def test_a_host_key_other_than_the_pinned_one_is_refused_before_anything_runs(
    ssh_host: SshHost,
) -> None:
    impostor = HostKey("ssh-ed25519", RunKey().public_b64)
    with ssh_host.connect(host_key=impostor) as conn:
        with pytest.raises(HostKeyMismatchError) as refused:
            conn.run(["touch", "ran"], timeout=10)
        with pytest.raises(HostKeyMismatchError):
            conn.put(b"x", "~/uploaded")
    assert impostor.fingerprint in str(refused.value)
    assert refused.value.hint
    assert not (ssh_host.sandbox / "ran").exists()
    assert not (ssh_host.sandbox / "uploaded").exists()


def test_a_client_key_missing_from_the_metadata_is_refused(ssh_host: SshHost) -> None:
    stranger = RunKey()
    started = time.monotonic()
    with ssh_host.connect(key=stranger) as conn, pytest.raises(AuthError) as refused:
        conn.run(["touch", "ran"], timeout=10)
    assert time.monotonic() - started < 5  # refused outright, not retried to the deadline
    assert stranger.fingerprint in str(refused.value)
    assert not (ssh_host.sandbox / "ran").exists()


def test_no_private_key_material_reaches_the_logs(
    ssh_host: SshHost, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    for name in ("paramiko", "paramiko.transport", "asyncssh", "tpulab"):
        caplog.set_level(logging.DEBUG, logger=name)
    texts: list[str] = []
    with ssh_host.connect() as conn:
        conn.run(["echo", "hello"], timeout=10)
        conn.put(b"data", "~/d.bin")
        texts += [repr(conn), str(conn.target)]
    with ssh_host.connect(key=RunKey()) as conn, pytest.raises(AuthError) as refused:
        conn.open()
    texts += [repr(ssh_host.key), str(refused.value), str(refused.value.hint)]
    with ssh_host.key.private_key_file(tmp_path) as path:
        pem_lines = path.read_text().splitlines()
    secret_lines = [line for line in pem_lines if line and not line.startswith("-----")]
    assert secret_lines
    everything = caplog.text + "\n".join(texts)
    assert "paramiko" in caplog.text or "asyncssh" in caplog.text  # we did capture them
    for line in secret_lines:
        assert line not in everything
    assert "PRIVATE KEY" not in everything


def test_tpu_busy_is_reported_as_such(ssh_host: SshHost) -> None:
    script = "echo 'The TPU is already in use by process with pid 4242.' >&2; exit 1"
    with ssh_host.connect() as conn, pytest.raises(TpuBusyError) as busy:
        conn.run(["sh", "-c", script], timeout=10, check=True)
    assert busy.value.exit_status == 1


def test_a_server_that_listens_late_is_waited_for(
    start_ssh_host: HostStarter, tmp_path: Path
) -> None:
    # Timed from before the host starts, a connection tried less than `refuse` seconds
    # later is inside the refusal however slow the start: it must be refused. Tried
    # later (a loaded machine), it proves nothing, so the host is started again with a
    # window four times as long. A bound on the elapsed time alone would also pass on
    # a host that listened at once but was slow to answer.
    for attempt, refuse in enumerate((1.5, 6.0, 24.0)):
        started = time.monotonic()
        host = start_ssh_host(
            tmp_path / f"sandbox-{attempt}", node_key=f"late-{attempt}", refuse_for=refuse
        )
        refused = _refuses(host.endpoint.host, host.endpoint.port)
        inside = time.monotonic() - started < refuse  # measured once the probe is done
        if inside:
            break
    assert inside, "never reached the host inside its refusal"
    assert refused, "the host accepted a connection inside its refusal window"
    with host.connect(connect_timeout=refuse + 15) as conn:
        assert conn.run(["echo", "up"], timeout=10).stdout == "up\n"
    assert time.monotonic() - started >= refuse


def test_a_server_that_never_listens_is_reported_past_the_deadline(
    start_ssh_host: HostStarter, tmp_path: Path
) -> None:
    host = start_ssh_host(tmp_path / "sandbox", refuse_for=60)
    started = time.monotonic()
    with host.connect(connect_timeout=1.0) as conn, pytest.raises(ConnectError) as failed:
        conn.run(["touch", "ran"], timeout=10)
    elapsed = time.monotonic() - started
    assert 1.0 <= elapsed < 10.0  # the 1 s deadline, far from the server's 60 s
    assert "within 1s" in str(failed.value)
    assert "attempts" in str(failed.value)
    assert failed.value.hint
    assert not (host.sandbox / "ran").exists()


def test_stopping_a_node_ends_its_server_and_sessions(
    start_ssh_host: HostStarter, tmp_path: Path
) -> None:
    host = start_ssh_host(tmp_path / "sandbox", node_key="doomed")
    host_backend = host.backend
    with host.connect() as conn:
        conn.run("sleep 30 >/dev/null 2>&1 & echo $! > sleeper.pid", timeout=10, check=True)
    sleeper = int((host.sandbox / "sleeper.pid").read_text())
    assert _pid_alive(sleeper)
    host_backend.stop("doomed")
    host_backend.stop("doomed")  # idempotent
    deadline = time.monotonic() + 5
    while _pid_alive(sleeper) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _pid_alive(sleeper)
    with host.connect(connect_timeout=0.5) as conn, pytest.raises(ConnectError):
        conn.open()


def test_the_image_has_jax_for_a_fresh_venv(ssh_host: SshHost) -> None:
    command = (
        "python3 -m venv --without-pip ~/jax-tpu-lab/.venv && "
        "~/jax-tpu-lab/.venv/bin/python -c 'import sys, jax; print(sys.prefix)'"
    )
    with ssh_host.connect() as conn:
        result = conn.run(command, timeout=60, check=True)
    assert result.stdout.strip() == str(ssh_host.sandbox.resolve() / "jax-tpu-lab" / ".venv")


def test_losing_the_host_mid_command_is_a_connect_error(
    start_ssh_host: HostStarter, tmp_path: Path
) -> None:
    host = start_ssh_host(tmp_path / "sandbox", node_key="preempted")
    with host.connect() as conn:
        conn.open()
        # Like a spot VM reclaimed under a running command.
        reclaim = threading.Timer(0.5, host.backend.stop, ("preempted",))
        reclaim.start()
        started = time.monotonic()
        with pytest.raises(ConnectError, match=r"dropped|failed while"):
            conn.run(["sleep", "20"], timeout=30)
        assert time.monotonic() - started < 10
        reclaim.join()


def test_a_host_gone_after_it_worked_is_given_the_reconnect_bound_not_the_boot_one(
    start_ssh_host: HostStarter, tmp_path: Path
) -> None:
    host = start_ssh_host(tmp_path / "sandbox", node_key="reclaimed")
    clock = FakeClock(now=1000.0)
    with host.connect(connect_timeout=600, clock=clock, sleep=clock.sleep) as conn:
        conn.run(["true"], timeout=10, check=True)
        host.backend.stop("reclaimed")  # a spot VM reclaimed between two commands
        with pytest.raises(ConnectError, match="was lost and could not be opened again"):
            conn.run(["true"], timeout=10)
    # Refused at once on every try: the held clock moves only by the retries' naps.
    assert clock.now - 1000.0 <= RECONNECT_TIMEOUT + 5  # the last nap may overrun
    assert sum(clock.sleeps) < 600


def test_sessions_see_the_image_environment_only(
    ssh_host: SshHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TPULAB_CONTROLLER_ONLY", "leak")  # must not reach the "VM"
    with ssh_host.connect() as conn:
        result = conn.run(["env"], timeout=10, check=True)
    names = {line.split("=", 1)[0] for line in result.stdout.splitlines() if "=" in line}
    image = {"HOME", "USER", "LOGNAME", "SHELL", "LANG", "PATH", "PYTHONPATH"}
    assert image <= names
    emulator = {"TPULAB_EMULATED_NODE", "TPULAB_EMULATED_IMAGE"}  # node tag, image name
    # The preloaded image's shared jax compilation cache (tpulab/emulator/hostenv.py).
    warm_jax = {
        "JAX_COMPILATION_CACHE_DIR",
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES",
    }
    # The machine's CA bundle and proxies, as a real VM has its own (both images).
    network = {name for name in NETWORK_VARS if name in os.environ}
    assert names - image <= {
        *emulator, *warm_jax, *network, "SSH_CONNECTION", "PWD", "SHLVL", "_"
    }  # fmt: skip


@pytest.mark.openssh
def test_keys_installed_late_by_the_guest_agent_are_waited_for(tmp_path: Path) -> None:
    """Like a real VM: sshd is up before the guest agent writes authorized_keys."""
    from helpers import require_tool
    from ssh_fixtures import sshd_available

    from tpulab.emulator.openssh import OpenSshHostBackend

    require_tool(sshd_available(), "OpenSSH server (sshd and sftp-server)")
    backend = OpenSshHostBackend(tmp_path / "hosts")
    try:
        key = RunKey()
        endpoint = backend.start("late-keys", tmp_path / "sandbox", "")
        authorized = tmp_path / "hosts" / "openssh" / "late-keys" / "authorized_keys"
        assert authorized.read_text() == ""
        target = SshTarget(
            endpoint.host,
            endpoint.port,
            backend.login_user,
            HostKey(endpoint.host_key_type, endpoint.host_key_b64),
        )
        with (
            Connection(target, key, connect_timeout=10, auth_retry_for=0.5) as conn,
            pytest.raises(AuthError),
        ):
            conn.open()
        agent = threading.Timer(1.0, authorized.write_text, (key.public_line("tpulab") + "\n",))
        agent.start()
        started = time.monotonic()
        with Connection(target, key, connect_timeout=10, auth_retry_for=8) as conn:
            assert conn.run(["echo", "in"], timeout=10).stdout == "in\n"
        assert time.monotonic() - started >= 0.9
    finally:
        backend.close()


def test_a_command_killed_by_a_signal_reports_128_plus_the_signal(ssh_host: SshHost) -> None:
    # The remote shell (and `timeout`) relay a killed child the POSIX way, on both hosts.
    with ssh_host.connect() as conn:
        result = conn.run(["sh", "-c", "echo before; kill -KILL $$"], timeout=20)
        assert result.exit_status == 128 + 9
        assert result.stdout == "before\n"
        with pytest.raises(CommandFailedError) as failed:
            conn.run(["sh", "-c", "kill -TERM $$"], timeout=20, check=True)
        assert failed.value.exit_status == 128 + 15


def test_a_node_key_with_shell_metacharacters_is_inert(
    start_ssh_host: HostStarter, tmp_path: Path
) -> None:
    node_key = "p/z/n'; touch pwned; $(touch pwned) `touch pwned`\n"
    host = start_ssh_host(tmp_path / "sandbox", node_key=node_key)
    with host.connect() as conn:
        assert conn.run(["echo", "ok"], timeout=10).stdout == "ok\n"
    host.backend.stop(node_key)
    assert not list(tmp_path.rglob("pwned"))
    assert not list(Path.cwd().glob("pwned"))


@pytest.mark.parametrize("escape", ["env -i", "setsid env -i"])
def test_a_daemon_without_the_node_tag_dies_with_the_node(ssh_host: SshHost, escape: str) -> None:
    """Deleting a node kills what its sessions left running, even a daemon that wiped its
    environment (the node's tag lived there), left its session and its directory: it
    stays in the tree of the session's holder (a child subreaper), where stop finds it.
    It once survived `down` and node deletes."""
    from tpulab.emulator.processes import NODE_TAG_VAR

    pid_file = ssh_host.sandbox / "daemon.pid"
    # The daemon names itself once it has left the directory (then becomes `sleep`):
    # `$!` of a backgrounded `cd / && sleep` was read while its `cd` had not run yet
    # on a loaded machine (CI, 2026-12-07), and its cwd was still the session's.
    daemon = f"cd / && echo $$ > {pid_file}.new && mv {pid_file}.new {pid_file} && exec sleep 1000"
    inner = f"/bin/sh -c {shlex.quote(daemon)} </dev/null >/dev/null 2>&1 &"
    with ssh_host.connect() as conn:
        done = conn.run(f"{escape} /bin/sh -c {shlex.quote(inner)}", timeout=60)
        assert done.exit_status == 0, done.stderr
        # The session has ended; its daemon lives on, as on a VM.
        assert conn.run(["true"], timeout=30).exit_status == 0
    wait_until(pid_file.exists, "the daemon to name itself", 30)
    pid = int(pid_file.read_text())
    assert _pid_alive(pid)
    assert NODE_TAG_VAR.encode() not in Path(f"/proc/{pid}/environ").read_bytes()
    assert os.readlink(f"/proc/{pid}/cwd") == "/"
    ssh_host.backend.stop("node-1")  # what deleting (or rebooting) the node does
    wait_until(lambda: not _pid_alive(pid), f"the daemon {pid} to die with its node", 30)


def test_a_put_after_the_connection_died_reconnects_rather_than_reuse_its_sftp(
    ssh_host: SshHost,
) -> None:
    """SFTP rides the connection: once the connection died (a command saw it drop and
    said so, without closing it), the next put must open both again. It reused the dead
    SFTP channel: 'Upload to ... failed: Socket is closed' (CI: the workspace upload's
    second try after a drop, when the drop was seen as a command's lost status)."""
    with ssh_host.connect() as conn:
        assert conn.put(b"one", "first.txt") == hashlib.sha256(b"one").hexdigest()
        assert conn._client is not None
        transport = conn._client.get_transport()
        assert transport is not None
        transport.sock.shutdown(socket.SHUT_RDWR)  # the network drops
        wait_until(lambda: not transport.is_active(), "paramiko to see the drop", timeout=30)
        assert conn.put(b"two", "second.txt") == hashlib.sha256(b"two").hexdigest()
        assert conn.run(["cat", "second.txt"], timeout=30, check=True).stdout == "two"


def test_a_failure_on_the_dropped_connection_leaves_the_new_one_open(
    ssh_host: SshHost,
) -> None:
    """The lease renewer's thread shares the run's connection. After a drop, the run's
    thread connects again to follow its command; the renewer's own failure on the
    dropped connection, met later, must not close that new one (it did: the follow lost
    it and connected a third time, CI on OpenSSH). Here one thread plays both: an
    operation starts on the first connection, the connection is replaced meanwhile, and
    the operation then fails on the first."""
    with ssh_host.connect() as conn:
        conn.run(["true"], timeout=30, check=True)
        first = conn._client
        assert first is not None
        transport = first.get_transport()
        assert transport is not None

        def renew_on_the_dropped_connection() -> None:
            with conn._mapped("renewing the lease"):
                transport.sock.shutdown(socket.SHUT_RDWR)  # the network drops
                conn.close()
                conn.open()  # the run's thread follows its command on a new connection
                raise EOFError("the renewer's read on the dropped connection")

        with pytest.raises(ConnectError):
            renew_on_the_dropped_connection()
        assert conn._client is not None
        assert conn._client is not first
        assert conn._client_active()  # still open for the run's thread
        assert conn.run(["echo", "followed"], timeout=30, check=True).stdout == "followed\n"


class _SlowToLetGo(Connection):
    """Counts its connects; the thread named `slow` stops before letting go of the
    client it found dead, until `resume` is set (the window of a race, held open)."""

    def __init__(self, target: SshTarget, key: RunKey) -> None:
        super().__init__(target, key, connect_timeout=10.0)
        self.connects = 0
        self.slow: threading.Thread | None = None
        self.reached, self.resume = threading.Event(), threading.Event()

    def open(self) -> None:
        if self._client is None:
            self.connects += 1
        super().open()

    def _let_go_of(self, client: object) -> None:
        if threading.current_thread() is self.slow:
            self.reached.set()
            self.resume.wait(timeout=60)
        super()._let_go_of(client)  # type: ignore[arg-type]


def test_two_threads_that_find_the_connection_dropped_open_one_new_one(
    ssh_host: SshHost,
) -> None:
    """The lease renewer and the run's thread share a connection. After a drop each
    finds it dead as its next command starts; the one that goes on first connects again,
    and the other, letting go of the dead client only then, must not close the new one
    (it did: it closed whatever was current, and connected a third time, CI
    /tmp/ci131, embedded server)."""
    conn = _SlowToLetGo(ssh_host.target(), ssh_host.key)
    try:
        conn.run(["true"], timeout=30, check=True)
        first = conn._client
        assert first is not None
        transport = first.get_transport()
        assert transport is not None
        transport.sock.shutdown(socket.SHUT_RDWR)  # the network drops
        wait_until(lambda: not transport.is_active(), "paramiko to see the drop", timeout=30)
        said: list[str] = []

        def renew() -> None:
            said.append(conn.run(["echo", "renewed"], timeout=30, check=True).stdout)

        conn.slow = threading.Thread(target=renew, name="renewer")
        conn.slow.start()
        assert conn.reached.wait(timeout=30), "the renewer never found the client dead"
        # The run's thread, meanwhile: finds it dead too, lets go of it, connects again.
        assert conn.run(["echo", "followed"], timeout=30, check=True).stdout == "followed\n"
        second = conn._client
        assert second is not first
        conn.resume.set()
        conn.slow.join(timeout=60)
        assert said == ["renewed\n"]
        assert conn._client is second, "the renewer closed the new connection"
        assert conn.connects == 2  # the first, and one after the drop
    finally:
        conn.resume.set()
        conn.close()
