"""What an emulated TPU VM looks like from the inside, shared by both SSH host backends.

- `ImageEnv`: the environment the "VM image" gives every session. Real TPU VM images
  carry no jax; our emulated image pretends jax and numpy are baked in by pointing
  `PYTHONPATH` at the controller's own site-packages, so `python3 -m venv` followed by
  `import jax` works offline without downloading anything.
- `parse_ssh_keys`: the node's `metadata["ssh-keys"]` as the guest agent reads it.
- `new_host_keys`: fresh ed25519, ECDSA P-256 and RSA host keys per node, the set the
  guest agent generates at a VM's first boot (its `host_key_types = ecdsa,ed25519,rsa`).
- `reserve_port`: a loopback port held (bound, not listening) so it can be published
  before the server accepts connections.
- `NODE_TAG_VAR` / `kill_tagged`: every session process carries the node's tag in its
  environment, so deleting a node can kill everything it started, daemonized children
  included, the way deleting a VM does (Linux /proc; elsewhere only live sessions die).
"""

from __future__ import annotations

import base64
import importlib.util
import logging
import os
import secrets
import signal
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "NODE_TAG_VAR",
    "AuthorizedKey",
    "HostKeyPair",
    "ImageEnv",
    "default_image_env",
    "kill_tagged",
    "new_host_keys",
    "new_node_tag",
    "parse_ssh_keys",
    "reserve_port",
    "session_env",
]

log = logging.getLogger(__name__)

NODE_TAG_VAR = "TPULAB_EMULATED_NODE"


@dataclass(frozen=True)
class ImageEnv:
    """Environment variables of the emulated image, layered under HOME/USER per session.

    `path` and `pythonpath` are joined with ':'; `extra` is added verbatim.
    """

    path: tuple[str, ...]
    pythonpath: tuple[str, ...] = ()
    extra: Mapping[str, str] = field(default_factory=dict)

    def as_env(self) -> dict[str, str]:
        env = {"PATH": ":".join(self.path)}
        if self.pythonpath:
            env["PYTHONPATH"] = ":".join(self.pythonpath)
        env.update(self.extra)
        return env


def _site_dir_of(module: str) -> str | None:
    # find_spec locates the package without importing it (jax takes seconds to import).
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    return str(Path(next(iter(spec.submodule_search_locations))).resolve().parent)


def default_image_env() -> ImageEnv:
    """The running interpreter first on PATH, and the site-packages holding jax and numpy
    on PYTHONPATH, so a venv made on the "VM" sees them like a jax-baked image."""
    site_dirs: list[str] = []
    for module in ("jax", "jaxlib", "numpy"):
        site = _site_dir_of(module)
        if site is not None and site not in site_dirs:
            site_dirs.append(site)
    bin_dir = str(Path(sys.executable).parent)
    return ImageEnv(path=(bin_dir, "/usr/bin", "/bin"), pythonpath=tuple(site_dirs))


def session_env(image: ImageEnv, home: Path, user: str) -> dict[str, str]:
    """A clean login environment: nothing leaks in from the emulator's own environment."""
    env = {
        "HOME": str(home),
        "USER": user,
        "LOGNAME": user,
        "SHELL": "/bin/sh",
        "LANG": "C.UTF-8",
    }
    env.update(image.as_env())
    return env


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


# RSA size: ssh-keygen's default is 3072 bits, but generating one costs ~0.3 s per node
# start here (2048: ~0.08 s) and no client's choice depends on the size.
_RSA_BITS = 2048


def new_host_keys() -> list[HostKeyPair]:
    """One fresh key per type the guest agent publishes: ssh-ed25519 (tpulab pins this),
    ecdsa-sha2-nistp256 (ssh-keygen's default ECDSA curve) and ssh-rsa."""
    from cryptography.hazmat.primitives.asymmetric import ec, rsa
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    return [
        _pair(Ed25519PrivateKey.generate()),
        _pair(ec.generate_private_key(ec.SECP256R1())),
        _pair(rsa.generate_private_key(public_exponent=65537, key_size=_RSA_BITS)),
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


def reserve_port(host: str = "127.0.0.1") -> socket.socket:
    """Bind (but do not listen on) a free port: connections to it are refused, yet no
    other process can take it before our server starts listening there."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    os.set_inheritable(sock.fileno(), False)
    return sock


def new_node_tag(node_key: str) -> str:
    return f"{node_key}.{secrets.token_hex(8)}"


def kill_tagged(tag: str) -> int:
    """SIGKILL every process of ours whose environment carries `NODE_TAG_VAR=tag`."""
    needle = f"{NODE_TAG_VAR}={tag}".encode()
    killed = 0
    try:
        entries = os.listdir("/proc")
    except OSError:
        return 0
    for entry in entries:
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as handle:
                tagged = needle in handle.read().split(b"\0")
            if tagged:
                os.kill(int(entry), signal.SIGKILL)
                killed += 1
        except (OSError, ValueError):
            continue  # gone, or not ours to read
    return killed
