"""`tpulab doctor`: is this project ready for a run, before any money is spent?

The checks, in order, each ok / problem / unknown with its fix:

    credentials  ADC and the account they belong to (an emulator: its own caller)
    project      resolves as `run`'s does (tpulab.config.doctor)
    tpu-api, permissions, vm-account, network    tpulab.cloud.preflight
    private-access   with --internal-ip: the VM's subnetwork has Private Google Access

For the Compute Engine provider (a Compute-only --accelerator such as tpu7x-8, or
--provider compute) the same checks ask Compute's side (tpulab.cloud.preflight
`compute_checks`): compute-api instead of tpu-api, Compute's permissions and
delete role, and, with --accelerator, machine-type (the zone offers its machine type).

A check that cannot run because an earlier one failed is "unknown" and says why.
Nothing here creates anything. `run_preflight` is the cheap subset (the provider's API
+ permissions, + private-access for --internal-ip) a run asks before its create
(`preflight_for` gives the run engine its seam;
tpulab.cloud.preflight.refuse_on_problems turns definite problems into a ConfigError,
exit 2: nothing was created).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict

from tpulab.envelope import Envelope
from tpulab.errors import ConfigError, TpuLabError
from tpulab.exits import EXIT_CLOUD, EXIT_CONFIG, EXIT_OK
from tpulab.models import DEFER_BUILD

if TYPE_CHECKING:
    from collections.abc import Callable

    from tpulab.cloud.google import CallerSession
    from tpulab.cloud.network_checks import Placement
    from tpulab.cloud.preflight import ProviderChecks
    from tpulab.cloud.project_apis import Check
    from tpulab.config import RunSpec
    from tpulab.config.doctor import DoctorInputs

__all__ = [
    "CheckReport",
    "DoctorEnvelope",
    "doctor",
    "exit_status",
    "preflight_for",
    "run_preflight",
]

# Seconds each preflight request may take (Google answers these in well under one).
PREFLIGHT_TIMEOUT = 10.0
# Problems in these mean tpulab is not set up (exit 2); any other problem is the
# cloud project's (exit 3). docs/reference/exit-status.md says so.
_CONFIG_CHECKS = ("credentials", "project")


class CheckReport(BaseModel):
    """One check as `--json` reports it."""

    model_config = ConfigDict(defer_build=DEFER_BUILD, extra="forbid", frozen=True)

    name: str
    status: Literal["ok", "problem", "unknown"]
    summary: str
    fix: str | None


class DoctorEnvelope(Envelope):
    """`tpulab doctor --json`: `ok` is true when no check is a problem."""

    project: str | None
    account: str | None
    checks: list[CheckReport]
    exit_status: int


def _report(check: Check) -> CheckReport:
    return CheckReport(name=check.name, status=check.status, summary=check.summary, fix=check.fix)


def exit_status(checks: Sequence[Check]) -> int:
    """0 when nothing is a problem; 2 when credentials or project are; else 3."""
    problems = {check.name for check in checks if check.status == "problem"}
    if not problems:
        return EXIT_OK
    return EXIT_CONFIG if problems & set(_CONFIG_CHECKS) else EXIT_CLOUD


def envelope(inputs: DoctorInputs, account: str, checks: Sequence[Check]) -> DoctorEnvelope:
    status = exit_status(checks)
    return DoctorEnvelope(
        command="doctor",
        ok=status == EXIT_OK,
        project=inputs.project.value if inputs.project else None,
        account=account or None,
        checks=[_report(check) for check in checks],
        exit_status=status,
    )


@contextmanager
def _endpoint(inputs: DoctorInputs) -> Iterator[str | None]:
    """The URL asked: --api-endpoint, an embedded emulator's (--emulate), or None."""
    if not inputs.target.emulate:
        yield inputs.target.api_endpoint
        return
    from tpulab.app.embedded import emulated_target

    project = inputs.project.value if inputs.project else None
    with emulated_target(project) if project else emulated_target() as target:
        yield target.emulator.url


def doctor(inputs: DoctorInputs) -> tuple[str, list[Check]]:
    """(the caller's account, every check in order). Raises only when the endpoint
    cannot be reached at all (UnreachableError)."""
    from tpulab.cloud.preflight import checks_for
    from tpulab.cloud.project_apis import Check

    asked = checks_for(inputs.provider, external_ip=not inputs.internal_ip)
    with _endpoint(inputs) as url:
        credentials, session = _credentials(url)
        checks = [credentials]
        if inputs.project is None:
            error = inputs.project_error
            checks.append(
                Check(
                    "project",
                    "problem",
                    error.message if error else "No project.",
                    error.hint if error else None,
                )
            )
        else:
            project = inputs.project
            checks.append(Check("project", "ok", f"{project.value} (from {project.source})."))
        if session is None or inputs.project is None:
            why = "without credentials" if session is None else "without a project"
            for name in _cloud_check_names(inputs, asked):
                checks.append(Check(name, "unknown", f"Not checked {why}.", None))
            return "", checks
        checks += _cloud_checks(
            session,
            url,
            inputs.project.value,
            inputs.service_account,
            inputs.network,
            _placement(inputs),
            asked=asked,
            machine=_machine(inputs),
        )
        return session.account, checks


def _cloud_check_names(inputs: DoctorInputs, asked: ProviderChecks) -> list[str]:
    """The cloud checks' names, in their order, for `inputs` (as `_cloud_checks` asks)."""
    names = [asked.api_check, "permissions", "vm-account", "network"]
    if _machine(inputs) is not None:
        names.append("machine-type")
    return names + (["private-access"] if inputs.internal_ip else [])


def _machine(inputs: DoctorInputs) -> tuple[str | None, str, str] | None:
    """(zone, accelerator, its machine type) when doctor asks Compute whether the zone
    offers it: the Compute provider with an --accelerator; else None (the Cloud TPU
    API's zones are checked from the catalog before anything is asked)."""
    if inputs.provider != "compute" or inputs.accelerator is None:
        return None
    from tpulab import catalog

    machine_type = catalog.lookup(inputs.accelerator).machine_type
    if machine_type is None:  # check_provider refused such a pair already
        return None
    return (inputs.zone.value if inputs.zone else None, inputs.accelerator, machine_type)


def _placement(inputs: DoctorInputs) -> Placement | None:
    """Where a --internal-ip VM would be (None: doctor was not asked about one)."""
    from tpulab.cloud.network_checks import Placement

    if not inputs.internal_ip:
        return None
    zone = inputs.zone.value if inputs.zone else None
    return Placement(zone, inputs.network, inputs.subnetwork)


def _credentials(url: str | None) -> tuple[Check, CallerSession | None]:
    from tpulab.cloud.google import caller_session
    from tpulab.cloud.project_apis import Check

    try:
        session = caller_session(url)
    except ConfigError as error:
        return Check("credentials", "problem", error.message, error.hint), None
    except TpuLabError as error:  # a refresh that failed: the login expired or was revoked
        return Check("credentials", "problem", error.message, error.hint), None
    who = session.account or "an account Google would not name"
    return Check("credentials", "ok", f"{session.credentials}: {who}."), session


def _cloud_checks(
    session: CallerSession,
    url: str | None,
    project: str,
    service_account: str | None,
    network: str = "default",
    internal_ip: Placement | None = None,
    *,
    asked: ProviderChecks,
    machine: tuple[str | None, str, str] | None = None,
) -> list[Check]:
    from tpulab.cloud.network_checks import network_check, private_access_check
    from tpulab.cloud.preflight import (
        api_check,
        machine_type_check,
        permissions_check,
        vm_account_check,
    )
    from tpulab.cloud.project_apis import ProjectApis

    apis = ProjectApis(session.session, url)
    api, number = api_check(apis, project, asked)
    account = session.account
    checks = [
        api,
        permissions_check(
            apis, project, account=account, service_account=service_account, checks=asked
        ),
        vm_account_check(
            apis, project, service_account=service_account, number=number, checks=asked
        ),
        network_check(apis, project, network),
    ]
    if machine is not None:
        checks.append(machine_type_check(apis, project, *machine))
    if internal_ip is not None:
        checks.append(private_access_check(apis, project, internal_ip))
    return checks


def run_preflight(
    project: str,
    *,
    api_endpoint: str | None,
    service_account: str | None = None,
    internal_ip: Placement | None = None,
    provider: str = "tpu-api",
) -> list[Check]:
    """The cheap subset before a create (two requests): is the provider's API enabled
    (the Cloud TPU API, or Compute Engine for `provider` "compute"), and does the caller
    hold what a run needs of it? With `internal_ip` (where a VM without an external IP
    would be) also its subnetwork's Private Google Access (one or two more).
    `api_endpoint` is the client's (for --emulate, the embedded emulator's URL:
    `GoogleTpuApi.api_endpoint`)."""
    from tpulab.cloud.google import caller_session
    from tpulab.cloud.preflight import checks_for, preflight
    from tpulab.cloud.project_apis import ProjectApis

    session = caller_session(api_endpoint, with_account=False)
    # Short: two small reads before a create; an endpoint that does not answer in this
    # long is the create's to report (tpulab.run.provision).
    apis = ProjectApis(session.session, api_endpoint, timeout=PREFLIGHT_TIMEOUT)
    return list(
        preflight(
            apis,
            project,
            account=session.account,
            service_account=service_account,
            internal_ip=internal_ip,
            checks=checks_for(provider, external_ip=internal_ip is None),
        )
    )


def preflight_for(spec: RunSpec, api_endpoint: str | None) -> Callable[[], list[Check]]:
    """The run engine's preflight seam for `spec` (RunContext.preflight): asked once,
    however many attempts (zones, recoveries) the run makes, of `spec`'s provider (the
    Cloud TPU API's checks, or Compute's); `api_endpoint` is the client's (the embedded
    emulator's URL under --emulate)."""
    from tpulab.cloud.network_checks import placement_of

    answered: list[Check] | None = None

    def ask() -> list[Check]:
        nonlocal answered
        if answered is None:
            answered = run_preflight(
                spec.project.value,
                api_endpoint=api_endpoint,
                service_account=spec.service_account,
                internal_ip=placement_of(spec),  # None without --internal-ip
                provider=spec.provider,
            )
        return answered

    return ask
