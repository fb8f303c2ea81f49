"""One function per command: its raw flag values in, a validated spec out.

The CLI passes what typer parsed, unchanged, and maps ConfigError to exit 2; every check
(conflicts, ranges, URLs, zones, project ids, names, run ids, timeouts) happens here,
before anything is contacted, so a bad value can never create, list or delete anything.

    run_inputs            tpulab run       -> RunInputs (a RunSpec + how to run it)
    list_scope            tpulab list      -> Scope
    teardown_inputs       tpulab teardown  -> TeardownInputs (a Scope + its timeout)
    local_verify_inputs   tpulab verify    -> LocalVerifyInputs
    costs_inputs          tpulab costs     -> CostsInputs
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, time, timedelta, timezone
from pathlib import Path
from typing import Literal

from tpulab import catalog
from tpulab.config.endpoint import Target, choose_target
from tpulab.config.groups import (
    CAPACITY_DEFAULTS,
    PYTHON_DEFAULTS,
    TIMEOUT_DEFAULTS,
    CapacityFlags,
    PythonFlags,
    TargetFlags,
    TimeoutFlags,
)
from tpulab.config.project_file import load_project_file
from tpulab.config.resolve import (
    AdcProject,
    check_seconds,
    find_project,
    given,
    parse_duration,
    project_flag,
    resolve_project,
    resolve_zones,
    zone_flags,
)
from tpulab.config.spec import EMULATED_PROJECT, EMULATED_ZONE, RunSpec, build_run_spec
from tpulab.config.watchdog import WatchdogGroup
from tpulab.config.workload import WorkloadFlags, build_workload, check_workdir
from tpulab.errors import ConfigError
from tpulab.models import PLATFORMS, check_run_id

__all__ = [
    "LOCAL_MAX_DEVICES",
    "CostsInputs",
    "Installer",
    "LocalVerifyInputs",
    "RunInputs",
    "Scope",
    "SshBackend",
    "TeardownInputs",
    "costs_inputs",
    "installer_choice",
    "list_scope",
    "local_verify_inputs",
    "run_inputs",
    "ssh_backend_choice",
    "teardown_inputs",
]

Installer = Literal["uv", "pip"]
SshBackend = Literal["embedded", "openssh"]
LOCAL_MAX_DEVICES = 64


@dataclass(frozen=True)
class RunInputs:
    spec: RunSpec
    installer: Installer
    ssh_backend: SshBackend


def run_inputs(
    *,
    target: TargetFlags,
    capacity: CapacityFlags = CAPACITY_DEFAULTS,
    timeouts: TimeoutFlags = TIMEOUT_DEFAULTS,
    python: PythonFlags = PYTHON_DEFAULTS,
    workload: WorkloadFlags | None = None,
    watchdog: WatchdogGroup | None = None,
    ssh_backend: str = "embedded",
    env: Mapping[str, str] | None = None,
    adc_project: AdcProject | None = None,
    cwd: Path | None = None,
) -> RunInputs:
    """`tpulab run`'s flags, validated. `adc_project` None (a dry run) never asks ADC.

    `workload` holds `-- CMD` and its flags; the workspace (--workdir, default `cwd`, the
    current directory) is where the project file with the run's defaults is looked for,
    with or without a command.
    """
    flags = workload or WorkloadFlags()
    flags.refuse_without_command()
    cwd = Path.cwd() if cwd is None else cwd
    workdir = check_workdir(flags.workdir, cwd)
    defaults = load_project_file(workdir)
    chosen_installer = installer_choice(python.installer)
    chosen_backend = ssh_backend_choice(ssh_backend)
    spec = build_run_spec(
        target=target,
        capacity=capacity,
        timeouts=timeouts,
        python=python,
        watchdog=watchdog,
        env=env,
        adc_project=adc_project,
        defaults=defaults,
    )
    spec = dataclasses.replace(
        spec,
        workload=build_workload(
            flags, run_id=spec.run_id, workdir=workdir, cwd=cwd, defaults=defaults
        ),
    )
    return RunInputs(spec=spec, installer=chosen_installer, ssh_backend=chosen_backend)


def installer_choice(text: str) -> Installer:
    """--installer, typed once: the remote package installer."""
    installers: dict[str, Installer] = {"uv": "uv", "pip": "pip"}
    if text in installers:
        return installers[text]
    raise ConfigError(f"Unknown installer {text!r}.", hint="Use uv or pip.")


def ssh_backend_choice(text: str) -> SshBackend:
    """--ssh-backend, typed once: paramiko in-process, or the system's OpenSSH client."""
    backends: dict[str, SshBackend] = {"embedded": "embedded", "openssh": "openssh"}
    if text in backends:
        return backends[text]
    raise ConfigError(f"Unknown SSH backend {text!r}.", hint="Use embedded or openssh.")


@dataclass(frozen=True)
class Scope:
    """Which API, project and zones a scanning command (list, teardown) looks at."""

    project: str
    zones: list[str]  # teardown may start empty: the journal's open rows add zones
    target: Target
    run_id: str | None = None

    @property
    def emulate(self) -> bool:
        return self.target.emulate

    @property
    def api_endpoint(self) -> str | None:
        return self.target.api_endpoint


def _scope(
    *,
    project: str | None,
    zones: Sequence[str],
    emulate: bool,
    api_endpoint: str | None,
    run_id: str | None,
    env: Mapping[str, str] | None,
    adc_project: AdcProject | None,
) -> Scope:
    target = choose_target(emulate=emulate, api_endpoint=api_endpoint)
    if run_id is not None:
        check_run_id(run_id)
    if target.emulate:  # only the flags: never a real project's configuration
        found = project_flag(project)
        name = found.value if found else EMULATED_PROJECT
        return Scope(name, zone_flags(zones) or [EMULATED_ZONE], target, run_id)
    checked = resolve_zones(zones, env=env)
    if target.emulated:  # a local emulator: any project, and its default zone
        found = find_project(project, env=env)
        name = found.value if found else EMULATED_PROJECT
        return Scope(name, checked or [EMULATED_ZONE], target, run_id)
    # Only Google's endpoint receives credentials, so only it may name the project.
    adc = adc_project if target.mode == "google" else None
    name = resolve_project(project, env=env, adc_project=adc).value
    return Scope(name, checked, target, run_id)


def list_scope(
    *,
    project: str | None,
    zones: Sequence[str],
    emulate: bool,
    api_endpoint: str | None,
    env: Mapping[str, str] | None = None,
    adc_project: AdcProject | None = None,
) -> Scope:
    """`tpulab list`'s flags, validated; at least one zone (listing has no journal)."""
    scope = _scope(
        project=project,
        zones=zones,
        emulate=emulate,
        api_endpoint=api_endpoint,
        run_id=None,
        env=env,
        adc_project=adc_project,
    )
    if not scope.zones:
        raise ConfigError(
            "No zone to list.",
            hint="Pass --zone (repeatable), set TPULAB_ZONE, or run `gcloud config set "
            "compute/zone ZONE`.",
        )
    return scope


@dataclass(frozen=True)
class TeardownInputs:
    scope: Scope
    timeout: float


def teardown_inputs(
    *,
    verify: bool,
    project: str | None,
    zones: Sequence[str],
    emulate: bool,
    api_endpoint: str | None,
    run_id: str | None,
    timeout: float,
    env: Mapping[str, str] | None = None,
    adc_project: AdcProject | None = None,
    forget: bool = False,
    include_sessions: bool = False,
) -> TeardownInputs:
    """`tpulab teardown`'s flags, validated. No zone is not an error here: the journal's
    open rows may supply them (`find_orphans` says so if nothing does). With `forget`
    the target must be an endpoint other than Google's: only such a target can be gone
    (`tpulab.cleanup.forget`)."""
    if verify == forget:
        raise ConfigError(
            "teardown needs --verify." if not verify else "Give --verify or --forget, not both.",
            hint="Run `tpulab teardown --verify` (add --dry-run to only look); "
            "`--forget --api-endpoint URL` only closes journal rows of an endpoint that is gone.",
        )
    if forget and include_sessions:
        raise ConfigError(
            "--include-sessions applies to --verify, not --forget.",
            hint="`tpulab teardown --verify --include-sessions` also deletes live sessions' "
            "nodes; `tpulab down S` ends one session.",
        )
    seconds = check_seconds("--timeout", timeout)
    scope = _scope(
        project=project,
        zones=zones,
        emulate=emulate,
        api_endpoint=api_endpoint,
        run_id=run_id,
        env=env,
        adc_project=adc_project,
    )
    endpoint = scope.target.endpoint
    if forget and (endpoint is None or endpoint.kind == "google"):
        raise ConfigError(
            "--forget needs the --api-endpoint of a target that no longer exists "
            f"(not {'--emulate' if scope.emulate else 'Google'}).",
            hint="Google's API and the embedded emulator do not go away: "
            "`tpulab teardown --verify` deletes what remains and closes the rows whose "
            "node a list shows gone.",
        )
    return TeardownInputs(scope, seconds)


@dataclass(frozen=True)
class LocalVerifyInputs:
    accelerator: str | None  # a single-host catalog name
    devices: int | None
    expect_platform: str | None
    timeout: float


def local_verify_inputs(
    *,
    local: bool,
    accelerator: str | None,
    devices: int | None,
    expect_platform: str | None,
    timeout: float,
) -> LocalVerifyInputs:
    """`tpulab verify`'s flags, validated."""
    if not local:
        raise ConfigError(
            "Only local verification is a separate command: pass --local.",
            hint="Remote verification is `tpulab run --accelerator TYPE`, which checks "
            "the receipt on the TPU VM before deleting it.",
        )
    if accelerator is not None and devices is not None:
        raise ConfigError(
            "--accelerator and --devices both set the device count.",
            hint="Give one: --accelerator v5litepod-4, or --devices 4.",
        )
    if expect_platform is not None and expect_platform not in PLATFORMS:
        raise ConfigError(
            f"Unknown platform {expect_platform!r} for --expect-platform.",
            hint="Use one of: " + ", ".join(PLATFORMS),
        )
    if devices is not None and not 1 <= devices <= LOCAL_MAX_DEVICES:
        raise ConfigError(
            f"--devices {devices} is out of range for a local run.",
            hint=f"Use 1 to {LOCAL_MAX_DEVICES} devices.",
        )
    name = None
    if accelerator is not None:
        given(accelerator, "--accelerator", hint="Pass a type such as v5litepod-4.")
        name = catalog.lookup_single_host(
            accelerator.strip(),
            what="`verify --local` (one machine, one JAX process)",
            instead="Verify a slice on the slice itself: `tpulab run --accelerator "
            f"{accelerator.strip()}`",
        ).name
        if expect_platform == "gpu":
            raise ConfigError(
                f"{name} is a TPU; it cannot be expected on gpu.",
                hint="Use --expect-platform tpu, or cpu to emulate it (the default).",
            )
    return LocalVerifyInputs(name, devices, expect_platform, check_seconds("--timeout", timeout))


@dataclass(frozen=True)
class CostsInputs:
    since: datetime | None  # aware (UTC); None: the whole journal
    now: datetime  # the moment the ledger is priced at (open rows bill up to it)


# The longest --since duration: ten years back covers any journal tpulab can have
# written, and keeps `now - timedelta(...)` far from datetime's range (year 1).
MAX_SINCE_SECONDS = 3650 * 86400.0


def _since(text: str, now: datetime) -> datetime:
    raw = given(text, "--since", hint="Leave --since out for the whole journal, or pass e.g. 7d.")
    assert raw is not None
    raw = raw.strip()
    hint = (
        "Pass --since as an ISO date (2026-11-30: midnight UTC), an ISO date-time "
        "(2026-11-30T14:00: UTC unless it carries an offset such as +01:00), or a "
        "duration back from now (7d, 12h, 1d12h)."
    )
    if raw.isdigit():  # "2026" or "90": a year or seconds? Neither is guessed.
        raise ConfigError(f"Invalid --since {text!r}: a number needs a unit.", hint=hint)
    try:
        parsed = datetime.fromisoformat(raw)
    except ValueError:
        return now - timedelta(seconds=_since_seconds(text, raw, hint))
    if len(raw) == 10:  # a bare date: fromisoformat gave its midnight
        parsed = datetime.combine(parsed.date(), time(0), tzinfo=timezone.utc)
    elif parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)  # the journal's times are UTC
    parsed = parsed.astimezone(timezone.utc)
    if parsed > now:
        raise ConfigError(
            f"--since {text} is in the future ({parsed:%Y-%m-%d %H:%M} UTC); "
            "no run can have started after it.",
            hint=hint,
        )
    return parsed


def _since_seconds(text: str, raw: str, hint: str) -> float:
    try:
        # A duration is "that long before now"; parse_duration is the one syntax.
        seconds = parse_duration("--since", raw)
    except ConfigError:
        raise ConfigError(f"Invalid --since {text!r}.", hint=hint) from None
    if seconds > MAX_SINCE_SECONDS:
        # Bounded before timedelta/datetime arithmetic can overflow (999999d did).
        raise ConfigError(
            f"--since {text} is out of range: a duration back from now is at most "
            f"{MAX_SINCE_SECONDS / 86400:.0f}d (ten years).",
            hint="Pass a shorter duration (e.g. 7d), an ISO date for older runs "
            "(e.g. 2016-01-01), or leave --since out for the whole journal.",
        )
    return seconds


def costs_inputs(*, since: str | None, now: datetime | None = None) -> CostsInputs:
    """`tpulab costs`'s flags, validated; `now` (default: the clock) prices open rows."""
    moment = now or datetime.now(timezone.utc)
    return CostsInputs(since=None if since is None else _since(since, moment), now=moment)
