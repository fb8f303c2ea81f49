"""`tpulab doctor`'s flags, validated before anything is asked of the cloud.

The project resolves as `tpulab run`'s does (`spec._project_and_zone`, with the same
resolve.py functions: flag, environment, the workspace's [tool.tpulab], the gcloud
configuration, ADC for Google only), so what doctor checks is the project a run would
use. A project that does not resolve is
not raised here but returned as `project_error`: doctor reports it as a check.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tpulab import catalog
from tpulab.config.endpoint import Target, choose_target
from tpulab.config.network import check_network, check_subnetwork
from tpulab.config.project_file import load_project_file
from tpulab.config.resolve import (
    AdcProject,
    Resolved,
    find_project,
    find_zone,
    given,
    project_flag,
    resolve_project,
    zone_flags,
)
from tpulab.config.spec import (
    EMULATED_PROJECT,
    EMULATED_ZONE,
    _from_file,
    _network,
    _service_account,
)
from tpulab.config.watchdog import check_service_account
from tpulab.errors import ConfigError

__all__ = ["DoctorInputs", "doctor_inputs"]


@dataclass(frozen=True)
class DoctorInputs:
    target: Target
    project: Resolved | None
    zone: Resolved | None
    accelerator: str | None
    service_account: str | None
    project_error: ConfigError | None = None
    network: str = "default"  # the VPC a run would create in (its short name)
    subnetwork: str | None = None  # --subnetwork (a name or its regions/R path), or None
    internal_ip: bool = False  # check what a VM without an external IP needs


def doctor_inputs(
    *,
    project: str | None,
    zone: str | None,
    accelerator: str | None,
    service_account: str | None,
    emulate: bool,
    network: str | None = None,
    subnetwork: str | None = None,
    internal_ip: bool = False,
    api_endpoint: str | None,
    env: Mapping[str, str] | None = None,
    adc_project: AdcProject | None = None,
    cwd: Path | None = None,
) -> DoctorInputs:
    """Bad flags raise ConfigError (exit 2, nothing asked); a project that no place
    names is kept in `project_error` for the report. The zone is optional: only an
    --accelerator is checked against it."""
    target = choose_target(emulate=emulate, api_endpoint=api_endpoint)
    accel = None
    if accelerator is not None:
        given(accelerator, "--accelerator", hint="Pass a type such as v5litepod-4.")
        found = catalog.lookup(accelerator.strip())
        if found.default_provider == "compute":
            # doctor's checks are the Cloud TPU API's (its API, tpu.* permissions, its
            # zones): for a Compute-only type they would answer a question nobody asked.
            raise ConfigError(
                f"{found.name} is served by the Compute Engine provider only, and doctor "
                "checks the Cloud TPU API's path; its Compute Engine checks are not "
                "written yet.",
                hint="Run doctor without --accelerator for the project-wide checks, and "
                "check Compute yourself: `gcloud services list --enabled` shows "
                "compute.googleapis.com, and you hold roles/compute.instanceAdmin.v1.",
            )
        accel = found.name
    account = check_service_account(service_account)
    vpc = check_network(network)
    subnet = check_subnetwork(subnetwork)
    flag = project_flag(project)  # malformed: bad input, raised
    zn = Resolved(zone_flags([zone])[0], "--zone") if zone is not None else None
    env = os.environ if env is None else env
    if target.emulate:  # the embedded emulator's own; only flags are asked (as run does)
        proj: Resolved | None = flag or Resolved(EMULATED_PROJECT, "emulator")
        zn = zn or Resolved(EMULATED_ZONE, "emulator")
    else:
        defaults = load_project_file(Path.cwd() if cwd is None else cwd)
        from_file = _from_file(defaults, "project")
        # The VM account and the VPC a run from here would use: flag, else the file.
        account = _service_account(service_account, defaults)
        vpc = _network(network, "network", defaults)
        subnet = _network(subnetwork, "subnetwork", defaults)
        zn = zn or find_zone(None, env=env)
        if target.emulated:
            proj = find_project(project, env=env, project_file=from_file) or Resolved(
                EMULATED_PROJECT, "emulator default"
            )
        else:
            # Only Google's endpoint receives credentials, so only it may name the project.
            adc = adc_project if target.mode == "google" else None
            try:
                proj = resolve_project(project, env=env, adc_project=adc, project_file=from_file)
            except ConfigError as error:
                return DoctorInputs(
                    target,
                    None,
                    zn,
                    accel,
                    account,
                    project_error=error,
                    network=_short(vpc),
                    subnetwork=subnet,
                    internal_ip=internal_ip,
                )
    if accel is not None and zn is not None and zn.value not in catalog.zones_offering(accel):
        raise ConfigError(
            f"Zone {zn.value} (from {zn.source}) does not offer {accel}.",
            hint=f"Zones that do: {', '.join(catalog.zones_offering(accel)[:6])}."
            if catalog.zones_offering(accel)
            else "No zone in tpulab's zone table offers it.",
        )
    return DoctorInputs(
        target,
        proj,
        zn,
        accel,
        account,
        network=_short(vpc),
        subnetwork=subnet,
        internal_ip=internal_ip,
    )


def _short(network: str | None) -> str:
    """The network's name (a `projects/P/global/networks/N` path names N); `default`."""
    return network.rsplit("/", 1)[-1] if network else "default"
