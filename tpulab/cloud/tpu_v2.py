"""What the Cloud TPU v2 API needs in a node request for a tpulab run.

The run engine (tpulab.run.provision) knows a run's key and watchdog; how they reach a
TPU VM -- the `ssh-keys` metadata the guest agent installs, OS Login off so it does,
guest attributes on for the host key, a startup-script for the watchdog, the scopes its
token needs -- is this API's business, kept here beside its wire (tpulab.cloud.rest).
"""

from __future__ import annotations

from tpulab.config import RunSpec
from tpulab.contract import (
    GUEST_ATTRIBUTES_METADATA,
    OS_LOGIN_METADATA,
    SSH_KEYS_METADATA,
    STARTUP_SCRIPT_METADATA,
)
from tpulab.models import NodeRequest

__all__ = ["CLOUD_PLATFORM_SCOPE", "node_request"]

# What the watchdog's service account may do with its metadata token: deleting the node
# needs the Cloud TPU API, which cloud-platform covers.
CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"


def node_request(spec: RunSpec, *, ssh_keys: str, startup_script: str | None) -> NodeRequest:
    """The node `spec` asks for: its labels, `ssh_keys` (the per-run key's metadata
    line) and the watchdog's `startup_script` (None: --no-watchdog)."""
    metadata = {
        SSH_KEYS_METADATA: ssh_keys,
        # Our key reaches the VM only through ssh-keys, which OS Login would make the
        # guest agent ignore; the host key only through guest attributes.
        OS_LOGIN_METADATA: "FALSE",
        GUEST_ATTRIBUTES_METADATA: "TRUE",
    }
    if startup_script is not None:
        metadata[STARTUP_SCRIPT_METADATA] = startup_script
    return NodeRequest(
        accelerator_type=spec.accelerator.name,
        runtime_version=spec.accelerator.runtime_version,
        labels=spec.labels,
        metadata=metadata,
        spot=spec.spot,
        description=f"tpulab run {spec.run_id}",
        external_ips=not spec.internal_ip,
        service_account_email=spec.service_account or "",
        # The watchdog's token must reach the TPU API; without a watchdog the VM keeps
        # the API's default scopes unless an account was asked for.
        service_account_scopes=(CLOUD_PLATFORM_SCOPE,)
        if startup_script is not None or spec.service_account
        else (),
    )
