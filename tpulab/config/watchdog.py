"""The VM's watchdog flags (--lease, --boot-grace, --max-duration, --no-watchdog,
--service-account) validated into `WatchdogSettings`, before anything is created.

Defaults, and why (docs/architecture.md §10; the watchdog itself is remote_payloads/watchdog.py):

- lease 10 min: what a SIGKILLed controller's VM may still bill (a v5litepod-4 is about
  0.80 USD per 10 min at list price) against what a stalled laptop survives (a Wi-Fi
  drop or a suspended lid of a few minutes must not kill a healthy run). The controller
  renews every lease/5 (at most every 10 s), so four lost renewals in a row are harmless.
- boot grace: the run's own --boot-timeout twice (host key, then SSH) plus 2 min. Until
  the controller's first renewal over SSH only the grace stands, and it must outlast the
  longest the controller legitimately waits before it can renew; shorter would delete a
  VM its controller is still connecting to.
- max duration: every phase timeout of the run added up (create, READY, host key, SSH,
  bootstrap, verifier, collect, teardown, and the user's command) plus 10 min. A run
  that is still alive past that is stuck by its own definition, whatever the laptop says.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

from tpulab.config.resolve import format_duration, given, out_of_range, parse_duration
from tpulab.errors import ConfigError

__all__ = [
    "BOOT_GRACE_MARGIN_SECONDS",
    "DEFAULT_LEASE_SECONDS",
    "WatchdogGroup",
    "WatchdogRequest",
    "WatchdogSettings",
    "check_service_account",
    "watchdog_settings",
]

DEFAULT_LEASE_SECONDS = 600.0
BOOT_GRACE_MARGIN_SECONDS = 120.0
MAX_DURATION_MARGIN_SECONDS = 600.0
# A lease must leave room for several renewals (one every lease/5, at least 1 s apart)
# and for the watchdog's own poll; below 10 s a busy SSH channel could let it lapse.
MIN_LEASE_SECONDS = 10.0
MAX_LEASE_SECONDS = 86400.0
MIN_MAX_DURATION_SECONDS = 10.0
MAX_MAX_DURATION_SECONDS = 30 * 86400.0

# Service accounts are e-mail addresses (user-managed: NAME@PROJECT.iam.gserviceaccount.com;
# the default compute one: NUMBER-compute@developer.gserviceaccount.com).
_EMAIL = re.compile(r"^[a-z0-9][a-z0-9._+-]{0,99}@[a-z0-9][a-z0-9.-]{0,200}\.[a-z]{2,}$")


class WatchdogGroup(Protocol):
    """A command's watchdog flags, validated once into the settings a run carries:
    `run`'s (WatchdogRequest) or `up`'s --ttl/--idle (tpulab.config.sessions)."""

    def resolve(self, *, boot_wait_seconds: float) -> WatchdogSettings | None: ...


@dataclass(frozen=True)
class WatchdogRequest:
    """`run`'s raw flags; None means "not given" (the default applies)."""

    enabled: bool = True
    lease: str | None = None
    boot_grace: str | None = None
    max_duration: str | None = None

    def resolve(self, *, boot_wait_seconds: float) -> WatchdogSettings | None:
        return watchdog_settings(self, boot_wait_seconds=boot_wait_seconds)


@dataclass(frozen=True)
class WatchdogSettings:
    """A validated watchdog: the lease, the grace before the first renewal, the hard
    deadline (all seconds, counted on the VM from the watchdog's start at boot)."""

    lease_seconds: float
    boot_grace_seconds: float
    max_duration_seconds: float | None  # None: the run's timeouts added up (`deadline`)

    def deadline(self, run_seconds: float) -> float:
        """The hard deadline: --max-duration, else `run_seconds` (every timeout of the
        run added up, the user's command included) plus 10 min."""
        if self.max_duration_seconds is not None:
            return self.max_duration_seconds
        return run_seconds + MAX_DURATION_MARGIN_SECONDS


def _bounded(option: str, text: str, low: float, high: float) -> float:
    given(text, option, hint=f"Pass {option} as a duration such as 20s, 10m or 1h.")
    seconds = parse_duration(option, text)
    if not low <= seconds <= high:
        raise ConfigError(
            out_of_range(option, text, seconds, low, high),
            hint=f"Use between {format_duration(low)} and {format_duration(high)}.",
        )
    return seconds


def watchdog_settings(
    request: WatchdogRequest, *, boot_wait_seconds: float
) -> WatchdogSettings | None:
    """The watchdog a run carries, or None with --no-watchdog.

    `boot_wait_seconds`: how long the controller may wait after READY before its first
    renewal (host key + SSH timeouts).
    """
    if not request.enabled:
        for option, value in (
            ("--lease", request.lease),
            ("--boot-grace", request.boot_grace),
            ("--max-duration", request.max_duration),
        ):
            if value is not None:
                raise ConfigError(
                    f"{option} has no effect with --no-watchdog.",
                    hint=f"Leave out {option}, or drop --no-watchdog.",
                )
        return None
    lease = (
        DEFAULT_LEASE_SECONDS
        if request.lease is None
        else _bounded("--lease", request.lease, MIN_LEASE_SECONDS, MAX_LEASE_SECONDS)
    )
    grace = (
        boot_wait_seconds + BOOT_GRACE_MARGIN_SECONDS
        if request.boot_grace is None
        else _bounded("--boot-grace", request.boot_grace, MIN_LEASE_SECONDS, MAX_LEASE_SECONDS)
    )
    deadline = (
        None
        if request.max_duration is None
        else _bounded(
            "--max-duration",
            request.max_duration,
            MIN_MAX_DURATION_SECONDS,
            MAX_MAX_DURATION_SECONDS,
        )
    )
    return WatchdogSettings(lease, grace, deadline)


def check_service_account(email: str | None) -> str | None:
    """--service-account, validated; None: the project's default compute account."""
    if given(email, "--service-account", hint="Pass a service account's e-mail address.") is None:
        return None
    assert email is not None
    value = email.strip()
    if not _EMAIL.fullmatch(value):
        raise ConfigError(
            f"--service-account {email!r} is not a service account e-mail address.",
            hint="Pass one like NAME@PROJECT.iam.gserviceaccount.com (see `gcloud iam "
            "service-accounts list`), or leave it out for the default compute account.",
        )
    return value
