"""The VM's dead man's switch, controller side: the startup-script, the lease, the state.

`remote_payloads/watchdog.py` runs on the VM (see its docstring for what it does and the
real-GCP facts it rests on). This module builds what arms it and reads what it says:

- `startup_script(config)`: the node's metadata `startup-script`, a small `sh` wrapper
  that pipes the watchdog's source into `python3 - --config JSON`. Everything in it is
  visible to project members (node metadata), so it holds names and durations only;
  the watchdog gets its credentials from the VM's metadata server.
- `renew_command(config, seq)`: the argv the controller runs over SSH to renew the lease
  (write a new line to a temporary file, then rename it over the lease file, so the
  watchdog never reads half a line).
- `parse_state(value)`: the watchdog's guest attribute `tpulab/watchdog` as a
  `WatchdogState` the run reports ("armed", or why not and what to grant).
- `parse_lease(value)`: its guest attribute `tpulab/lease` as a `PublishedLease`: when
  the node's lease was last renewed and for how long, which tells whoever lists the
  node (on any machine) whether it is someone's live work.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Literal

from tpulab import paths
from tpulab.contract import (
    DELETE_NODE_PERMISSION,
    DELETE_QUEUED_RESOURCE_PERMISSION,
    EMULATED_TMP_ENV,
    LEASE_ATTRIBUTE,
    WATCHDOG_STATE_ATTRIBUTE,
)

__all__ = [
    "DELETE_ROLE",
    "LEASE_ATTRIBUTE",
    "STATE_ATTRIBUTE",
    "WATCHDOG_PAYLOAD",
    "PublishedLease",
    "WatchdogConfig",
    "WatchdogState",
    "parse_lease",
    "parse_state",
    "renew_command",
    "startup_script",
]

WATCHDOG_PAYLOAD = "watchdog.py"
STATE_ATTRIBUTE = WATCHDOG_STATE_ATTRIBUTE
DELETE_PERMISSION = DELETE_NODE_PERMISSION
DELETE_ROLE = "roles/tpu.admin"
# Ends the heredoc that carries the source; the builder refuses a source containing it.
_SOURCE_END = "TPULAB_WATCHDOG_SOURCE_END"
RENEW_TIMEOUT = 20.0

StateKind = Literal["armed", "unverified", "no-permission", "error", "firing", "unpublished"]


@dataclass(frozen=True)
class WatchdogConfig:
    """One run's watchdog: whose node, and the lease, grace and deadline (seconds)."""

    run_id: str
    node_name: str
    zone: str
    project: str
    lease_seconds: float
    boot_grace_seconds: float
    max_duration_seconds: float
    # --queued: the queued resource (named like the node) that made the node.
    queued_resource: str | None = None
    # "compute": a Compute Engine instance, deleted at `api_base` (the config carries
    # both; a TPU API node's config leaves them out and is unchanged).
    provider: str = "tpu-api"
    api_base: str = ""

    @property
    def delete_paths(self) -> tuple[str, ...]:
        """What the watchdog DELETEs when it fires, relative to the TPU API's root. A
        queued node's queued resource goes first, with force=true, so the node AND the
        queued resource go (a lone node DELETE leaves the queued resource SUSPENDED,
        still holding quota); the node's own DELETE follows, so the VM still goes should
        the queued-resource delete be refused."""
        if self.provider == "compute":
            return (
                f"compute/v1/projects/{self.project}/zones/{self.zone}/instances/{self.node_name}",
            )
        parent = f"v2/projects/{self.project}/locations/{self.zone}"
        node = f"{parent}/nodes/{self.node_name}"
        if self.queued_resource is None:
            return (node,)
        return (f"{parent}/queuedResources/{self.queued_resource}?force=true", node)

    # The three files' paths on a real VM. Each is resolved ON the VM (the watchdog's
    # `Config.on_this_vm`, the renew script's `case`): under /tmp unless the emulator
    # gives the worker its own /tmp (contract.EMULATED_TMP_ENV), as each real worker VM
    # of a slice has, so that an emulated slice's watchdogs read one lease file each.
    # The config keeps the real paths: online, byte for byte what they always were.

    @property
    def lease_path(self) -> str:
        # /tmp: root (the startup-script) reads it, the SSH user writes it; see the
        # watchdog's docstring. The run id keeps emulated nodes on one host apart.
        return f"/tmp/tpulab-lease-{self.run_id}"

    @property
    def log_path(self) -> str:
        return f"/tmp/tpulab-watchdog-{self.run_id}.log"

    @property
    def pid_path(self) -> str:
        return f"/tmp/tpulab-watchdog-{self.run_id}.pid"

    @property
    def poll_seconds(self) -> float:
        """How often the watchdog looks: a fifth of the lease, between 1 and 5 s, so it
        fires at most that late."""
        return min(5.0, max(1.0, self.lease_seconds / 5))

    @property
    def renew_seconds(self) -> float:
        """How often the controller renews: at least five renewals per lease, so a few
        lost ones (a slow SSH channel) never let it lapse; at most every 10 s."""
        return min(10.0, max(1.0, self.lease_seconds / 5))

    def as_json(self) -> str:
        # A TPU API node's config is what it always was, key for key: only an instance
        # carries its provider and the API root its DELETE goes to.
        extra = (
            {"provider": self.provider, "api_base": self.api_base}
            if self.provider == "compute"
            else {}
        )
        return json.dumps(
            {
                **extra,
                "run_id": self.run_id,
                "node_name": self.node_name,
                "zone": self.zone,
                "project": self.project,
                "lease_path": self.lease_path,
                "log_path": self.log_path,
                "pid_path": self.pid_path,
                "lease_seconds": self.lease_seconds,
                "boot_grace_seconds": self.boot_grace_seconds,
                "max_duration_seconds": self.max_duration_seconds,
                "poll_seconds": self.poll_seconds,
                "delete_paths": list(self.delete_paths),
            },
            sort_keys=True,
            separators=(",", ":"),
        )


def watchdog_source() -> str:
    return paths.payload_path(WATCHDOG_PAYLOAD).read_text(encoding="utf-8")


def _sh_quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


def startup_script(config: WatchdogConfig, source: str | None = None) -> str:
    """The node's `startup-script`: runs the watchdog (it daemonises) and returns."""
    source = watchdog_source() if source is None else source
    if _SOURCE_END in source:
        raise ValueError(f"the watchdog source must not contain {_SOURCE_END}")
    return (
        "#!/bin/sh\n"
        f"# tpulab watchdog for run {config.run_id}: deletes this TPU VM when tpulab's lease\n"
        f"# ({config.lease_seconds:g}s; {config.boot_grace_seconds:g}s after boot until the\n"
        f"# first renewal) lapses, or {config.max_duration_seconds:g}s after boot. It holds\n"
        "# no secret: it asks the metadata server for the VM service account's token.\n"
        f"# Its log: {config.log_path}\n"
        f"exec python3 - --config {_sh_quote(config.as_json())} <<'{_SOURCE_END}'\n"
        f"{source.rstrip()}\n"
        f"{_SOURCE_END}\n"
    )


def renew_command(config: WatchdogConfig, seq: int) -> list[str]:
    """The argv that renews the lease once (the Connection quotes every word)."""
    line = json.dumps({"seq": seq, "lease_seconds": config.lease_seconds}, sort_keys=True)
    # $1 the line, $2 the lease file: nothing but the constant below is pasted into the
    # script. A lease under /tmp is under this worker's own /tmp: the watchdog resolves
    # it the same way (`Config.on_this_vm`); online the variable is unset and the path
    # is $2 itself. The temporary file is this shell's own ($$): two renewers at once (a
    # forward beside an exec) made one's mv fail on the other's "$2.tmp". -T: a
    # directory in the lease's place is a failure, not a place to move into (GNU mv, as
    # on the TPU VM images). POSIX sh: dash runs it on Debian-based images.
    script = (
        f'lease="$2"; case "$lease" in /tmp/*) lease="${{{EMULATED_TMP_ENV}:-/tmp}}/'
        '${lease#/tmp/}";; esac; '
        'tmp="$lease.tmp.$$"; printf "%s\\n" "$1" > "$tmp" && mv -fT "$tmp" "$lease" '
        '|| { rm -f "$tmp"; exit 1; }'
    )
    return ["sh", "-c", script, "tpulab-lease", line, config.lease_path]


@dataclass(frozen=True)
class WatchdogState:
    """What the watchdog published: its kind, the detail, and the raw value."""

    kind: StateKind
    detail: str = ""
    raw: str | None = None

    @property
    def armed(self) -> bool:
        """Will it delete the node? "unverified" is armed, just not proven."""
        return self.kind in ("armed", "unverified", "firing")

    @property
    def reason(self) -> str:
        """Why it is not armed (or what it is doing), in words."""
        if self.kind == "unpublished":
            return "it published no state (the VM's startup-script may not have run)"
        return self.detail

    def describe(self) -> str:
        if self.kind == "armed":
            return "armed (its identity may delete its VM)"
        if self.kind == "unverified":
            return f"armed, permission unverified ({self.detail})"
        if self.kind == "firing":
            return f"firing ({self.detail}): it is deleting its VM"
        return f"NOT ARMED: {self.reason}"

    def fix(self, service_account: str | None) -> str | None:
        """What to do when it is not armed, naming the identity to grant to."""
        if self.armed:
            return None
        who = service_account or "the project's default compute service account"
        if self.kind == "no-permission":
            # A queued node's watchdog also needs its queued resource's delete.
            queued = DELETE_QUEUED_RESOURCE_PERMISSION in self.detail
            needed = DELETE_PERMISSION + (f" and {DELETE_QUEUED_RESOURCE_PERMISSION}" * queued)
            return (
                f"Grant {who} {DELETE_ROLE} (or a role with {needed}), or pass "
                "--service-account EMAIL of one that has it. The run continues; only the "
                "laptop-side teardown protects it."
            )
        return (
            f"Check the VM's startup-script log and that {who} has {DELETE_ROLE}. The run "
            "continues; only the laptop-side teardown protects it."
        )


_PREFIXES: tuple[tuple[str, StateKind], ...] = (
    ("unverified: ", "unverified"),
    ("no-permission: ", "no-permission"),
    ("error: ", "error"),
    ("firing: ", "firing"),
)


def parse_state(value: str | None) -> WatchdogState:
    """The guest attribute's value as a state; anything unrecognised is an error."""
    if value is None:
        return WatchdogState("unpublished")
    text = value.strip()
    if text == "armed":
        return WatchdogState("armed", raw=value)
    for prefix, kind in _PREFIXES:
        if text.startswith(prefix):
            return WatchdogState(kind, text[len(prefix) :], raw=value)
    return WatchdogState("error", f"unrecognised state {text[:100]!r}", raw=value)


@dataclass(frozen=True)
class PublishedLease:
    """The lease as the node's watchdog last published it (the VM's wall clock)."""

    renewed_at: float  # epoch seconds of the last renewal it saw (its start before one)
    lease_seconds: float
    renewals: int

    def age(self, now: float) -> float:
        """Seconds since the last renewal, by this machine's clock (never negative: a VM
        clock a little ahead must not read as a renewal from the future)."""
        return max(0.0, now - self.renewed_at)

    def fresh(self, now: float) -> bool:
        """Renewed within its lease: the watchdog has not fired, so someone is using the
        node. (Clocks on both sides are NTP-synced; a skew of seconds against leases of
        minutes does not change the answer.)"""
        return now - self.renewed_at < self.lease_seconds


def parse_lease(value: str | None) -> PublishedLease | None:
    """`tpulab/lease`'s value; None when there is none or it is not the watchdog's."""
    if not value:
        return None
    try:
        data = json.loads(value)
        lease = PublishedLease(
            renewed_at=float(data["renewed_at"]),
            lease_seconds=float(data["lease_seconds"]),
            renewals=int(data.get("renewals", 0)),
        )
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    finite = math.isfinite(lease.renewed_at) and math.isfinite(lease.lease_seconds)
    if not (finite and lease.lease_seconds > 0 and lease.renewed_at > 0):
        return None
    return lease
