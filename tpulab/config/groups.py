"""The flag groups of `run`, `up`, `exec` and `tpulab.run_tpu`, declared once.

Each group holds its flags' raw values as typer parsed them, with the commands' defaults,
and validates them in its `resolve()`; `build_run_spec` (config/spec.py) composes the
results into a RunSpec. A caller passes only what differs from the defaults (`exec` its
shorter boot timeout). The CLI's help panels are these groups (`option_names`,
tpulab/cli/_panels.py), so a flag's panel cannot disagree with its group. The other two
groups are `WorkloadFlags` (config/workload.py: `-- CMD` and its flags) and the
watchdog's (config/watchdog.py: `run`'s WatchdogRequest, `up`'s SessionTimes).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tpulab import catalog
from tpulab.config.capacity import Capacity, choose_capacity
from tpulab.config.endpoint import Target, choose_target
from tpulab.config.python import check_jax_version, choose_python
from tpulab.config.resolve import Resolved, check_seconds, given, parse_duration
from tpulab.config.watchdog import check_service_account
from tpulab.errors import ConfigError

if TYPE_CHECKING:
    from tpulab.config.project_file import ProjectDefaults

__all__ = [
    "CAPACITY_DEFAULTS",
    "EMULATED_IMAGE",
    "MAX_VALID_FOR_SECONDS",
    "PYTHON_DEFAULTS",
    "TIMEOUT_DEFAULTS",
    "CapacityFlags",
    "PythonFlags",
    "TargetFlags",
    "TimeoutFlags",
    "Timeouts",
    "VmPython",
    "Where",
    "check_queued_capacity",
    "check_valid_for",
    "from_file",
    "network_choice",
    "option_name",
    "option_names",
    "provider_choice",
    "service_account_choice",
]

# The boot image of a Compute instance under --emulate when no --image is given: the
# emulator boots every instance alike (its own guest image), so it needs no real one;
# the name says where it came from in the plan and the emulator's records.
EMULATED_IMAGE = "projects/tpulab-emulator/global/images/tpulab-emulated-tpu-vm"
# How long a queued resource may wait for capacity. The API documents no bound of its
# own; a week keeps a typo ("30d" for "30m") from queueing a request for a month.
MAX_VALID_FOR_SECONDS = 7 * 86400


@dataclass(frozen=True)
class Timeouts:
    """Deadlines (seconds) of each waiting phase; tests shrink them, users rarely should."""

    create: float = 900.0
    ready: float = 900.0
    host_key: float = 180.0
    connect: float = 180.0
    bootstrap: float = 1200.0
    payload: float = 600.0
    collect: float = 60.0
    teardown: float = 600.0

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            check_seconds(f"{name} timeout", value)


@dataclass(frozen=True)
class TimeoutFlags:
    """--payload-timeout, --teardown-timeout, --boot-timeout, --bootstrap-timeout."""

    payload: float = Timeouts.payload
    teardown: float = Timeouts.teardown
    boot: float = Timeouts.connect
    bootstrap: float = Timeouts.bootstrap

    def resolve(self) -> Timeouts:
        # After READY the VM boots its guest agent (host keys) and sshd: one budget.
        boot = check_seconds("--boot-timeout", self.boot)
        bootstrap = check_seconds("--bootstrap-timeout", self.bootstrap)
        teardown = check_seconds("--teardown-timeout", self.teardown)
        payload = check_seconds("--payload-timeout", self.payload)
        return Timeouts(
            host_key=boot, connect=boot, bootstrap=bootstrap, payload=payload, teardown=teardown
        )


@dataclass(frozen=True)
class Where:
    """TargetFlags resolved: the VM but for its project, zone and name, which wait for
    the capacity group's zones (build_run_spec)."""

    target: Target
    accelerator: catalog.Accelerator
    accelerator_source: str
    provider: catalog.Provider
    provider_source: str
    image: str | None
    image_source: str
    service_account: str | None
    network: str | None
    subnetwork: str | None


@dataclass(frozen=True)
class TargetFlags:
    """Where the VM is and what it is. `zones` are the repeatable --zone; `zone` is the
    library's single zone (one or the other)."""

    accelerator: str | None = None
    zones: Sequence[str] = ()
    zone: str | None = None
    project: str | None = None
    name: str | None = None
    emulate: bool = False
    api_endpoint: str | None = None
    internal_ip: bool = False
    network: str | None = None
    subnetwork: str | None = None
    provider: str | None = None
    image: str | None = None
    service_account: str | None = None

    def resolve(self, defaults: ProjectDefaults | None) -> Where:
        """Each flag, else the workspace's file (`defaults`), else the default."""
        target = choose_target(emulate=self.emulate, api_endpoint=self.api_endpoint)
        accel, accel_source = _accelerator(self.accelerator, defaults)
        chosen, chosen_source = provider_choice(self.provider, accel, defaults)
        boot_image, image_source = (
            _image(self.image, defaults, emulated=target.mode == "emulate")
            if chosen == "compute"
            else (None, "default")
        )
        if self.zone is not None and self.zones:
            raise ConfigError("Pass the zone once: zone or zones.", hint="Use --zone (repeatable).")
        return Where(
            target,
            accel,
            accel_source,
            chosen,
            chosen_source,
            boot_image,
            image_source,
            service_account_choice(self.service_account, defaults),
            network_choice(self.network, "network", defaults),
            network_choice(self.subnetwork, "subnetwork", defaults),
        )


@dataclass(frozen=True)
class CapacityFlags:
    """How capacity is found: spot and its recoveries, retries, a queued resource."""

    spot: bool = False
    recover: int = 0
    retry_until_up: bool = False
    retry_for: str | None = None
    queued: bool = False
    valid_for: str | None = None

    def resolve(
        self, *, accelerator: str, provider: catalog.Provider, zones: Sequence[str], source: str
    ) -> tuple[Capacity, int | None]:
        """The zones to try and the retry budget, and --valid-for in whole seconds.
        `source` names where `zones` came from: the flags or the workspace's list."""
        if self.queued and provider == "compute":
            raise ConfigError(
                "--queued asks the Cloud TPU API for a queued resource; the Compute "
                "provider has none.",
                hint="Drop --queued, or pass --provider tpu-api with a type it serves.",
            )
        capacity = choose_capacity(
            accelerator=accelerator,
            zones=zones,
            zones_source=source,
            spot=self.spot,
            recover=self.recover,
            retry_until_up=self.retry_until_up,
            retry_for=None
            if self.retry_for is None
            else parse_duration("--retry-for", self.retry_for),
        )
        window = check_valid_for(self.valid_for, queued=self.queued)
        if self.queued:
            check_queued_capacity(capacity)
        return capacity, window


@dataclass(frozen=True)
class VmPython:
    """PythonFlags resolved: the venv's python request, where it came from, the jax pin."""

    python: str
    source: str
    jax_version: str | None


@dataclass(frozen=True)
class PythonFlags:
    """The VM's venv: --python, --jax-version, --installer. The installer is typed by
    run_inputs (config/commands.py): the RunSpec does not carry it."""

    python: str | None = None
    jax_version: str | None = None
    installer: str = "uv"

    def resolve(self, *, emulated: bool, defaults: ProjectDefaults | None) -> VmPython:
        python, source = choose_python(
            self.python, emulated=emulated, from_file=from_file(defaults, "python")
        )
        jax = None if self.jax_version is None else check_jax_version(self.jax_version)
        return VmPython(python, source, jax)


# Each group's defaults, as default arguments (run_inputs, build_run_spec): frozen, so
# one instance serves every call.
CAPACITY_DEFAULTS = CapacityFlags()
TIMEOUT_DEFAULTS = TimeoutFlags()
PYTHON_DEFAULTS = PythonFlags()

# Options whose name is not `--` and the field's name with dashes; None: no option.
_SPELLED: dict[str, str | None] = {
    "zones": "--zone",
    "zone": "--zone",
    "payload": "--payload-timeout",
    "teardown": "--teardown-timeout",
    "boot": "--boot-timeout",
    "bootstrap": "--bootstrap-timeout",
    "command": None,  # WorkloadFlags: `-- CMD`
    "with_packages": "--with",
    "allow_secrets": "--allow-secret",
    "enabled": "--no-watchdog",  # WatchdogRequest
}


def option_name(field: str) -> str | None:
    """The CLI option a flag group's field is; None: none (`-- CMD`)."""
    return _SPELLED.get(field, "--" + field.replace("_", "-"))


def option_names(group: type) -> tuple[str, ...]:
    """The CLI options a flag group's fields are, once each, in field order."""
    names = (option_name(field.name) for field in dataclasses.fields(group))
    return tuple(dict.fromkeys(name for name in names if name is not None))


def check_queued_capacity(capacity: Capacity) -> None:
    """A queued run is one request in one zone: the service itself waits for capacity,
    for as long as --valid-for. Failing over to another zone, re-queueing after a pass or
    recovering a preempted node (a queued node that is preempted is SUSPENDED, not
    recreated) would each be a second wait the user did not ask for -- and, across N
    zones, N windows one after the other -- so they are refused, not half done."""
    clashes = []
    if len(capacity.zones) > 1:
        clashes.append(
            f"{len(capacity.zones)} zones ({', '.join(z.value for z in capacity.zones)})"
        )
    if capacity.recover:
        clashes.append(f"--recover {capacity.recover}")
    if capacity.retry_until_up:
        clashes.append("--retry-until-up")
    if clashes:
        raise ConfigError(
            f"--queued takes one zone and waits there; it does not combine with "
            f"{' or '.join(clashes)}.",
            hint="Pass one --zone with --queued (bound the wait with --valid-for), or drop "
            "--queued to fail over across zones and retry.",
        )


def check_valid_for(text: str | None, *, queued: bool) -> int | None:
    """--valid-for as whole seconds (what validUntilDuration carries), or None."""
    if text is None:
        return None
    if not queued:
        raise ConfigError(
            "--valid-for applies only to queued resources.",
            hint="Add --queued, or leave --valid-for out.",
        )
    seconds = parse_duration("--valid-for", text)
    if seconds > MAX_VALID_FOR_SECONDS:
        raise ConfigError(
            f"Invalid --valid-for {text!r}: at most 7d (a week).",
            hint="Pass how long the queued resource may wait for capacity, e.g. 30m or 6h.",
        )
    return max(1, math.ceil(seconds))


def provider_choice(
    flag: str | None, accelerator: catalog.Accelerator, defaults: ProjectDefaults | None
) -> tuple[catalog.Provider, str]:
    """--provider, else the workspace's, else the catalog's default for the type; a pair
    the catalog does not serve is refused here, before anything is contacted."""
    found = from_file(defaults, "provider")
    text, source = (flag, "--provider") if flag is not None else (None, "")
    if text is None and found is not None:
        text, source = found.value, found.source
    if text is None:
        return accelerator.default_provider, f"default for {accelerator.name}"
    by_name: dict[str, catalog.Provider] = {name: name for name in catalog.PROVIDERS}
    if text.strip() not in by_name:
        raise ConfigError(
            f"Unknown provider {text!r} (from {source}).",
            hint="Use tpu-api (the Cloud TPU API) or compute (Compute Engine instances).",
        )
    chosen = by_name[text.strip()]
    catalog.check_provider(accelerator, chosen)
    return chosen, source


def _image(
    flag: str | None, defaults: ProjectDefaults | None, *, emulated: bool
) -> tuple[str | None, str]:
    """--image, else the workspace's `image`, else (the embedded emulator only) its own
    EMULATED_IMAGE: the boot image of a Compute instance, and where it came from. None
    elsewhere: a real run refuses to guess one (tpulab.app.target.compute_api)."""
    if flag is not None:
        given(flag, "--image", hint="Pass an image path, e.g. projects/P/global/images/I.")
        return flag.strip(), "--image"
    found = from_file(defaults, "image")
    if found is not None:
        return found.value, found.source
    if emulated:
        return EMULATED_IMAGE, "the emulator's"
    return None, "default"


def _accelerator(
    flag: str | None, defaults: ProjectDefaults | None
) -> tuple[catalog.Accelerator, str]:
    if flag is not None:
        given(flag, "--accelerator", hint="Pass a type such as v5litepod-4.")
        return catalog.lookup(flag.strip()), "--accelerator"
    found = from_file(defaults, "accelerator")
    if found is None:
        raise ConfigError(
            "No accelerator type: --accelerator is missing and the workspace's "
            "[tool.tpulab] names none.",
            hint="Pass --accelerator (e.g. v5litepod-4), or set accelerator in the "
            "workspace's pyproject.toml [tool.tpulab] or tpulab.toml.",
        )
    try:
        return catalog.lookup(found.value), found.source
    except ConfigError as error:
        raise ConfigError(
            f"{error.message.rstrip('.')} (from {found.source}).", hint=error.hint
        ) from None


def service_account_choice(flag: str | None, defaults: ProjectDefaults | None) -> str | None:
    """--service-account, else the workspace's [tool.tpulab] service_account, checked."""
    if flag is not None:
        return check_service_account(flag)
    found = from_file(defaults, "service_account")
    if found is None:
        return None
    try:
        return check_service_account(found.value)
    except ConfigError as error:
        raise ConfigError(
            f"{error.message.rstrip('.')} (from {found.source}).", hint=error.hint
        ) from None


def network_choice(flag: str | None, key: str, defaults: ProjectDefaults | None) -> str | None:
    """--network / --subnetwork, else the workspace's [tool.tpulab] value, checked."""
    from tpulab.config.network import check_network, check_subnetwork

    check = check_network if key == "network" else check_subnetwork
    if flag is not None:
        return check(flag, f"--{key}")
    found = from_file(defaults, key)
    return None if found is None else check(found.value, f"{key} (from {found.source})")


def from_file(defaults: ProjectDefaults | None, key: str) -> Resolved | None:
    """A scalar the workspace's file set, with the file as its source."""
    if defaults is None:
        return None
    value = getattr(defaults, key)
    return None if value is None else Resolved(value, defaults.source)
