"""The emulator's state on disk: one JSON file, locked while used, replaced atomically.

Every request reads the file under an exclusive lock and writes it back if it changed,
so the cloud's state outlives the emulator process (a controller killed with SIGKILL
leaves its node behind, exactly as the real cloud would) and two emulators started on
the same directory (a served one and `tpulab list --emulate`) agree on what exists.
"""

from __future__ import annotations

import fcntl
import json
import marshal
import os
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpulab import errors as E

__all__ = ["EmulatorStateError", "StateFile", "read_settings_file"]

_VERSION = 1


def _empty() -> dict[str, Any]:
    return {"version": _VERSION, "nodes": {}, "operations": {}, "next_id": 1}


@dataclass(frozen=True)
class _Known:
    """The state file's bytes as this process last read or wrote them, and that state:
    `pristine`, never handed out, to tell whether a transaction changed anything, and
    `frozen`, from which each transaction gets its own copy (marshal, ~0.7 ms at 120
    nodes, against ~2 ms to parse the JSON again)."""

    raw: bytes | None
    pristine: dict[str, Any]
    frozen: bytes

    @classmethod
    def of(cls, raw: bytes | None, state: dict[str, Any]) -> _Known:
        return cls(raw, state, marshal.dumps(state))

    def copy(self) -> dict[str, Any]:
        # Bytes this process made from its own state a moment ago, never read from disk.
        return marshal.loads(self.frozen)  # type: ignore[no-any-return]  # noqa: S302


class EmulatorStateError(E.ConfigError):
    """The state directory cannot be used: not a directory, or `state.json` unreadable.

    Retrying never helps (the ticker used to log this 20 times a second), so whoever
    meets it stops and shows the message, which names the file and what to do."""


_JSON_KINDS = {list: "array", str: "string", int: "number", float: "number", bool: "boolean"}
_JSON_KINDS[type(None)] = "null"


def read_settings_file(path: Path, what: str, *, hint: str) -> dict[str, Any] | None:
    """A JSON object a user or a test put in the state directory beside state.json
    (faults.json, timing.json, image.json), or None when there is none. Anything else
    there (not a file, unreadable, not JSON, not an object) is an EmulatorStateError
    that names the file, says what is wrong, and gives `hint`: each such file changes
    how the emulated cloud behaves, so a damaged one must stop the emulator rather than
    be ignored or end in a traceback."""
    if not path.exists() and not path.is_symlink():
        return None
    try:
        text = path.read_text(encoding="utf-8")
        values = json.loads(text)
    except OSError as error:
        problem = f"cannot be read ({error.strerror or error})"
    except ValueError as error:  # not UTF-8, or not JSON
        problem = f"is not valid JSON ({error})"
    else:
        if isinstance(values, dict):
            return values
        kind = _JSON_KINDS.get(type(values), type(values).__name__)
        problem = f"holds a JSON {kind}, not an object of names and values"
    raise EmulatorStateError(f"The emulator {what} {path} {problem}.", hint=hint)


class StateFile:
    def __init__(self, state_dir: Path, *, on_change: Callable[[], None] | None = None) -> None:
        self.state_dir = state_dir
        # Told after each write this process makes (the emulator wakes its ticker: a
        # changed state may mean SSH hosts to start or stop).
        self._on_change = on_change
        self.path = state_dir / "state.json"
        self._lock_path = state_dir / "state.lock"
        # flock excludes other processes; this excludes our own request threads.
        self._thread_lock = threading.RLock()
        # The file as this process last read or wrote it (see _Known): most transactions
        # find it unchanged, so they skip parsing it and encoding the state to compare.
        self._known: _Known | None = None

    @contextmanager
    def transaction(self) -> Iterator[dict[str, Any]]:
        """Yield the whole state; write it back (atomically) if the body changed it."""
        self.ensure_dir()
        try:
            lock = open(self._lock_path, "a+")  # noqa: SIM115 (the with below closes it)
        except OSError as error:
            raise self._unusable(error, "lock") from None
        with self._thread_lock, lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            changed = False
            try:
                raw = self._read_bytes()
                known = self._known
                if known is None or known.raw != raw:
                    known = _Known.of(raw, _empty() if raw is None else self._parse(raw))
                state = known.copy()
                yield state
                # Equality of the parsed values (C, ~0.3 ms at 120 nodes) rather than of
                # their JSON encodings (~3 ms). It differs only where Python's == does
                # from JSON's text (1 == 1.0 == True): a body that did nothing but swap
                # one of those for another would not be written.
                changed = state != known.pristine
                if changed:
                    text = json.dumps(state, sort_keys=True, indent=1)
                    self._write_text(text)
                    raw = text.encode("utf-8")
                    # What the file now says, parsed back: the yielded state may still
                    # be held (and hold non-JSON types such as tuples) by the caller.
                    known = _Known.of(raw, json.loads(text))
                self._known = known
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
        if changed and self._on_change is not None:
            self._on_change()

    def ensure_dir(self) -> None:
        """Create the state directory, or say plainly why it cannot be one."""
        if self.state_dir.exists() and not self.state_dir.is_dir():
            raise EmulatorStateError(
                f"The emulator state path {self.state_dir} is a file, not a directory.",
                hint="Pass --state a directory (it is created if missing), or move the file.",
            )
        try:
            self.state_dir.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise EmulatorStateError(
                f"Cannot create the emulator state directory {self.state_dir}: "
                f"{error.strerror or error}.",
                hint="Pass --state a directory you can write to.",
            ) from None

    def _afresh(self) -> str:
        return (
            f"Move {self.path} aside (or delete it) to start with an empty emulated cloud; "
            "the nodes it recorded are then forgotten."
        )

    def _parse(self, raw: bytes) -> dict[str, Any]:
        afresh = self._afresh()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise EmulatorStateError(
                f"The emulator state file {self.path} is not valid JSON ({error}).", hint=afresh
            ) from None
        if not text.strip():
            # Never written so by us (every write replaces the file whole): damage, such
            # as a crash before the file's blocks reached the disk. Not a fresh cloud:
            # starting afresh would forget, silently, every node it recorded.
            raise EmulatorStateError(f"The emulator state file {self.path} is empty.", hint=afresh)
        try:
            state = json.loads(text)
        except ValueError as error:
            raise EmulatorStateError(
                f"The emulator state file {self.path} is not valid JSON ({error}).",
                hint=afresh,
            ) from None
        if not isinstance(state, dict) or not all(
            isinstance(state.get(k), dict) for k in ("nodes", "operations")
        ):
            raise EmulatorStateError(
                f"The emulator state file {self.path} is not an emulator state "
                "(no 'nodes' and 'operations' maps).",
                hint=afresh,
            )
        if state.get("version") != _VERSION:
            raise EmulatorStateError(
                f"The emulator state file {self.path} has version {state.get('version')!r}; "
                f"this tpulab reads version {_VERSION}.",
                hint=afresh,
            )
        return state

    def read(self) -> dict[str, Any]:
        with self.transaction() as state:
            return json.loads(json.dumps(state))  # type: ignore[no-any-return]

    def _unusable(self, error: OSError, action: str) -> EmulatorStateError:
        # An OSError here is about the state directory; left as it is, the CLI would
        # blame the port it was about to listen on.
        return EmulatorStateError(
            f"Cannot {action} the emulator state in {self.state_dir}: {error.strerror or error}.",
            hint="Pass --state a directory you can read and write.",
        )

    def _read_bytes(self) -> bytes | None:
        """The file's bytes, or None when there is no state file yet (a fresh cloud)."""
        try:
            return self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as error:  # e.g. state.json is a directory
            raise self._unusable(error, "read") from None

    def _write_text(self, text: str) -> None:
        try:
            self._replace_file(text)
        except OSError as error:
            raise self._unusable(error, "write") from None

    def _replace_file(self, text: str) -> None:
        fd, tmp = tempfile.mkstemp(prefix=".state-", suffix=".json", dir=self.state_dir)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
