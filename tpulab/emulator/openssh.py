"""An emulated TPU VM's SSH host served by the system's OpenSSH `sshd`.

The embedded asyncssh host is the default; this backend exists so the end-to-end tests
also speak to the server real TPU VMs run. Per node: a private sshd on a free loopback
port, fresh ed25519, ECDSA and RSA host keys, an AuthorizedKeysFile built from the node's
`metadata["ssh-keys"]`, no passwords, no PAM.

sshd only logs in accounts that exist, so every metadata user maps onto the account
running the emulator (`login_user`): root in CI, yourself on a laptop. A `ForceCommand`
wrapper makes the sandbox the session's HOME and working directory, applies the image
environment, then runs the client's command (`$SSH_ORIGINAL_COMMAND`) with `/bin/sh -c`.
Because ForceCommand also captures subsystem requests, the sftp subsystem is declared as
a marker the wrapper turns into `sftp-server -d <sandbox>`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import shlex
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tpulab import errors as E
from tpulab.emulator.hostenv import BackendImage, ImageEnv, ImageKind, session_env
from tpulab.emulator.hostkeys import new_host_keys, parse_ssh_keys
from tpulab.emulator.hosts import AddressedHostBackend, HostEndpoint
from tpulab.emulator.processes import NODE_TAG_VAR, held, kill_tagged, new_node_tag, reserve_port
from tpulab.emulator.rsa_pool import RsaKeyPool

__all__ = [
    "DEFAULT_SSHD",
    "OpenSshHostBackend",
    "OpenSshMissingError",
    "SshdStartError",
    "find_sftp_server",
]

log = logging.getLogger(__name__)

DEFAULT_SSHD = "/usr/sbin/sshd"
_SFTP_MARKER = "tpulab-sftp"
_SFTP_CANDIDATES = (
    "/usr/lib/openssh/sftp-server",
    "/usr/libexec/openssh/sftp-server",
    "/usr/libexec/sftp-server",
    "/usr/lib/ssh/sftp-server",
)
_LISTEN_WAIT = 10.0
_INSTALL_HINT = (
    "Install OpenSSH's server (it provides both): sudo apt-get install -y openssh-server "
    "(Debian/Ubuntu; dnf install openssh-server on Fedora), or use --ssh embedded, "
    "which needs nothing installed."
)


class SshdStartError(RuntimeError):
    """sshd did not come up; the message carries the tail of its log."""


class OpenSshMissingError(E.ConfigError):
    """sshd or sftp-server is not installed: refused when the backend is built, not
    discovered by each run after waiting minutes for a host that can never start."""


def find_sftp_server() -> str | None:
    return next((p for p in _SFTP_CANDIDATES if os.access(p, os.X_OK)), None)


@dataclass
class _Sshd:
    node_dir: Path
    config: Path
    address: str
    port: int
    sock: socket.socket | None
    tag: str
    lock: threading.Lock = field(default_factory=threading.Lock)
    process: subprocess.Popen[bytes] | None = None
    timer: threading.Timer | None = None
    stopped: bool = False


class OpenSshHostBackend(AddressedHostBackend):
    """`HostBackend` running one system sshd per node (see the module docstring)."""

    def __init__(
        self,
        state_dir: Path,
        sshd: str = DEFAULT_SSHD,
        *,
        image: ImageEnv | ImageKind = "bare",
        sftp_server: str | None = None,
        cache_dir: Path | None = None,
    ) -> None:
        self.state_dir = state_dir
        self.sshd = sshd
        if not os.access(sshd, os.X_OK):
            raise OpenSshMissingError(
                f"The OpenSSH server {sshd} is not installed (or not executable).",
                hint=_INSTALL_HINT,
            )
        found = sftp_server or find_sftp_server()
        if found is None or not os.access(found, os.X_OK):
            where = found or " or ".join(_SFTP_CANDIDATES)
            raise OpenSshMissingError(
                f"OpenSSH's sftp-server is not installed (looked for {where}).",
                hint=_INSTALL_HINT,
            )
        self.sftp_server = found
        self.images = BackendImage(image, state_dir / "image", cache_dir=cache_dir)
        self._rsa_keys = RsaKeyPool(state_dir)  # host keys: rsa_pool.py
        self.image = self.images.base
        self.login_user = pwd.getpwuid(os.getuid()).pw_name
        self._nodes: dict[str, _Sshd] = {}
        self._lock = threading.Lock()

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
        self.stop(node_key)
        if not os.access(self.sshd, os.X_OK):
            raise SshdStartError(f"{self.sshd} is not an executable sshd")
        sock = reserve_port(address, port)  # first: a taken port starts nothing
        sandbox.mkdir(parents=True, exist_ok=True)
        sandbox = sandbox.resolve()
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in node_key)
        node_dir = (self.state_dir / "openssh" / safe).resolve()
        shutil.rmtree(node_dir, ignore_errors=True)
        node_dir.mkdir(parents=True, mode=0o700)

        pairs = new_host_keys(self._rsa_keys)
        host_key_files = []
        for pair in pairs:
            # sshd's own naming: ssh_host_<ed25519|ecdsa|rsa>_key
            short = pair.key_type.removeprefix("ssh-").split("-")[0]
            host_key_files.append(node_dir / f"ssh_host_{short}_key")
            _write(host_key_files[-1], pair.private_openssh, 0o600)
        authorized = node_dir / "authorized_keys"
        _write_authorized_keys(authorized, ssh_keys_metadata)
        tag = new_node_tag(node_key)
        wrapper = node_dir / "session.sh"
        image = self.images.for_node(ensurepip_missing=ensurepip_missing)
        _write(wrapper, self._wrapper(sandbox, tag, image, env or {}).encode(), 0o755)

        port = sock.getsockname()[1]
        config = node_dir / "sshd_config"
        config.write_text(
            self._config(node_dir, address, port, host_key_files, authorized, wrapper)
        )
        node = _Sshd(
            node_dir=node_dir, config=config, address=address, port=port, sock=sock, tag=tag
        )
        with self._lock:
            self._nodes[node_key] = node
        if refuse_for > 0:
            node.timer = threading.Timer(refuse_for, self._launch_later, (node_key, node))
            node.timer.daemon = True
            node.timer.start()
        else:
            try:
                self._launch(node)
            except BaseException:
                self.stop(node_key)
                raise
        log.info("sshd for %s on %s:%d (listening in %.1fs)", node_key, address, port, refuse_for)
        return HostEndpoint(address, port, {pair.key_type: pair.b64 for pair in pairs}, tag=tag)

    def update_keys(self, node_key: str, ssh_keys_metadata: str) -> None:
        # sshd reads AuthorizedKeysFile at each login, so replacing the file is enough.
        with self._lock:
            node = self._nodes.get(node_key)
        if node is not None:
            _write_authorized_keys(node.node_dir / "authorized_keys", ssh_keys_metadata)

    def stop(self, node_key: str) -> None:
        with self._lock:
            node = self._nodes.pop(node_key, None)
        if node is None:
            return
        with node.lock:
            node.stopped = True
            if node.timer is not None:
                node.timer.cancel()
            if node.sock is not None:
                node.sock.close()
            # sshd's holder, everything below it (per-connection sshd processes call
            # setsid; what sessions leave running is adopted by the holder, env -i and
            # setsid or not) and anything tagged: processes.kill_tagged.
            roots = [node.process.pid] if node.process is not None else []
            kill_tagged(node.tag, roots=roots)
            if node.process is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    node.process.wait(timeout=5)
        shutil.rmtree(node.node_dir, ignore_errors=True)

    def close(self) -> None:
        with self._lock:
            keys = list(self._nodes)
        for key in keys:
            self.stop(key)

    # -- internals ---------------------------------------------------------------------

    def _launch_later(self, node_key: str, node: _Sshd) -> None:
        try:
            self._launch(node)
        except SshdStartError:
            log.exception("delayed sshd for %s did not start", node_key)

    def _launch(self, node: _Sshd) -> None:
        with node.lock:
            if node.stopped:
                return
            if os.getuid() == 0:
                # sshd's privilege-separation chroot; a fresh container may lack it.
                Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
            log_file = (node.node_dir / "sshd.log").open("ab")
            if node.sock is not None:
                node.sock.close()  # hand the reserved port over to sshd
                node.sock = None
            with log_file:
                process = node.process = subprocess.Popen(
                    # Under a holder (a child subreaper): what sessions leave running
                    # stays in its tree, where `stop` finds it (processes.held).
                    held([self.sshd, "-D", "-e", "-f", str(node.config)]),
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=log_file,
                    env={
                        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
                        "LANG": "C.UTF-8",
                        NODE_TAG_VAR: node.tag,
                    },
                    start_new_session=True,
                )
        deadline = time.monotonic() + _LISTEN_WAIT
        while time.monotonic() < deadline:
            if process.poll() is not None:
                break
            with (
                contextlib.suppress(OSError),
                socket.create_connection((node.address, node.port), timeout=1),
            ):
                return
            time.sleep(0.05)
        tail = _tail(node.node_dir / "sshd.log")
        raise SshdStartError(f"sshd did not start listening on {node.address}:{node.port}: {tail}")

    def _wrapper(
        self, sandbox: Path, tag: str, image: ImageEnv, node_env: Mapping[str, str]
    ) -> str:
        # `env -i`: sessions see the image environment only, like the embedded host,
        # not whatever the login shell's rc files exported on the emulator's machine.
        env = session_env(image, sandbox, self.login_user)
        env.update(node_env)
        env[NODE_TAG_VAR] = tag
        assignments = " ".join(shlex.quote(f"{k}={v}") for k, v in env.items())
        home = shlex.quote(str(sandbox))
        return (
            "#!/bin/sh\n"
            "# Written by tpulab's OpenSSH host backend: the sandbox is this VM's HOME.\n"
            f"cd {home} || exit 1\n"
            f'if [ "${{SSH_ORIGINAL_COMMAND-}}" = {_SFTP_MARKER} ]; then\n'
            f"  exec {shlex.quote(self.sftp_server)} -d {home}\n"
            "fi\n"
            'if [ -z "${SSH_ORIGINAL_COMMAND+set}" ]; then\n'
            '  echo "this emulated host runs commands only (no shell)" >&2; exit 1\n'
            "fi\n"
            f"exec env -i {assignments} "
            '"SSH_CONNECTION=${SSH_CONNECTION-}" /bin/sh -c "$SSH_ORIGINAL_COMMAND"\n'
        )

    def _config(
        self,
        node_dir: Path,
        address: str,
        port: int,
        host_keys: list[Path],
        authorized: Path,
        wrapper: Path,
    ) -> str:
        options = [
            ("Port", str(port)),
            ("ListenAddress", address),
            ("AddressFamily", "inet"),
            *(("HostKey", _quote(path)) for path in host_keys),
            ("PidFile", _quote(node_dir / "sshd.pid")),
            ("AuthorizedKeysFile", _quote(authorized).replace("%", "%%")),
            ("StrictModes", "no"),  # the state dir's owner/modes are not sshd's business
            ("PubkeyAuthentication", "yes"),
            ("PasswordAuthentication", "no"),
            ("KbdInteractiveAuthentication", "no"),
            ("HostbasedAuthentication", "no"),
            ("UsePAM", "no"),
            ("PermitRootLogin", "prohibit-password"),
            ("AllowUsers", self.login_user),
            ("AllowAgentForwarding", "no"),
            # `tpulab ssh -L` and `tpulab notebook` forward ports as on a real VM (whose
            # sshd allows it); `remote` (-R) stays off: nothing listens for the client.
            ("AllowTcpForwarding", "local"),
            ("X11Forwarding", "no"),
            ("PermitTTY", "no"),
            ("PermitUserEnvironment", "no"),
            # sshd runs ForceCommand through the login account's shell, and Debian's bash
            # then sources that account's ~/.bashrc (it does for ssh sessions of a
            # "top-level" shell, SHLVL < 2): the emulator machine's own rc files, not the
            # image's. Seen here: a pyenv-rehash lock left by a killed session made every
            # session wait a minute. SHLVL=1 makes the shell level 2, so bash skips it.
            ("SetEnv", "SHLVL=1"),
            ("PrintMotd", "no"),
            ("UseDNS", "no"),
            ("MaxStartups", "100"),  # clients probe and retry while we start up
            ("LogLevel", "VERBOSE"),
            ("ForceCommand", shlex.quote(str(wrapper))),
            ("Subsystem", f"sftp {_SFTP_MARKER}"),
        ]
        return "".join(f"{name} {value}\n" for name, value in options)


def _quote(path: Path) -> str:
    text = str(path)
    if '"' in text or "\n" in text:
        raise SshdStartError(f"path {text!r} cannot be written into an sshd_config")
    return f'"{text}"' if any(c.isspace() for c in text) else text


def _write_authorized_keys(path: Path, ssh_keys_metadata: str) -> None:
    lines = "".join(k.openssh_line + "\n" for k in parse_ssh_keys(ssh_keys_metadata))
    # Written aside then renamed, so a login racing an update reads one whole file.
    partial = path.with_name(path.name + ".new")
    _write(partial, lines.encode(), 0o600)
    os.replace(partial, path)


def _write(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.chmod(path, mode)


def _tail(path: Path, limit: int = 800) -> str:
    try:
        return path.read_text(errors="replace")[-limit:].strip() or "(empty log)"
    except OSError:
        return "(no log)"
