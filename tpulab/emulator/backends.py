"""Pick the SSH host backend behind the emulator's READY nodes."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from tpulab.emulator.hostenv import ImageEnv, ImageKind
from tpulab.emulator.hosts import HostBackend

__all__ = ["HostBackendKind", "make_host_backend"]

HostBackendKind = Literal["embedded", "openssh"]


def make_host_backend(
    kind: HostBackendKind, state_dir: Path, *, image: ImageEnv | ImageKind = "bare"
) -> HostBackend:
    """ "embedded" (default; asyncssh, needs nothing installed) or "openssh" (the system
    sshd, as real TPU VMs run), serving `image` (default "bare", like a real TPU VM).
    Imports are lazy: asyncssh is heavy and sshd optional."""
    if kind == "embedded":
        from tpulab.emulator.sshhost import EmbeddedHostBackend

        return EmbeddedHostBackend(state_dir, image=image)
    if kind == "openssh":
        from tpulab.emulator.openssh import OpenSshHostBackend

        return OpenSshHostBackend(state_dir, image=image)
    raise ValueError(f"unknown SSH host backend {kind!r}; choose 'embedded' or 'openssh'")
