"""tpulab.remote.ssh without a server (keys, pinning inputs, command building), plus the two
waits that involve one: a late host key and a port that is not speaking SSH."""

from __future__ import annotations

import base64
import io
import pickle
import shlex
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import paramiko
import pytest
from helpers import FakeClock
from hypothesis import given, settings
from hypothesis import strategies as st

from tpulab.contract import EMULATOR_SSH_PORT_ATTRIBUTE as SSH_PORT_ATTRIBUTE
from tpulab.emulator.sshhost import EmbeddedHostBackend
from tpulab.errors import ConfigError, ConnectError, HostKeyMismatchError, TransientError
from tpulab.remote.ssh import (
    HOST_KEY_ATTRIBUTE,
    Connection,
    HostKey,
    HostKeyNotPublishedError,
    RunKey,
    SshTarget,
    _shown,
    host_key_from,
    remote_command,
    ssh_port_from,
    wait_for_host_key,
)

# -- keys ------------------------------------------------------------------------------


def test_run_key_lines_have_the_metadata_shape() -> None:
    key = RunKey()
    entry = key.metadata_entry("alice")
    user, _, line = entry.partition(":")
    key_type, body, comment = line.split(" ")
    assert (user, key_type, comment) == ("alice", "ssh-ed25519", "alice")
    assert key.public_line("alice") == line
    blob = base64.b64decode(body)
    assert blob[4:15] == b"ssh-ed25519"
    assert len(blob) == 4 + 11 + 4 + 32
    # paramiko, loading the private half, derives the same public half.
    pem = key.openssh_private_bytes().decode()
    assert paramiko.Ed25519Key.from_private_key(io.StringIO(pem)).get_base64() == body
    assert RunKey().public_b64 != body


@pytest.mark.parametrize("user", ["", "bad user", "a:b", "1abc", "x" * 33, "ro\not"])
def test_run_key_rejects_users_that_would_break_the_metadata_line(user: str) -> None:
    with pytest.raises(ConfigError):
        RunKey().metadata_entry(user)


def test_run_key_private_half_stays_private(tmp_path: Path) -> None:
    key = RunKey()
    with key.private_key_file(tmp_path) as path:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        pem = path.read_text()
        assert "OPENSSH PRIVATE KEY" in pem
    assert not path.exists()
    body = [line for line in pem.splitlines() if not line.startswith("-----")]
    assert all(line not in repr(key) for line in body)
    assert key.fingerprint in repr(key)
    with pytest.raises(TypeError):
        pickle.dumps(key)


def test_host_key_fingerprint_matches_paramikos_and_bad_keys_are_refused() -> None:
    body = RunKey().public_b64
    host_key = HostKey("ssh-ed25519", body)
    as_paramiko = paramiko.PKey.from_type_string("ssh-ed25519", base64.b64decode(body))
    assert host_key.fingerprint == as_paramiko.fingerprint
    with pytest.raises(HostKeyMismatchError):
        HostKey("ssh-ed25519", "not base64!")
    with pytest.raises(HostKeyMismatchError):
        HostKey("ssh-rsa", body)  # the body says ed25519


# -- guest attributes ------------------------------------------------------------------


def test_guest_attribute_helpers() -> None:
    body = RunKey().public_b64
    assert host_key_from({HOST_KEY_ATTRIBUTE: body}).b64 == body
    assert host_key_from({HOST_KEY_ATTRIBUTE: f"ssh-ed25519 {body}"}).b64 == body
    with pytest.raises(HostKeyNotPublishedError) as missing:
        host_key_from({})
    assert isinstance(missing.value, ConnectError)
    assert "not published" in str(missing.value)
    assert missing.value.hint
    assert ssh_port_from({}) == 22
    assert ssh_port_from({SSH_PORT_ATTRIBUTE: "2222"}) == 2222
    for bad in ("", "ssh", "0", "65536"):
        with pytest.raises(ConnectError, match=SSH_PORT_ATTRIBUTE):
            ssh_port_from({SSH_PORT_ATTRIBUTE: bad})


def test_a_late_host_key_is_waited_for_and_a_missing_one_reported() -> None:
    body = RunKey().public_b64
    fake = FakeClock()
    calls: list[float] = []

    def fetch() -> dict[str, str]:
        calls.append(fake.now)
        if len(calls) == 2:
            raise TransientError("503 from the API")
        return {HOST_KEY_ATTRIBUTE: body} if fake.now >= 7 else {}

    got = wait_for_host_key(fetch, timeout=30, sleep=fake.sleep, clock=fake.clock)
    assert got.b64 == body
    assert 7 <= fake.now < 12
    assert max(fake.sleeps) <= 5

    fake = FakeClock()
    with pytest.raises(HostKeyNotPublishedError, match="within 20s") as late:
        wait_for_host_key(dict, timeout=20, sleep=fake.sleep, clock=fake.clock)
    assert fake.now == pytest.approx(20)
    assert late.value.hint


def test_a_host_key_published_late_then_used_for_a_real_session(tmp_path: Path) -> None:
    backend = EmbeddedHostBackend(tmp_path / "hosts")
    try:
        key = RunKey()
        endpoint = backend.start("n", tmp_path / "sandbox", key.metadata_entry("u"))
        attrs: dict[str, str] = {}
        publish = threading.Timer(1.0, attrs.update, ({HOST_KEY_ATTRIBUTE: endpoint.host_key_b64},))
        publish.start()
        started = time.monotonic()
        host_key = wait_for_host_key(lambda: dict(attrs), timeout=10)
        assert time.monotonic() - started >= 0.9
        target = SshTarget(endpoint.host, endpoint.port, "u", host_key)
        with Connection(target, key) as conn:
            assert conn.run(["echo", "pinned"], timeout=10).stdout == "pinned\n"
    finally:
        backend.close()


# -- command building ------------------------------------------------------------------


def test_remote_command_shapes() -> None:
    argv = ["python3", "verify.py", "--nonce", "a b;c"]
    assert shlex.split(remote_command(argv)) == argv
    with_env = remote_command(argv, env={"JAX_PLATFORMS": "tpu"})
    assert with_env == "export JAX_PLATFORMS=tpu; " + shlex.join(argv)
    wrapped = shlex.split(remote_command(argv, timeout=5))
    assert wrapped[:5] == ["timeout", "--signal=KILL", "5.000", "/bin/sh", "-c"]
    assert shlex.split(wrapped[5]) == argv
    for bad_env in ({"A B": "x"}, {"1A": "x"}, {"A;rm": "x"}, {"A": "x\0"}):
        with pytest.raises(ConfigError):
            remote_command(argv, env=bad_env)
    bad: list[str] | str
    for bad in ([], "  "):
        with pytest.raises(ConfigError):
            remote_command(bad)
    with pytest.raises(ConfigError):
        remote_command(argv, timeout=0)


# Anything a process argument can hold: all of Unicode except NUL and lone surrogates.
_SHELL_SAFE_CHARS = st.characters(exclude_categories=["Cs"], exclude_characters="\0")


@settings(max_examples=60, deadline=None)
@given(arg=st.text(_SHELL_SAFE_CHARS), value=st.text(_SHELL_SAFE_CHARS))
def test_any_argument_or_env_value_reaches_the_program_intact(arg: str, value: str) -> None:
    # What a POSIX shell on the VM would do with the command string: run it for real.
    argv = ["sh", "-c", 'printf "%s|%s" "$1" "$V"', "sh", arg]
    command = remote_command(argv, env={"V": value}, timeout=10)
    out = subprocess.run(["/bin/sh", "-c", command], capture_output=True, check=True).stdout
    assert out == f"{arg}|{value}".encode()


def test_target_validation() -> None:
    host_key = HostKey("ssh-ed25519", RunKey().public_b64)
    for host, port, user in (("", 22, "u"), ("a b", 22, "u"), ("h", 0, "u"), ("h", 22, "u u")):
        with pytest.raises(ConfigError):
            SshTarget(host, port, user, host_key)
    assert str(SshTarget("10.0.0.2", 22, "u", host_key)) == "u@10.0.0.2:22"


def test_a_port_that_does_not_speak_ssh_is_reported_as_a_connect_error() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                client, _ = server.accept()
            except TimeoutError:
                continue
            with client:
                client.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        host_key = HostKey("ssh-ed25519", RunKey().public_b64)
        target = SshTarget("127.0.0.1", server.getsockname()[1], "u", host_key)
        with (
            Connection(target, RunKey(), connect_timeout=0.6) as conn,
            pytest.raises(ConnectError, match="no SSH banner"),
        ):
            conn.open()
    finally:
        stop.set()
        thread.join()
        server.close()


def test_a_host_offering_only_another_key_type_is_refused(tmp_path: Path) -> None:
    """The server has no ed25519 key at all: still a mismatch, before authentication."""
    import asyncio

    import asyncssh

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    auth_attempts: list[str] = []

    class Server(asyncssh.SSHServer):
        def begin_auth(self, username: str) -> bool:
            auth_attempts.append(username)
            return True

    async def serve() -> asyncssh.SSHAcceptor:
        return await asyncssh.listen(
            "127.0.0.1",
            0,
            server_factory=Server,
            server_host_keys=[asyncssh.generate_private_key("ecdsa-sha2-nistp256")],
        )

    acceptor = asyncio.run_coroutine_threadsafe(serve(), loop).result(10)
    try:
        port = acceptor.sockets[0].getsockname()[1]
        pinned = HostKey("ssh-ed25519", RunKey().public_b64)
        target = SshTarget("127.0.0.1", port, "u", pinned)
        with (
            Connection(target, RunKey(), connect_timeout=5) as conn,
            pytest.raises(
                HostKeyMismatchError, match="presented host key ecdsa-sha2-nistp256 SHA256:"
            ),
        ):
            conn.run(["true"], timeout=5)
        assert auth_attempts == []
    finally:

        async def shut() -> None:  # asyncio objects are closed on their own loop only
            acceptor.close()
            await acceptor.wait_closed()

        asyncio.run_coroutine_threadsafe(shut(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


def test_paramikos_own_error_logs_never_reach_the_terminal() -> None:
    # paramiko's transport thread logs a connection reset at ERROR; with no handler of
    # the program's own, Python's last-resort handler printed it to stderr.
    script = (
        "import logging, tpulab.remote.ssh\n"
        "logging.getLogger('paramiko.transport').error('Socket exception: reset (104)')\n"
        "logging.getLogger('tpulab.other').error('tpulab keeps its own')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "Socket exception" not in done.stderr
    assert "tpulab keeps its own" in done.stderr  # last resort still works for others


def test_a_script_passed_as_an_argument_is_named_by_its_size_in_messages() -> None:
    """The transfers run `python3 -c <source> unpack DIR`: an error named the command by
    its first 120 characters, which were the script's docstring (a dropped upload named
    the start of the transfer script's docstring), never what it was doing."""
    from tpulab.remote.workspace import unpack_command

    shown = _shown(unpack_command("jax-tpu-lab/workspace", keep=True))
    lines = unpack_command("d")[2].count("\n") + 1
    assert shown == f"python3 -c '<{lines}-line script>' unpack jax-tpu-lab/workspace --keep"
    assert _shown(["echo", "hi"]) == "echo hi"
    assert _shown("x" * 200) == "x" * 117 + "..."
