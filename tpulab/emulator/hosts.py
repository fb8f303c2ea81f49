"""The seam between the emulated API and the SSH servers that stand in for TPU VMs.

The emulator calls `start` when a node becomes READY and `stop` when it is deleted (or
its state is reloaded after a restart). A backend runs a real SSH server on loopback
that accepts only the node's `metadata["ssh-keys"]` and runs commands in `sandbox`,
which is the session's HOME.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

__all__ = ["HostBackend", "HostEndpoint"]


@dataclass(frozen=True)
class HostEndpoint:
    host: str
    port: int
    host_key_type: str  # e.g. "ssh-ed25519"
    host_key_b64: str  # the key body, as published in guest attributes


class HostBackend(Protocol):
    def start(
        self,
        node_key: str,
        sandbox: Path,
        ssh_keys_metadata: str,
        *,
        refuse_for: float = 0.0,
        ensurepip_missing: bool = False,
    ) -> HostEndpoint:
        """Start an SSH host for a node; `ssh_keys_metadata` is the raw metadata value
        ("user:ssh-ed25519 AAAA... comment" lines). `refuse_for` delays listening, to
        emulate an sshd that lags READY; `ensurepip_missing` gives the node an image
        whose python3 lacks ensurepip (Ubuntu without python3-venv)."""
        ...

    def stop(self, node_key: str) -> None:
        """Stop the node's SSH server (idempotent). The emulator removes the sandbox."""
        ...

    def close(self) -> None:
        """Stop every server this backend started."""
        ...
