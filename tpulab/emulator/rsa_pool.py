"""RSA host keys made once per machine and handed out again to later emulated clouds.

A node's boot makes an ed25519, an ECDSA and an RSA host key, as the guest agent does at
a VM's first boot (hostkeys.py). Generating RSA-2048 costs ~40 ms of CPU (searching for
primes), about 400 times the other two together, and it happens for every worker of
every node an emulator boots: a large share of an emulated node's start, paid again by
every `--emulate` run and every test.

So RSA keys come from a pool kept beside the emulated image's package caches: key N of
the pool is the same for every emulated cloud, and each cloud (a state directory) takes
keys in order, counting in its own `host-keys.next`, so no two boots in one cloud share
a key (until POOL_SIZE more boots) and a node booted again gets a new one, as in the
real cloud. Two clouds may hold the same key at once; nothing can tell, since each
cloud's clients learn host keys from that cloud's guest attributes alone. A missing key
is generated and added (concurrent makers agree: the first one written wins); a damaged
one (its checksum line does not match) is made anew, so the pool is a cache that
repairs itself.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.rsa import RSAPrivateKey

__all__ = ["POOL_SIZE", "RSA_BITS", "RsaKeyPool", "default_pool_dir"]

log = logging.getLogger(__name__)

# ssh-keygen's default is 3072 bits; no client's choice depends on the size, and 2048
# is what the emulator has always served.
RSA_BITS = 2048
# The pool's bound (~0.4 MB): a cloud's count goes round it, so a key comes back only
# after this many more boots in that cloud, long after the node that held it is gone
# (an emulated node lives minutes; a user's default cloud boots one or two a run).
POOL_SIZE = 256
_CHECKSUM = b"# sha256 "


def default_pool_dir() -> Path:
    """Beside the emulated image's package caches (hostenv.default_cache_dir)."""
    from tpulab.emulator.hostenv import default_cache_dir

    return default_cache_dir().parent / "emulated-host-keys" / f"rsa-{RSA_BITS}"


class RsaKeyPool:
    """The pool in `pool_dir`, as seen by the cloud whose state directory is `state_dir`."""

    def __init__(self, state_dir: Path, pool_dir: Path | None = None) -> None:
        self.pool_dir = pool_dir if pool_dir is not None else default_pool_dir()
        self.counter = state_dir / "host-keys.next"

    def take(self) -> RSAPrivateKey:
        """The next key this cloud has not handed out."""
        try:
            return self.key(self._next_index())
        except OSError as error:
            # The pool only saves time: a cache directory that cannot be written (a
            # read-only HOME) or a counter that cannot be kept costs a fresh key, never
            # a node's boot.
            log.warning("the RSA host key pool %s is unusable (%s)", self.pool_dir, error)
            return _generate()

    def key(self, index: int) -> RSAPrivateKey:
        """Key `index` of the pool, made (and kept) if it is missing or damaged."""
        path = self.pool_dir / f"{index:06d}.pem"
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return self._make(path, replace=False)
        found = _load(data)
        if found is not None:
            return found
        log.warning("the pooled RSA host key %s is damaged; making a new one", path)
        return self._make(path, replace=True)

    def _next_index(self) -> int:
        self.counter.parent.mkdir(parents=True, exist_ok=True)
        with open(self.counter, "a+b") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            handle.seek(0)
            text = handle.read().strip()
            # Unreadable counts restart at 0: keys would repeat only against nodes this
            # damaged file's cloud booted earlier, a cloud already hand-edited.
            index = int(text) if text.isascii() and text.isdigit() else 0
            handle.seek(0)
            handle.truncate()
            handle.write(b"%d\n" % (index + 1))
            handle.flush()
        return index % POOL_SIZE

    def _make(self, path: Path, *, replace: bool) -> RSAPrivateKey:
        from cryptography.hazmat.primitives import serialization

        key = _generate()
        pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        data = _CHECKSUM + hashlib.sha256(pem).hexdigest().encode() + b"\n" + pem
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".key-", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            if replace:
                os.replace(tmp, path)
                return key
            try:
                os.link(tmp, path)  # never over a key another process made meanwhile
            except FileExistsError:
                theirs = _load(path.read_bytes())
                if theirs is not None:
                    return theirs
                os.replace(tmp, path)
            except OSError:  # a filesystem without hard links: the last one written wins
                os.replace(tmp, path)
            return key
        finally:
            Path(tmp).unlink(missing_ok=True)


def _generate() -> RSAPrivateKey:
    from cryptography.hazmat.primitives.asymmetric import rsa

    return rsa.generate_private_key(public_exponent=65537, key_size=RSA_BITS)


def _load(data: bytes) -> RSAPrivateKey | None:
    """The key in a pool file, or None when its checksum line does not match."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.rsa import RSAPrivateKey

    head, _, pem = data.partition(b"\n")
    if head != _CHECKSUM + hashlib.sha256(pem).hexdigest().encode():
        return None
    # The checksum proves these are the bytes written from a generated key, so the
    # ~30 ms check of the key's mathematics would only re-prove that.
    try:
        key = serialization.load_pem_private_key(pem, None, unsafe_skip_rsa_key_validation=True)
    except ValueError:
        return None
    return key if isinstance(key, RSAPrivateKey) else None
