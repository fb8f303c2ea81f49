"""What a run needs of an SSH session to a worker VM (`RemoteSession`), and the seam
that opens one (`Connect`).

`tpulab.remote.ssh.Connection` is the real one; the dry run's recorder
(tpulab.run.recording_ssh) and the tests' rigs are others. Its own module so that
the run's context, its workers and its drivers name it without importing each other.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from tpulab.remote import bootstrap as boot
from tpulab.remote import workload as wl
from tpulab.remote.workspace import StreamShell

if TYPE_CHECKING:
    from pathlib import Path

    from tpulab.remote.keys import RunKey, SshTarget

__all__ = ["Connect", "RemoteSession"]


class RemoteSession(boot.RemoteShell, StreamShell, wl.HoldingShell, Protocol):
    """What the run needs from `tpulab.remote.ssh.Connection`: the bootstrap's `run`,
    plus opening, closing, file transfer and `hold` (an exec's lock)."""

    def open(self) -> None: ...

    def close(self) -> None: ...

    def put(self, local: Path | bytes, remote: str) -> str: ...

    def read(self, remote: str, *, max_bytes: int) -> bytes: ...


Connect = Callable[["SshTarget", "RunKey"], RemoteSession]
