"""The exact command lines an SSH `Connection` hands the remote shell. Pure; no paramiko.

`tpulab.remote.ssh.Connection` executes these strings and `tpulab run --dry-run` prints
them, so a plan shows the `timeout --signal=KILL ... /bin/sh -c` wrapping, the `export`s
and the transfers' sha256 checks that a run really sends, not a paraphrase of them.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath

from tpulab.errors import ConfigError

__all__ = [
    "SHA256_TIMEOUT",
    "remote_command",
    "remote_path",
    "sha256_command",
]

# Seconds a transfer's `sha256sum` may take on the VM (a payload or a receipt: small).
SHA256_TIMEOUT = 120.0

_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def remote_command(
    argv: Sequence[str] | str,
    *,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
) -> str:
    """The exact string the remote shell receives.

    A list is joined with `shlex.join`, so each element is one argument whatever it
    contains; a plain string is taken as a shell snippet written by tpulab itself. `env`
    becomes `export K=V;` (quoted) because servers commonly refuse SSH setenv requests.
    """
    if isinstance(argv, str):
        if not argv.strip():
            raise ConfigError("Empty remote command")
        inner = argv
    else:
        if not argv:
            raise ConfigError("Empty remote command")
        inner = shlex.join(argv)
    for name, value in (env or {}).items():
        if not _ENV_NAME_RE.fullmatch(name):
            raise ConfigError(f"Environment variable name {name!r} is not valid for a shell")
        if "\0" in value:
            raise ConfigError(f"Environment variable {name} contains a NUL byte")
    exports = "".join(f"export {k}={shlex.quote(v)}; " for k, v in (env or {}).items())
    inner = exports + inner
    if timeout is None:
        return inner
    if timeout <= 0:
        raise ConfigError(f"Remote command timeout must be positive, got {timeout}")
    return f"timeout --signal=KILL {timeout:.3f} /bin/sh -c {shlex.quote(inner)}"


def sha256_command(path: str) -> str:
    """The check run after every upload and before every download."""
    # Hash stdin, not a named file: sha256sum escapes names holding "\\" or newlines.
    return f"sha256sum < {shlex.quote(path)}"


def remote_path(home: str, remote: str) -> str:
    """`remote` resolved against the login directory `home`: `~`, `~/x` and relative
    paths are the login's; absolute paths stay as they are."""
    if not remote or "\0" in remote:
        raise ConfigError(f"Remote path {remote!r} is empty or contains NUL")
    if remote == "~":
        return home
    if remote.startswith("~/"):
        remote = remote[2:]
    elif remote.startswith("~"):
        raise ConfigError(f"Remote path {remote!r}: only '~' and '~/...' are supported")
    return str(PurePosixPath(home, remote))
