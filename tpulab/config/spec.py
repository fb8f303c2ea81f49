"""The validated `RunSpec`: every input of a run, checked before anything is contacted.

Everything here is pure input handling: a `RunSpec` that exists has been validated, so
nothing billable is created from bad input (docs/architecture.md §3, invariant 1).
"""

from __future__ import annotations

import dataclasses
import math
import os
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tpulab import catalog, paths
from tpulab.config.capacity import Capacity, check_attempt_names, choose_capacity
from tpulab.config.endpoint import Mode, Target, choose_target
from tpulab.config.python import REAL_PYTHON, check_jax_version, choose_python
from tpulab.config.resolve import (
    AdcProject,
    Resolved,
    check_seconds,
    find_project,
    find_zone,
    given,
    parse_duration,
    project_flag,
    resolve_project,
    resolve_zone,
    zone_flags,
    zone_from_env,
)
from tpulab.config.watchdog import (
    WatchdogGroup,
    WatchdogRequest,
    WatchdogSettings,
    check_service_account,
)
from tpulab.contract import KIND_RUN
from tpulab.errors import ConfigError, LeakedNode, target_for
from tpulab.models import check_node_name, check_run_id, tpulab_labels

if TYPE_CHECKING:
    # Annotations only: config/workload.py (and project_file.py through it) import this
    # module.
    from tpulab.config.project_file import ProjectDefaults
    from tpulab.config.workload import WorkloadSpec

__all__ = [
    "EMULATED_PROJECT",
    "EMULATED_ZONE",
    "SSH_USER",
    "Mode",
    "RunSpec",
    "Timeouts",
    "build_run_spec",
    "new_run_id",
]

# The embedded emulator's defaults (the same ones `tpulab list --emulate` uses).
EMULATED_PROJECT = "tpulab-emulated"
EMULATED_ZONE = "us-central1-a"
# The boot image of a Compute instance under --emulate when no --image is given: the
# emulator boots every instance alike (its own guest image), so it needs no real one;
# the name says where it came from in the plan and the emulator's records.
EMULATED_IMAGE = "projects/tpulab-emulator/global/images/tpulab-emulated-tpu-vm"
# The login user our per-run key is registered for in metadata["ssh-keys"].
SSH_USER = "tpulab"


def new_run_id(now: float | None = None) -> str:
    """A run id that sorts by time and is a valid label value: 20261130t210405-3fa2c1."""
    stamp = time.strftime("%Y%m%dt%H%M%S", time.gmtime(time.time() if now is None else now))
    return f"{stamp}-{secrets.token_hex(3)}"


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
class RunSpec:
    """A validated request for one run. Built by `build_run_spec`; never from raw flags."""

    run_id: str
    accelerator: catalog.Accelerator
    project: Resolved
    zone: Resolved
    node_name: str
    mode: Mode
    spot: bool = False
    api_endpoint: str | None = None
    emulated: bool = False
    payload: Path | None = None  # None: the packaged verify_tpu.py
    timeouts: Timeouts = field(default_factory=Timeouts)
    ssh_user: str = SSH_USER
    # The venv's python ("3.12", ">=3.11", "system"), chosen by config/python.py, and
    # where that choice came from; a pinned jax version, or None for the newest.
    python: str = REAL_PYTHON
    python_source: str = "default"
    jax_version: str | None = None
    internal_ip: bool = False  # connect to the node's internal address (inside its VPC)
    # Zones to try in order (`zone` is the one this spec's attempt uses), preemptions to
    # recover from, and the retry budget: tpulab.run.attempts reads these.
    zones: tuple[Resolved, ...] = ()
    recover: int = 0
    retry_until_up: bool = False
    retry_for: float | None = None

    @property
    def zone_order(self) -> tuple[Resolved, ...]:
        """Every zone a run may try, in order; just `zone` without --zone flags."""
        return self.zones or (self.zone,)

    @property
    def capacity(self) -> Capacity:
        return Capacity(self.zones, self.recover, self.retry_until_up, self.retry_for)

    # --queued: ask for the node through a QueuedResource (named like the node) and let
    # the service wait for capacity, at most `valid_for` seconds when given.
    queued: bool = False
    valid_for: int | None = None
    accelerator_source: str = "--accelerator"  # or the workspace's [tool.tpulab]
    # The user's `-- CMD` (run after the verifier gated it); None: the run is verify-only.
    workload: WorkloadSpec | None = None
    # The VM's own dead man's switch (docs/architecture.md §10); None: --no-watchdog.
    watchdog: WatchdogSettings | None = None
    # The node's service account e-mail; None: the project's default compute account.
    service_account: str | None = None
    # The VPC network and subnetwork (--network, --subnetwork, [tool.tpulab]); None:
    # the API's default (`default`).
    network: str | None = None
    subnetwork: str | None = None
    # Who serves the node (tpulab.catalog.PROVIDERS) and where that choice came from;
    # the Compute provider's boot image (None: none given, which a real run refuses).
    provider: catalog.Provider = "tpu-api"
    provider_source: str = "default"
    image: str | None = None
    image_source: str = "default"
    # What the node is for, as its `tpulab-kind` label says: KIND_RUN, or KIND_SESSION
    # for `tpulab up` (which keeps it).
    kind: str = KIND_RUN
    # The node's `tpulab-owner` label; None: this home's id, made on first use. The dry
    # run sets it (the existing id, or a placeholder) so that a plan writes nothing.
    owner: str | None = None

    @property
    def max_duration_seconds(self) -> float | None:
        """The watchdog's hard deadline (None without a watchdog): --max-duration, else
        every timeout of this run, the user's command included, plus a margin."""
        if self.watchdog is None:
            return None
        total = sum(vars(self.timeouts).values())
        if self.workload is not None:
            total += self.workload.timeout
        return self.watchdog.deadline(total)

    @property
    def platform(self) -> str:
        """What the payload must run on: an emulated node is a CPU host, never a TPU."""
        return "cpu" if self.emulated else "tpu"

    @property
    def sources(self) -> dict[str, str]:
        """Where each configurable value came from: the plan and --json show it."""
        found = {
            "accelerator": self.accelerator_source,
            "project": self.project.source,
            "zone": self.zone.source,
            "python": self.python_source,
            "provider": self.provider_source,
        }
        if self.provider == "compute":
            found["image"] = self.image_source
        if self.workload is not None:
            found.update(self.workload.sources)
        return found

    @property
    def labels(self) -> dict[str, str]:
        """The node's labels: tpulab's, its run, its kind and this home's owner id (made
        on first use: `tpulab.paths.owner_id`)."""
        owner = self.owner if self.owner is not None else paths.owner_id()
        return tpulab_labels(self.run_id, kind=self.kind, owner=owner)

    @property
    def target(self) -> str:
        """The API the node lives behind, as the journal and LeakedNode name it."""
        return target_for(self.api_endpoint, embedded_emulator=self.mode == "emulate")

    def leaked_node(self) -> LeakedNode:
        """This run's node as a possible leak, with commands that work for its API."""
        return LeakedNode(
            self.project.value,
            self.zone.value,
            self.node_name,
            self.target,
            self.run_id,
            queued_resource=self.node_name if self.queued else None,
            provider=self.provider,
        )


def build_run_spec(
    *,
    accelerator: str | None,
    emulate: bool = False,
    api_endpoint: str | None = None,
    project: str | None = None,
    zone: str | None = None,
    zones: Sequence[str] = (),
    name: str | None = None,
    spot: bool = False,
    recover: int = 0,
    retry_until_up: bool = False,
    retry_for: float | None = None,
    payload_timeout: float | None = None,
    timeouts: Timeouts | None = None,
    payload: Path | None = None,
    run_id: str | None = None,
    env: Mapping[str, str] | None = None,
    adc_project: AdcProject | None = None,
    python: str | None = None,
    jax_version: str | None = None,
    internal_ip: bool = False,
    queued: bool = False,
    valid_for: str | None = None,
    defaults: ProjectDefaults | None = None,
    watchdog: WatchdogGroup | None = None,
    service_account: str | None = None,
    network: str | None = None,
    subnetwork: str | None = None,
    provider: str | None = None,
    image: str | None = None,
) -> RunSpec:
    """Validate every input of a run before anything contacts the cloud (invariant 1).

    `emulate` and `api_endpoint` are the raw flags; `choose_target` decides what they
    mean. The embedded emulator defaults project and zone to its own; a loopback
    endpoint (a local emulator accepts any project) resolves them like a real run and
    falls back to those defaults only when nothing is configured; Google and any other
    endpoint need both resolved, and only Google consults ADC for the project.

    `defaults` is the workspace's project file (config/project_file.py): it supplies the
    accelerator and python when their flags are absent, and project and zone at their
    place in DESIGN §1's order (not for the embedded emulator, which only asks flags).
    """
    target = choose_target(emulate=emulate, api_endpoint=api_endpoint)
    accel, accel_source = _accelerator(accelerator, defaults)
    chosen, chosen_source = _provider(provider, accel, defaults)
    boot_image, image_source = (
        _image(image, defaults, emulated=target.mode == "emulate")
        if chosen == "compute"
        else (None, "default")
    )
    if queued and chosen == "compute":
        raise ConfigError(
            "--queued asks the Cloud TPU API for a queued resource; the Compute provider has none.",
            hint="Drop --queued, or pass --provider tpu-api with a type it serves.",
        )
    env = os.environ if env is None else env
    if zone is not None and zones:
        raise ConfigError("Pass the zone once: zone or zones.", hint="Use --zone (repeatable).")
    file_zones = _zones_from_file(target, zone, zones, env, defaults)
    capacity = choose_capacity(
        accelerator=accel.name,
        zones=zones or file_zones,
        zones_source="--zone" if zones or defaults is None else defaults.source,
        spot=spot,
        recover=recover,
        retry_until_up=retry_until_up,
        retry_for=retry_for,
    )
    first = capacity.zones[0] if capacity.zones else None
    proj, zn = _project_and_zone(
        target, project, first.value if first else zone, env, adc_project, defaults
    )
    zn = first or zn  # keeps where it came from ("--zone auto (catalog)")
    rid = check_run_id(run_id) if run_id is not None else new_run_id()
    given(name, "--name", hint="Pass a node name, or leave --name out for tpulab-<run id>.")
    node_name = check_node_name(name if name is not None else f"tpulab-{rid}")
    check_attempt_names(capacity, rid, node_name)
    timeouts = timeouts or Timeouts()
    if payload_timeout is not None:
        timeouts = dataclasses.replace(timeouts, payload=payload_timeout)
    if payload is not None and not payload.is_file():
        raise ConfigError(f"Payload {payload} does not exist.", hint="Pass an existing file.")
    from_file = _from_file(defaults, "python")
    python_request, python_source = choose_python(
        python, emulated=target.emulated, from_file=from_file
    )
    window = check_valid_for(valid_for, queued=queued)
    if queued:
        check_queued_capacity(capacity)
    # Until its first renewal the watchdog must outwait the controller's own boot waits.
    dog = (watchdog or WatchdogRequest()).resolve(
        boot_wait_seconds=timeouts.host_key + timeouts.connect
    )
    return RunSpec(
        run_id=rid,
        accelerator=accel,
        project=proj,
        zone=zn,
        node_name=node_name,
        mode=target.mode,
        spot=spot,
        api_endpoint=target.api_endpoint,
        emulated=target.emulated,
        payload=payload,
        timeouts=timeouts,
        python=python_request,
        python_source=python_source,
        jax_version=check_jax_version(jax_version) if jax_version is not None else None,
        internal_ip=internal_ip,
        zones=capacity.zones,
        recover=capacity.recover,
        retry_until_up=capacity.retry_until_up,
        retry_for=capacity.retry_for,
        queued=queued,
        valid_for=window,
        accelerator_source=accel_source,
        watchdog=dog,
        service_account=_service_account(service_account, defaults),
        network=_network(network, "network", defaults),
        subnetwork=_network(subnetwork, "subnetwork", defaults),
        provider=chosen,
        provider_source=chosen_source,
        image=boot_image,
        image_source=image_source,
    )


def _provider(
    flag: str | None, accelerator: catalog.Accelerator, defaults: ProjectDefaults | None
) -> tuple[catalog.Provider, str]:
    """--provider, else the workspace's, else the catalog's default for the type; a pair
    the catalog does not serve is refused here, before anything is contacted."""
    found = _from_file(defaults, "provider")
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
    found = _from_file(defaults, "image")
    if found is not None:
        return found.value, found.source
    if emulated:
        return EMULATED_IMAGE, "the emulator's"
    return None, "default"


# How long a queued resource may wait for capacity. The API documents no bound of its
# own; a week keeps a typo ("30d" for "30m") from queueing a request for a month.
MAX_VALID_FOR_SECONDS = 7 * 86400


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


def _accelerator(
    flag: str | None, defaults: ProjectDefaults | None
) -> tuple[catalog.Accelerator, str]:
    if flag is not None:
        given(flag, "--accelerator", hint="Pass a type such as v5litepod-4.")
        return catalog.lookup(flag.strip()), "--accelerator"
    found = _from_file(defaults, "accelerator")
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


def _service_account(flag: str | None, defaults: ProjectDefaults | None) -> str | None:
    """--service-account, else the workspace's [tool.tpulab] service_account, checked."""
    if flag is not None:
        return check_service_account(flag)
    found = _from_file(defaults, "service_account")
    if found is None:
        return None
    try:
        return check_service_account(found.value)
    except ConfigError as error:
        raise ConfigError(
            f"{error.message.rstrip('.')} (from {found.source}).", hint=error.hint
        ) from None


def _network(flag: str | None, key: str, defaults: ProjectDefaults | None) -> str | None:
    """--network / --subnetwork, else the workspace's [tool.tpulab] value, checked."""
    from tpulab.config.network import check_network, check_subnetwork

    check = check_network if key == "network" else check_subnetwork
    if flag is not None:
        return check(flag, f"--{key}")
    found = _from_file(defaults, key)
    return None if found is None else check(found.value, f"{key} (from {found.source})")


def _from_file(defaults: ProjectDefaults | None, key: str) -> Resolved | None:
    """A scalar the workspace's file set, with the file as its source."""
    if defaults is None:
        return None
    value = getattr(defaults, key)
    return None if value is None else Resolved(value, defaults.source)


def _zones_from_file(
    target: Target,
    zone: str | None,
    zones: Sequence[str],
    env: Mapping[str, str],
    defaults: ProjectDefaults | None,
) -> tuple[str, ...]:
    """The file's `zone` (one name, a list, `auto`) as the zones to try, read like
    repeated --zone; () where something outranks it (DESIGN §1: flags, then the
    environment) or for the embedded emulator, which only asks flags."""
    if defaults is None or zone is not None or zones or target.emulate:
        return ()
    if zone_from_env(env) is not None:
        return ()
    return defaults.zones


def _project_and_zone(
    target: Target,
    project: str | None,
    zone: str | None,
    env: Mapping[str, str],
    adc_project: AdcProject | None,
    defaults: ProjectDefaults | None,
) -> tuple[Resolved, Resolved]:
    if target.emulate:
        # The embedded emulator is this process's own: only the flags are asked, never
        # the environment or the gcloud configuration of a real project.
        proj = project_flag(project) or Resolved(EMULATED_PROJECT, "emulator")
        zn = Resolved(zone_flags([zone])[0], "--zone") if zone is not None else None
        return proj, zn or Resolved(EMULATED_ZONE, "emulator")
    file_project = _from_file(defaults, "project")
    # The file's zones reach here as `zone` (the first of them), through choose_capacity.
    if target.emulated:
        proj = find_project(project, env=env, project_file=file_project) or Resolved(
            EMULATED_PROJECT, "emulator default"
        )
        zn = find_zone(zone, env=env)
        return proj, zn or Resolved(EMULATED_ZONE, "emulator default")
    # Only Google's endpoint receives credentials, so only it may name the project.
    adc = adc_project if target.mode == "google" else None
    zn = resolve_zone(zone, env=env)
    return resolve_project(project, env=env, adc_project=adc, project_file=file_project), zn
