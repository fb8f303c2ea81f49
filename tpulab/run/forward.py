"""`tpulab ssh S -L ...` and `tpulab notebook`: a kept node's ports on this laptop, with
the session's idle lease renewed for as long as a forward is open (a browser tab on a
notebook is use of the TPU, even when no command runs).

- `session_ssh(state, key, known_hosts)`: the system OpenSSH client with the session's
  pins (tpulab.remote.system_ssh), its known_hosts written from the host key `up` pinned.
- `session_renewer(ssh, state)`: the run's own `LeaseRenewer` over that client: once in
  the foreground, then every `renew_seconds` until stopped.
- `Forwarding`: the `ssh -N -L ...` child (its own process group, so a Ctrl-C is this
  process's to handle: the forward is then ended by SIGTERM, never left behind), waited
  for until its local ports listen, and held while the lease is renewed.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from tpulab.errors import ConfigError, RemoteError
from tpulab.remote.keys import HostKey, SshTarget
from tpulab.remote.system_ssh import SystemSsh, write_known_hosts
from tpulab.run.lease import LeaseRenewer

if TYPE_CHECKING:
    from tpulab.config.forward import Forward
    from tpulab.run.session_state import SessionState
    from tpulab.run.workers import EveryWorker

__all__ = [
    "Forwarding",
    "Reopening",
    "check_local_ports_free",
    "forward_argv",
    "session_renewer",
    "session_ssh",
    "session_target",
    "wall_time_of",
]

# How long ssh may take to authenticate and listen on its forwards.
LISTEN_WAIT_SECONDS = 60.0
# How long an `ssh -N` asked to end (SIGTERM) may take before it is killed.
END_WAIT_SECONDS = 10.0
# ssh(1) exits 255 when the connection failed or was lost (ServerAliveInterval, a
# network gone); any other status is the remote side's.
SSH_CONNECTION_LOST = 255
# A lost forward is started again this often, while the session's lease may hold...
REOPEN_PAUSE_SECONDS = 5.0
# ...unless it keeps failing while renewals go through (the link is up: a port taken
# meanwhile, a key refused), which no retry mends.
REOPEN_TRIES_ON_A_LIVE_LINK = 3


def session_target(state: SessionState) -> SshTarget:
    return SshTarget(
        state.ssh_host,
        state.ssh_port,
        state.ssh_user,
        HostKey(state.host_key_type, state.host_key_b64),
    )


def session_ssh(state: SessionState, key_path: Path, known_hosts: Path) -> SystemSsh:
    """The session's OpenSSH client; (re)writes `known_hosts` from the pinned key."""
    target = session_target(state)
    write_known_hosts(known_hosts, target)
    return SystemSsh(target, key_path, known_hosts)


def session_renewer(
    ssh: SystemSsh | EveryWorker,
    state: SessionState,
    *,
    note: Callable[[str], None] = lambda _message: None,
    wall_clock: Callable[[], float] = time.time,
) -> LeaseRenewer:
    # The wall clock in ms as the first seq: never the text an earlier renewer left.
    return LeaseRenewer(ssh, state.watchdog_config(), note=note, first_seq=int(wall_clock() * 1000))


def forward_argv(
    ssh: SystemSsh, forwards: Sequence[Forward], *, command: Sequence[str] | None
) -> list[str]:
    """`ssh -L ... -N` (command None: forward only) or `ssh -L ... [CMD]` (a shell or
    CMD as `tpulab ssh` runs it, with the forwards beside it). A forward that cannot
    listen ends ssh (ExitOnForwardFailure) instead of leaving a shell without it."""
    extra = ["-o", "ExitOnForwardFailure=yes", "-o", "ServerAliveInterval=15"]
    for forward in forwards:
        extra += ["-L", forward.ssh_arg]
    if command is None:
        return ssh.argv(*extra, "-N", "-o", "BatchMode=yes")
    return ssh.argv(*extra, remote=command, typed=True)


def _probe_address(forward: Forward) -> str:
    if forward.bind in (None, "localhost", "*"):
        return "127.0.0.1"
    return forward.bind.strip("[]")


def _listening(forward: Forward) -> bool:
    with (
        contextlib.suppress(OSError),
        socket.create_connection((_probe_address(forward), forward.port), timeout=1.0),
    ):
        return True
    return False


def check_local_ports_free(forwards: Sequence[Forward]) -> None:
    """Refuse, before anything is sent, a local port something already listens on."""
    for forward in forwards:
        if _listening(forward):
            raise ConfigError(
                f"Port {forward.port} is already in use on this laptop.",
                hint="Pick another local port (e.g. -L 18888:localhost:8888, or "
                "`tpulab notebook S --port 18888`), or stop what listens there.",
            )


class Reopening(Protocol):
    """What a forward that lost its connection asks before it starts ssh again."""

    def note(self, message: str) -> None:
        """Say what happens (the forward's line on the terminal)."""

    def gone(self) -> bool:
        """Is the session's node gone (deleted, its --ttl passed)? Then nothing is reopened."""


@dataclass
class Forwarding:
    """The `ssh -N -L ...` child; `hold` renews the lease until it ends or Ctrl-C."""

    argv: list[str]
    forwards: Sequence[Forward]
    process: subprocess.Popen[bytes] | None = None
    ended_by_us: bool = False
    clock: Callable[[], float] = time.monotonic
    reopen_pause: float = REOPEN_PAUSE_SECONDS
    _renewals_saved: int = field(default=0, repr=False)

    def start(self, *, own_group: bool = True) -> None:
        """Start ssh; `own_group`: out of the terminal's process group (forward only:
        ssh has no terminal to read, and Ctrl-C must reach this process alone)."""
        self.process = subprocess.Popen(
            self.argv, stdin=subprocess.DEVNULL, start_new_session=own_group
        )

    def wait_listening(self, timeout: float = LISTEN_WAIT_SECONDS) -> None:
        """Until every local port accepts a connection; RemoteError if ssh ended first
        (its own words, e.g. a refused host key, are on stderr already)."""
        assert self.process is not None
        deadline = self.clock() + timeout
        pending = list(self.forwards)
        while pending:
            status = self.process.poll()
            if status is not None:
                raise RemoteError(
                    f"ssh ended (exit {status}) before its forwards were open.",
                    hint="Its message is above; `tpulab ssh S -- true` checks the connection.",
                )
            if self.clock() >= deadline:
                self.end()
                raise RemoteError(
                    f"The forward of port {pending[0].port} did not open in {timeout:g} s."
                )
            pending = [f for f in pending if not _listening(f)]
            if pending:
                time.sleep(0.1)

    def hold(
        self,
        renewer: LeaseRenewer,
        *,
        on_renewed: Callable[[], None] = lambda: None,
        reopen: Reopening | None = None,
    ) -> int:
        """Wait for ssh to end, calling `on_renewed` after each renewal the renewer made
        meanwhile; KeyboardInterrupt (Ctrl-C) ends ssh first and propagates. With
        `reopen` (forwards alone, `-N`), an ssh that lost its connection is started
        again for as long as the session's lease may hold and its node is there,
        `reopen` hearing what happens: a Wi-Fi blip does not end a notebook (whose
        end stops Jupyter, and its kernels' state with it)."""
        try:
            while True:
                status = self._wait(renewer, on_renewed)
                if reopen is None or status != SSH_CONNECTION_LOST:
                    return status
                if not self._reopen(renewer, reopen):
                    return status
        finally:
            self.end()

    def _wait(self, renewer: LeaseRenewer, on_renewed: Callable[[], None]) -> int:
        assert self.process is not None
        while True:
            try:
                return self.process.wait(timeout=renewer.config.renew_seconds)
            except subprocess.TimeoutExpired:
                pass
            if renewer.renewals != self._renewals_saved:
                self._renewals_saved = renewer.renewals
                on_renewed()

    def _reopen(self, renewer: LeaseRenewer, reopening: Reopening) -> bool:
        """Start ssh again until its forwards listen (True). False once the lease may
        have lapsed (the VM deletes itself) or the node is gone, or after
        REOPEN_TRIES_ON_A_LIVE_LINK failures while renewals went through."""
        note = reopening.note
        note("the forward's SSH connection was lost (ssh exit 255); reopening it")
        failed_on_a_live_link = 0
        while failed_on_a_live_link < REOPEN_TRIES_ON_A_LIVE_LINK:
            if not renewer.lapses_in():
                note("not reopened: the session's lease may have lapsed (its VM deletes itself)")
                return False
            if reopening.gone():
                return False  # the caller asks the API why, and says so
            time.sleep(self.reopen_pause)
            # This ssh is gone: whatever listens on a forward's port now is another
            # program's (which `wait_listening` would take for the forward).
            taken = [f.port for f in self.forwards if _listening(f)]
            if taken:
                note(
                    f"not reopened: port {taken[0]} on this laptop is in use by another program now"
                )
                return False
            renewed = renewer.renewals
            self.start(own_group=True)
            try:
                self.wait_listening()
            except RemoteError:
                if renewer.renewals > renewed or renewer.renewing:
                    failed_on_a_live_link += 1
                continue
            note("the forward is open again")
            return True
        note("not reopened: ssh keeps failing while the VM answers (its message is above)")
        return False

    def end(self) -> int | None:
        """End ssh if it still runs (SIGTERM, then SIGKILL): its exit status."""
        process = self.process
        if process is None:
            return None
        if process.poll() is None:
            self.ended_by_us = True
            process.terminate()
            try:
                process.wait(timeout=END_WAIT_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        return process.returncode


def wall_time_of(renewer: LeaseRenewer, *, wall_clock: Callable[[], float] = time.time) -> float:
    """The wall-clock time of the renewer's last renewal (now, if it never renewed)."""
    if renewer.last_renewed is None:
        return wall_clock()
    return wall_clock() - (renewer.clock() - renewer.last_renewed)
