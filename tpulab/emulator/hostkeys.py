"""SSH keys of an emulated node: the authorized keys its guest agent reads from the
node's `metadata["ssh-keys"]`, and the host keys it generates at first boot.

- `parse_ssh_keys`: "user:keytype base64 [comment]" lines, as the guest agent reads them.
- `new_host_keys`: ed25519, ECDSA P-256 and RSA host keys per node, the set the guest
  agent generates at a VM's first boot (its `host_key_types = ecdsa,ed25519,rsa`).
"""

from __future__ import annotations

import base64
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tpulab.emulator.rsa_pool import RsaKeyPool

__all__ = ["AuthorizedKey", "HostKeyPair", "new_host_keys", "parse_ssh_keys"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AuthorizedKey:
    user: str
    key_type: str
    b64: str

    @property
    def openssh_line(self) -> str:
        return f"{self.key_type} {self.b64} {self.user}"


def parse_ssh_keys(metadata: str) -> list[AuthorizedKey]:
    """Parse "user:keytype base64 [comment]" lines; malformed lines are skipped (and
    logged) the way the guest agent ignores them, so one bad line locks nobody out."""
    keys: list[AuthorizedKey] = []
    for number, raw in enumerate(metadata.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        user, sep, rest = line.partition(":")
        parts = rest.split()
        if not sep or not user or len(parts) < 2:
            log.warning("ssh-keys line %d is not 'user:keytype base64 comment'; ignored", number)
            continue
        try:
            base64.b64decode(parts[1], validate=True)
        except ValueError:
            log.warning("ssh-keys line %d has a key body that is not base64; ignored", number)
            continue
        keys.append(AuthorizedKey(user=user, key_type=parts[0], b64=parts[1]))
    return keys


@dataclass(frozen=True)
class HostKeyPair:
    private_openssh: bytes  # OpenSSH PEM; never logged
    key_type: str
    b64: str

    def __repr__(self) -> str:
        return f"HostKeyPair({self.key_type} {self.b64[:16]}...)"


def new_host_keys(rsa_keys: RsaKeyPool) -> list[HostKeyPair]:
    """One key per type the guest agent publishes, none of them held by another boot of
    this cloud: ssh-ed25519 (tpulab pins this) and ecdsa-sha2-nistp256 (ssh-keygen's
    default ECDSA curve), fresh; ssh-rsa, the next of `rsa_keys` (rsa_pool.py: making
    one costs ~400 times the other two)."""
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    return [
        _pair(Ed25519PrivateKey.generate()),
        _pair(ec.generate_private_key(ec.SECP256R1())),
        _pair(rsa_keys.take()),
    ]


def _pair(private: Any) -> HostKeyPair:
    from cryptography.hazmat.primitives import serialization

    pem = private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    )
    public = private.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    key_type, b64 = public.decode("ascii").split()[:2]
    return HostKeyPair(private_openssh=pem, key_type=key_type, b64=b64)
