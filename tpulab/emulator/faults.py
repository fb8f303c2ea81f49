"""Faults the emulator can inject, chosen per test in-process or over the admin endpoint.

A `FaultPlan` is plain data: tests mutate `emulator.faults` directly, and an
out-of-process user POSTs the same field names as JSON to `/_emulator/faults`.
Counted faults (`transient`, `rate_limited`, `create_lost_replies`, `delete_failures`,
`garbled_deletes`) are consumed as they fire.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

__all__ = [
    "GUEST_ATTRIBUTE_ERRORS",
    "LAG_HEALTHS",
    "METHODS",
    "NEVER",
    "PREEMPTED_STATES",
    "FaultPlan",
    "unreachable_index_env",
]

# The method names `transient` understands ("*" means any call).
METHODS = (
    "create_node",
    "get_node",
    "list_nodes",
    "delete_node",
    "update_node",
    "get_guest_attributes",
    "get_operation",
    "list_operations",
    "get_location",
    "list_locations",
    "list_accelerator_types",
    "get_accelerator_type",
    "list_runtime_versions",
    "get_runtime_version",
    "create_queued_resource",
    "get_queued_resource",
    "list_queued_resources",
    "delete_queued_resource",
    "get_compute_project",
    "test_iam_permissions",
    "get_service",
    "get_iam_policy",
    "get_network",
    "list_firewalls",
    "get_subnetwork",
    "get_tokeninfo",
    # Compute's instances API (instances.py)
    "get_compute_zone",
    "get_machine_type",
    "insert_instance",
    "list_instances",
    "get_instance",
    "delete_instance",
    "set_instance_metadata",
    "get_instance_guest_attributes",
    "get_zone_operation",
    "wait_zone_operation",
    "aggregated_instances",
)

# How long a dead worker's SSH host waits before it listens: longer than any test or
# run (about 31 years), and short enough for asyncio's and threading's timers.
NEVER = 1e9

# What `preempt_as` may be: the states a reclaimed spot node is reported in.
PREEMPTED_STATES = ("PREEMPTED", "TERMINATED")

# What `preempt_lag_health` may be: the v2 Node's HealthValueValuesEnum, less unspecified.
LAG_HEALTHS = ("HEALTHY", "TIMEOUT", "UNHEALTHY_TENSORFLOW", "UNHEALTHY_MAINTENANCE")

# What `guest_attributes_error` may be: the HTTP status and google.rpc status it answers.
GUEST_ATTRIBUTE_ERRORS = {"NOT_FOUND": 404, "FAILED_PRECONDITION": 400}


@dataclass
class FaultPlan:
    stockout: bool = False
    """Every create operation fails with code 8 "no more capacity" (any zone)."""
    stockout_zones: list[str] = field(default_factory=list)
    """Create operations fail with a stockout in these zones only."""
    quota: bool = False
    """Create is refused synchronously with 429 RESOURCE_EXHAUSTED (quota)."""
    quota_zones: list[str] = field(default_factory=list)
    """Create in these zones is refused with a per-zone quota 429 ("... in zone Z")."""
    quota_regions: list[str] = field(default_factory=list)
    """Create in any zone of these regions is refused with a per-region quota 429
    ("... in region R"), which failover takes as "skip the region's other zones"."""
    deny_zones: list[str] = field(default_factory=list)
    """Create in these zones is refused with 403 IAM denial of tpu.nodes.create (reads
    and deletes still work, as with a role that may list but not create)."""
    invalid_type: bool = False
    """Create is refused with 400 "invalid AcceleratorType" whatever the type."""
    deny_projects: list[str] = field(default_factory=list)
    """Any call on these projects gets 403 PERMISSION_DENIED."""
    transient: dict[str, int] = field(default_factory=dict)
    """method name (or "*") -> how many of the next calls answer 503 UNAVAILABLE."""
    rate_limited: dict[str, int] = field(default_factory=dict)
    """method name (or "*") -> how many of the next calls answer 429 (requests/minute)."""
    create_lost_replies: int = 0
    """The next N CreateNode calls create the node, then answer 503 UNAVAILABLE: the API
    acted but its reply was lost (what a resend must notice, by the node's labels)."""
    delete_failures: int = 0
    """The next N delete operations end with an INTERNAL error; the node stays."""
    garbled_deletes: int = 0
    """The next N DeleteNode calls answer 200 with a body that is no Operation (its
    `done` a string), as a broken proxy or a truncated reply might: the client cannot
    parse it, and the node is not deleted."""
    delete_hangs: bool = False
    """Delete operations never finish; the node stays DELETING."""
    preempt_after: float | None = None
    """Spot nodes turn PREEMPTED this many seconds after READY."""
    preempt_nodes: int | None = None
    """How many spot nodes `preempt_after` may still preempt (one fewer per node it
    preempts); None: every one."""
    preempt_as: str = "PREEMPTED"
    """The state a preempted spot node ends in: PREEMPTED, or TERMINATED (a real state a
    reclaimed TPU VM may show instead; SkyPilot #1468)."""
    preempt_state_lag: float = 0.0
    """Seconds the API keeps saying READY after `preempt_after` stopped the VM (its SSH
    host and guest are gone at once), as the state can lag by about a minute
    (SkyPilot #849)."""
    preempt_notice: float = 0.0
    """Seconds between a spot VM being told it is preempted and it stopping: its metadata
    server's `instance/preempted` says TRUE for that long while the VM still runs, as
    Compute Engine gives a preempted VM a notice (an ACPI soft-off and the metadata value,
    about 30 s, on its "Preemption process" page for Spot VMs). 0: the VM stops at once."""
    preempt_lag_health: str = "HEALTHY"
    """The health a spot node reports while `preempt_state_lag` keeps its state READY
    after `preempt_after` stopped its VM: HEALTHY (the API has not noticed), or e.g.
    UNHEALTHY_MAINTENANCE (the v2 Node's "under maintenance/priority boost caused
    rescheduling"), which the controller takes as the reclaim without waiting out the
    lag."""
    create_preempted: int = 0
    """The next N spot create operations fail with code 3, the API's "preempted during
    create" ("... update is not supported while in state PREEMPTED")."""
    guest_attributes_delay: float = 0.0
    """Guest attributes (the host key) appear this many seconds after READY."""
    guest_attributes_error_for: float = 0.0
    """getGuestAttributes answers `guest_attributes_error` (instead of an empty list)
    until this many seconds after READY, as the API can before the agent publishes."""
    guest_attributes_error: str = "NOT_FOUND"
    """NOT_FOUND (404) or FAILED_PRECONDITION (400), for `guest_attributes_error_for`."""
    guest_attributes_disabled: bool = False
    """The organisation policy constraints/compute.disableGuestAttributesAccess is
    enforced: getGuestAttributes answers 400 FAILED_PRECONDITION naming the constraint,
    with a google.rpc.PreconditionFailure violation of that type (the shape of Google's
    org-policy refusals; the exact words of this one are not on record)."""
    ssh_refuse_for: float = 0.0
    """Passed to the host backend: the SSH server refuses connections this long."""
    dead_workers: list[int] = field(default_factory=list)
    """These workers' SSH hosts never listen (connections are refused), as on a VM
    whose sshd died: their guest attributes still publish host keys and port, their
    guest (metadata server, startup-script) still boots. Worker 0 is also a single-host
    node's only VM. Applies to nodes booted while it is set."""
    late_workers: dict[int, float] = field(default_factory=dict)
    """worker -> seconds its SSH host refuses connections after boot, like
    `ssh_refuse_for` for that worker only (the longer of the two wins). JSON keys are
    worker numbers as strings ({"2": 5.0})."""
    host_key_types: list[str] = field(default_factory=list)
    """Publish only these host key types (e.g. ["ssh-rsa"]: an image without ed25519);
    empty means every type the node's sshd serves."""
    no_external_ips: bool = False
    """An organisation policy strips external IPs: nodes get only an internal address
    (constraints/compute.vmExternalIpAccess)."""
    project_os_login: bool = False
    """Project metadata says enable-oslogin=TRUE: a node's ssh-keys are ignored (no key
    logs in) unless its own metadata says enable-oslogin: FALSE. The Compute project
    gcloud reads (compute.py) says so in its commonInstanceMetadata."""
    ensurepip_missing: bool = False
    """Passed to the host backend: nodes that become READY get an image whose python3
    lacks ensurepip, like Ubuntu without python3-venv (`python3 -m venv` refuses)."""
    node_identity_cannot_delete: bool = False
    """Every node's own identity (its metadata-server token) lacks tpu.nodes.delete, like
    a service account without roles/tpu.admin: testIamPermissions omits it and a DELETE
    with that token answers 403 PERMISSION_DENIED. The controller is unaffected."""
    node_identity_cannot_delete_nodes: list[str] = field(default_factory=list)
    """As `node_identity_cannot_delete`, for the nodes of these names only."""
    tpu_admins: list[str] = field(default_factory=list)
    """Service accounts the project's IAM policy binds to roles/tpu.admin (getIamPolicy),
    as a dedicated VM identity is granted it; unless `node_identity_cannot_delete`."""

    # The project as `tpulab doctor` sees it (project_apis.py); each is a negative answer.
    disabled_services: list[str] = field(default_factory=list)
    """Service Usage says these APIs are DISABLED; with "tpu.googleapis.com" every Cloud
    TPU API call answers 403 SERVICE_DISABLED, as a project that never enabled it."""
    caller_lacks: list[str] = field(default_factory=list)
    """Permissions the controller (the caller without a node token, otherwise the owner)
    does not hold: testIamPermissions omits them, a TPU call needing one answers 403, and
    "resourcemanager.projects.getIamPolicy" here makes getIamPolicy answer 403. Compute's
    permissions too (e.g. "compute.instances.create", "compute.disks.create"): Compute's
    calls that need one answer its 403 `forbidden` (instances.py)."""
    absent_machine_types: list[str] = field(default_factory=list)
    """"ZONE/MACHINE_TYPE" entries a zone does not offer (every TPU machine type is
    offered in every zone otherwise): machineTypes.get answers 404 notFound and an
    instance insert 400 invalid, as Compute answers a type the zone lacks."""
    no_default_network: bool = False
    """The project has no `default` network (deleted, or an organisation that skips it):
    Compute networks.get answers 404 notFound, and firewalls.list has no default rules."""
    custom_networks: list[str] = field(default_factory=list)
    """VPC networks the project has besides `default`, each auto-mode (a subnetwork of
    its name in every region): what `--network` / `--subnetwork` may name."""
    no_ssh_firewall: bool = False
    """The `default` network lacks its default-allow-ssh rule: nothing lets tcp:22 in."""
    private_google_access: bool = False
    """Every subnetwork has Private Google Access on (`gcloud compute networks subnets
    update S --enable-private-ip-google-access`). Off by default, as auto-mode
    subnetworks are created: a VM without an external IP then reaches no Google API."""
    package_index_unreachable: bool = False
    """Nodes booted while it is set reach no package index and no Python download, as a
    VM without an external IP whose subnetwork has no Cloud NAT: their sessions get
    UV_DEFAULT_INDEX, PIP_INDEX_URL and UV_PYTHON_INSTALL_MIRROR at a loopback port
    nothing listens on (`unreachable_index_env`)."""

    queued_invalid: bool = False
    """A queued resource FAILS when its capacity arrives with INVALID_ARGUMENT (a request
    the service accepted, then found it cannot fulfil), failedData.error a full
    google.rpc.Status. A quota failure of a queued resource is `quota_zones` /
    `quota_regions`: its node create is refused at provisioning, so it FAILS with the
    quota's RESOURCE_EXHAUSTED."""

    capacity_after: dict[str, float] = field(default_factory=dict)
    """zone (or "*") -> seconds before capacity arrives there. A queued resource waits
    that long after its creation, WAITING_FOR_RESOURCES (and FAILS if its validUntil
    passes first); a zone not named has capacity at once for it. A stocked-out zone
    (`stockout`, `stockout_zones`) named here gains capacity that long after the first
    create that met the stockout (what --retry-until-up waits for); one not named stays
    stocked out."""

    def refuse_for(self, worker: int) -> float:
        """How long worker `worker`'s SSH host refuses connections after boot (`NEVER`
        for a dead worker): `ssh_refuse_for`, `late_workers`, `dead_workers`."""
        with self._lock:
            if worker in self.dead_workers:
                return NEVER
            return max(self.ssh_refuse_for, self.late_workers.get(worker, 0.0))

    def capacity_delay(self, zone: str) -> float:
        return self.capacity_after.get(zone, self.capacity_after.get("*", 0.0))

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._stockout_began: float | None = None

    def take_transient(self, method: str) -> bool:
        """True (and one fewer left) if this call of `method` should fail with 503."""
        return self._take(self.transient, method)

    def take_rate_limited(self, method: str) -> bool:
        """True (and one fewer left) if this call of `method` should fail with 429."""
        return self._take(self.rate_limited, method)

    def _take(self, counts: dict[str, int], method: str) -> bool:
        with self._lock:
            for key in (method, "*"):
                if counts.get(key, 0) > 0:
                    counts[key] -= 1
                    return True
            return False

    def _take_one(self, counter: str) -> bool:
        """True (and one fewer left) while the count of fault `counter` is not used up."""
        with self._lock:
            left: int = getattr(self, counter)
            if left > 0:
                setattr(self, counter, left - 1)
            return left > 0

    def take_create_lost_reply(self) -> bool:
        return self._take_one("create_lost_replies")

    def take_garbled_delete(self) -> bool:
        return self._take_one("garbled_deletes")

    def take_delete_failure(self) -> bool:
        return self._take_one("delete_failures")

    def stockout_in(self, zone: str, now: float | None = None) -> bool:
        """Whether a create in `zone` meets a stockout (at `now`, for capacity_after)."""
        if not (self.stockout or zone in self.stockout_zones):
            return False
        if now is None or not ({zone, "*"} & set(self.capacity_after)):
            return True
        with self._lock:
            if self._stockout_began is None:
                self._stockout_began = now
            return now < self._stockout_began + self.capacity_delay(zone)

    def quota_message(self, zone: str) -> str | None:
        """The 429 quota message a create in `zone` gets, or None."""
        if self.quota or zone in self.quota_zones:
            return (
                "Quota limit 'TPUV5sLitepodServingPerProjectPerZoneForTPUAPI' has been "
                f"exceeded. Limit: 0 in zone {zone}."
            )
        region = zone.rsplit("-", 1)[0]
        if region in self.quota_regions:
            # The per-region wording SkyPilot's handler quotes for TPU QuotaFailure.
            return (
                "Quota 'TPUV5sLitepodPerProjectPerRegionForTPUAPI' exhausted. Limit 0 in "
                f"region {region}"
            )
        return None

    def take_preemption(self) -> bool:
        """True (and one fewer left) if `preempt_after` may preempt one more node."""
        with self._lock:
            if self.preempt_nodes is None:
                return True
            if self.preempt_nodes > 0:
                self.preempt_nodes -= 1
                return True
            return False

    def take_create_preempted(self) -> bool:
        return self._take_one("create_preempted")

    def to_dict(self) -> dict[str, Any]:
        with self._lock:
            return {f.name: _copy(getattr(self, f.name)) for f in fields(self)}

    def update(self, values: dict[str, Any]) -> None:
        """Set fields from JSON, refusing unknown names and wrong types (ValueError)."""
        defaults = FaultPlan()
        known = {f.name for f in fields(self)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown fault(s) {unknown}; known: {sorted(known)}")
        checked: dict[str, Any] = {}
        for name, value in values.items():
            checked[name] = _checked(name, value, getattr(defaults, name))
        ended = checked.get("preempt_as", self.preempt_as)
        if ended not in PREEMPTED_STATES:
            raise ValueError(f"preempt_as cannot be {ended!r}; known: {list(PREEMPTED_STATES)}")
        health = checked.get("preempt_lag_health", self.preempt_lag_health)
        if health not in LAG_HEALTHS:
            raise ValueError(f"preempt_lag_health cannot be {health!r}; known: {list(LAG_HEALTHS)}")
        error = checked.get("guest_attributes_error", self.guest_attributes_error)
        if error not in GUEST_ATTRIBUTE_ERRORS:
            raise ValueError(
                f"guest_attributes_error cannot be {error!r}; "
                f"known: {sorted(GUEST_ATTRIBUTE_ERRORS)}"
            )
        for name in ("transient", "rate_limited"):
            bad = sorted(set(checked.get(name, {})) - {*METHODS, "*"})
            if bad:
                raise ValueError(f"unknown method(s) in {name}: {bad}; known: {METHODS}")
        with self._lock:
            for name, value in checked.items():
                setattr(self, name, value)
            if "capacity_after" in checked or "stockout_zones" in checked:
                self._stockout_began = None  # a new plan: its clock starts again

    def reset(self) -> None:
        self.update(FaultPlan().to_dict())


def unreachable_index_env(faults: FaultPlan) -> dict[str, str]:
    """What `package_index_unreachable` adds to a booting node's environment: every
    download source at a loopback port that was free a moment ago (bound, then closed),
    so a connection is refused as a network without a route refuses it; {} when off."""
    if not faults.package_index_unreachable:
        return {}
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}"
    return {
        "UV_DEFAULT_INDEX": f"{closed}/simple",
        "PIP_INDEX_URL": f"{closed}/simple",
        "UV_PYTHON_INSTALL_MIRROR": f"{closed}/python-build-standalone",
    }


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return dict(value)
    if isinstance(value, list):
        return list(value)
    return value


def _worker_number(value: Any) -> int:
    """A worker number from JSON: a non-negative int, or its decimal string (a key)."""
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise ValueError(f"{value!r} is not a worker number")


def _dead_workers(value: Any) -> list[int]:
    if isinstance(value, list) and all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value
    ):
        return sorted(set(value))
    raise ValueError(f"fault 'dead_workers' cannot be {value!r}: want a list of workers")


def _late_workers(value: Any) -> dict[int, float]:
    if isinstance(value, dict) and all(
        isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
        for v in value.values()
    ):
        return {_worker_number(k): float(v) for k, v in value.items()}
    raise ValueError(f"fault 'late_workers' cannot be {value!r}: want worker -> seconds")


_WORKER_FAULTS: dict[str, Callable[[Any], Any]] = {
    "dead_workers": _dead_workers,
    "late_workers": _late_workers,
}

# Faults that may be None ("off"), and the type their value has otherwise.
_OPTIONAL: dict[str, Any] = {"preempt_after": 0.0, "preempt_nodes": 0}


def _checked(name: str, value: Any, default: Any) -> Any:
    if name in _WORKER_FAULTS:
        return _WORKER_FAULTS[name](value)
    if name == "capacity_after":
        # Seconds, so any finite number >= 0 (the other maps count calls: ints only).
        if isinstance(value, dict) and all(
            isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
            for v in value.values()
        ):
            return {str(k): float(v) for k, v in value.items()}
        raise ValueError(f"fault {name!r} cannot be {value!r}")
    if name in _OPTIONAL:
        if value is None:
            return None
        default = _OPTIONAL[name]
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
    elif isinstance(default, float):
        if (
            isinstance(value, (int, float))
            and not isinstance(value, bool)
            and math.isfinite(value)
            and value >= 0
        ):
            return float(value)
    elif isinstance(default, int):
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    elif isinstance(default, str):
        if isinstance(value, str):
            return value
    elif isinstance(default, list):
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return list(value)
    elif isinstance(default, dict) and (
        isinstance(value, dict)
        and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value.values())
    ):
        return {str(k): v for k, v in value.items()}
    raise ValueError(f"fault {name!r} cannot be {value!r}")
