"""Pre-flight checks of a project, before any money is spent (`tpulab doctor`).

Each check asks one of Google's project-level REST APIs and answers ok / problem /
unknown, with the exact fix (a gcloud command or the role to grant). One mechanism
serves both providers; the provider chooses what is asked (`ProviderChecks`:
`TPU_API_CHECKS`, or `compute_checks()` for Compute Engine instances):

    tpu-api /    Service Usage v1 services.get(tpu.googleapis.com, or
    compute-api  compute.googleapis.com for Compute): ENABLED or DISABLED
    permissions  Resource Manager v1 projects.testIamPermissions: what the caller holds
                 of what a run needs (`RUN_PERMISSIONS`, or `COMPUTE_RUN_PERMISSIONS`;
                 + actAs on a --service-account)
    vm-account   Resource Manager v1 projects.getIamPolicy: does the VM's account hold a
                 role that deletes its own VM (the watchdog's second line of defence)?
    machine-type (Compute, with --accelerator and a zone) Compute v1 machineTypes.get:
                 does the zone offer the accelerator's TPU machine type? (404: no)
    network      Compute v1 networks.get + firewalls.list: the network exists and a rule
                 lets tcp:22 in from outside
    private-access  (--internal-ip only) Compute v1 subnetworks.get: the VM's subnetwork
                 has Private Google Access (`privateIpGoogleAccess`), without which a VM
                 with no external IP reaches no Google API (its watchdog's TPU API)

"unknown" means the API would not say (the caller may not ask it); only "problem" is a
definite no. `preflight` is the cheap subset a run asks before its create (the
provider's API and permissions: two requests; with --internal-ip also private-access:
one or two more).
Nothing here creates or changes anything.

The same `ProjectApis` (tpulab.cloud.project_apis) reaches Google or one emulator URL
(which serves these paths, tpulab/emulator/project_apis.py); the session comes from
`tpulab.cloud.google`. The network and private-access checks are
tpulab.cloud.network_checks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tpulab.cloud.network_checks import Placement, private_access_check
from tpulab.cloud.project_apis import Body, Check, ProjectApis, api_message, error_reason
from tpulab.contract import DELETE_NODE_PERMISSION

if TYPE_CHECKING:
    pass

__all__ = [
    "COMPUTE_RUN_PERMISSIONS",
    "DELETE_ROLES",
    "RUN_PERMISSIONS",
    "TPU_API_CHECKS",
    "ProviderChecks",
    "api_check",
    "checks_for",
    "compute_checks",
    "machine_type_check",
    "permissions_check",
    "preflight",
    "refuse_on_problems",
    "tpu_api_check",
    "vm_account_check",
]

# What `tpulab run` calls: create, poll the operation, read, list, delete.
RUN_PERMISSIONS = (
    "tpu.nodes.create",
    "tpu.nodes.get",
    "tpu.nodes.list",
    DELETE_NODE_PERMISSION,
    "tpu.operations.get",
)
ACT_AS = "iam.serviceAccounts.actAs"
# The predefined roles that hold tpu.nodes.delete (a custom role may too: "unknown").
DELETE_ROLES = ("roles/tpu.admin", "roles/editor", "roles/owner")
TPU_SERVICE = "tpu.googleapis.com"

# What a Compute Engine run calls, as IAM names the permissions (docs/reference/
# compute-facts.md, "Permissions a Compute run needs", has each one's source):
# instances.insert with a boot disk made from an image, labels, metadata (ssh-keys,
# startup-script) and a service account, on a subnetwork; then get, list, delete,
# getGuestAttributes (the host keys) and zoneOperations.get. Compute checks the disk's
# and subnetwork's permissions at insert (its audit log names compute.disks.create and
# compute.subnetworks.use beside compute.instances.create). Not asked: the image's
# compute.images.useReadOnly, which is held on the image's project (a public image's
# project grants it to every account), not on the caller's.
COMPUTE_RUN_PERMISSIONS = (
    "compute.instances.create",
    "compute.disks.create",
    "compute.subnetworks.use",
    "compute.instances.setMetadata",
    "compute.instances.setLabels",
    "compute.instances.setServiceAccount",
    "compute.instances.get",
    "compute.instances.list",
    "compute.instances.getGuestAttributes",
    "compute.instances.delete",
    "compute.zoneOperations.get",
)
# An access config (an external IP) on a VPC subnetwork: not asked with --internal-ip.
COMPUTE_EXTERNAL_IP = "compute.subnetworks.useExternalIp"
COMPUTE_SERVICE = "compute.googleapis.com"
# The predefined role that holds every permission above (its name is the one Compute's
# pages tell users to ask for before creating VMs).
COMPUTE_ADMIN_ROLE = "roles/compute.instanceAdmin.v1"
# The predefined roles that hold compute.instances.delete (a custom role may too).
COMPUTE_DELETE_ROLES = (
    COMPUTE_ADMIN_ROLE,
    "roles/compute.instanceAdmin",
    "roles/editor",
    "roles/owner",
)


@dataclass(frozen=True)
class ProviderChecks:
    """What the checks ask of one provider: its API (the check's name, Service Usage's
    service and its title), what a run needs of the caller and the role that grants it,
    and what the VM's own account needs to delete its VM (the watchdog)."""

    provider: str
    api_check: str
    service: str
    title: str
    permissions: tuple[str, ...]
    admin_role: str
    delete_permission: str
    delete_roles: tuple[str, ...]
    vm_noun: str  # what the provider calls the VM: "node" or "instance"


TPU_API_CHECKS = ProviderChecks(
    provider="tpu-api",
    api_check="tpu-api",
    service=TPU_SERVICE,
    title="Cloud TPU API",
    permissions=RUN_PERMISSIONS,
    admin_role="roles/tpu.admin",
    delete_permission=DELETE_NODE_PERMISSION,
    delete_roles=DELETE_ROLES,
    vm_noun="node",
)


def compute_checks(*, external_ip: bool = True) -> ProviderChecks:
    """Compute Engine's checks; `external_ip` False (--internal-ip) leaves out the
    permission an access config needs."""
    extra = (COMPUTE_EXTERNAL_IP,) if external_ip else ()
    return ProviderChecks(
        provider="compute",
        api_check="compute-api",
        service=COMPUTE_SERVICE,
        title="Compute Engine API",
        permissions=COMPUTE_RUN_PERMISSIONS + extra,
        admin_role=COMPUTE_ADMIN_ROLE,
        delete_permission="compute.instances.delete",
        delete_roles=COMPUTE_DELETE_ROLES,
        vm_noun="instance",
    )


def checks_for(provider: str, *, external_ip: bool = True) -> ProviderChecks:
    """The checks of `provider` ("tpu-api" or "compute")."""
    return compute_checks(external_ip=external_ip) if provider == "compute" else TPU_API_CHECKS


def _member(account: str) -> str:
    """An IAM member for `account` ("MEMBER" when the account is not known)."""
    if not account:
        return "MEMBER"
    kind = "serviceAccount" if account.endswith(".gserviceaccount.com") else "user"
    return f"{kind}:{account}"


def _grant(project: str, member: str, role: str) -> str:
    return f"gcloud projects add-iam-policy-binding {project} --member={member} --role={role}"


def tpu_api_check(apis: ProjectApis, project: str) -> tuple[Check, str | None]:
    """Is the Cloud TPU API enabled? (`api_check` with the TPU API's checks.)"""
    return api_check(apis, project, TPU_API_CHECKS)


def api_check(apis: ProjectApis, project: str, checks: ProviderChecks) -> tuple[Check, str | None]:
    """Is the provider's API enabled? Also the project NUMBER (Service Usage names the
    service by it), which names the default compute service account."""
    service, name, title = checks.service, checks.api_check, checks.title
    status, body = apis.get("serviceusage", f"projects/{project}/services/{service}")
    enable = f"gcloud services enable {service} --project {project}"
    if status != 200:
        return (
            Check(
                name,
                "unknown",
                f"Service Usage would not say whether the {title} is enabled (HTTP "
                f"{status}: {api_message(body) or 'no message'}).",
                f"Check with `gcloud services list --enabled --project {project} "
                f"--filter=name:{service}`; to enable it: `{enable}`.",
            ),
            None,
        )
    parent = str(body.get("parent") or "")
    number = parent.removeprefix("projects/") if parent.startswith("projects/") else None
    if body.get("state") == "ENABLED":
        return Check(name, "ok", f"The {title} is enabled."), number
    state = str(body.get("state") or "not reported")
    summary = f"The {title} is not enabled in project {project} (state {state})."
    return Check(name, "problem", summary, f"Run `{enable}`."), number


def permissions_check(
    apis: ProjectApis,
    project: str,
    *,
    account: str,
    service_account: str | None,
    checks: ProviderChecks = TPU_API_CHECKS,
) -> Check:
    """Does the caller hold what a run needs? testIamPermissions answers only those held."""
    wanted = list(checks.permissions) + ([ACT_AS] if service_account else [])
    status, body = apis.post(
        "cloudresourcemanager", f"projects/{project}:testIamPermissions", {"permissions": wanted}
    )
    if status != 200:
        why = f"the {checks.title} is disabled" if error_reason(body) == "SERVICE_DISABLED" else ""
        return Check(
            "permissions",
            "unknown",
            f"Resource Manager would not say what you may do in {project} (HTTP {status}: "
            f"{api_message(body) or why or 'no message'}).",
            "Check that the project exists and that you can see it: "
            f"`gcloud projects describe {project}`.",
        )
    held = {str(p) for p in body.get("permissions") or []}
    missing = [p for p in wanted if p not in held]
    if not missing:
        return Check("permissions", "ok", f"You hold all {len(wanted)} permissions a run needs.")
    member = _member(account)
    fixes: list[str] = []
    if set(missing) - {ACT_AS}:
        fixes.append(f"`{_grant(project, member, checks.admin_role)}`")
    if ACT_AS in missing and service_account:
        fixes.append(
            f"`gcloud iam service-accounts add-iam-policy-binding {service_account} "
            f"--project {project} --member={member} --role=roles/iam.serviceAccountUser`"
        )
    who = account or "the caller"
    return Check(
        "permissions",
        "problem",
        f"{who} lacks {', '.join(missing)} in project {project}.",
        "Ask a project owner to run " + " and ".join(fixes) + " (console: IAM & Admin > IAM).",
    )


def vm_account_check(
    apis: ProjectApis,
    project: str,
    *,
    service_account: str | None,
    number: str | None,
    checks: ProviderChecks = TPU_API_CHECKS,
) -> Check:
    """Can the VM's account delete its own VM? Read from the project's IAM policy."""
    role, vm = checks.admin_role, checks.vm_noun
    account = service_account or (
        f"{number}-compute@developer.gserviceaccount.com" if number else ""
    )
    if not account:
        return Check(
            "vm-account",
            "unknown",
            "The VM's account (the default compute service account) is not known: the "
            "project number was not found.",
            f"Find it with `gcloud projects describe {project} --format='value(projectNumber)'`"
            " (the account is NUMBER-compute@developer.gserviceaccount.com) and check it "
            f"holds {role}, or pass --service-account.",
        )
    member = f"serviceAccount:{account}"
    status, body = apis.post(
        "cloudresourcemanager",
        f"projects/{project}:getIamPolicy",
        {"options": {"requestedPolicyVersion": 3}},
    )
    look = (
        f"gcloud projects get-iam-policy {project} --flatten=bindings[].members "
        f"--filter=bindings.members:{member} --format='value(bindings.role)'"
    )
    if status != 200:
        return Check(
            "vm-account",
            "unknown",
            f"Cannot read the IAM policy of {project} (HTTP {status}: "
            f"{api_message(body) or 'no message'}), so whether {account} may delete its "
            f"own {vm} (the watchdog needs it) is not known.",
            f"Ask a project owner to run `{look}`: it needs one of "
            f"{', '.join(checks.delete_roles)}.",
        )
    roles = _roles_of(body, member)
    granting = [held for held in roles if held in checks.delete_roles]
    if granting:
        return Check(
            "vm-account", "ok", f"{account} holds {granting[0]}: its watchdog can delete its {vm}."
        )
    custom = [held for held in roles if not held.startswith("roles/")]
    if custom:
        return Check(
            "vm-account",
            "unknown",
            f"{account} holds custom role(s) {', '.join(custom)}; whether one grants "
            f"{checks.delete_permission} is not read here.",
            f"Check with `gcloud iam roles describe ROLE` for each; or grant "
            f"`{_grant(project, member, role)}`.",
        )
    return Check(
        "vm-account",
        "problem",
        f"{account} holds no role in {project}'s policy that deletes a {checks.title} "
        f"{vm} ({checks.delete_permission}; e.g. a "
        '"secure by default" organisation gives the default compute account no Editor): '
        "the VM's watchdog could not delete a forgotten VM. (Roles granted on a folder or "
        "the organisation are not in the project's policy.)",
        f"Run `{_grant(project, member, role)}`, or "
        + (
            f"pass --service-account with an account that holds {role}."
            if service_account
            else _dedicated_account(project, role)
        ),
    )


def _dedicated_account(project: str, role: str = "roles/tpu.admin") -> str:
    """The three commands that make the VM a dedicated identity (issue: a default compute
    account with Editor is broader than a TPU VM needs, and gone in new organisations)."""
    account = f"tpulab-vm@{project}.iam.gserviceaccount.com"
    return (
        "give the VMs a dedicated account: "
        f"`gcloud iam service-accounts create tpulab-vm --project {project} "
        '--display-name="tpulab TPU VMs"`, '
        f"`{_grant(project, f'serviceAccount:{account}', role)}`, "
        f"`gcloud iam service-accounts add-iam-policy-binding {account} --project {project} "
        "--member=user:YOU --role=roles/iam.serviceAccountUser` (you act as it), then run "
        f"with --service-account {account} (or [tool.tpulab] service_account)."
    )


def _roles_of(policy: Body, member: str) -> list[str]:
    roles: list[str] = []
    for binding in policy.get("bindings") or []:
        if isinstance(binding, dict) and member in (binding.get("members") or []):
            roles.append(str(binding.get("role") or ""))
    return roles


def machine_type_check(
    apis: ProjectApis, project: str, zone: str | None, accelerator: str, machine_type: str
) -> Check:
    """Does `zone` offer the TPU machine type of `accelerator`? Compute's
    machineTypes.get (GET compute/v1/projects/P/zones/Z/machineTypes/M, gcloud's
    generated compute_v1_client.py MachineTypesService.Get) answers the MachineType, or
    404 notFound ("The resource 'projects/P/zones/Z/machineTypes/M' was not found") when
    the zone has no such type."""
    where = (
        f"`gcloud compute machine-types list --project {project} "
        f"--filter=name={machine_type} --format='value(zone)'`"
    )
    if zone is None:
        return Check(
            "machine-type",
            "unknown",
            f"No zone, so whether one offers {machine_type} ({accelerator}) was not asked.",
            f"Pass --zone; the zones that offer it: {where}.",
        )
    path = f"projects/{project}/zones/{zone}/machineTypes/{machine_type}"
    status, body = apis.get("compute", path)
    if status == 200:
        return Check("machine-type", "ok", f"Zone {zone} offers {machine_type} ({accelerator}).")
    if status == 404:
        return Check(
            "machine-type",
            "problem",
            f"Zone {zone} does not offer machine type {machine_type} ({accelerator}): "
            "Compute would refuse the instance.",
            f"Choose a zone that offers it: {where}, then pass it with --zone.",
        )
    return Check(
        "machine-type",
        "unknown",
        f"Compute would not show machine type {machine_type} in {zone} (HTTP {status}: "
        f"{api_message(body) or 'no message'}).",
        f"Check with `gcloud compute machine-types describe {machine_type} --zone {zone} "
        f"--project {project}`.",
    )


def preflight(
    apis: ProjectApis,
    project: str,
    *,
    account: str,
    service_account: str | None,
    internal_ip: Placement | None = None,
    checks: ProviderChecks = TPU_API_CHECKS,
) -> Sequence[Check]:
    """The cheap subset a run asks before its create: the provider's API enabled, the
    caller's permissions (`checks`: the TPU API's, or Compute's); and, for a VM without
    an external IP (`internal_ip`: where it would be), its subnetwork's Private Google
    Access."""
    api, _ = api_check(apis, project, checks)
    answered = [
        api,
        permissions_check(
            apis, project, account=account, service_account=service_account, checks=checks
        ),
    ]
    if internal_ip is not None:
        answered.append(private_access_check(apis, project, internal_ip))
    return answered


def refuse_on_problems(checks: Sequence[Check]) -> None:
    """A ConfigError naming each definite problem and its fix; "unknown" does not refuse
    (the API would not say: the create itself will, if it must)."""
    from tpulab.errors import ConfigError

    problems = [check for check in checks if check.status == "problem"]
    if problems:
        raise ConfigError(
            " ".join(check.summary for check in problems),
            hint=" ".join(check.fix or "" for check in problems).strip()
            + " (`tpulab doctor` checks everything.)",
        )
