"""The system OpenSSH client (`ssh`) pointed at a kept node: `tpulab ssh`, `-L` forwards,
`tpulab notebook` and the `Host tpulab-S` entry of `tpulab ssh-config` all reach the VM
through it, with the same three pins:

- the node's host key, pinned at `up` from its guest attributes, as the ONLY entry of a
  known_hosts file (`UserKnownHostsFile`, no global file) with `StrictHostKeyChecking
  yes`: a VM that answers with another key is refused, never prompted for;
- the session's own key (`IdentityFile`, `IdentitiesOnly yes`: no agent key is offered);
- no user configuration (`-F /dev/null`): a `Host *` block in ~/.ssh/config must not
  turn any of it off.

`SystemSsh.run` is a `RemoteShell` (tpulab.remote.bootstrap), so the lease renewer and
the extras install run over the same client as the user's own shell.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tpulab.errors import CommandFailedError, RemoteError
from tpulab.remote.keys import HostKey, SshTarget
from tpulab.remote.lines import LineSplitter

__all__ = ["SshResult", "SystemSsh", "known_hosts_line", "write_known_hosts"]

# A connect to a node that is up takes well under a second; a gone one must not hang.
CONNECT_TIMEOUT = 20


def known_hosts_line(host: str, port: int, key: HostKey) -> str:
    """The known_hosts entry OpenSSH looks up for host:port (`[host]:port` off port 22)."""
    name = host if port == 22 else f"[{host}]:{port}"
    return f"{name} {key.key_type} {key.b64}\n"


def write_known_hosts(path: Path, target: SshTarget) -> Path:
    """Write the pinned key as `path`'s only entry (replaced whole, never appended to)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    partial = path.with_name(path.name + ".new")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(known_hosts_line(target.host, target.port, target.host_key))
    partial.replace(path)
    return path


@dataclass(frozen=True)
class SshResult:
    exit_status: int
    stdout: str
    stderr: str


@dataclass(frozen=True)
class SystemSsh:
    """`ssh` to `target` with `key_path` and the pinned key in `known_hosts`."""

    target: SshTarget
    key_path: Path
    known_hosts: Path
    executable: str = "ssh"

    def options(self) -> list[str]:
        """Everything but the destination and the command."""
        return [
            "-F", "/dev/null", "-i", str(self.key_path), "-p", str(self.target.port),
            "-o", f"UserKnownHostsFile={self.known_hosts}", "-o", "GlobalKnownHostsFile=/dev/null",
            "-o", "StrictHostKeyChecking=yes", "-o", "IdentitiesOnly=yes",
            "-o", "LogLevel=ERROR",
        ]  # fmt: skip

    @property
    def destination(self) -> str:
        return f"{self.target.user}@{self.target.host}"

    def argv(self, *extra: str, remote: Sequence[str] = (), typed: bool = False) -> list[str]:
        """`ssh OPTIONS EXTRA user@host [REMOTE]`; REMOTE's words are quoted (one shell
        line on the VM, as paramiko's Connection sends it). `typed`: REMOTE is what a
        user typed after `tpulab ssh S --`, and ONE argument is then a command line for
        the VM's shell, as `ssh host 'cd x && y'` is (several stay quoted words)."""
        if typed and len(remote) == 1:
            command = list(remote)
        else:
            command = [shlex.join(remote)] if remote else []
        return [self.executable, *self.options(), *extra, self.destination, *command]

    def batch_argv(self, remote: Sequence[str]) -> list[str]:
        """A non-interactive command: never a prompt, a bounded connect."""
        extra = ("-o", "BatchMode=yes", "-o", f"ConnectTimeout={CONNECT_TIMEOUT}", "-T")
        return self.argv(*extra, remote=remote)

    def run(
        self,
        argv: Sequence[str] | str,
        *,
        env: Mapping[str, str] | None = None,
        timeout: float,
        on_line: Callable[[str, str], None] | None = None,
        check: bool = False,
        input: str | None = None,
    ) -> SshResult:
        """Run one command on the VM; `check` raises CommandFailedError on a non-zero
        status. RemoteError when it does not finish within `timeout`."""
        remote = ["sh", "-c", argv] if isinstance(argv, str) else list(argv)
        if env:
            remote = ["env", *(f"{k}={v}" for k, v in env.items()), *remote]
        try:
            done = subprocess.run(
                self.batch_argv(remote),
                input=input,
                stdin=None if input is not None else subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise RemoteError(
                f"ssh {self.target}: {shlex.join(remote)[:80]} did not finish in {timeout:g} s."
            ) from None
        result = SshResult(done.returncode, done.stdout, done.stderr)
        if on_line is not None:  # as a streamed run passes them, lines as a terminal shows
            for stream, text in (("stdout", done.stdout), ("stderr", done.stderr)):
                LineSplitter(stream, on_line).feed(text.encode(), final=True)
        if check and done.returncode != 0:
            tail = (done.stderr.strip() or done.stdout.strip())[-400:]
            # 255 is ssh's own failure (unreachable, refused key), not the command's.
            said = "ssh failed" if done.returncode == 255 else f"exit {done.returncode}"
            raise CommandFailedError(
                f"ssh {self.target}: {said}" + (f" ({tail})" if tail else ""),
                exit_status=done.returncode,
                output_tail=tail,
            )
        return result
