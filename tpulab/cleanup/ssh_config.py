"""`tpulab ssh-config`: a `Host tpulab-S` entry per session, for `ssh tpulab-S`, scp,
rsync and VS Code Remote-SSH -- with the session's pins, never host-key checking off.

Each entry is its own file in the session's directory, beside its key and the pinned
known_hosts it names:

    <state dir>/sessions/<name>/ssh_config     Host tpulab-<name> ...
    <state dir>/sessions/<name>/known_hosts    the host key `up` pinned, its only entry

The user's ~/.ssh/config gets ONE line, `Include "<state dir>/sessions/*/ssh_config"`,
added once at its top (an Include below a `Host` block would apply only inside that
block) after a backup; no other line of it is ever touched. Because the entry lives in
the session's directory, whatever removes the session -- `down`, a node found gone at
--ttl/--idle (`conclude_gone`), the sweep -- removes its entry with its key: an entry
can never outlive the session it points at, and a glob that matches nothing is no
error for OpenSSH.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tpulab.errors import ConfigError, JournalError

if TYPE_CHECKING:
    from tpulab.cleanup.sessions import SessionFiles, SessionStore

__all__ = [
    "ENTRY_FILE",
    "KNOWN_HOSTS_FILE",
    "IncludeChange",
    "ensure_include",
    "host_alias",
    "host_block",
    "include_line",
    "known_hosts_path",
    "user_ssh_config",
    "write_entry",
]

ENTRY_FILE = "ssh_config"
KNOWN_HOSTS_FILE = "known_hosts"
BACKUP_SUFFIX = ".tpulab-backup"
_MARK = "# Added by `tpulab ssh-config --write`: the Host tpulab-* entries of its sessions."


def host_alias(name: str) -> str:
    return f"tpulab-{name}"


def known_hosts_path(files: SessionFiles) -> Path:
    """The session's pinned known_hosts, beside its key (removed with it)."""
    return files.key_path.parent / KNOWN_HOSTS_FILE


def user_ssh_config() -> Path:
    return Path.home() / ".ssh" / "config"


def _quoted(path: Path, *, tokens: bool) -> str:
    """A path as an ssh_config argument: quoted; `%` doubled where ssh expands tokens."""
    text = str(path)
    if '"' in text or "\n" in text:
        raise ConfigError(
            f"The path {text!r} cannot be written into an SSH config (it holds a quote).",
            hint="Set TPULAB_HOME to a directory whose path has no quotes.",
        )
    return '"' + (text.replace("%", "%%") if tokens else text) + '"'


def host_block(files: SessionFiles) -> str:
    """The session's `Host tpulab-S` entry."""
    state = files.state
    lines = [
        f"# tpulab session {state.name}: node {state.node_name} in {state.zone}. Written by",
        f"# `tpulab ssh-config --write`; `tpulab down {state.name}` removes it.",
        f"Host {host_alias(state.name)}",
        f"  HostName {state.ssh_host}",
        f"  Port {state.ssh_port}",
        f"  User {state.ssh_user}",
        f"  IdentityFile {_quoted(files.key_path, tokens=True)}",
        "  IdentitiesOnly yes",
        f"  UserKnownHostsFile {_quoted(known_hosts_path(files), tokens=True)}",
        "  GlobalKnownHostsFile /dev/null",
        "  StrictHostKeyChecking yes",
    ]
    return "\n".join(lines) + "\n"


def _write_atomic(path: Path, text: str, mode: int) -> None:
    fd, partial = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(partial, mode)
        os.replace(partial, path)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise


def write_entry(files: SessionFiles) -> Path:
    """Write the session's entry file (its known_hosts must be written: see
    `tpulab.run.forward.session_ssh`); the path."""
    path = files.key_path.parent / ENTRY_FILE
    try:
        _write_atomic(path, host_block(files), 0o600)
    except OSError as error:
        raise JournalError(
            f"Cannot write the SSH entry {path}: {error}",
            hint="Check that the tpulab state directory is writable (TPULAB_HOME).",
        ) from None
    return path


def include_line(store: SessionStore) -> str:
    return f"Include {_quoted(store.root.resolve() / '*' / ENTRY_FILE, tokens=False)}"


@dataclass(frozen=True)
class IncludeChange:
    config: Path
    added: bool  # False: the Include was there already
    backup: Path | None  # the user's config as it was, when there was one to change


def ensure_include(store: SessionStore, config: Path | None = None) -> IncludeChange:
    """Put `include_line` at the top of the user's SSH config, once. The file's other
    lines are kept byte for byte (after a backup); a symlinked config is written
    through its link; a missing one is created (0600, in a 0700 ~/.ssh)."""
    config = config or user_ssh_config()
    line = include_line(store)
    target = config.resolve() if config.is_symlink() else config
    try:
        if not target.exists():
            target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            _write_atomic(target, f"{_MARK}\n{line}\n", 0o600)
            return IncludeChange(config, added=True, backup=None)
        original = target.read_text(encoding="utf-8")
        if any(existing.strip() == line for existing in original.splitlines()):
            return IncludeChange(config, added=False, backup=None)
        backup = target.with_name(target.name + BACKUP_SUFFIX)
        shutil.copy2(target, backup)
        mode = target.stat().st_mode & 0o777
        _write_atomic(target, f"{_MARK}\n{line}\n\n{original}", mode)
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(
            f"Cannot add the Include line to {config}: {error}",
            hint=f"Add it yourself at the top of {config}: {line}",
        ) from None
    return IncludeChange(config, added=True, backup=backup)
