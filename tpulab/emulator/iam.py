"""Who a node's processes are to the emulated APIs: its service account and its tokens.

A real TPU VM's metadata server hands out OAuth access tokens for the node's service
account; Google's APIs then check that account's IAM permissions. The emulator models
exactly that much:

- `identity_of(node)`: the node's service account (CreateNode's `serviceAccount`, else
  the project's default compute service account) and its scopes.
- `current_token(node, now)`: the token the metadata server hands out, rotated before it
  expires (as GCE's server refreshes its cached token); tokens live in the node record,
  so a restarted emulator still honours the ones it issued.
- `principal(nodes, authorization, now)`: the node whose token a request carries (None:
  no emulated token, the controller, which keeps owner rights as before).
- `granted(node, faults, permissions)`: the subset of permissions its identity holds:
  Editor-like TPU permissions, minus `tpu.nodes.delete` under the
  `node_identity_cannot_delete*` faults.
- `permission_denied(...)`: the API's 403 in its own words.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Iterable
from typing import Any

from tpulab.contract import DELETE_NODE_PERMISSION
from tpulab.emulator.faults import FaultPlan
from tpulab.emulator.wire import ApiError

__all__ = [
    "CLOUD_PLATFORM_SCOPE",
    "COMPUTE_DELETE_PERMISSION",
    "ROUTE_PERMISSIONS",
    "TOKEN_PREFIX",
    "check_permissions",
    "current_token",
    "granted",
    "identity_of",
    "permission_denied",
    "principal",
    "project_number",
    "unauthenticated",
]

Record = dict[str, Any]

CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
# Real access tokens start "ya29."; the rest marks them as the emulator's, so a request
# carrying some other bearer token (a developer's ADC) is not mistaken for a node's.
TOKEN_PREFIX = "ya29.tpulab-emulated."  # noqa: S105 (a marker, not a secret)
# GCE's tokens live an hour; its metadata server hands out a fresh one when the cached
# one has less than about five minutes left.
TOKEN_LIFETIME = 3600.0
TOKEN_REFRESH_MARGIN = 300.0

# What a VM's watchdog needs to delete its own Compute instance (instances.py).
COMPUTE_DELETE_PERMISSION = "compute.instances.delete"
# What the default compute service account (Editor) holds among the permissions the
# emulated APIs check. Editor has every tpu.* permission; tpu.nodes.delete is the one the
# watchdog needs (roles/tpu.admin grants it to a dedicated account).
_EDITOR_PERMISSIONS = frozenset(
    {
        "tpu.nodes.create",
        DELETE_NODE_PERMISSION,
        "tpu.nodes.get",
        "tpu.nodes.list",
        "tpu.nodes.update",
        "tpu.nodes.start",
        "tpu.nodes.stop",
        "tpu.operations.get",
        "tpu.operations.list",
        "tpu.locations.get",
        "tpu.locations.list",
        "tpu.acceleratortypes.get",
        "tpu.acceleratortypes.list",
        "tpu.runtimeversions.get",
        "tpu.runtimeversions.list",
        "tpu.queuedresources.create",
        "tpu.queuedresources.delete",
        "tpu.queuedresources.get",
        "tpu.queuedresources.list",
        "resourcemanager.projects.get",
        # Compute Engine's, for a TPU VM made as an instance (instances.py).
        "compute.instances.create",
        COMPUTE_DELETE_PERMISSION,
        "compute.instances.get",
        "compute.instances.list",
        "compute.instances.getGuestAttributes",
        "compute.instances.setMetadata",
        "compute.zoneOperations.get",
        "compute.zones.get",
    }
)
# service.resource.verb, as IAM spells every permission.
_PERMISSION = re.compile(r"^[a-z][a-zA-Z0-9]*\.[a-zA-Z0-9]+\.[a-zA-Z0-9]+$")

# API method (server route name) -> the permission a node identity needs to call it.
# Routes not named here (added later) are not checked.
ROUTE_PERMISSIONS = {
    "list_nodes": "tpu.nodes.list",
    "get_node": "tpu.nodes.get",
    "create_node": "tpu.nodes.create",
    "delete_node": DELETE_NODE_PERMISSION,
    "update_node": "tpu.nodes.update",
    "get_guest_attributes": "tpu.nodes.get",
    "get_operation": "tpu.operations.get",
    "list_operations": "tpu.operations.list",
    "get_location": "tpu.locations.get",
    "list_locations": "tpu.locations.list",
    "list_accelerator_types": "tpu.acceleratortypes.list",
    "get_accelerator_type": "tpu.acceleratortypes.get",
    "list_runtime_versions": "tpu.runtimeversions.list",
    "get_runtime_version": "tpu.runtimeversions.get",
    "list_queued_resources": "tpu.queuedresources.list",
    "create_queued_resource": "tpu.queuedresources.create",
    "get_queued_resource": "tpu.queuedresources.get",
    "delete_queued_resource": "tpu.queuedresources.delete",
}


def project_number(project: str) -> str:
    """A stable 12-digit project number for a project id (real numbers look like this)."""
    digest = int(hashlib.sha256(project.encode()).hexdigest()[:12], 16)
    return str(100_000_000_000 + digest % 900_000_000_000)


def identity_of(node: Record) -> tuple[str, list[str]]:
    """The node's service account email and scopes."""
    account = node.get("service_account") or {}
    email = str(account.get("email") or "")
    if email in {"", "default"}:
        email = f"{project_number(node['project'])}-compute@developer.gserviceaccount.com"
    scopes = [str(s) for s in account.get("scopes") or []] or [CLOUD_PLATFORM_SCOPE]
    return email, scopes


def current_token(node: Record, now: float) -> tuple[str, int]:
    """(access token, seconds it stays valid) for the node's identity, minting a new one
    when the newest has less than `TOKEN_REFRESH_MARGIN` left. Mutates the record."""
    tokens: dict[str, float] = node.setdefault("tokens", {})
    for token, expires_at in list(tokens.items()):
        if expires_at <= now:
            del tokens[token]
    newest = max(tokens.items(), key=lambda item: item[1], default=None)
    if newest is None or newest[1] - now < TOKEN_REFRESH_MARGIN:
        newest = (TOKEN_PREFIX + secrets.token_hex(24), now + TOKEN_LIFETIME)
        tokens[newest[0]] = newest[1]
    return newest[0], max(0, int(newest[1] - now) - 1)


def principal(nodes: Iterable[Record], authorization: str, now: float) -> Record | None:
    """The node whose emulated token `authorization` ("Bearer ...") carries; None when it
    carries none. An emulated token that is unknown or expired is refused (401)."""
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token.startswith(TOKEN_PREFIX):
        return None
    for node in nodes:
        expires_at = (node.get("tokens") or {}).get(token)
        if expires_at is not None and expires_at > now:
            return node
    raise unauthenticated()


def granted(node: Record, faults: FaultPlan, permissions: Iterable[str]) -> list[str]:
    """The permissions (of those asked, in their order) that the node's identity holds."""
    held = set(_EDITOR_PERMISSIONS)
    denied_here = node["name"] in faults.node_identity_cannot_delete_nodes
    if faults.node_identity_cannot_delete or denied_here:
        held.discard(DELETE_NODE_PERMISSION)
        held.discard(COMPUTE_DELETE_PERMISSION)  # the same identity, on either API
    return [p for p in permissions if p in held]


def check_permissions(permissions: Any) -> list[str]:
    """testIamPermissions' argument, refused (400) unless a list of permission names."""
    if not isinstance(permissions, list) or not all(isinstance(p, str) for p in permissions):
        raise ApiError(
            400, "INVALID_ARGUMENT", "Invalid value at 'permissions': want a list of strings."
        )
    for permission in permissions:
        if not _PERMISSION.match(permission):
            raise ApiError(
                400,
                "INVALID_ARGUMENT",
                f"Permission {permission} is not valid.",
            )
    return list(permissions)


def permission_denied(permission: str, resource: str) -> ApiError:
    # The API's wording, e.g. "Permission 'tpu.nodes.get' denied on 'projects/.../nodes/ai'"
    # (tensorflow/tpu#296); the ErrorInfo reason is IAM's.
    return ApiError(
        403,
        "PERMISSION_DENIED",
        f"Permission '{permission}' denied on '{resource}'",
        reason="IAM_PERMISSION_DENIED",
        metadata={"permission": permission, "resource": resource},
    )


def unauthenticated() -> ApiError:
    return ApiError(
        401,
        "UNAUTHENTICATED",
        "Request had invalid authentication credentials. Expected OAuth 2 access token, "
        "login cookie or other valid authentication credential.",
        reason="ACCESS_TOKEN_EXPIRED",
    )
