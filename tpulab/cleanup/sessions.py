"""The sessions kept by `tpulab up`, on disk under the state directory.

    <state dir>/sessions/<name>/session.json   the SessionState (tpulab.run.session)
    <state dir>/sessions/<name>/key            the session's private SSH key, 0600

A session.json that does not parse (empty, truncated, not an object, a field missing or
of the wrong type) is set aside -- its directory moved to `sessions/.damaged/<name>-<UTC
time>/`, never deleted -- and named in a warning; the other sessions are unaffected, and
its node (if any) is left to `tpulab teardown --verify`, which finds it by its journal
row and labels.

The key is written with O_EXCL and mode 0600 (never through an existing file) and goes
away with the session: `remove` deletes both, which `tpulab down` calls once the node
is confirmed gone. `resolve(None)` is the one session when exactly one is up.

When a session's node is found gone (it deleted itself at --ttl or --idle, or someone
deleted it), `conclude_gone` is the one place that draws the consequences -- key and
state removed, journal row closed -- for `list`, `ssh`, `exec`, `down` and `teardown`
alike. `why_gone` says why from the session's own times; `ask_gone` asks the API
(GetNode, or Compute's instances.get for an instance) first, for commands that only
know that the node stopped answering. A session's provider (SessionState.provider) says
which API its node lives behind.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from tpulab import catalog, paths
from tpulab.cleanup.journal import SESSION_PHASE, VANISHED, Journal
from tpulab.config.sessions import SESSION_NAME, check_session_name
from tpulab.errors import (
    ConfigError,
    JournalError,
    NodeVanishedError,
    StateFileError,
    UnknownAcceleratorError,
    target_for,
)
from tpulab.run.lease import node_gone
from tpulab.run.session_state import SessionState

if TYPE_CHECKING:
    from tpulab.cloud.api import TpuApi

__all__ = [
    "SESSION_PHASE",
    "DamagedSession",
    "GoneCause",
    "SessionConcluded",
    "SessionFiles",
    "SessionStore",
    "Vanish",
    "ask_gone",
    "check_session_name",
    "conclude_gone",
    "estimated_cost",
    "reconcile_listed",
    "why_gone",
]


@dataclass(frozen=True)
class SessionFiles:
    state: SessionState
    key_path: Path


# Where damaged sessions' directories go (under the store's root): a dot name is never
# a session's (check_session_name), so `names()` does not see them.
DAMAGED_DIR = ".damaged"


@dataclass(frozen=True)
class DamagedSession:
    """A session whose session.json could not be parsed; its directory (state and key)
    was set aside, not deleted, so the others are listed and its node is left to
    `tpulab teardown --verify` (the journal row names it)."""

    name: str
    path: Path  # the damaged session.json where it was found
    why: str
    moved_to: Path | None  # where its directory went; None: it could not be moved

    @property
    def message(self) -> str:
        where = (
            f"set aside as {self.moved_to}"
            if self.moved_to is not None
            else "not set aside (it could not be moved, or another command moved it)"
        )
        return (
            f"session {self.name}'s state file {self.path} is damaged: {self.why}; {where}; "
            "its node, if any, is still found by `tpulab teardown --verify`."
        )

    def error(self) -> StateFileError:
        return StateFileError(
            self.message[0].upper() + self.message[1:],
            hint="`tpulab teardown --verify` lists its node, if it still exists, and deletes "
            "it; other sessions are unaffected.",
        )


class SessionStore:
    """The sessions on disk. Reading is defensive: a session.json that does not parse
    is set aside (`damaged` says which and why, for the command to warn about) and never
    hides the others."""

    def __init__(self, root: Path | None = None, *, clock: Callable[[], float] = time.time) -> None:
        self.root = root if root is not None else paths.state_dir() / "sessions"
        self.damaged: list[DamagedSession] = []
        self._clock = clock

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
                hint="Free space on its disk, or check that the tpulab state directory is "
                "writable (TPULAB_HOME).",
            ) from None
        return key

    def save(self, state: SessionState) -> None:
        """Write the session's state (atomically); StateFileError (exit 8) when the disk
        refuses it, which `up` answers by deleting the node it could not record."""
        path = self._dir(state.name) / "session.json"
        temporary = path.with_suffix(".tmp")
        try:
            temporary.write_text(state.to_json(), encoding="utf-8")
            temporary.replace(path)
        except OSError as error:
            temporary.unlink(missing_ok=True)
            raise StateFileError(
                f"Cannot write session {state.name}'s state {path}: {error.strerror or error}.",
                hint="Free space on that disk, or make the tpulab state directory "
                "writable (TPULAB_HOME), then run `tpulab up` again.",
            ) from None

    def load(self, name: str) -> SessionFiles:
        """The named session; StateFileError (exit 8) if its state is damaged (then set
        aside, and in `damaged`)."""
        directory = self._dir(name)
        if not (directory / "session.json").is_file():
            raise ConfigError(
                f"There is no session named {name!r}.",
                hint=self._known_hint(name),
            )
        found = self._read(name)
        if isinstance(found, DamagedSession):
            raise found.error()
        return found

    def _parse(self, name: str) -> SessionFiles:
        """The session's files, or ValueError saying why its state is not a session's."""
        directory = self._dir(name)
        try:
            raw = (directory / "session.json").read_bytes()
        except OSError as error:
            raise ValueError(f"it cannot be read ({error.strerror or error})") from None
        state = SessionState.from_json(raw)
        if state.name != name:
            raise ValueError(f"it names another session ({state.name!r})")
        try:
            state.watchdog_config()
        except TypeError:
            raise ValueError("its watchdog settings are incomplete") from None
        return SessionFiles(state, directory / "key")

    def _read(self, name: str, *, set_aside: bool = True) -> SessionFiles | DamagedSession:
        try:
            return self._parse(name)
        except ValueError as error:
            if set_aside:
                return self._set_aside(name, str(error))
            return DamagedSession(name, self._dir(name) / "session.json", str(error), None)

    def _set_aside(self, name: str, why: str) -> DamagedSession:
        """Move the damaged session's directory (state and key) under DAMAGED_DIR, named
        by the moment, and remember it in `damaged`."""
        directory = self._dir(name)
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(self._clock()))
        target = self.root / DAMAGED_DIR / f"{name}-{stamp}"
        moved_to: Path | None = target
        try:
            target.parent.mkdir(mode=0o700, exist_ok=True)
            directory.rename(target)
        except OSError:
            # Unwritable, or another command set it aside first: it is not up either way.
            moved_to = None
        damaged = DamagedSession(name, directory / "session.json", why, moved_to)
        self.damaged.append(damaged)
        return damaged

    def names(self) -> list[str]:
        """The sessions with a state file (readable or not)."""
        if not self.root.is_dir():
            return []
        found = (p.parent.name for p in self.root.glob("*/session.json"))
        return sorted(name for name in found if SESSION_NAME.fullmatch(name))

    def all(self) -> list[SessionFiles]:
        """Every readable session; the damaged ones are set aside (see `damaged`)."""
        found = (self._read(name) for name in self.names())
        return [files for files in found if isinstance(files, SessionFiles)]

    def by_run_id(self) -> dict[str, SessionState]:
        """The readable sessions' states by run id, for commands that meet their journal
        rows (teardown, costs); one whose state cannot be read is left out and left in
        place (its node is then treated like any run's; `list`, `ssh`, `exec` and `down`
        set it aside and say so)."""
        found: dict[str, SessionState] = {}
        for name in self.names():
            files = self._read(name, set_aside=False)
            if isinstance(files, SessionFiles):
                found[files.state.run_id] = files.state
        return found

    def resolve(self, name: str | None) -> SessionFiles:
        """The named session, or the only one up when `name` is None (the damaged ones
        set aside first: they are not up as far as tpulab can tell)."""
        if name is not None:
            return self.load(name)
        readable = self.all()
        names = [files.state.name for files in readable]
        if len(names) == 1:
            return readable[0]
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

    def _known_hint(self, name: str | None = None) -> str:
        # `_set_aside` names them NAME-<UTC time>: "lab-*" would also match "lab-2"'s.
        stamped = re.compile(re.escape(name or "") + r"-\d{8}T\d{6}Z")
        damaged = self.root / DAMAGED_DIR
        set_aside = (
            sorted(p for p in damaged.glob(f"{name}-*") if stamped.fullmatch(p.name))
            if name
            else []
        )
        if set_aside:
            # `list` or another command found its state damaged and moved it: its node
            # is not ended by `down` any more, but by the sweep that finds it by label.
            return (
                f"Its state was damaged and set aside as {set_aside[-1]}; its node, if it "
                "still exists, is deleted by `tpulab teardown --verify`."
            )
        names = self.names()
        if names:
            return f"Sessions up: {', '.join(names)} (see `tpulab list`)."
        return "No session is up; start one with `tpulab up --accelerator TYPE`."


# Why a session's node went: its hard deadline (--ttl) passed, its idle lease (--idle)
# lapsed, or neither had (so someone else deleted it).
GoneCause = Literal["ttl", "idle", "deleted"]


def _duration(seconds: float) -> str:
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g} h"
    if seconds >= 60:
        return f"{seconds / 60:.3g} min"
    return f"{seconds:.3g} s"


@dataclass(frozen=True)
class Vanish:
    """Why a session's node is gone, as far as the session's own times tell."""

    cause: GoneCause
    reason: str  # e.g. "deleted itself: idle for 30 min (--idle)"
    # The earliest the node can have gone (its deadline or idle expiry), epoch seconds;
    # None when someone else deleted it (then only "when it was seen gone" is known).
    since: float | None


def why_gone(state: SessionState, *, now: float) -> Vanish:
    """Classify a gone node by the session's deadline and idle expiry (wall clock): of
    the two that have passed, the earlier is what deleted it (its watchdog acts on the
    first); neither passed means someone else deleted it. The watchdog counts the
    deadline from boot, a little after `deadline_at`'s start, and acts on its next
    poll, so a node found gone after either moment went by it."""
    lifetime = _duration(state.deadline_at - state.started_at)
    ttl = Vanish(
        "ttl", f"deleted itself: its hard deadline passed (--ttl {lifetime})", state.deadline_at
    )
    idle = Vanish(
        "idle",
        f"deleted itself: idle for {_duration(state.idle_seconds)} (--idle)",
        state.idle_expires_at,
    )
    passed = [v for v in (ttl, idle) if v.since is not None and now >= v.since]
    if passed:
        return min(passed, key=lambda v: v.since or 0.0)
    return Vanish(
        "deleted",
        "was deleted by someone else: neither its --ttl nor its --idle had passed",
        None,
    )


def ask_gone(
    api: TpuApi, state: SessionState, *, now: Callable[[], float] = time.time
) -> Vanish | None:
    """Ask the API (GetNode) whether the session's node is gone or being deleted, and
    why; None when it is still there or the API could not say (conclude nothing)."""
    if node_gone(api, state.zone, state.node_name) is None:
        return None
    return why_gone(state, now=now())


@dataclass(frozen=True)
class SessionConcluded:
    """What `conclude_gone` found and did."""

    name: str
    node_name: str
    zone: str
    run_id: str
    vanish: Vanish
    journal_closed: bool  # False: the row was already closed, or the journal failed
    warnings: tuple[str, ...] = ()

    @property
    def message(self) -> str:
        """One sentence for the user, e.g. for `tpulab list`'s stderr."""
        return (
            f"session {self.name}'s node {self.node_name} {self.vanish.reason}; "
            "its key and state are removed."
        )

    def error(self) -> NodeVanishedError:
        """The same, as the error `ssh` and `exec` exit with (EXIT_REMOTE)."""
        return NodeVanishedError(
            f"Session {self.name}'s node {self.node_name} in {self.zone} is gone: it "
            f"{self.vanish.reason}. Its key and state are removed.",
            hint="Start a new one with `tpulab up`; a longer --ttl or --idle keeps it longer.",
        )


def conclude_gone(
    store: SessionStore,
    state: SessionState,
    vanish: Vanish,
    *,
    seen_by: str,
    journal: Journal | None = None,
    now: Callable[[], float] = time.time,
) -> SessionConcluded:
    """The session's node is gone (the caller has seen it: a listing of its zone, or
    GetNode): remove its key and state and close its journal row as vanished and
    confirmed, billed to the earliest moment it can have gone (`vanish.since`).

    Idempotent: a row some other command closed already is left as it is. The journal
    failing only warns -- the node is gone, so the key must go regardless."""
    journal = journal or Journal()
    warnings: list[str] = []
    closed = False
    detail = f"{VANISHED}: session {state.name}'s node {vanish.reason} ({seen_by})"
    until = min(vanish.since, now()) if vanish.since is not None else now()
    try:
        row = journal.get(state.run_id)
        if row is not None and row.needs_teardown:
            journal.close_run(
                state.run_id,
                "confirmed",
                detail,
                ended=datetime.fromtimestamp(max(until, row.started.timestamp()), timezone.utc),
            )
            closed = True
    except JournalError as error:
        warnings.append(error.message)
    store.remove(state.name)
    return SessionConcluded(
        state.name, state.node_name, state.zone, state.run_id, vanish, closed, tuple(warnings)
    )


def reconcile_listed(
    store: SessionStore,
    *,
    target: str,
    project: str,
    zones: Collection[str],
    listed: Collection[tuple[str, str]],
    seen_by: str,
    providers: Collection[str] = ("tpu-api",),
    journal: Journal | None = None,
    now: Callable[[], float] = time.time,
) -> tuple[list[SessionFiles], list[SessionConcluded]]:
    """Sessions next to a listing of `zones` of `project` behind `target` (the journal's
    name of the API, `target_for`) by `providers` (those that answered): the ones still
    up, and the ones whose node the listing covers but does not show (`listed` holds
    (zone, node name)), concluded gone. Sessions the listing does not cover -- another
    target, zone, or a provider that was not asked -- are returned as up: nothing is
    known of them."""
    up: list[SessionFiles] = []
    concluded: list[SessionConcluded] = []
    for files in store.all():
        state = files.state
        covered = (
            target_for(state.api_endpoint) == target
            and state.project == project
            and state.zone in zones
            and state.provider in providers
        )
        if covered and (state.zone, state.node_name) not in listed:
            vanish = why_gone(state, now=now())
            concluded.append(
                conclude_gone(store, state, vanish, seen_by=seen_by, journal=journal, now=now)
            )
        else:
            up.append(files)
    return up, concluded


def estimated_cost(state: SessionState, *, now: float) -> float | None:
    """What the session's node has cost so far at list prices (`catalog.PRICE_DATE`),
    spot-aware, from when its create was sent; None for a type not in the catalog. An
    emulated session's figure is what Google would bill for it, as `list` says of nodes."""
    try:
        accelerator = catalog.lookup(state.accelerator_type)
    except UnknownAcceleratorError:
        return None
    return accelerator.estimated_cost(max(0.0, now - state.started_at), spot=state.spot)
