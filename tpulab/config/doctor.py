"""`tpulab doctor`'s flags, validated before anything is asked of the cloud.

The project resolves as `tpulab run`'s does (`spec._project_and_zone`, with the same
resolve.py functions: flag, environment, the workspace's [tool.tpulab], the gcloud
configuration, ADC for Google only), so what doctor checks is the project a run would
use. A project that does not resolve is
not raised here but returned as `project_error`: doctor reports it as a check. The
provider resolves as a run's does too (--provider, the workspace's, the accelerator's
default): it chooses which checks doctor asks (tpulab.cloud.preflight.checks_for).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tpulab import catalog
from tpulab.config.endpoint import Target, choose_target
from tpulab.config.groups import from_file as _from_file
from tpulab.config.groups import network_choice as _network
from tpulab.config.groups import provider_choice as _provider
from tpulab.config.groups import service_account_choice as _service_account
from tpulab.config.network import check_network, check_subnetwork
from tpulab.config.project_file import ProjectDefaults, load_project_file
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
from tpulab.config.spec import EMULATED_PROJECT, EMULATED_ZONE
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
    provider: catalog.Provider = "tpu-api"  # whose checks: the Cloud TPU API's or Compute's


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
    provider: str | None = None,
    api_endpoint: str | None,
    env: Mapping[str, str] | None = None,
    adc_project: AdcProject | None = None,
    cwd: Path | None = None,
) -> DoctorInputs:
    """Bad flags raise ConfigError (exit 2, nothing asked); a project that no place
    names is kept in `project_error` for the report. The zone is optional: only an
    --accelerator is checked against it."""
    target = choose_target(emulate=emulate, api_endpoint=api_endpoint)
    found: catalog.Accelerator | None = None
    if accelerator is not None:
        given(accelerator, "--accelerator", hint="Pass a type such as v5litepod-4.")
        found = catalog.lookup(accelerator.strip())
    accel = found.name if found else None
    account = check_service_account(service_account)
    vpc = check_network(network)
    subnet = check_subnetwork(subnetwork)
    flag = project_flag(project)  # malformed: bad input, raised
    zn = Resolved(zone_flags([zone])[0], "--zone") if zone is not None else None
    env = os.environ if env is None else env
    defaults = None if target.emulate else load_project_file(Path.cwd() if cwd is None else cwd)
    chosen = _doctor_provider(provider, found, defaults)
    if target.emulate:  # the embedded emulator's own; only flags are asked (as run does)
        proj: Resolved | None = flag or Resolved(EMULATED_PROJECT, "emulator")
        zn = zn or Resolved(EMULATED_ZONE, "emulator")
    else:
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
                    provider=chosen,
                )
    # tpulab's zone table is the Cloud TPU API's; on Compute, machineTypes.get asks the
    # zone itself (doctor's machine-type check), so a Compute-only type is not refused.
    offering = catalog.zones_offering(accel) if accel is not None else []
    if chosen == "tpu-api" and accel is not None and zn is not None and zn.value not in offering:
        raise ConfigError(
            f"Zone {zn.value} (from {zn.source}) does not offer {accel}.",
            hint=f"Zones that do: {', '.join(offering[:6])}."
            if offering
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
        provider=chosen,
    )


def _doctor_provider(
    flag: str | None, accelerator: catalog.Accelerator | None, defaults: ProjectDefaults | None
) -> catalog.Provider:
    """The provider whose checks doctor asks: with --accelerator as a run's (--provider,
    the workspace's, the type's default; a pair the catalog does not serve is refused);
    without one, --provider or the workspace's, else the Cloud TPU API."""
    if accelerator is not None:
        return _provider(flag, accelerator, defaults)[0]
    found = _from_file(defaults, "provider")
    text, source = (flag, "--provider") if flag is not None else (None, "")
    if text is None and found is not None:
        text, source = found.value, found.source
    if text is None:
        return "tpu-api"
    by_name: dict[str, catalog.Provider] = {name: name for name in catalog.PROVIDERS}
    if text.strip() not in by_name:
        raise ConfigError(
            f"Unknown provider {text!r} (from {source}).",
            hint="Use tpu-api (the Cloud TPU API) or compute (Compute Engine instances).",
        )
    return by_name[text.strip()]


def _short(network: str | None) -> str:
    """The network's name (a `projects/P/global/networks/N` path names N); `default`."""
    return network.rsplit("/", 1)[-1] if network else "default"
