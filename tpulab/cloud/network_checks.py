"""The network checks of `tpulab doctor` and of a run's preflight: the VPC network exists
and lets SSH in (`network_check`), and with --internal-ip the VM's subnetwork has Private
Google Access, without which a VM with no external IP reaches no Google API
(`private_access_check`). Asked through Compute's networks, firewalls and subnetworks
(`tpulab.cloud.project_apis.ProjectApis`); nothing here changes anything."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tpulab.catalog import region_of
from tpulab.cloud.project_apis import Body, Check, ProjectApis, api_message

if TYPE_CHECKING:
    from tpulab.config import RunSpec

__all__ = ["Placement", "network_check", "placement_of", "private_access_check"]


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
            f"{api_message(body) or 'no message'}).",
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
            f"{api_message(body) or 'no message'})"
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
