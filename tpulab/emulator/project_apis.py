"""The project-level Google APIs `tpulab doctor` asks, in their real REST shapes.

    Service Usage v1      GET  /v1/projects/{p}/services/{service}       services.get
    Resource Manager v1   POST /v1/projects/{p}:getIamPolicy             projects.getIamPolicy
    Compute v1            GET  /compute/v1/projects/{p}/global/networks/{n}   networks.get
    Compute v1            GET  /compute/v1/projects/{p}/global/firewalls      firewalls.list
    OAuth2                GET  /tokeninfo                                 whose token this is

(testIamPermissions is server.py's own route.) The shapes are the discovery documents'
(`GoogleApiServiceusageV1Service`, `Policy`, `Network`, `FirewallList`; gcloud's
generated apitools messages carry the same fields). The project is as a fresh one is:
the Cloud TPU API enabled; the caller the owner; the default compute service account an
Editor (the grant "secure by default" organisations no longer make); a `default` network
in auto mode with the default-allow-* firewall rules. Each negative answer is a fault
(faults.py): `disabled_services`, `caller_lacks`, `node_identity_cannot_delete`,
`no_default_network`, `no_ssh_firewall`.

Compute answers its errors in its own shape (`errors[]` with `reason`, no `status`),
so its handlers return them rather than raise an `ApiError` (the TPU API's shape); with
compute.googleapis.com in `disabled_services` they answer Compute's 403
accessNotConfigured (instances.py `compute_disabled`), as every Compute call does.

Service Usage knows every service by name, ENABLED unless `disabled_services` names it:
tpu.googleapis.com and compute.googleapis.com are the two tpulab asks about.
"""

from __future__ import annotations

import base64
import re
import zlib
from typing import Any

from tpulab.emulator.compute import subnetwork_links
from tpulab.emulator.faults import FaultPlan
from tpulab.emulator.iam import project_number
from tpulab.emulator.instances import COMPUTE_SERVICE, compute_disabled
from tpulab.emulator.wire import ApiError

__all__ = [
    "CALLER_ACCOUNT",
    "PROJECT_ROUTES",
    "firewall_list",
    "iam_policy",
    "network",
    "service",
    "service_disabled",
    "tokeninfo",
]

Record = dict[str, Any]

# Who the emulator's controller is (it sends no credentials): the project's owner.
CALLER_ACCOUNT = "owner@tpulab-emulator.example"

# (method, path pattern, handler name), as server.py's own routes.
PROJECT_ROUTES: list[tuple[str, re.Pattern[str], str]] = [
    (
        "GET",
        re.compile(r"^/v1/projects/(?P<project>[^/:]+)/services/(?P<service>[^/:]+)$"),
        "get_service",
    ),
    ("POST", re.compile(r"^/v1/projects/(?P<project>[^/:]+):getIamPolicy$"), "get_iam_policy"),
    # OAuth2's tokeninfo (oauth2.googleapis.com/tokeninfo): whom the caller's token is.
    ("GET", re.compile(r"^/tokeninfo$"), "get_tokeninfo"),
    (
        "GET",
        re.compile(r"^/compute/v1/projects/(?P<project>[^/]+)/global/networks/(?P<network>[^/]+)$"),
        "get_network",
    ),
    (
        "GET",
        re.compile(r"^/compute/v1/projects/(?P<project>[^/]+)/global/firewalls$"),
        "list_firewalls",
    ),
]

_TITLES = {"tpu.googleapis.com": "Cloud TPU API", "compute.googleapis.com": "Compute Engine API"}
_COMPUTE = "https://www.googleapis.com/compute/v1/projects/"


def tokeninfo() -> Record:
    """OAuth2 tokeninfo of the controller, who sends no token: the project owner. (Google
    answers for the `access_token` given; its fields are these, `exp` in epoch seconds.)"""
    return {
        "email": CALLER_ACCOUNT,
        "email_verified": "true",
        "scope": "https://www.googleapis.com/auth/cloud-platform openid "
        "https://www.googleapis.com/auth/userinfo.email",
        "access_type": "offline",
    }


def service(project: str, name: str, faults: FaultPlan) -> Record:
    """Service Usage's `GoogleApiServiceusageV1Service`: named by project NUMBER."""
    number = project_number(project)
    return {
        "name": f"projects/{number}/services/{name}",
        "parent": f"projects/{number}",
        "config": {"name": name, "title": _TITLES.get(name, name)},
        "state": "DISABLED" if name in faults.disabled_services else "ENABLED",
    }


def service_disabled(project: str, name: str = "tpu.googleapis.com") -> ApiError:
    """What any call of a disabled API answers: 403 with ErrorInfo SERVICE_DISABLED."""
    number = project_number(project)
    title = _TITLES.get(name, name)
    return ApiError(
        403,
        "PERMISSION_DENIED",
        f"{title} has not been used in project {number} before or it is disabled. Enable "
        f"it by visiting https://console.developers.google.com/apis/api/{name}/overview"
        f"?project={number} then retry. If you enabled this API recently, wait a few "
        "minutes for the action to propagate to our systems and retry.",
        reason="SERVICE_DISABLED",
        metadata={"consumer": f"projects/{number}", "service": name},
    )


def iam_policy(project: str, faults: FaultPlan) -> Record:
    """Resource Manager's `Policy` of the project; 403 when the caller may not read it."""
    permission = "resourcemanager.projects.getIamPolicy"
    if permission in faults.caller_lacks:
        raise ApiError(
            403,
            "PERMISSION_DENIED",
            f"The caller does not have permission (needs {permission} on projects/{project})",
            reason="IAM_PERMISSION_DENIED",
            metadata={"permission": permission},
        )
    compute_account = f"{project_number(project)}-compute@developer.gserviceaccount.com"
    bindings = [{"role": "roles/owner", "members": [f"user:{CALLER_ACCOUNT}"]}]
    if not faults.node_identity_cannot_delete:
        # The automatic Editor grant of the default compute service account.
        bindings.append({"role": "roles/editor", "members": [f"serviceAccount:{compute_account}"]})
        if faults.tpu_admins:
            members = [f"serviceAccount:{email}" for email in faults.tpu_admins]
            bindings.append({"role": "roles/tpu.admin", "members": members})
    etag = base64.b64encode(zlib.crc32(repr(bindings).encode()).to_bytes(8, "big")).decode()
    return {"version": 1, "etag": etag, "bindings": sorted(bindings, key=lambda b: b["role"])}


def _compute_error(code: int, reason: str, message: str) -> tuple[int, Record]:
    return code, {
        "error": {
            "code": code,
            "message": message,
            "errors": [{"message": message, "domain": "global", "reason": reason}],
        }
    }


def _disabled(project: str) -> tuple[int, Record]:
    error = compute_disabled(project)
    return error.code, error.body()


def _id(*parts: str) -> str:
    """A stable uint64-looking id, as Compute writes ids (strings)."""
    return str(5_000_000_000_000 + zlib.crc32("/".join(parts).encode()))


def project_networks(faults: FaultPlan) -> list[str]:
    """The project's VPC networks: `default` (unless the fault removed it) and the
    custom ones the faults give it."""
    return [*([] if faults.no_default_network else ["default"]), *faults.custom_networks]


def network(project: str, name: str, faults: FaultPlan) -> tuple[int, Record]:
    """Compute `networks.get`: the auto-mode `default` network, or 404 notFound."""
    if COMPUTE_SERVICE in faults.disabled_services:
        return _disabled(project)
    link = f"{_COMPUTE}{project}/global/networks/{name}"
    if name not in project_networks(faults):
        resource = f"projects/{project}/global/networks/{name}"
        return _compute_error(404, "notFound", f"The resource '{resource}' was not found")
    return 200, {
        "kind": "compute#network",
        "id": _id(project, name),
        "creationTimestamp": "2024-01-01T00:00:00.000-08:00",
        "name": name,
        "description": "Default network for the project",
        "selfLink": link,
        "autoCreateSubnetworks": True,
        "subnetworks": subnetwork_links(project, name),
        "routingConfig": {"routingMode": "REGIONAL"},
        "networkFirewallPolicyEnforcementOrder": "AFTER_CLASSIC_FIREWALL",
    }


def _rule(project: str, name: str, allowed: list[Record], sources: list[str]) -> Record:
    return {
        "kind": "compute#firewall",
        "id": _id(project, "firewall", name),
        "creationTimestamp": "2024-01-01T00:00:00.000-08:00",
        "name": name,
        "description": f"Allow {name.removeprefix('default-allow-')} from anywhere",
        "network": f"{_COMPUTE}{project}/global/networks/default",
        "priority": 65534,
        "sourceRanges": sources,
        "allowed": allowed,
        "direction": "INGRESS",
        "logConfig": {"enable": False},
        "disabled": False,
        "selfLink": f"{_COMPUTE}{project}/global/firewalls/{name}",
    }


def firewall_list(project: str, faults: FaultPlan) -> tuple[int, Record]:
    """Compute `firewalls.list`: the rules a `default` network is created with."""
    if COMPUTE_SERVICE in faults.disabled_services:
        return _disabled(project)
    rules: list[Record] = []
    if not faults.no_default_network:
        anywhere = ["0.0.0.0/0"]
        rules.append(_rule(project, "default-allow-icmp", [{"IPProtocol": "icmp"}], anywhere))
        internal: list[Record] = [
            {"IPProtocol": "tcp", "ports": ["0-65535"]},
            {"IPProtocol": "udp", "ports": ["0-65535"]},
            {"IPProtocol": "icmp"},
        ]
        rules.append(_rule(project, "default-allow-internal", internal, ["10.128.0.0/9"]))
        rdp = [{"IPProtocol": "tcp", "ports": ["3389"]}]
        rules.append(_rule(project, "default-allow-rdp", rdp, anywhere))
        if not faults.no_ssh_firewall:
            ssh = [{"IPProtocol": "tcp", "ports": ["22"]}]
            rules.append(_rule(project, "default-allow-ssh", ssh, anywhere))
    return 200, {
        "kind": "compute#firewallList",
        "id": f"projects/{project}/global/firewalls",
        "items": sorted(rules, key=lambda rule: rule["name"]),
        "selfLink": f"{_COMPUTE}{project}/global/firewalls",
    }
