"""The sessions kept by `tpulab up`, on disk under the state directory.

    <state dir>/sessions/<name>/session.json   the SessionState (tpulab.run.session)
    <state dir>/sessions/<name>/key            the session's private SSH key, 0600

The key is written with O_EXCL and mode 0600 (never through an existing file) and goes
away with the session: `remove` deletes both, which `tpulab down` calls once the node
is confirmed gone. `resolve(None)` is the one session when exactly one is up.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from tpulab import paths
from tpulab.config.sessions import check_session_name
from tpulab.errors import ConfigError, JournalError
from tpulab.run.session import SessionState

__all__ = ["SESSION_PHASE", "SessionFiles", "SessionStore", "check_session_name"]

# The journal's phase of a run whose node was kept by `tpulab up`.
SESSION_PHASE = "session"


@dataclass(frozen=True)
class SessionFiles:
    state: SessionState
    key_path: Path


class SessionStore:
    def __init__(self, root: Path | None = None) -> None:
        self.root = root if root is not None else paths.state_dir() / "sessions"

    def _dir(self, name: str) -> Path:
        return self.root / check_session_name(name)

    def exists(self, name: str) -> bool:
        return (self._dir(name) / "session.json").is_file()

    def reserve(self, name: str, private_key: bytes) -> Path:
        """Create the session's directory and its 0600 key file before the node exists,
        so a name already in use is refused before anything is created."""
        directory = self._dir(name)
        if directory.exists():
            raise ConfigError(
                f"A session named {name!r} already exists.",
                hint=f"Use it, pick another --name, or end it with `tpulab down {name}`.",
            )
        try:
            self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
            directory.mkdir(mode=0o700)
            key = directory / "key"
            fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as handle:
                handle.write(private_key)
        except OSError as error:
            raise JournalError(
                f"Cannot write the session's key under {directory}: {error}",
                hint="Check that the tpulab state directory is writable (TPULAB_HOME).",
            ) from None
        return key

    def save(self, state: SessionState) -> None:
        path = self._dir(state.name) / "session.json"
        temporary = path.with_suffix(".tmp")
        temporary.write_text(state.to_json(), encoding="utf-8")
        temporary.replace(path)

    def load(self, name: str) -> SessionFiles:
        directory = self._dir(name)
        path = directory / "session.json"
        if not path.is_file():
            raise ConfigError(
                f"There is no session named {name!r}.",
                hint=self._known_hint(),
            )
        return SessionFiles(SessionState.from_json(path.read_text("utf-8")), directory / "key")

    def names(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.parent.name for p in self.root.glob("*/session.json"))

    def all(self) -> list[SessionFiles]:
        return [self.load(name) for name in self.names()]

    def resolve(self, name: str | None) -> SessionFiles:
        """The named session, or the only one up when `name` is None."""
        if name is not None:
            return self.load(name)
        names = self.names()
        if len(names) == 1:
            return self.load(names[0])
        if not names:
            raise ConfigError(
                "No session is up.", hint="Start one with `tpulab up --accelerator TYPE`."
            )
        raise ConfigError(
            f"{len(names)} sessions are up ({', '.join(names)}): say which.",
            hint="Pass the session's name, e.g. `tpulab ssh " + names[0] + "`.",
        )

    def remove(self, name: str) -> None:
        """Forget the session: its state and its private key."""
        shutil.rmtree(self._dir(name), ignore_errors=True)

    def _known_hint(self) -> str:
        names = self.names()
        if names:
            return f"Sessions up: {', '.join(names)} (see `tpulab list`)."
        return "No session is up; start one with `tpulab up --accelerator TYPE`."
