"""The seam between the emulated API and the SSH servers that stand in for TPU VMs.

The emulator calls `start` when a node becomes READY, `update_keys` when UpdateNode has
changed its `ssh-keys` (the guest agent re-reads metadata on a live VM), and `stop` when
it is deleted (or its state is reloaded after a restart). A backend runs a real SSH
server on loopback that accepts only the node's `metadata["ssh-keys"]` and runs
commands in `sandbox`, which is the session's HOME.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

__all__ = ["PRIMARY_HOST_KEY_TYPE", "AddressedHostBackend", "HostBackend", "HostEndpoint"]

# The type tpulab pins (DESIGN §3.6); the others are published for other clients.
PRIMARY_HOST_KEY_TYPE = "ssh-ed25519"


@dataclass(frozen=True)
class HostEndpoint:
    host: str
    port: int
    host_keys: Mapping[str, str]
    """Every host key the server presents: type ("ssh-ed25519", "ecdsa-sha2-nistp256",
    "ssh-rsa") -> base64 body, as the guest agent publishes them (`hostkeys/<type>`)."""
    tag: str = ""
    """The node tag (processes.NODE_TAG_VAR) its sessions' processes carry: recorded with
    the node, so whichever emulator deletes or reboots it can kill what they left running
    although the emulator that started them died (SIGKILLed `tpulab run --emulate`)."""

    @property
    def host_key_type(self) -> str:
        return PRIMARY_HOST_KEY_TYPE

    @property
    def host_key_b64(self) -> str:
        return self.host_keys[PRIMARY_HOST_KEY_TYPE]


class HostBackend(Protocol):
    def start(
        self,
        node_key: str,
        sandbox: Path,
        ssh_keys_metadata: str,
        *,
        refuse_for: float = 0.0,
        ensurepip_missing: bool = False,
        env: Mapping[str, str] | None = None,
    ) -> HostEndpoint:
        """Start an SSH host for a node; `ssh_keys_metadata` is the raw metadata value
        ("user:ssh-ed25519 AAAA... comment" lines). `refuse_for` delays listening, to
        emulate an sshd that lags READY; `ensurepip_missing` gives the node an image
        whose python3 lacks ensurepip (Ubuntu without python3-venv); `env` is added to
        every session's environment (the node's metadata server and API addresses)."""
        ...

    def update_keys(self, node_key: str, ssh_keys_metadata: str) -> None:
        """Accept exactly these keys from now on (new sessions; open ones stay)."""
        ...

    def stop(self, node_key: str) -> None:
        """Stop the node's SSH server (idempotent). The emulator removes the sandbox."""
        ...

    def close(self) -> None:
        """Stop every server this backend started."""
        ...


@runtime_checkable
class AddressedHostBackend(HostBackend, Protocol):
    """A backend that can listen where it is told: the emulator puts the workers of a
    multi-host node on 127.0.0.(1+w), all on one port (see workers.py). A backend
    without `start_at` still serves slices, each worker on its own 127.0.0.1 port."""

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
        """`start` on `address`:`port` (0: any free port). OSError (EADDRINUSE) when the
        port is taken there, before anything was started."""
        ...

    def start(
        self,
        node_key: str,
        sandbox: Path,
        ssh_keys_metadata: str,
        *,
        refuse_for: float = 0.0,
        ensurepip_missing: bool = False,
        env: Mapping[str, str] | None = None,
    ) -> HostEndpoint:
        # A backend that subclasses this protocol gets `start` for free: a lone node
        # listens on any free port of 127.0.0.1.
        return self.start_at(
            node_key,
            sandbox,
            ssh_keys_metadata,
            address="127.0.0.1",
            port=0,
            refuse_for=refuse_for,
            ensurepip_missing=ensurepip_missing,
            env=env,
        )
