"""`tpulab up`'s own flags (--ttl, --idle, the session's name), validated before any
API call; the rest of its flags are `run`'s (config.commands.run_inputs).

--ttl is the watchdog's hard deadline (default 2 h, at most 24 h: a kept TPU that
outlives a day is a forgotten one); --idle is its lease (default 30 min), renewed by
every `tpulab ssh`/`exec`, so a session left alone deletes itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tpulab.config.resolve import given, out_of_range, parse_duration
from tpulab.config.watchdog import BOOT_GRACE_MARGIN_SECONDS, WatchdogSettings
from tpulab.errors import ConfigError

__all__ = [
    "DEFAULT_IDLE",
    "DEFAULT_TTL",
    "MAX_TTL_SECONDS",
    "SESSION_NAME",
    "SessionTimes",
    "check_session_name",
    "session_name_flag",
    "session_times",
]

DEFAULT_TTL = "2h"
DEFAULT_IDLE = "30m"
MAX_TTL_SECONDS = 24 * 3600.0
# The shortest --ttl: the deadline counts from the create, and `up` itself (create, boot,
# bootstrap, verify) takes 13-30 s on the emulator, up to ~45 s on a loaded machine, and
# minutes on a real TPU. Below 3 min a session would be gone before, or just after, it
# is first used; `up` still refuses to call a session whose deadline passed during it
# a success (run.session.bring_up).
MIN_TTL_SECONDS = 180.0
# The shortest --idle: nothing renews the lease between two commands, and the gap from
# one exec's exit to the next one's renewal (GetNode, SSH login, renewer start) took
# over 15 s on a loaded machine (CI, 2026-12-01). Below 30 s even a script's
# `up && exec && exec` could lose its node between two commands.
MIN_IDLE_SECONDS = 30.0
SESSION_NAME = re.compile(r"[a-z][a-z0-9-]{0,30}")


def check_session_name(name: str) -> str:
    if not SESSION_NAME.fullmatch(name):
        raise ConfigError(
            f"Session name {name!r} is not valid.",
            hint="Use lower-case letters, digits and '-', starting with a letter, at most "
            "31 characters (e.g. lesson-3).",
        )
    return name


def session_name_flag(name: str | None) -> str | None:
    """`up --name`, checked before anything else: None when it was left out (the name is
    then s-<run id>); `--name ''` is refused, never read as "left out"."""
    if name is None:
        return None
    given(name, "--name", hint="Pass a session name (e.g. lesson-3), or leave --name out.")
    return check_session_name(name)


@dataclass(frozen=True)
class SessionTimes:
    """`up`'s validated --ttl and --idle: its watchdog group (tpulab.config.watchdog), the
    hard deadline and the idle lease, in seconds -- parsed once, here."""

    ttl_seconds: float
    idle_seconds: float

    def resolve(self, *, boot_wait_seconds: float) -> WatchdogSettings:
        return WatchdogSettings(
            lease_seconds=self.idle_seconds,
            boot_grace_seconds=boot_wait_seconds + BOOT_GRACE_MARGIN_SECONDS,
            max_duration_seconds=self.ttl_seconds,
        )


def session_times(ttl: str | None, idle: str | None) -> SessionTimes:
    ttl_seconds = parse_duration("--ttl", ttl or DEFAULT_TTL)
    if not MIN_TTL_SECONDS <= ttl_seconds <= MAX_TTL_SECONDS:
        raise ConfigError(
            out_of_range(
                "--ttl", ttl or DEFAULT_TTL, ttl_seconds, MIN_TTL_SECONDS, MAX_TTL_SECONDS
            ),
            hint="Pass --ttl between 3m and 24h (default 2h): `up` itself takes from 30 s "
            "(emulator) to several minutes (a real TPU); start a new session after it.",
        )
    # A --ttl shorter than the default idle lease makes the lease the whole session.
    idle_seconds = (
        min(parse_duration("--idle", DEFAULT_IDLE), ttl_seconds)
        if idle is None
        else parse_duration("--idle", idle)
    )
    if not MIN_IDLE_SECONDS <= idle_seconds <= ttl_seconds:
        raise ConfigError(
            out_of_range(
                "--idle",
                idle or DEFAULT_IDLE,
                idle_seconds,
                MIN_IDLE_SECONDS,
                ttl_seconds,
                high_is="the --ttl",
            ),
            hint="Pass --idle between 30s (the gap between two commands) and the --ttl "
            "(default 30m).",
        )
    return SessionTimes(ttl_seconds, idle_seconds)
