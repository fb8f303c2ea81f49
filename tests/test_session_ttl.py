"""`tpulab up --ttl/--idle`'s lower bounds, and a session whose --ttl passed during `up`
(issue 20, defect 9): `up --ttl 10s` used to exit 0 saying "deletes itself in -0 min"
while its node was about to delete itself."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from helpers import served_emulator, tpulab

from tpulab.config.sessions import session_times
from tpulab.config.watchdog import BOOT_GRACE_MARGIN_SECONDS
from tpulab.emulator import Emulator
from tpulab.errors import ConfigError, NodeVanishedError
from tpulab.run.session import abandon, bring_up

if TYPE_CHECKING:
    from run_rig import Rig

pytest_plugins = ["emulator_fixtures", "run_rig"]

PROJECT = "ttl-proj"
ZONE = "us-central1-a"

EXIT_CONFIG = 2


@pytest.mark.parametrize(
    ("ttl", "idle", "says"),
    [
        ("10s", None, "--ttl '10s' is too short: the minimum is 3m."),
        ("179s", None, "is too short"),
        ("25h", None, "--ttl '25h' is too long: the maximum is 1d."),
        ("1h", "10s", "--idle '10s' is too short: the minimum is 30s."),
        ("3m", "4m", r"the maximum is 3m \(the --ttl\)"),
    ],
)
def test_a_ttl_or_idle_too_short_to_use_is_refused(ttl: str, idle: str | None, says: str) -> None:
    with pytest.raises(ConfigError, match=says) as caught:
        session_times(ttl, idle)
    assert caught.value.hint is not None
    assert "between" in caught.value.hint


def test_the_shortest_accepted_session_is_3_min_with_30_s_idle() -> None:
    times = session_times("3m", "30s")
    assert (times.ttl_seconds, times.idle_seconds) == (180.0, 30.0)
    # No --idle: the default lease, never longer than the session.
    assert session_times("3m", None).idle_seconds == 180.0


def test_up_times_become_the_watchdog_without_a_second_parse() -> None:
    # --ttl and --idle are the session's watchdog group: its deadline and lease as given,
    # the boot grace as a run's (the controller's boot waits plus the margin).
    settings = session_times("10h", "8h").resolve(boot_wait_seconds=300.0)
    assert settings.max_duration_seconds == 36000.0
    assert settings.lease_seconds == 28800.0
    assert settings.boot_grace_seconds == 300.0 + BOOT_GRACE_MARGIN_SECONDS


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Emulator]:
    with served_emulator(tmp_path / "emulator") as emulator:
        yield emulator


@pytest.mark.parametrize("flags", [("--ttl", "10s"), ("--idle", "10s")])
def test_up_with_a_ttl_or_idle_too_short_exits_2_before_any_api_call(
    served: Emulator, flags: tuple[str, ...]
) -> None:
    done = tpulab(
        "up", "--accelerator", "v5litepod-4", "--api-endpoint", served.url,
        "--project", PROJECT, "--zone", ZONE, *flags, timeout=60,
    )  # fmt: skip
    assert done.returncode == EXIT_CONFIG, done.stderr + done.stdout
    assert "the minimum is" in done.stderr
    assert served.requests() == []


def test_a_session_whose_ttl_passed_during_up_is_not_kept(embedded_rig: Rig) -> None:
    spec = embedded_rig.spec()
    assert spec.watchdog is not None
    # What `up --ttl 3m --idle 30s` asks of the watchdog.
    watchdog = dataclasses.replace(spec.watchdog, lease_seconds=30.0, max_duration_seconds=180.0)
    spec = dataclasses.replace(spec, watchdog=watchdog)
    life, _ = embedded_rig.kept_run(spec)
    # `up` took longer than the --ttl: the clock reads the create's moment, then past it.
    readings = iter([1000.0])

    def clock() -> float:
        return next(readings, 1000.0 + 181.0)

    with pytest.raises(NodeVanishedError, match=r"--ttl \(180 s\) passed while `up`"):
        bring_up(life, session_name="late", now=clock)
    # The node was handed over but is not a session: the caller deletes it (as `up` does).
    assert life.outcome.kept
    assert embedded_rig.leftovers() != []
    abandon(life)
    assert embedded_rig.leftovers() == []
