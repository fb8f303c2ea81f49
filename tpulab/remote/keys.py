"""The keys of an SSH session to a TPU VM, and where they come from. No paramiko here.

- `RunKey`: a fresh ed25519 key pair per run, held in memory. Its public half goes into
  the node's `metadata["ssh-keys"]` at create time; the private half never touches disk
  unless a caller asks for `private_key_file` (0600, removed on exit), is never logged
  and never shows in a repr.
- `HostKey`: the VM's host key as the Cloud TPU API publishes it in guest attributes
  (`hostkeys/ssh-ed25519`); `tpulab.ssh.Connection` pins it and trusts nothing else.
- `SshTarget`: host, port, user and pinned host key, validated.
- `ssh_port_from`, `host_key_from`, `wait_for_host_key`: reading guest attributes, which
  may lag the node's READY state.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import re
import struct
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tpulab.contract import (
    EMULATOR_SSH_PORT_ATTRIBUTE,
    HOST_KEY_ATTRIBUTE,
    HOST_KEY_NAMESPACE,
    HOST_KEY_TYPES,
)
from tpulab.errors import (
    CloudError,
    ConfigError,
    ConnectError,
    HostKeyMismatchError,
)
from tpulab.polling import Backoff, Tries, poll_until

__all__ = [
    "GUEST_ATTRIBUTES_POLICY",
    "HOST_KEY_ATTRIBUTE",
    "GuestAttributesDisabledError",
    "HostKey",
    "HostKeyNotPublishedError",
    "RunKey",
    "SshTarget",
    "fingerprint",
    "host_key_from",
    "ssh_port_from",
    "wait_for_host_key",
]

log = logging.getLogger(__name__)

_USER_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")


class HostKeyNotPublishedError(ConnectError):
    """The node has no `hostkeys/ssh-ed25519` guest attribute (yet)."""


class GuestAttributesDisabledError(ConnectError):
    """The organisation policy `compute.disableGuestAttributesAccess` is enforced: the
    host key can never be read, so waiting is pointless."""


# The org policy constraint that blocks getGuestAttributes. gcloud's `tpu-vm ssh` names
# it in its troubleshooting text (command_lib/compute/tpus/tpu_vm/ssh.py,
# IAP_TROUBLESHOOTING_HELP); Google's org-policy refusals name the constraint they
# enforce, which is what recognises it here.
GUEST_ATTRIBUTES_POLICY = "compute.disableGuestAttributesAccess"


def fingerprint(blob: bytes) -> str:
    """OpenSSH's SHA256 fingerprint of a public key blob."""
    digest = base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
    return f"SHA256:{digest}"


def _check_user(user: str) -> str:
    if not _USER_RE.fullmatch(user):
        raise ConfigError(
            f"SSH user {user!r} is not a valid login name",
            hint="Use letters, digits, '_', '.', '-' (starting with a letter or '_'), "
            "at most 32 characters.",
        )
    return user


class RunKey:
    """A per-run ed25519 key pair that lives in memory only."""

    key_type = "ssh-ed25519"

    def __init__(self) -> None:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        self._private = Ed25519PrivateKey.generate()
        public = self._private.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        )
        self._b64 = public.decode("ascii").split()[1]

    @classmethod
    def from_openssh_private(cls, data: bytes) -> RunKey:
        """A session's key read back from its 0600 file (`tpulab up` wrote it with
        `openssh_private_bytes`), so `tpulab exec` authenticates as the session."""
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        loaded = serialization.load_ssh_private_key(data, password=None)
        if not isinstance(loaded, Ed25519PrivateKey):
            raise ConfigError("The session's key is not an ed25519 key.")
        key = cls.__new__(cls)
        key._private = loaded
        public = loaded.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        )
        key._b64 = public.decode("ascii").split()[1]
        return key

    @property
    def public_b64(self) -> str:
        return self._b64

    @property
    def fingerprint(self) -> str:
        return fingerprint(base64.b64decode(self._b64))

    def public_line(self, user: str) -> str:
        return f"{self.key_type} {self._b64} {_check_user(user)}"

    def metadata_entry(self, user: str) -> str:
        """One line of the node's `metadata["ssh-keys"]`."""
        return f"{_check_user(user)}:{self.public_line(user)}"

    def openssh_private_bytes(self) -> bytes:
        """The private key in OpenSSH format, for the SSH client only: never log,
        print or persist it (see `private_key_file` if a tool needs a file)."""
        from cryptography.hazmat.primitives import serialization

        return self._private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        )

    @contextmanager
    def private_key_file(self, directory: Path) -> Iterator[Path]:
        """For tools that need a key file (e.g. an `ssh -i` fallback): created 0600 with
        O_EXCL (never through a pre-existing or world-readable file), removed on exit."""
        # Base64 fingerprints contain "/" and "+": keep only file-name-safe characters.
        tag = re.sub(r"[^A-Za-z0-9]", "_", self.fingerprint[-8:])
        path = directory / f"tpulab-run-key-{os.getpid()}-{tag}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(self.openssh_private_bytes())
            yield path
        finally:
            path.unlink(missing_ok=True)

    def __repr__(self) -> str:
        return f"RunKey({self.key_type} {self.fingerprint})"

    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError("RunKey cannot be pickled: the private key stays in this process")


@dataclass(frozen=True)
class HostKey:
    """A host key as published in guest attributes: type and base64 body."""

    key_type: str
    b64: str

    def __post_init__(self) -> None:
        try:
            blob = base64.b64decode(self.b64, validate=True)
            (length,) = struct.unpack(">I", blob[:4])
            inner_type = blob[4 : 4 + length].decode("ascii")
        except (ValueError, struct.error, UnicodeDecodeError):
            inner_type = None
        if inner_type != self.key_type:
            raise HostKeyMismatchError(
                f"The published host key is not a valid {self.key_type} key",
                hint="The node's guest attribute hostkeys/ssh-ed25519 is malformed; do not "
                "connect. Recreate the node if it persists.",
            )

    @property
    def blob(self) -> bytes:
        return base64.b64decode(self.b64)

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.blob)


@dataclass(frozen=True)
class SshTarget:
    host: str
    port: int
    user: str
    host_key: HostKey

    def __post_init__(self) -> None:
        if not self.host or any(c.isspace() for c in self.host):
            raise ConfigError(f"SSH host {self.host!r} is not a host name or address")
        if not 0 < self.port < 65536:
            raise ConfigError(f"SSH port {self.port} is outside 1..65535")
        _check_user(self.user)

    def __str__(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"


def ssh_port_from(attrs: Mapping[str, str]) -> int:
    """The emulator publishes its loopback port; real TPU VMs listen on 22."""
    raw = attrs.get(EMULATOR_SSH_PORT_ATTRIBUTE)
    if raw is None:
        return 22
    try:
        port = int(raw)
    except ValueError:
        port = 0
    if not 0 < port < 65536:
        raise ConnectError(
            f"Guest attribute {EMULATOR_SSH_PORT_ATTRIBUTE} is {raw!r}, not a port number",
            hint="The emulator published a bad endpoint; restart `tpulab emulator serve`.",
        )
    return port


def host_key_from(attrs: Mapping[str, str]) -> HostKey:
    """The host key to pin: ed25519 when published, else the next type the guest agent
    publishes (ecdsa, then rsa) -- an image whose sshd has no ed25519 key is still a VM
    we can pin, not one to give up on."""
    for key_type in HOST_KEY_TYPES:
        value = attrs.get(f"{HOST_KEY_NAMESPACE}/{key_type}", "").strip()
        if value:
            # Some images publish "ssh-ed25519 AAAA..." rather than the bare body.
            parts = value.split()
            body = parts[1] if len(parts) > 1 and parts[0] == key_type else parts[0]
            return HostKey(key_type, body)
    raise HostKeyNotPublishedError(
        "The node has not published its SSH host key yet "
        f"(guest attribute {HOST_KEY_ATTRIBUTE}, or another {HOST_KEY_NAMESPACE}/ type)",
        hint="The VM's guest agent publishes it shortly after boot; wait and retry. "
        "tpulab never connects without a pinned host key.",
    )


def wait_for_host_key(
    fetch_attrs: Callable[[], Mapping[str, str]],
    *,
    timeout: float,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    backoff: Iterable[float] | None = None,
) -> HostKey:
    """Poll guest attributes until the host key appears (it may lag READY).

    Until the deadline, "not yet" is: no key in the attributes, or any API error from
    getGuestAttributes -- as gcloud's `tpu-vm ssh` treats every HttpError there
    (command_lib/compute/tpus/tpu_vm/ssh.py, GetGuestAttributes): the API answers
    NOT_FOUND, FAILED_PRECONDITION and others before the guest agent has published.
    When it gives up it quotes the last error. One answer ends the wait at once: the org
    policy compute.disableGuestAttributesAccess, which no wait can outlast."""

    def not_published(tries: Tries[HostKey]) -> Exception:
        last = f"; the API's last answer: {_said(tries.error)}" if tries.error else ""
        error = HostKeyNotPublishedError(
            f"The node did not publish its SSH host key ({HOST_KEY_ATTRIBUTE}) "
            f"within {tries.timeout:g}s{last}",
            hint="Check the node in the console (serial port output); if the image "
            "just boots slowly, give it longer with --boot-timeout. Nothing was sent "
            "to the VM.",
        )
        error.__cause__ = tries.error
        return error

    def on_retry(error: Exception, delay: float) -> None:
        log.debug("host key not available yet (%s); next look in %.1fs", error, delay)

    return poll_until(
        lambda: host_key_from(_unless_disabled(fetch_attrs)),
        lambda _key: True,
        timeout=timeout,
        clock=clock,
        sleep=sleep,
        backoff=backoff if backoff is not None else Backoff(0.5, 5.0, factor=2.0),
        retry_if=_not_published_yet,
        on_retry=on_retry,
        # Also what a dry run shows as this poll's goal.
        describe=lambda _key: f"the node to publish its SSH host key ({HOST_KEY_ATTRIBUTE})",
        expired=not_published,
    )


def _not_published_yet(error: Exception) -> bool:
    return isinstance(error, HostKeyNotPublishedError | CloudError)


def _said(error: Exception) -> str:
    words = str(getattr(error, "message", "") or error).strip()
    status = getattr(error, "status", None)
    return f"{status}: {words}" if status and status not in words else words


def _unless_disabled(fetch_attrs: Callable[[], Mapping[str, str]]) -> Mapping[str, str]:
    try:
        return fetch_attrs()
    except CloudError as error:
        said = f"{error.message} {error.api_message or ''}"
        if GUEST_ATTRIBUTES_POLICY.lower() not in said.lower():
            raise
        raise GuestAttributesDisabledError(
            "The node's SSH host key cannot be read: the organisation policy "
            f"constraints/{GUEST_ATTRIBUTES_POLICY} is enforced for this project, so the "
            f"API refuses getGuestAttributes ({_said(error)}).",
            hint="tpulab pins the VM's SSH host key from guest attributes and does not "
            "connect without it. Ask an organisation policy administrator to stop "
            f"enforcing {GUEST_ATTRIBUTES_POLICY} for this project (`gcloud "
            f"resource-manager org-policies disable-enforce {GUEST_ATTRIBUTES_POLICY} "
            "--project=PROJECT`), then run again. Nothing was sent to the VM.",
        ) from error
