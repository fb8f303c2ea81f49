"""SSH to a TPU VM with nothing trusted on first use. The only module that imports paramiko.

The keys and targets live in `tpulab.remote.keys` (re-exported here); this module turns them
into paramiko objects. The client knows exactly one host key, the one the Cloud TPU API
published for the node, and uses `RejectPolicy`: any other key aborts the handshake
before authentication, let alone before a command runs.

`Connection` is a context manager, opened lazily, with `run`, `run_streaming` (stdin and
stdout as byte streams: the workspace transfers), `hold` (a command left running, its
stdin open, until the connection closes: the exec lock), `put` and `get`. Errors map
onto `tpulab.errors` at this seam:

      paramiko.BadHostKeyException, "not found in known_hosts"  -> HostKeyMismatchError
      paramiko.AuthenticationException                         -> AuthError
      socket errors, NoValidConnectionsError (an OSError, not
        an SSHException), banner/handshake failures            -> retried, then ConnectError
      command ran past `timeout`                                -> RemoteTimeoutError
      non-zero exit with check=True                             -> CommandFailedError
                                                                   (TpuBusyError for libtpu's
                                                                   "already in use")

Remote timeouts are enforced ON THE REMOTE SIDE with coreutils `timeout --signal=KILL`
wrapped around the command, not by a pid file and a second `kill` session: the limit is
armed atomically with the command (no window between start and recording a pid), it
kills the whole process group `timeout` leads (the command's children too), and it still
fires if our connection or the controller dies. The client also gives up `kill_grace`
seconds later in case the remote `timeout` itself is wedged.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import re
import select
import shlex
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, BinaryIO

from tpulab.errors import (
    AuthError,
    CommandFailedError,
    ConfigError,
    ConnectError,
    HostKeyMismatchError,
    RemoteError,
    RemoteTimeoutError,
    TpuBusyError,
    TpuLabError,
)
from tpulab.polling import Backoff, Tries, poll_until, time_left
from tpulab.remote.cmdline import SHA256_TIMEOUT, remote_command, remote_path, sha256_command
from tpulab.remote.keys import (
    HOST_KEY_ATTRIBUTE,
    HostKey,
    HostKeyNotPublishedError,
    RunKey,
    SshTarget,
    fingerprint,
    host_key_from,
    ssh_port_from,
    wait_for_host_key,
)
from tpulab.remote.lines import LineSplitter

if TYPE_CHECKING:
    import paramiko

__all__ = [
    "HOST_KEY_ATTRIBUTE",
    "RECONNECT_TIMEOUT",
    "Connection",
    "HeldCommand",
    "HostKey",
    "HostKeyNotPublishedError",
    "RunKey",
    "RunResult",
    "SshTarget",
    "host_key_from",
    "remote_command",
    "ssh_port_from",
    "wait_for_host_key",
]

log = logging.getLogger(__name__)
# paramiko logs what it sees of a dying connection at ERROR ("Socket exception:
# Connection reset by peer (104)", from its transport thread). With no handler of the
# program's own, Python's last-resort handler printed that to the user's terminal,
# beside tpulab's own words for the same event (or none needed: a VM `down` just
# deleted). A handler on paramiko's logger keeps it out; a logging setup of the
# program's (`-v`) still receives the records, which propagate as before.
logging.getLogger("paramiko").addHandler(logging.NullHandler())


class _KeyNotInstalledYet(Exception):
    """The server refused our key inside the `auth_retry_for` window: try again."""


def _said(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


_CHUNK = 32 * 1024
_TAIL = 2000
_EOF_GRACE = 2.0  # seconds to wait for the output's EOF once the exit status is in


# -- commands --------------------------------------------------------------------------


@dataclass(frozen=True)
class RunResult:
    # A signal usually shows as 128+N (the remote shell reports it); -1 means the server
    # sent no status at all (the process itself was signalled, or the session was cut).
    exit_status: int
    stdout: str
    stderr: str
    duration: float

    @property
    def output_tail(self) -> str:
        return (self.stdout + self.stderr)[-_TAIL:]


@dataclass(frozen=True)
class HeldCommand:
    """What `Connection.hold` saw: the output up to the command's first stdout line, and
    its exit status if it has already ended (None: it runs on, held by the connection)."""

    exit_status: int | None
    stdout: str
    stderr: str


def _paramiko_key(key: RunKey) -> paramiko.PKey:
    import paramiko

    pem = key.openssh_private_bytes().decode("ascii")
    return paramiko.Ed25519Key.from_private_key(io.StringIO(pem))


def _paramiko_host_key(host_key: HostKey) -> paramiko.PKey:
    import paramiko

    return paramiko.PKey.from_type_string(host_key.key_type, host_key.blob)


def _shown(argv: Sequence[str] | str) -> str:
    """The command as error messages name it: never a whole script. A script passed as
    one argument (the transfers' `python3 -c <source> unpack DIR`) is named by its size,
    so what it was asked to do stays in view."""
    if not isinstance(argv, str):
        argv = shlex.join(
            f"<{arg.count(chr(10)) + 1}-line script>" if "\n" in arg else arg for arg in argv
        )
    return argv if len(argv) <= 120 else argv[:117] + "..."


def _active(client: paramiko.SSHClient | None) -> bool:
    """Is `client`'s connection still up?"""
    transport = client.get_transport() if client is not None else None
    return transport is not None and transport.is_active()


def _chunks_of(source: BinaryIO | Iterable[bytes] | None) -> Iterator[bytes] | None:
    """A stream's chunks: a file is read `_CHUNK` at a time, an iterable passes through."""
    if source is None:
        return None
    if hasattr(source, "read"):
        reader: BinaryIO = source  # type: ignore[assignment]
        return iter(lambda: reader.read(_CHUNK), b"")
    return (bytes(chunk) for chunk in source if chunk)


# -- the connection --------------------------------------------------------------------

# How long a connection lost after it worked is given to come back (see Connection).
RECONNECT_TIMEOUT = 20.0


class Connection:
    """An SSH session to one pinned host; opened on first use, closed on exit.

    `connect_timeout` bounds the wait for the server to come up; `auth_retry_for` keeps
    retrying a refused key for that long (0 = fail at once, right for the emulator; a
    real VM may need ~60 s while its guest agent installs the metadata keys). A
    connection lost after it worked is opened again on next use, within
    RECONNECT_TIMEOUT: a network blip comes back in seconds, and a VM that went away
    is not waited for as a booting one is. Commands may run from more than one thread
    (the lease renewer shares the run's connection; paramiko multiplexes the channels),
    and opening is serialised.
    """

    def __init__(
        self,
        target: SshTarget,
        key: RunKey,
        *,
        connect_timeout: float = 120.0,
        banner_timeout: float = 15.0,
        keepalive: int = 15,
        kill_grace: float = 5.0,
        auth_retry_for: float = 0.0,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.target = target
        self._key = key
        self.connect_timeout = connect_timeout
        self.banner_timeout = banner_timeout
        self.keepalive = keepalive
        self.kill_grace = kill_grace
        self.auth_retry_for = auth_retry_for
        self._sleep = sleep
        self._clock = clock
        self._client: paramiko.SSHClient | None = None
        self._was_open = False  # once it has worked, an open is a reconnect
        self._opening = threading.Lock()
        self._sftp: paramiko.SFTPClient | None = None
        self._home: str | None = None
        self._held: list[paramiko.Channel] = []
        self._beats: list[tuple[threading.Event, threading.Thread]] = []

    def __repr__(self) -> str:
        state = "open" if self._client is not None else "closed"
        return f"Connection({self.target}, {state})"

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Let go of the connection; never raises. Closing one that has died is what
        this is for (it runs as a failure is reported): paramiko's polite close of the
        SFTP channel raises EOFError over a dead socket, which replaced the failure's
        ConnectError and left this connection holding the dead transport, so the next
        command could not reconnect."""
        self._let_go()
        sftp, self._sftp = self._sftp, None
        client, self._client = self._client, None
        for part in (sftp, client):
            if part is not None:
                with contextlib.suppress(Exception):  # EOFError, OSError, SSHException
                    part.close()

    # -- opening -------------------------------------------------------------------------

    def open(self) -> None:
        """Connect, waiting for the server within `connect_timeout`: sshd often starts
        listening some seconds after the node is READY. A reconnect waits at most
        RECONNECT_TIMEOUT."""
        # The lease renewer's thread shares this connection: after a drop both may
        # reconnect at once, and only one client may be kept (the other would leak).
        with self._opening:
            if self._client is None:
                self._connect()

    def _connect(self) -> None:
        t = self.target
        refused_at: list[float] = []  # when the key was first refused, if it was
        reconnect = self._was_open
        budget = min(self.connect_timeout, RECONNECT_TIMEOUT) if reconnect else self.connect_timeout

        def attempt() -> paramiko.SSHClient:
            import paramiko

            remaining = max(time_left(budget), 0.1)
            try:
                self._probe(min(remaining, self.banner_timeout))
                return self._handshake(remaining)
            except paramiko.BadHostKeyException as exc:
                presented = f"{exc.key.get_name()} {fingerprint(exc.key.asbytes())}"
                raise self._mismatch(presented) from exc
            except paramiko.AuthenticationException as exc:
                # A real VM's guest agent writes metadata keys into authorized_keys some
                # seconds after sshd starts; the host key was verified before auth, so
                # retrying for a bounded window trusts nothing new.
                now = self._clock()
                refused_at[:1] = refused_at[:1] or [now]
                if now - refused_at[0] < self.auth_retry_for:
                    raise _KeyNotInstalledYet(str(exc)) from exc
                raise self._refused() from exc
            except paramiko.SSHException as exc:
                if "not found in known_hosts" in str(exc):
                    # The server offered no key of the pinned type: also a mismatch.
                    raise self._mismatch("no key of the pinned type") from exc
                raise

        def not_ready(error: Exception) -> bool:
            import paramiko

            retryable = (_KeyNotInstalledYet, paramiko.SSHException, OSError, EOFError)
            return isinstance(error, retryable)

        def on_retry(error: Exception, delay: float) -> None:
            log.debug("ssh to %s not ready (%s); next try in %.1fs", t, _said(error), delay)

        def gave_up(tries: Tries[paramiko.SSHClient]) -> Exception:
            if isinstance(tries.error, _KeyNotInstalledYet):
                return self._refused()
            last = _said(tries.error) if tries.error is not None else "no attempt was made"
            if reconnect:
                return ConnectError(
                    f"The SSH connection to {t} was lost and could not be opened again "
                    f"within {tries.timeout:g}s ({tries.attempts} attempts; last error: "
                    f"{last})",
                    hint="The VM may have been preempted, stopped or deleted; check its state.",
                )
            return ConnectError(
                f"Could not open an SSH session to {t} within "
                f"{tries.timeout:g}s ({tries.attempts} attempts; last error: {last})",
                hint="Check that the node is READY and reachable on that port from "
                "this machine; if the VM just boots slowly, give it longer with "
                "--boot-timeout.",
            )

        self._client = poll_until(
            attempt,
            lambda _client: True,
            timeout=budget,
            clock=self._clock,
            sleep=self._sleep,
            backoff=Backoff(initial=0.25, cap=5.0, factor=2.0, jitter=0.1),
            retry_if=not_ready,
            on_retry=on_retry,
            expired=gave_up,
        )
        self._was_open = True
        log.debug("ssh %s to %s", "reconnected" if reconnect else "connected", t)

    def _refused(self) -> AuthError:
        t = self.target
        return AuthError(
            f"{t} refused this run's SSH key ({self._key.fingerprint})",
            hint=f"The node's metadata ssh-keys must list this run's key for user "
            f"{t.user!r}; tpulab injects it at create time (with enable-oslogin: "
            "FALSE), so a node created elsewhere cannot be used. If your "
            "organisation enforces OS Login (policy compute.requireOsLogin), the "
            "VM ignores ssh-keys whatever the node says: ask an admin to exempt "
            "the project, or grant yourself roles/compute.osAdminLogin and use "
            "`gcloud compute tpus tpu-vm ssh`.",
        )

    def _mismatch(self, presented: str) -> HostKeyMismatchError:
        t = self.target
        return HostKeyMismatchError(
            f"{t.host}:{t.port} presented host key {presented}, but the Cloud TPU API "
            f"published {t.host_key.key_type} {t.host_key.fingerprint}; nothing was sent",
            hint="If the VM was just recreated, fetch its guest attributes again. Otherwise "
            "something else answers at that address: do not connect.",
        )

    def _probe(self, timeout: float) -> None:
        """A cheap TCP connect + banner read, so we do not spin up paramiko's transport
        thread against a port that is not serving SSH yet."""
        with socket.create_connection((self.target.host, self.target.port), timeout) as sock:
            banner = b""
            while b"\n" not in banner and len(banner) < 256:
                chunk = sock.recv(256)
                if not chunk:
                    break
                banner += chunk
        if not banner.startswith(b"SSH-"):
            raise ConnectionError(f"no SSH banner (got {banner[:40]!r})")

    def _handshake(self, timeout: float) -> paramiko.SSHClient:
        import paramiko

        t = self.target
        client = paramiko.SSHClient()
        # paramiko looks host keys up under "host" for port 22 and "[host]:port" otherwise.
        name = t.host if t.port == 22 else f"[{t.host}]:{t.port}"
        client.get_host_keys().add(name, t.host_key.key_type, _paramiko_host_key(t.host_key))
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        try:
            client.connect(
                t.host,
                port=t.port,
                username=t.user,
                pkey=_paramiko_key(self._key),
                timeout=timeout,
                banner_timeout=self.banner_timeout,
                auth_timeout=timeout,
                allow_agent=False,
                look_for_keys=False,
            )
        except BaseException:
            client.close()
            raise
        transport = client.get_transport()
        assert transport is not None
        transport.set_keepalive(self.keepalive)
        if isinstance(transport.sock, socket.socket):
            # Small request/reply messages (channel opens, exec) otherwise wait out
            # Nagle + delayed ACK: ~40 ms per command.
            transport.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return client

    def _transport(self) -> paramiko.Transport:
        """The live transport; a lost one is opened again (see the class)."""
        self.open()
        client = self._client
        transport = client.get_transport() if client is not None else None
        if transport is None or not transport.is_active():
            self._let_go_of(client)
            self.open()
            client = self._client
            transport = client.get_transport() if client is not None else None
            if transport is None:  # another thread let go of it at once: it died again
                raise ConnectError(
                    f"The SSH connection to {self.target} dropped as it was opened again",
                    hint="The VM may have been preempted or rebooted; check its state.",
                )
        return transport

    def _let_go_of(self, client: paramiko.SSHClient | None) -> None:
        """`close`, if `client` (found dead, or met by a failure) is still this
        connection's. The lease renewer's thread shares the connection: after a drop,
        the one that notices second must not close the new client the other opened
        meanwhile (a third connect where two were due: CI, both SSH servers, 2026-12-07;
        a check and a close of whatever is current left a window between them)."""
        with self._opening:
            if self._client is client:
                self.close()

    # -- run -----------------------------------------------------------------------------

    def run(
        self,
        argv: Sequence[str] | str,
        *,
        env: Mapping[str, str] | None = None,
        timeout: float,
        on_line: Callable[[str, str], None] | None = None,
        check: bool = False,
    ) -> RunResult:
        """Run a command with stdin closed, streaming output lines to `on_line(stream,
        line)` ("stdout"/"stderr"). Past `timeout` the remote process group is killed and
        RemoteTimeoutError raised."""
        channel, command, shown = self._open_session(argv, env=env, timeout=timeout)
        out, err = LineSplitter("stdout", on_line), LineSplitter("stderr", on_line)
        start = self._clock()
        give_up = start + timeout + self.kill_grace
        log.debug("ssh %s: %s", self.target, shown)
        try:
            with self._mapped(f"running {shown!r}"):
                channel.exec_command(command)
                channel.shutdown_write()
                status = self._pump(channel, out, err, give_up, shown, timeout)
        finally:
            channel.close()
        out.feed(b"", final=True)
        err.feed(b"", final=True)
        duration = self._clock() - start
        result = RunResult(status, out.text, err.text, duration)
        self._check_ended(status, duration, timeout, shown, "work", result.output_tail)
        if check and status != 0:
            busy = TpuBusyError.evidence_in(result.output_tail)
            cls = TpuBusyError if busy else CommandFailedError
            raise cls(
                f"{shown!r} on {self.target} exited with status {status}",
                exit_status=status,
                output_tail=result.output_tail,
                hint="See the output tail above."
                if cls is CommandFailedError
                else "A stale process holds the TPU: kill it on the VM or recreate the node.",
            )
        return result

    def run_streaming(
        self,
        argv: Sequence[str],
        *,
        stdin: BinaryIO | Iterable[bytes] | None,
        stdout: BinaryIO | None,
        timeout: float,
        env: Mapping[str, str] | None = None,
    ) -> RunResult:
        """Run a command with its stdin fed from `stdin` (a file or an iterable of
        chunks; None = closed) and its stdout written to `stdout` as it arrives (None =
        discarded); stderr is captured into the result, whose `stdout` is empty. Both
        directions move in `_CHUNK`s, interleaved, so neither side's pipe fills while the
        other waits, and nothing is held in memory whole. Past `timeout` the remote
        process group is killed and RemoteTimeoutError raised; the exit status is
        returned, not checked (the transfers read their own verdicts)."""
        chunks = _chunks_of(stdin)
        channel, command, shown = self._open_session(argv, env=env, timeout=timeout)
        err = LineSplitter("stderr", None)
        start = self._clock()
        give_up = start + timeout + self.kill_grace
        log.debug("ssh %s (streaming): %s", self.target, shown)
        try:
            with self._mapped(f"running {shown!r}"):
                channel.exec_command(command)
                status = self._pump_both(channel, chunks, stdout, err, give_up, shown, timeout)
        finally:
            channel.close()
        err.feed(b"", final=True)
        duration = self._clock() - start
        self._check_ended(status, duration, timeout, shown, "transfer", err.text)
        return RunResult(status, "", err.text, duration)

    def _open_session(
        self, argv: Sequence[str] | str, *, env: Mapping[str, str] | None = None, timeout: float
    ) -> tuple[paramiko.Channel, str, str]:
        """A new session for `argv`: its channel, the command line that runs `argv` under
        the remote `timeout`, and `argv` as messages name it."""
        command = remote_command(argv, env=env, timeout=timeout)
        shown = _shown(argv)
        for last_try in (False, True):
            transport = self._transport()
            try:
                with self._mapped(f"opening a session for {shown!r}"):
                    return transport.open_session(timeout=self.banner_timeout), command, shown
            except ConnectError:
                # A connection that looked alive and was not (dropped, not yet noticed:
                # a Ctrl-C can land while its stream is mid-message). Nothing was sent
                # on this session, so one fresh connection is tried.
                if last_try:
                    raise
        raise AssertionError("unreachable")

    def _check_ended(
        self, status: int, duration: float, timeout: float, shown: str, work: str, tail: str
    ) -> None:
        """Raise for a command the remote `timeout` killed, or whose connection dropped
        (`work` names what took long, `tail` is its last output)."""
        if status in (-1, 124, 137) and duration >= timeout * 0.98:
            raise RemoteTimeoutError(
                f"{shown!r} on {self.target} ran past its {timeout:g}s timeout and was "
                f"killed (remote exit status {status})",
                hint=f"Raise the timeout if the {work} legitimately takes longer. "
                "Last output: " + tail[-300:],
            )
        if status == -1 and not self._client_active():
            raise ConnectError(
                f"The SSH connection to {self.target} dropped while running {shown!r}",
                hint="The VM may have been preempted or rebooted; check its state.",
            )

    def _past_grace(self, shown: str, timeout: float) -> RemoteTimeoutError:
        """The session outlived the remote `timeout` and its grace: it was closed."""
        return RemoteTimeoutError(
            f"{shown!r} on {self.target} did not end within {timeout:g}s "
            f"(+{self.kill_grace:g}s grace); the session was closed",
            hint="The remote `timeout` did not take effect; the process may "
            "still be running on the VM.",
        )

    def _pump_both(
        self,
        channel: paramiko.Channel,
        chunks: Iterator[bytes] | None,
        stdout: BinaryIO | None,
        err: LineSplitter,
        give_up: float,
        shown: str,
        timeout: float,
    ) -> int:
        """`_pump` with a stdin to feed: send when the window allows, drain always."""
        pending = b""
        exited_at: float | None = None
        if chunks is None:
            channel.shutdown_write()
        while True:
            progressed = False
            while chunks is not None and channel.send_ready():
                if channel.exit_status_ready() or channel.closed:
                    chunks = None  # it has ended without reading it all: stop sending
                    break
                if not pending:
                    pending = next(chunks, b"")
                    if not pending:  # the source is exhausted: EOF to the command
                        chunks = None
                        channel.shutdown_write()
                        break
                try:
                    sent = channel.send(pending[:_CHUNK])
                except OSError:
                    if not (channel.exit_status_ready() or channel.closed):
                        raise
                    chunks = None  # closed by the server between our check and the send
                    break
                pending = pending[sent:]
                progressed = True
                if channel.recv_ready() or channel.recv_stderr_ready():
                    break  # drain before sending more, or the command may block on us
            while channel.recv_ready():
                data = channel.recv(_CHUNK)
                if stdout is not None:
                    stdout.write(data)
                progressed = True
            while channel.recv_stderr_ready():
                err.feed(channel.recv_stderr(_CHUNK))
                progressed = True
            if channel.exit_status_ready() or channel.closed:
                if channel.recv_ready() or channel.recv_stderr_ready():
                    continue
                # sshd may send the exit status BEFORE the last of the output (still in
                # the command's pipes): wait for EOF, briefly, so a refusal's message
                # is not lost. (A background process holding the pipes would block EOF.)
                exited_at = exited_at if exited_at is not None else self._clock()
                if channel.closed or channel.eof_received:
                    break
                if self._clock() - exited_at >= _EOF_GRACE:
                    break
            elif self._clock() >= give_up:
                raise self._past_grace(shown, timeout)
            if not progressed:
                # Readable for output and EOF; a full send window has no fd event, so
                # the nap stays short while there is something left to send.
                select.select([channel], [], [], 0.01 if chunks is None else 0.002)
        return channel.exit_status if channel.exit_status_ready() else -1

    def _pump(
        self,
        channel: paramiko.Channel,
        out: LineSplitter,
        err: LineSplitter,
        give_up: float,
        shown: str,
        timeout: float,
    ) -> int:
        """Relay output until the command ends; its exit status, or -1 for none (killed by
        a signal, or the connection went away)."""
        while True:
            while channel.recv_ready():
                out.feed(channel.recv(_CHUNK))
            while channel.recv_stderr_ready():
                err.feed(channel.recv_stderr(_CHUNK))
            if channel.exit_status_ready() or channel.closed:
                if not (channel.recv_ready() or channel.recv_stderr_ready()):
                    break
                continue
            if self._clock() >= give_up:
                raise self._past_grace(shown, timeout)
            # The channel's fd wakes us for output and EOF, not for exit-status (which
            # asyncssh sends before EOF), so keep the nap short.
            select.select([channel], [], [], 0.01)
        return channel.exit_status if channel.exit_status_ready() else -1

    @contextmanager
    def _mapped(self, doing: str) -> Iterator[None]:
        """paramiko and socket failures after connecting -> ConnectError (ours pass).
        The connection is let go when it is still the one the failure met, or dead: the
        lease renewer's thread shares it, and its failure on a dropped connection must
        not close the new one the run's own thread opened meanwhile to follow its
        command (a third connect where two were due: CI, openssh, twice on 2026-12-07)."""
        import paramiko

        client = self._client
        try:
            yield
        except TpuLabError:
            raise
        except (paramiko.SSHException, EOFError, OSError) as exc:
            current = self._client
            if current is client or not _active(current):
                self._let_go_of(current)
            raise ConnectError(
                f"The SSH connection to {self.target} failed while {doing}: "
                f"{type(exc).__name__}: {exc}",
                hint="The VM may have been preempted or rebooted; check its state.",
            ) from exc

    def _client_active(self) -> bool:
        return _active(self._client)

    # -- hold ----------------------------------------------------------------------------

    def hold(
        self,
        argv: Sequence[str],
        *,
        timeout: float,
        answer_within: float,
        beat_every: float | None = None,
    ) -> HeldCommand:
        """Start `argv` and leave it running, its stdin open, for as long as this
        connection: return once it has printed its first stdout line (or ended), within
        `answer_within` seconds, else RemoteTimeoutError. `timeout` is the remote
        `timeout --signal=KILL` around it, as for `run`.

        Whatever holds the command's interest (the exec lock) ends with the connection:
        `close` sends EOF to its stdin, and if this process dies instead, the SSH server
        closes the session's pipes, which is the same EOF to the command. A laptop that
        loses power or its network closes nothing, so with `beat_every` a thread writes a
        newline to the command's stdin that often until `close`, and the command can take
        silence for the same end."""
        channel, command, shown = self._open_session(argv, timeout=timeout)
        out, err = LineSplitter("stdout", None), LineSplitter("stderr", None)
        give_up = self._clock() + answer_within
        log.debug("ssh %s (held): %s", self.target, shown)
        try:
            with self._mapped(f"running {shown!r}"):
                channel.exec_command(command)
                ended = self._first_line(channel, out, err, give_up, shown, answer_within)
        except BaseException:
            channel.close()
            raise
        if ended:
            channel.close()
        else:
            self._held.append(channel)
            if beat_every is not None:
                self._start_beat(channel, beat_every, shown)
        out.feed(b"", final=True)
        err.feed(b"", final=True)
        status = (channel.exit_status if channel.exit_status_ready() else -1) if ended else None
        return HeldCommand(status, out.text, err.text)

    def _first_line(
        self,
        channel: paramiko.Channel,
        out: LineSplitter,
        err: LineSplitter,
        give_up: float,
        shown: str,
        answer_within: float,
    ) -> bool:
        """Read until a whole stdout line is in (False: the command runs on) or it ended
        (True). Reads byte by byte once data is there: nothing past that line is taken."""
        while True:
            while channel.recv_stderr_ready():
                err.feed(channel.recv_stderr(_CHUNK))
            while channel.recv_ready():
                data = channel.recv(1)
                out.feed(data)
                if data == b"\n":
                    return False
            if channel.exit_status_ready() or channel.closed:
                if channel.recv_ready() or channel.recv_stderr_ready():
                    continue
                return True
            if self._clock() >= give_up:
                raise RemoteTimeoutError(
                    f"{shown!r} on {self.target} said nothing within {answer_within:g}s",
                    hint="The VM may be overloaded; check it and try again. Output so far: "
                    + (out.text + err.text)[-300:],
                )
            select.select([channel], [], [], 0.01)

    def _start_beat(self, channel: paramiko.Channel, every: float, shown: str) -> None:
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(every):
                try:
                    channel.sendall(b"\n")
                except Exception:  # the connection is gone: the command sees EOF or silence
                    return

        thread = threading.Thread(target=beat, name=f"tpulab-beat {shown[:40]}", daemon=True)
        thread.start()
        self._beats.append((stop, thread))

    def _let_go(self) -> None:
        """EOF to every held command, then a short wait for each to exit, so what it held
        is free when `close` returns (the next exec from this laptop may follow at once).
        A connection already dead has nothing to wait for; closing never raises."""
        beats, self._beats = self._beats, []
        for stop, _thread in beats:
            stop.set()
        for _stop, thread in beats:  # no heartbeat may race the EOF below
            thread.join(timeout=_EOF_GRACE)
        held, self._held = self._held, []
        for channel in held:
            with contextlib.suppress(Exception):
                channel.shutdown_write()
        deadline = time.monotonic() + _EOF_GRACE
        for channel in held:
            with contextlib.suppress(Exception):
                if self._client_active():
                    # Set by the exit status or the channel's close (real time: bounded
                    # even under an injected clock).
                    channel.status_event.wait(max(0.0, deadline - time.monotonic()))
                channel.close()

    # -- files ---------------------------------------------------------------------------

    def _sftp_client(self) -> paramiko.SFTPClient:
        client = self._client
        if self._sftp is not None and not _active(client):
            # The SFTP channel died with its connection (a command saw the drop and said
            # so without closing it): open both again, as `_transport` does for commands.
            self._let_go_of(client)
        if self._sftp is None:
            self._transport()
            assert self._client is not None
            with self._mapped("starting SFTP"):
                self._sftp = self._client.open_sftp()
                self._home = self._sftp.normalize(".")
        return self._sftp

    def remote_path(self, remote: str) -> str:
        """Resolve `~`, `~/x` and relative paths against the SFTP home directory."""
        remote_path(".", remote)  # refuse a bad path before opening SFTP for it
        self._sftp_client()
        assert self._home is not None
        return remote_path(self._home, remote)

    def _remote_sha256(self, path: str) -> str:
        result = self.run(sha256_command(path), timeout=SHA256_TIMEOUT, check=True)
        digest = result.stdout.split(maxsplit=1)[0] if result.stdout else ""
        if not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise RemoteError(f"sha256sum on {self.target} printed {result.stdout[:80]!r}")
        return digest

    def _makedirs(self, sftp: paramiko.SFTPClient, directory: str) -> None:
        missing: list[str] = []
        current = PurePosixPath(directory)
        while str(current) not in ("/", "."):
            try:
                sftp.stat(str(current))
                break
            except FileNotFoundError:
                missing.append(str(current))
                current = current.parent
        for path in reversed(missing):
            sftp.mkdir(path)

    def put(self, local: Path | bytes, remote: str) -> str:
        """Upload a file or bytes; returns the sha256, verified on both ends."""
        with self._mapped(f"uploading to {remote!r}"):
            return self._put(local, remote)

    def read(self, remote: str, *, max_bytes: int) -> bytes:
        """A remote file's bytes (at most `max_bytes`), checked against `sha256sum` on the
        remote side. Held in memory, never written here: only the VM and the connection
        can fail it, so its errors speak of them (a full local disk cannot pass for a
        missing remote file)."""
        with self._mapped(f"reading {remote!r}"):
            return self._read(remote, max_bytes=max_bytes)

    def _put(self, local: Path | bytes, remote: str) -> str:
        sftp = self._sftp_client()
        path = self.remote_path(remote)
        digest = hashlib.sha256()
        source: BinaryIO
        if isinstance(local, bytes):
            source = io.BytesIO(local)
        else:
            try:
                source = local.open("rb")
            except OSError as exc:
                raise ConfigError(f"Cannot read {local}: {exc.strerror}") from exc
        with source:
            for chunk in iter(lambda: source.read(1 << 20), b""):
                digest.update(chunk)
            source.seek(0)
            try:
                self._makedirs(sftp, str(PurePosixPath(path).parent))
                sftp.putfo(source, path, confirm=True)
            except OSError as exc:
                if not self._client_active():
                    raise  # the connection dropped: `_mapped` says so (ConnectError)
                raise RemoteError(f"Upload to {self.target}:{path} failed: {exc}") from exc
        expected = digest.hexdigest()
        observed = self._remote_sha256(path)
        if observed != expected:
            raise RemoteError(
                f"Upload to {self.target}:{path} is corrupt: sha256 {observed}, sent {expected}",
                hint="Retry; if it persists the VM's disk may be full or failing.",
            )
        log.debug("put %s (%s)", path, expected)
        return expected

    def _read(self, remote: str, *, max_bytes: int) -> bytes:
        sftp = self._sftp_client()
        path = self.remote_path(remote)
        try:
            size = sftp.stat(path).st_size or 0
        except OSError as exc:
            if not self._client_active():
                raise  # the connection dropped (`_mapped`: ConnectError), not a missing file
            raise RemoteError(f"Cannot read {self.target}:{path}: {exc}") from exc
        if size > max_bytes:
            raise RemoteError(
                f"{self.target}:{path} is {size} bytes, over the {max_bytes}-byte limit",
                hint="The remote file is not what tpulab expects; inspect it on the VM.",
            )
        expected = self._remote_sha256(path)
        chunks: list[bytes] = []
        received = 0
        try:
            with sftp.open(path, "rb") as remote_file:
                remote_file.prefetch(size)
                for chunk in iter(lambda: remote_file.read(1 << 20), b""):
                    received += len(chunk)
                    if received > max_bytes:
                        raise RemoteError(
                            f"{self.target}:{path} grew past the {max_bytes}-byte limit"
                        )
                    chunks.append(chunk)
        except OSError as exc:
            if not self._client_active():
                raise  # as above: the link, not the file
            raise RemoteError(f"Download of {self.target}:{path} failed: {exc}") from exc
        data = b"".join(chunks)
        observed = hashlib.sha256(data).hexdigest()
        if observed != expected:
            raise RemoteError(
                f"Download of {self.target}:{path} is corrupt: sha256 {observed}, "
                f"remote {expected}",
                hint="Retry; if the file is still being written, wait for its writer.",
            )
        log.debug("read %s (%s)", path, expected)
        return data
