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

The same `ProjectApis` reaches Google or one emulator URL (which serves these paths,
tpulab/emulator/project_apis.py); the session comes from `tpulab.cloud.google`.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from tpulab.catalog import region_of
from tpulab.contract import DELETE_NODE_PERMISSION
from tpulab.errors import UnreachableError

if TYPE_CHECKING:
    from tpulab.config import RunSpec

__all__ = [
    "COMPUTE_RUN_PERMISSIONS",
    "DELETE_ROLES",
    "RUN_PERMISSIONS",
    "TPU_API_CHECKS",
    "Check",
    "CheckStatus",
    "Placement",
    "ProjectApis",
    "ProviderChecks",
    "api_check",
    "checks_for",
    "compute_checks",
    "machine_type_check",
    "network_check",
    "permissions_check",
    "placement_of",
    "preflight",
    "private_access_check",
    "refuse_on_problems",
    "tpu_api_check",
    "vm_account_check",
]

CheckStatus = Literal["ok", "problem", "unknown"]
Body = dict[str, Any]

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

_GOOGLE_BASES = {
    "serviceusage": "https://serviceusage.googleapis.com/v1/",
    "cloudresourcemanager": "https://cloudresourcemanager.googleapis.com/v1/",
    "compute": "https://compute.googleapis.com/compute/v1/",
}
_LOCAL_PATHS = {"serviceusage": "v1/", "cloudresourcemanager": "v1/", "compute": "compute/v1/"}


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


@dataclass(frozen=True)
class Check:
    """One check's answer: `summary` says what was found, `fix` what to do (None: ok)."""

    name: str
    status: CheckStatus
    summary: str
    fix: str | None = None


class ProjectApis:
    """Service Usage, Resource Manager and Compute over one `requests` session, at
    Google (`api_endpoint` None) or at one emulator URL that serves all three."""

    def __init__(self, session: Any, api_endpoint: str | None, *, timeout: float = 30.0) -> None:
        self._session = session
        self._endpoint = api_endpoint
        self._timeout = timeout

    def url(self, api: str, path: str) -> str:
        if self._endpoint is None:
            return _GOOGLE_BASES[api] + path
        return f"{self._endpoint.rstrip('/')}/{_LOCAL_PATHS[api]}{path}"

    def get(self, api: str, path: str, params: dict[str, str] | None = None) -> tuple[int, Body]:
        return self._send("GET", self.url(api, path), params=params)

    def post(self, api: str, path: str, body: Body) -> tuple[int, Body]:
        return self._send("POST", self.url(api, path), json=body)

    def _send(self, method: str, url: str, **kwargs: Any) -> tuple[int, Body]:
        """(HTTP status, JSON body). No answer at all is not a check's "unknown": the
        whole doctor cannot work, so it is raised (UnreachableError)."""
        import requests

        try:
            answer = self._session.request(method, url, timeout=self._timeout, **kwargs)
        except requests.RequestException as error:
            raise UnreachableError(
                f"Could not reach {url.split('/v1/')[0]}: {type(error).__name__}.",
                status="UNAVAILABLE",
                api_message=str(error)[:300],
                hint="Check the network (or, for --api-endpoint, that the emulator runs).",
            ) from None
        try:
            body = answer.json()
        except ValueError:
            body = {}
        return int(answer.status_code), body if isinstance(body, dict) else {}


def _api_message(body: Body) -> str:
    error = body.get("error")
    return str(error.get("message") or "") if isinstance(error, dict) else ""


def _reason(body: Body) -> str:
    """The ErrorInfo reason of a Google error body (SERVICE_DISABLED, ...), or ""."""
    error = body.get("error")
    details = error.get("details") if isinstance(error, dict) else None
    for detail in details if isinstance(details, list) else []:
        if isinstance(detail, dict) and str(detail.get("@type", "")).endswith("ErrorInfo"):
            return str(detail.get("reason") or "")
    return ""


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
                f"{status}: {_api_message(body) or 'no message'}).",
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
        why = f"the {checks.title} is disabled" if _reason(body) == "SERVICE_DISABLED" else ""
        return Check(
            "permissions",
            "unknown",
            f"Resource Manager would not say what you may do in {project} (HTTP {status}: "
            f"{_api_message(body) or why or 'no message'}).",
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
            f"{_api_message(body) or 'no message'}), so whether {account} may delete its "
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
        f"{_api_message(body) or 'no message'}).",
        f"Check with `gcloud compute machine-types describe {machine_type} --zone {zone} "
        f"--project {project}`.",
    )


def network_check(apis: ProjectApis, project: str, network: str = "default") -> Check:
    """Does the network exist, and does a firewall rule let tcp:22 in from outside?"""
    status, body = apis.get("compute", f"projects/{project}/global/networks/{network}")
    ssh_rule = (
        f"gcloud compute firewall-rules create tpulab-allow-ssh --project {project} "
        f"--network {network} --direction INGRESS --allow tcp:22 --source-ranges 0.0.0.0/0"
    )
    if status == 404:
        return Check(
            "network",
            "problem",
            f"Project {project} has no `{network}` network: a TPU VM cannot be created in it.",
            f"Run `gcloud compute networks create {network} --project {project} "
            f"--subnet-mode auto` and then `{ssh_rule}`.",
        )
    if status != 200:
        return Check(
            "network",
            "unknown",
            f"Compute would not show network `{network}` (HTTP {status}: "
            f"{_api_message(body) or 'no message'}).",
            f"Check with `gcloud compute networks describe {network} --project {project}` "
            "(Compute Engine API enabled, and roles/compute.networkViewer).",
        )
    rules, listed = _firewalls(apis, project)
    if not listed:
        return Check(
            "network",
            "unknown",
            f"Network `{network}` exists; its firewall rules could not be listed.",
            f"Check with `gcloud compute firewall-rules list --project {project} "
            f"--filter=network:{network}` for one that allows tcp:22.",
        )
    letting_in = [rule["name"] for rule in rules if _lets_ssh_in(rule, network)]
    if letting_in:
        return Check(
            "network", "ok", f"Network `{network}` exists; rule {letting_in[0]} lets tcp:22 in."
        )
    return Check(
        "network",
        "problem",
        f"No firewall rule of network `{network}` lets tcp:22 in from outside: tpulab "
        "could not SSH to the VM.",
        f"Run `{ssh_rule}` (narrow --source-ranges to your address if you can).",
    )


def _firewalls(apis: ProjectApis, project: str) -> tuple[list[Body], bool]:
    """Every firewall rule of the project (all pages); False when Compute refused."""
    rules: list[Body] = []
    token = ""
    while True:
        params = {"pageToken": token} if token else None
        status, body = apis.get("compute", f"projects/{project}/global/firewalls", params)
        if status != 200:
            return rules, False
        rules += [item for item in body.get("items") or [] if isinstance(item, dict)]
        token = str(body.get("nextPageToken") or "")
        if not token:
            return rules, True


def _lets_ssh_in(rule: Body, network: str) -> bool:
    """An enabled INGRESS allow rule on `network`, for every VM (no target tags or
    accounts: tpulab's VMs carry none), from a range outside private addresses."""
    if not str(rule.get("network") or "").endswith(f"/global/networks/{network}"):
        return False
    if rule.get("disabled") or (rule.get("direction") or "INGRESS") != "INGRESS":
        return False
    if rule.get("targetTags") or rule.get("targetServiceAccounts"):
        return False
    if not any(_public(source) for source in rule.get("sourceRanges") or []):
        return False
    return any(_allows_22(allowed) for allowed in rule.get("allowed") or [])


def _public(cidr: object) -> bool:
    try:
        return not ipaddress.ip_network(str(cidr), strict=False).is_private
    except ValueError:
        return False


def _allows_22(allowed: object) -> bool:
    if not isinstance(allowed, dict):
        return False
    if str(allowed.get("IPProtocol") or "").lower() not in {"tcp", "all", "6"}:
        return False
    ports = allowed.get("ports") or []
    if not ports:
        return True  # no ports: every port of the protocol
    for port in ports:
        low, _, high = str(port).partition("-")
        if low.isdigit() and int(low) <= 22 <= int(high or low):
            return True
    return False


@dataclass(frozen=True)
class Placement:
    """Where a VM without an external IP would be: the zone, its VPC and subnetwork as
    the run gives them (`network` a short name; `subnetwork` a name, a path, or None)."""

    zone: str | None
    network: str = "default"
    subnetwork: str | None = None


def placement_of(spec: RunSpec) -> Placement | None:
    """Where `spec`'s VM would be when it has no external IP (--internal-ip), else None:
    its first zone, and its VPC and subnetwork as given. (A failover to a zone of
    another region is not asked again: the preflight is asked once per run.)"""
    if not spec.internal_ip:
        return None
    network = (spec.network or "default").rsplit("/", 1)[-1]
    return Placement(spec.zone.value, network, spec.subnetwork)


def private_access_check(apis: ProjectApis, project: str, placement: Placement) -> Check:
    """Has the subnetwork a VM without an external IP would get Private Google Access?
    The subnetwork is --subnetwork's, else the network's in the zone's region (read from
    networks.get: an auto-mode network has one per region, named as the network)."""
    region, named = _subnetwork_region(placement)
    if region is None:
        return Check(
            "private-access",
            "unknown",
            "No zone, so the subnetwork a VM would get (and its Private Google Access) "
            "is not known.",
            "Pass --zone (or --subnetwork projects/P/regions/R/subnetworks/S).",
        )
    names = [named] if named else _subnetworks_in(apis, project, placement.network, region)
    if names is None:
        return Check(
            "private-access",
            "unknown",
            f"Compute would not show network `{placement.network}`, so its subnetwork in "
            f"{region} is not known.",
            f"Check with `gcloud compute networks subnets list --project {project} "
            f"--network {placement.network} --regions {region}`.",
        )
    if not names:
        return Check(
            "private-access",
            "unknown",
            f"Network `{placement.network}` lists no subnetwork in {region}.",
            f"Create one, or pass --subnetwork: `gcloud compute networks subnets list "
            f"--project {project} --network {placement.network}`.",
        )
    answers = [_private_access(apis, project, region, name) for name in names]
    return _private_access_verdict(project, region, placement.network, names, answers)


def _subnetwork_region(placement: Placement) -> tuple[str | None, str | None]:
    """(the region, the subnetwork's short name or None): a subnetwork path names its
    region; otherwise the zone does."""
    subnetwork = placement.subnetwork
    parts = (subnetwork or "").split("/")
    if len(parts) == 6 and parts[2] == "regions":
        return parts[3], parts[5]
    region = region_of(placement.zone) if placement.zone else None
    return region, subnetwork or None


def _subnetworks_in(apis: ProjectApis, project: str, network: str, region: str) -> list[str] | None:
    """The network's subnetworks in `region` (names), from networks.get's `subnetworks`
    URLs; None when Compute would not show the network."""
    status, body = apis.get("compute", f"projects/{project}/global/networks/{network}")
    if status != 200:
        return None
    marker = f"/regions/{region}/subnetworks/"
    links = [str(link) for link in body.get("subnetworks") or []]
    return [link.rsplit("/", 1)[-1] for link in links if marker in link]


def _private_access(apis: ProjectApis, project: str, region: str, name: str) -> bool | str:
    """The subnetwork's `privateIpGoogleAccess`, or why it is not known (a sentence)."""
    status, body = apis.get("compute", f"projects/{project}/regions/{region}/subnetworks/{name}")
    if status == 404:
        return f"subnetwork `{name}` does not exist in {region}"
    if status != 200:
        return (
            f"Compute would not show subnetwork `{name}` (HTTP {status}: "
            f"{_api_message(body) or 'no message'})"
        )
    return bool(body.get("privateIpGoogleAccess"))


def _private_access_verdict(
    project: str, region: str, network: str, names: list[str], answers: list[bool | str]
) -> Check:
    where = ", ".join(f"`{name}`" for name in names) + f" ({region})"
    unknown = [answer for answer in answers if isinstance(answer, str)]
    if unknown:
        return Check(
            "private-access",
            "unknown",
            f"Whether subnetwork {where} has Private Google Access is not known: "
            + "; ".join(unknown)
            + ".",
            f"Check with `gcloud compute networks subnets list --project {project} "
            f"--network {network} --regions {region} "
            "--format='table(name,privateIpGoogleAccess)'`.",
        )
    if all(answers):
        return Check(
            "private-access",
            "ok",
            f"Subnetwork {where} has Private Google Access: a VM without an external IP "
            "reaches Google APIs. (Package downloads still need Cloud NAT or a mirror.)",
        )
    off = [name for name, answer in zip(names, answers, strict=True) if not answer]
    if len(off) < len(names):
        return Check(
            "private-access",
            "unknown",
            f"Of network `{network}`'s subnetworks in {region}, only "
            + ", ".join(f"`{n}`" for n in names if n not in off)
            + " has Private Google Access; which one a VM gets is not known.",
            "Pass --subnetwork with one that has it.",
        )
    return Check(
        "private-access",
        "problem",
        f"Subnetwork {where} has Private Google Access off: a VM without an external IP "
        "(--internal-ip) could not reach Google APIs (the API its watchdog deletes it "
        "through, metadata-token calls).",
        _private_access_fix(project, region, network, off[0]),
    )


def _private_access_fix(project: str, region: str, network: str, subnetwork: str) -> str:
    """Turn Private Google Access on; and, since it covers Google APIs only, how pip/uv
    downloads get out too (Cloud NAT, or a mirror inside the VPC)."""
    router = "tpulab-nat-router"
    return (
        f"Run `gcloud compute networks subnets update {subnetwork} --project {project} "
        f"--region {region} --enable-private-ip-google-access`. Package downloads (pip, "
        "uv, a uv-managed Python) need Cloud NAT as well: "
        f"`gcloud compute routers create {router} --project {project} --network {network} "
        f"--region {region} && gcloud compute routers nats create tpulab-nat --project "
        f"{project} --router {router} --region {region} --auto-allocate-nat-external-ips "
        "--nat-all-subnet-ip-ranges`; or use --python system with a package mirror the "
        "VPC reaches."
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
