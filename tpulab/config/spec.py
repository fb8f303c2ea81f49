"""The validated `RunSpec`: every input of a run, checked before anything is contacted.

Everything here is pure input handling: a `RunSpec` that exists has been validated, so
nothing billable is created from bad input (docs/architecture.md §3, invariant 1).
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tpulab import catalog, paths
from tpulab.config.capacity import Capacity, check_attempt_names
from tpulab.config.endpoint import Mode, Target
from tpulab.config.groups import (
    CAPACITY_DEFAULTS,
    EMULATED_IMAGE,
    PYTHON_DEFAULTS,
    TIMEOUT_DEFAULTS,
    CapacityFlags,
    PythonFlags,
    TargetFlags,
    TimeoutFlags,
    Timeouts,
    from_file,
)
from tpulab.config.python import REAL_PYTHON
from tpulab.config.resolve import (
    AdcProject,
    Resolved,
    find_project,
    find_zone,
    given,
    project_flag,
    resolve_project,
    resolve_zone,
    zone_flags,
    zone_from_env,
)
from tpulab.config.watchdog import WatchdogGroup, WatchdogRequest, WatchdogSettings
from tpulab.contract import KIND_RUN
from tpulab.errors import ConfigError, LeakedNode, target_for
from tpulab.models import check_node_name, check_run_id, tpulab_labels

if TYPE_CHECKING:
    # Annotations only: config/workload.py (and project_file.py through it) import this
    # module.
    from tpulab.config.project_file import ProjectDefaults
    from tpulab.config.workload import WorkloadSpec

__all__ = [
    "EMULATED_IMAGE",
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
# The login user our per-run key is registered for in metadata["ssh-keys"].
SSH_USER = "tpulab"


def new_run_id(now: float | None = None) -> str:
    """A run id that sorts by time and is a valid label value: 20261130t210405-3fa2c1."""
    stamp = time.strftime("%Y%m%dt%H%M%S", time.gmtime(time.time() if now is None else now))
    return f"{stamp}-{secrets.token_hex(3)}"


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
    target: TargetFlags,
    capacity: CapacityFlags = CAPACITY_DEFAULTS,
    timeouts: TimeoutFlags | Timeouts = TIMEOUT_DEFAULTS,
    python: PythonFlags = PYTHON_DEFAULTS,
    watchdog: WatchdogGroup | None = None,
    payload: Path | None = None,
    run_id: str | None = None,
    env: Mapping[str, str] | None = None,
    adc_project: AdcProject | None = None,
    defaults: ProjectDefaults | None = None,
) -> RunSpec:
    """Validate every input of a run before anything contacts the cloud (invariant 1).

    The groups hold the raw flags (config/groups.py) and each resolves its own; a
    `Timeouts` instead of TimeoutFlags is every deadline already chosen (tests shrink
    them). The embedded emulator defaults project and zone to its own; a loopback
    endpoint (a local emulator accepts any project) resolves them like a real run and
    falls back to those defaults only when nothing is configured; Google and any other
    endpoint need both resolved, and only Google consults ADC for the project.

    `defaults` is the workspace's project file (config/project_file.py): it supplies the
    accelerator and python when their flags are absent, and project and zone at their
    place in DESIGN §1's order (not for the embedded emulator, which only asks flags).
    """
    times = timeouts if isinstance(timeouts, Timeouts) else timeouts.resolve()
    where = target.resolve(defaults)
    env = os.environ if env is None else env
    file_zones = _zones_from_file(where.target, target.zone, target.zones, env, defaults)
    chosen, window = capacity.resolve(
        accelerator=where.accelerator.name,
        provider=where.provider,
        zones=target.zones or file_zones,
        source="--zone" if target.zones or defaults is None else defaults.source,
    )
    first = chosen.zones[0] if chosen.zones else None
    zone = first.value if first else target.zone
    proj, zn = _project_and_zone(where.target, target.project, zone, env, adc_project, defaults)
    zn = first or zn  # keeps where it came from ("--zone auto (catalog)")
    rid = check_run_id(run_id) if run_id is not None else new_run_id()
    name = target.name
    given(name, "--name", hint="Pass a node name, or leave --name out for tpulab-<run id>.")
    node_name = check_node_name(name if name is not None else f"tpulab-{rid}")
    check_attempt_names(chosen, rid, node_name)
    if payload is not None and not payload.is_file():
        raise ConfigError(f"Payload {payload} does not exist.", hint="Pass an existing file.")
    vm = python.resolve(emulated=where.target.emulated, defaults=defaults)
    # Until its first renewal the watchdog must outwait the controller's own boot waits.
    dog = (watchdog or WatchdogRequest()).resolve(boot_wait_seconds=times.host_key + times.connect)
    return RunSpec(
        run_id=rid,
        accelerator=where.accelerator,
        project=proj,
        zone=zn,
        node_name=node_name,
        mode=where.target.mode,
        spot=capacity.spot,
        api_endpoint=where.target.api_endpoint,
        emulated=where.target.emulated,
        payload=payload,
        timeouts=times,
        python=vm.python,
        python_source=vm.source,
        jax_version=vm.jax_version,
        internal_ip=target.internal_ip,
        zones=chosen.zones,
        recover=chosen.recover,
        retry_until_up=chosen.retry_until_up,
        retry_for=chosen.retry_for,
        queued=capacity.queued,
        valid_for=window,
        accelerator_source=where.accelerator_source,
        watchdog=dog,
        service_account=where.service_account,
        network=where.network,
        subnetwork=where.subnetwork,
        provider=where.provider,
        provider_source=where.provider_source,
        image=where.image,
        image_source=where.image_source,
    )


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
    file_project = from_file(defaults, "project")
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
