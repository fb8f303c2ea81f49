"""Compute Engine calls the emulator answers: `GET compute/v1/projects/{project}`, and
`subnetworks.get` (`GET compute/v1/projects/{p}/regions/{r}/subnetworks/{s}`).

`gcloud compute tpus tpu-vm ssh` asks it before touching the node: the project's
`commonInstanceMetadata` decides whether OS Login is on (gcloud
`command_lib/util/ssh/ssh.py` `FeatureEnabledInMetadata`, called from
`command_lib/compute/tpus/tpu_vm/ssh.py` `PrepareNodeForSSH`) and whether its key is
already in the project's `ssh-keys` (`AddSSHKeyIfNeeded`; if not, it UpdateNodes the
node). gcloud reaches it with `CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE=<emulator>/compute/v1/`.

The project here is as plain as a fresh one: no project-wide ssh-keys, and OS Login
off unless the `project_os_login` fault plays an organisation that turns it on
(`enable-oslogin=TRUE`, the same fault under which the emulated guest agent ignores a
node's ssh-keys). The field names are the Compute v1 `Project` resource's.

Subnetworks are the auto-mode ones every network here has (project_apis.py
`project_networks`): one per region, named as the network, listed in the network's
`subnetworks` as full URLs. Their `privateIpGoogleAccess` (Private Google Access: may a
VM without an external IP reach Google APIs?) is false, as `gcloud compute networks
create --subnet-mode auto` makes them, unless the `private_google_access` fault plays a
project that turned it on. Field names: gcloud's generated Compute v1 messages, class
`Subnetwork` (googlecloudsdk/generated_clients/apis/compute/v1/compute_v1_messages.py).
"""

from __future__ import annotations

import base64
import re
import zlib
from typing import Any

from tpulab.contract import OS_LOGIN_METADATA
from tpulab.emulator.zones import ZONES

__all__ = ["COMPUTE_ROUTES", "compute_project", "subnetwork", "subnetwork_links"]

_COMPUTE = "https://www.googleapis.com/compute/v1/projects/"
# The auto-mode /20 of each region (Google's VPC documentation, "Auto mode IPv4
# ranges"); a region not listed here gets one derived from its name inside 10.128.0.0/9.
_AUTO_RANGES = {
    "us-central1": "10.128.0.0/20",
    "europe-west1": "10.132.0.0/20",
    "us-west1": "10.138.0.0/20",
    "asia-east1": "10.140.0.0/20",
    "us-east1": "10.142.0.0/20",
    "asia-northeast1": "10.146.0.0/20",
    "europe-west4": "10.164.0.0/20",
    "us-west4": "10.182.0.0/20",
    "us-east5": "10.202.0.0/20",
    "us-south1": "10.206.0.0/20",
}

# (method, path pattern, handler name), as server.py's own routes.
COMPUTE_ROUTES: list[tuple[str, re.Pattern[str], str]] = [
    ("GET", re.compile(r"^/compute/v1/projects/(?P<project>[^/]+)$"), "get_compute_project"),
    (
        "GET",
        re.compile(
            r"^/compute/v1/projects/(?P<project>[^/]+)/regions/(?P<region>[^/]+)"
            r"/subnetworks/(?P<subnetwork>[^/]+)$"
        ),
        "get_subnetwork",
    ),
]


def compute_project(project: str, *, os_login: bool) -> dict[str, Any]:
    """The Compute `Project` resource of `project`, as compute.projects.get answers it."""
    items = [{"key": OS_LOGIN_METADATA, "value": "TRUE"}] if os_login else []
    # A stable id per project name (Compute ids are uint64 written as strings).
    project_id = str(4_000_000_000_000 + zlib.crc32(project.encode("utf-8")))
    return {
        "kind": "compute#project",
        "id": project_id,
        "name": project,
        "selfLink": f"https://www.googleapis.com/compute/v1/projects/{project}",
        "creationTimestamp": "2024-01-01T00:00:00.000-08:00",
        "commonInstanceMetadata": {
            "kind": "compute#metadata",
            # Base64 bytes that change with the items, as Compute's optimistic-lock value.
            "fingerprint": base64.b64encode(
                zlib.crc32(repr(items).encode("utf-8")).to_bytes(8, "big")
            ).decode("ascii"),
            "items": items,
        },
        "defaultServiceAccount": f"{project_id}-compute@developer.gserviceaccount.com",
        "xpnProjectStatus": "UNSPECIFIED_XPN_PROJECT_STATUS",
        "defaultNetworkTier": "PREMIUM",
    }


def _regions() -> list[str]:
    """The regions an auto-mode network has a subnetwork in: every region with a TPU zone
    (the emulator's own zone table, not the controller's catalog)."""
    return sorted({zone.rsplit("-", 1)[0] for zone in ZONES})


def _auto_range(region: str) -> str:
    if region in _AUTO_RANGES:
        return _AUTO_RANGES[region]
    third = 128 + 16 * (zlib.crc32(region.encode("utf-8")) % 8)
    return f"10.{third}.0.0/20"


def subnetwork_links(project: str, network: str) -> list[str]:
    """An auto-mode network's `subnetworks`, as networks.get lists them (full URLs)."""
    return [f"{_COMPUTE}{project}/regions/{r}/subnetworks/{network}" for r in _regions()]


def subnetwork(
    project: str, region: str, name: str, *, networks: list[str], private_google_access: bool
) -> tuple[int, dict[str, Any]]:
    """Compute `subnetworks.get`: the auto-mode subnetwork `name` of network `name` in
    `region`, or Compute's 404 notFound."""
    if name not in networks or region not in _regions():
        resource = f"projects/{project}/regions/{region}/subnetworks/{name}"
        message = f"The resource '{resource}' was not found"
        return 404, {
            "error": {
                "code": 404,
                "message": message,
                "errors": [{"message": message, "domain": "global", "reason": "notFound"}],
            }
        }
    cidr = _auto_range(region)
    return 200, {
        "kind": "compute#subnetwork",
        "id": str(5_000_000_000_000 + zlib.crc32(f"{project}/{region}/{name}".encode())),
        "creationTimestamp": "2024-01-01T00:00:00.000-08:00",
        "name": name,
        "network": f"{_COMPUTE}{project}/global/networks/{name}",
        "ipCidrRange": cidr,
        "gatewayAddress": cidr.rsplit(".", 2)[0] + ".0.1",
        "region": f"{_COMPUTE}{project}/regions/{region}",
        "selfLink": f"{_COMPUTE}{project}/regions/{region}/subnetworks/{name}",
        "privateIpGoogleAccess": private_google_access,
        "fingerprint": base64.b64encode(zlib.crc32(name.encode()).to_bytes(8, "big")).decode(),
        "stackType": "IPV4_ONLY",
        "purpose": "PRIVATE",
    }
