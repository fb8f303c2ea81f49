"""The default SSH host of an emulated TPU VM: an embedded asyncssh server per node.

Why asyncssh rather than paramiko's server mode: asyncssh ships a complete server —
exec sessions with exit-status/exit-signal, env requests and a full SFTP server whose
path mapping we can point at the sandbox — so this module only decides policy (which keys,
which directory, which environment). paramiko's `ServerInterface` leaves the channel
plumbing, process relaying and the entire SFTP backend (`SFTPServerInterface`, a method
per file operation) to us, all thread-per-connection: several hundred lines of protocol
code that we would be testing instead of tpulab. And keeping paramiko on the client side
only means the client is never tested against its own server implementation.

All servers live on one asyncio loop in a daemon thread; `start`/`stop` are called from
the emulator's threads and block until the loop has done the work.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import threading
import warnings
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from tpulab.emulator.hostenv import BackendImage, ImageEnv, ImageKind, session_env
from tpulab.emulator.hostkeys import new_host_keys, parse_ssh_keys
from tpulab.emulator.hosts import AddressedHostBackend, HostEndpoint
from tpulab.emulator.processes import NODE_TAG_VAR, held, kill_tagged, new_node_tag, reserve_port
from tpulab.emulator.rsa_pool import RsaKeyPool

if TYPE_CHECKING:
    import asyncssh

__all__ = ["EmbeddedHostBackend"]

log = logging.getLogger(__name__)


def _load_asyncssh_quietly() -> None:
    """Import asyncssh (later `import asyncssh` finds it loaded) without its import-time
    warnings: asyncssh 2.24 names DSA key types that cryptography >= 48 deprecates, which
    printed eight warning lines on the terminal of every `tpulab run --emulate` -- noise
    about a library, not about the run."""
    from cryptography.utils import CryptographyDeprecationWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CryptographyDeprecationWarning)
        import asyncssh  # noqa: F401


_T = TypeVar("_T")
_CALL_TIMEOUT = 30.0
_CHUNK = 64 * 1024
_LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1"})  # where `ssh -L` may lead


@dataclass
class _Node:
    key: str
    sandbox: Path
    authorized: dict[str, set[bytes]]  # user -> key blobs (base64-decoded bodies)
    sock: socket.socket
    tag: str
    acceptor: Any = None  # asyncssh.SSHAcceptor once listening
    pending: asyncio.TimerHandle | None = None
    listening: asyncio.Future[None] | None = None  # a delayed start in progress
    connections: set[Any] = field(default_factory=set)
    processes: set[asyncio.subprocess.Process] = field(default_factory=set)  # holders
    retiring: set[asyncio.Future[None]] = field(default_factory=set)  # see _retire
    image: ImageEnv | None = None  # None: the backend's image
    env: dict[str, str] = field(default_factory=dict)  # the node's own, over the image's


class EmbeddedHostBackend(AddressedHostBackend):
    """`HostBackend` backed by asyncssh servers on 127.0.0.1, one per node.

    `image` is the environment every session starts with (see `ImageEnv`): by default
    "bare", like a real TPU VM image; `cache_dir` is the bare image's package cache.
    """

    def __init__(
        self,
        state_dir: Path,
        *,
        image: ImageEnv | ImageKind = "bare",
        cache_dir: Path | None = None,
    ) -> None:
        self.state_dir = state_dir
        self.images = BackendImage(image, state_dir / "image", cache_dir=cache_dir)
        self._rsa_keys = RsaKeyPool(state_dir)  # host keys: rsa_pool.py
        self.image = self.images.base
        self._nodes: dict[str, _Node] = {}
        self._lock = threading.Lock()
        # Every exec channel's command line exactly as this server received it, with its
        # node, in arrival order: what a client really sent (tests compare the dry run's
        # command lines with it, byte for byte).
        self.received: list[tuple[str, str]] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="tpulab-ssh-hosts", daemon=True
        )
        self._thread.start()

    # -- HostBackend -------------------------------------------------------------------

    def start_at(
        self,
        node_key: str,
        sandbox: Path,
        ssh_keys_metadata: str,
        *,
        address: str,
        port: int,
        refuse_for: float = 0.0,
        ensurepip_missing: bool = False,
        env: Mapping[str, str] | None = None,
    ) -> HostEndpoint:
        _load_asyncssh_quietly()
        import asyncssh

        self.stop(node_key)  # a restart replaces the old server, never doubles it
        sock = reserve_port(address, port)  # first: a taken port starts nothing
        sandbox.mkdir(parents=True, exist_ok=True)
        authorized = _authorized(ssh_keys_metadata)
        pairs = new_host_keys(self._rsa_keys)
        # Generated a line above, or (RSA) from the pool, checksum-proven: asyncssh's
        # check of the RSA key's consistency (~30 ms a node start) would only re-prove it.
        host_keys = [
            asyncssh.import_private_key(pair.private_openssh, unsafe_skip_rsa_key_validation=True)
            for pair in pairs
        ]
        node = _Node(node_key, sandbox.resolve(), authorized, sock, new_node_tag(node_key))
        node.image = self.images.for_node(ensurepip_missing=ensurepip_missing)
        node.env = dict(env or {})
        port = node.sock.getsockname()[1]
        with self._lock:
            self._nodes[node_key] = node
        self._call(self._open(node, host_keys, refuse_for))
        log.info(
            "embedded ssh host for %s on %s:%d (listening in %.1fs)",
            node_key,
            address,
            port,
            refuse_for,
        )
        return HostEndpoint(
            address, port, {pair.key_type: pair.b64 for pair in pairs}, tag=node.tag
        )

    def update_keys(self, node_key: str, ssh_keys_metadata: str) -> None:
        authorized = _authorized(ssh_keys_metadata)
        with self._lock:
            node = self._nodes.get(node_key)
            if node is not None:
                node.authorized = authorized  # one assignment: auth sees old or new, whole

    def drop_connections(self, node_key: str) -> int:
        """A network blip as the VM sees it: every SSH connection to the node is reset at
        once, and what their commands started keeps running (as under sshd when its
        client's network goes); the node still listens, so a client can connect again.
        How many connections were dropped (0: no such node)."""
        with self._lock:
            node = self._nodes.get(node_key)
        if node is None:
            return 0
        return self._call(_drop(node))

    def stop(self, node_key: str) -> None:
        with self._lock:
            node = self._nodes.pop(node_key, None)
        if node is not None:
            self._call(self._close(node))

    def close(self) -> None:
        with self._lock:
            keys = list(self._nodes)
        for key in keys:
            self.stop(key)
        if self._loop.is_running():
            with contextlib.suppress(Exception):
                self._call(_drain_tasks())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
        if not self._loop.is_running():
            self._loop.close()

    # -- on the loop -------------------------------------------------------------------

    def _call(self, coro: Coroutine[Any, Any, _T]) -> _T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(_CALL_TIMEOUT)

    async def _open(self, node: _Node, host_keys: list[asyncssh.SSHKey], refuse_for: float) -> None:
        if refuse_for <= 0:
            await self._listen(node, host_keys)
            return

        def later() -> None:
            node.pending = None
            node.listening = asyncio.ensure_future(self._listen(node, host_keys))

        node.pending = asyncio.get_running_loop().call_later(refuse_for, later)

    async def _listen(self, node: _Node, host_keys: list[asyncssh.SSHKey]) -> None:
        _load_asyncssh_quietly()
        import asyncssh

        backend = self

        class _Server(asyncssh.SSHServer):
            def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
                node.connections.add(conn)

            def connection_lost(self, exc: Exception | None) -> None:
                node.connections.difference_update([c for c in node.connections if c.is_closed()])

            def begin_auth(self, username: str) -> bool:
                return True  # always require authentication

            def password_auth_supported(self) -> bool:
                return False

            def kbdint_auth_supported(self) -> bool:
                return False

            def public_key_auth_supported(self) -> bool:
                return True

            def validate_public_key(self, username: str, key: asyncssh.SSHKey) -> bool:
                return bytes(key.public_data) in node.authorized.get(username, set())

            def connection_requested(
                self, dest_host: str, dest_port: int, orig_host: str, orig_port: int
            ) -> bool:
                # `ssh -L` (tpulab ssh -L, tpulab notebook) to the VM's own localhost, as
                # a real VM's sshd allows; this VM IS this machine, so only loopback.
                return dest_host in _LOOPBACK

        class _SandboxSFTP(asyncssh.SFTPServer):
            # Relative paths (and the client's start directory ".") resolve in the
            # sandbox, the session's HOME; absolute paths are left alone, like sshd.
            def map_path(self, path: bytes) -> bytes:
                if path.startswith(b"/"):
                    return path
                return os.path.join(os.fsencode(node.sandbox), path)

        async def run_session(process: asyncssh.SSHServerProcess[bytes]) -> None:
            await backend._run_session(node, process)

        node.acceptor = await asyncssh.listen(
            sock=node.sock,
            server_factory=_Server,
            server_host_keys=host_keys,  # each client gets the type it asks (pins) for
            process_factory=run_session,
            sftp_factory=lambda chan: _SandboxSFTP(chan),
            encoding=None,
            allow_scp=False,
            agent_forwarding=False,
            x11_forwarding=False,
        )

    async def _run_session(self, node: _Node, process: asyncssh.SSHServerProcess[bytes]) -> None:
        command = process.command
        if command is not None:
            with self._lock:
                self.received.append((node.key, command))
        if command is None:
            process.stderr.write(b"this emulated host runs commands only (no shell)\n")
            process.exit(1)
            return
        user = str(process.get_extra_info("username") or "")
        env = session_env(node.image or self.image, node.sandbox, user)
        env.update(node.env)
        env.update(process.env)  # the client's env requests are honoured
        env[NODE_TAG_VAR] = node.tag
        # Under a holder (processes.held): the command's own exit status comes back on a
        # pipe, and what it leaves running stays below the holder for `stop` to find.
        status_read, status_write = os.pipe()
        try:
            proc = await asyncio.create_subprocess_exec(
                *held(["/bin/sh", "-c", command], status_fd=status_write),
                cwd=node.sandbox,
                env=env,
                stdin=asyncio.subprocess.PIPE,  # fed from the channel, as sshd does
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                pass_fds=(status_write,),
                start_new_session=True,  # out of the emulator's group (a terminal's ^C)
            )
        except BaseException:
            os.close(status_read)
            raise
        finally:
            os.close(status_write)
        node.processes.add(proc)
        reporting = asyncio.ensure_future(_status(status_read))  # owns the fd from now on
        assert proc.stdin is not None
        # Not awaited with the output: like sshd, a command that exits without reading
        # all of its stdin ends the session (the client sees its status and stops sending).
        feeding = asyncio.ensure_future(_feed(process.stdin, proc.stdin))
        try:
            assert proc.stdout is not None
            assert proc.stderr is not None
            await asyncio.gather(
                _pump(proc.stdout, process.stdout), _pump(proc.stderr, process.stderr)
            )
            status = await reporting
        finally:
            feeding.cancel()
            reporting.cancel()  # done already, unless the session ended some other way
            await asyncio.gather(feeding, reporting, return_exceptions=True)
            # The holder outlives the command while what it left runs: keep it (stop
            # kills its tree) until it exits on its own.
            retiring = asyncio.ensure_future(_retire(node, proc))
            node.retiring.add(retiring)
            retiring.add_done_callback(node.retiring.discard)
        if status is None:  # the holder died before the command did: killed with it
            process.exit_with_signal("KILL")
        elif status < 0:
            process.exit_with_signal(signal.Signals(-status).name.removeprefix("SIG"))
        else:
            process.exit(status)

    async def _close(self, node: _Node) -> None:
        if node.pending is not None:
            node.pending.cancel()
        if node.listening is not None:
            with contextlib.suppress(Exception):
                await node.listening
        if node.acceptor is not None:
            node.acceptor.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(node.acceptor.wait_closed(), 5)
        node.sock.close()
        for conn in list(node.connections):
            conn.abort()
        processes = list(node.processes)
        # The holders' trees (whatever the commands left, env -i and setsid included)
        # and anything else tagged, descendants first: processes.kill_tagged.
        kill_tagged(node.tag, roots=[proc.pid for proc in processes])
        # Reap them here, on the loop, so no subprocess transport outlives it.
        await asyncio.gather(
            *(asyncio.wait_for(proc.wait(), 5) for proc in processes), return_exceptions=True
        )


async def _drain_tasks() -> None:
    # Aborted sessions and stops called from other threads may still be winding down:
    # let them finish (briefly), and only cancel what is stuck, rather than leave
    # "Task was destroyed but it is pending" or a half-done stop behind.
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    if not tasks:
        return
    _, stuck = await asyncio.wait(tasks, timeout=5)
    for task in stuck:
        task.cancel()
    await asyncio.gather(*stuck, return_exceptions=True)


async def _status(fd: int) -> int | None:
    """The command's exit status as its holder wrote it on `fd` (None: it wrote none)."""
    pipe = os.fdopen(fd, "rb", 0)
    try:
        reader = asyncio.StreamReader()
        transport, _ = await asyncio.get_running_loop().connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), pipe
        )
        try:
            said = await reader.read()
        finally:
            transport.close()
    finally:
        pipe.close()  # (a no-op once the transport has closed it)
    try:
        return int(said)
    except ValueError:
        return None


async def _drop(node: _Node) -> int:
    connections = list(node.connections)
    for conn in connections:
        conn.abort()
    return len(connections)


async def _retire(node: _Node, proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(Exception):
        await proc.wait()
    node.processes.discard(proc)
    # Close the subprocess transport now, on the loop: left to the garbage collector it
    # may be finalised after the loop has closed, and asyncio then raises "Event loop is
    # closed" from its __del__. asyncio's Process has no public close, hence the private
    # attribute. (Closing it while the holder runs would kill the holder.)
    transport = getattr(proc, "_transport", None)
    if transport is not None:
        transport.close()


async def _pump(reader: asyncio.StreamReader, writer: asyncssh.SSHWriter[bytes]) -> None:
    # Keep reading after the client has gone so the process never blocks on a full pipe.
    while chunk := await reader.read(_CHUNK):
        with contextlib.suppress(Exception):
            writer.write(chunk)
            await writer.drain()


async def _feed(reader: asyncssh.SSHReader[bytes], writer: asyncio.StreamWriter) -> None:
    # The client's stdin to the command's, until the client's EOF (or the command exits).
    with contextlib.suppress(Exception):
        while chunk := await reader.read(_CHUNK):
            writer.write(chunk)
            await writer.drain()
    with contextlib.suppress(Exception):
        writer.close()


def _authorized(ssh_keys_metadata: str) -> dict[str, set[bytes]]:
    authorized: dict[str, set[bytes]] = {}
    for entry in parse_ssh_keys(ssh_keys_metadata):
        authorized.setdefault(entry.user, set()).add(_blob(entry.b64))
    return authorized


def _blob(b64: str) -> bytes:
    import base64

    return base64.b64decode(b64)
