"""The one Compute Engine call the emulator answers: `GET compute/v1/projects/{project}`.

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
"""

from __future__ import annotations

import base64
import re
import zlib
from typing import Any

from tpulab.contract import OS_LOGIN_METADATA

__all__ = ["COMPUTE_ROUTES", "compute_project"]

# (method, path pattern, handler name), as server.py's own routes.
COMPUTE_ROUTES: list[tuple[str, re.Pattern[str], str]] = [
    ("GET", re.compile(r"^/compute/v1/projects/(?P<project>[^/]+)$"), "get_compute_project"),
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
