"""The flag groups (tpulab/config/groups.py): each validates its own flags, `run`, `up` and
`exec` declare the same defaults, and `--help` panels them by the same groups."""

from __future__ import annotations

import dataclasses

import pytest

from tpulab.cli._panels import PANELS
from tpulab.cli._reference import walk
from tpulab.cli.exec import exec_timeouts
from tpulab.config import (
    CapacityFlags,
    PythonFlags,
    TargetFlags,
    TimeoutFlags,
    Timeouts,
    WorkloadFlags,
    build_run_spec,
)
from tpulab.config.groups import option_name, option_names
from tpulab.config.watchdog import WatchdogRequest
from tpulab.errors import ConfigError

GROUP_OF_PANEL: dict[str, type] = {
    "Where": TargetFlags,
    "Capacity": CapacityFlags,
    "Your command (after --)": WorkloadFlags,
    "The VM's Python": PythonFlags,
    "Timeouts": TimeoutFlags,
    "Watchdog": WatchdogRequest,
}
GROUPS_OF_COMMAND: dict[str, tuple[type, ...]] = {
    "run": (TargetFlags, CapacityFlags, TimeoutFlags, PythonFlags, WorkloadFlags, WatchdogRequest),
    "up": (TargetFlags, CapacityFlags, TimeoutFlags, PythonFlags),
    "exec": (PythonFlags, WorkloadFlags),
}
# Fields no option's default can equal: the library's single zone (the CLI's --zone is
# `zones`), and --no-watchdog, which is `enabled` inverted.
NOT_A_DEFAULT = {"zone", "enabled"}


@pytest.mark.parametrize(("panel", "group"), GROUP_OF_PANEL.items())
def test_each_help_panel_is_one_flag_group(panel: str, group: type) -> None:
    assert sorted(PANELS[panel]) == sorted(option_names(group))


@pytest.mark.parametrize("command", GROUPS_OF_COMMAND)
def test_run_up_and_exec_declare_the_groups_defaults(command: str) -> None:
    params = next(entry.command.params for entry in walk() if entry.path == f"tpulab {command}")
    by_option = {opt: param for param in params for opt in param.opts}
    compared = 0
    for group in GROUPS_OF_COMMAND[command]:
        for field in dataclasses.fields(group):
            option = option_name(field.name)
            if field.name in NOT_A_DEFAULT or option not in by_option:
                continue
            param = by_option[option]
            # typer's default for a repeatable option is None; the group's is ().
            default = () if param.multiple and param.default is None else param.default
            assert (option, default) == (option, field.default)
            compared += 1
    # Every option of the command's groups was compared (none skipped by a renaming).
    assert compared == {"run": 41, "up": 19, "exec": 14}[command]


def test_exec_differs_from_runs_timeouts_only_in_the_boot_wait() -> None:
    # The node has been up since `up`: exec waits a minute for sshd, not a boot's three.
    assert exec_timeouts().boot < TimeoutFlags.boot
    assert dataclasses.replace(exec_timeouts(), boot=TimeoutFlags.boot) == TimeoutFlags()


def test_the_timeout_flags_defaults_are_the_runs_deadlines() -> None:
    assert TimeoutFlags().resolve() == Timeouts()


@pytest.mark.parametrize(
    ("field", "option"),
    [
        ("payload", "--payload-timeout"),
        ("teardown", "--teardown-timeout"),
        ("boot", "--boot-timeout"),
        ("bootstrap", "--bootstrap-timeout"),
    ],
)
@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), 86401.0])
def test_each_timeout_flag_is_refused_by_its_own_name(field: str, option: str, bad: float) -> None:
    flags = TimeoutFlags(**{field: bad})
    with pytest.raises(ConfigError, match=f"Invalid {option} "):
        flags.resolve()


def test_capacity_parses_each_duration_once_into_seconds() -> None:
    capacity, window = CapacityFlags(retry_until_up=True, retry_for="1m30s").resolve(
        accelerator="v5litepod-4", provider="tpu-api", zones=["us-west4-a"], source="--zone"
    )
    assert (capacity.retry_for, window) == (90.0, None)
    _, window = CapacityFlags(queued=True, valid_for="1.5s").resolve(
        accelerator="v5litepod-4", provider="tpu-api", zones=[], source="--zone"
    )
    assert window == 2  # whole seconds, rounded up: validUntilDuration's unit


def test_queued_needs_the_cloud_tpu_api() -> None:
    target = TargetFlags(accelerator="v6e-4", provider="compute", image="x", emulate=True)
    with pytest.raises(ConfigError, match="the Compute provider has none"):
        build_run_spec(target=target, capacity=CapacityFlags(queued=True), env={})
    assert build_run_spec(target=target, env={}).provider == "compute"


def test_the_zone_is_given_once() -> None:
    with pytest.raises(ConfigError, match="Pass the zone once"):
        TargetFlags(accelerator="v5litepod-4", zone="us-west4-a", zones=["us-west4-a"]).resolve(
            None
        )


def test_python_flags_check_the_request_and_the_pin() -> None:
    chosen = PythonFlags(python="3.11", jax_version=" 0.6.2 ").resolve(
        emulated=False, defaults=None
    )
    assert (chosen.python, chosen.source, chosen.jax_version) == ("3.11", "--python", "0.6.2")
    with pytest.raises(ConfigError, match="Invalid --jax-version"):
        PythonFlags(jax_version="jax==0.6.2").resolve(emulated=False, defaults=None)
