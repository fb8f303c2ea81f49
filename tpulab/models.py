"""Typed values that cross module boundaries: what a node is, what a run asks for.

The receipt model lives in `receipts.py` beside its validation; these are the shapes the
cloud layer, the lifecycle and the CLI share. Validation of user input happens here so
that nothing reaches the Cloud TPU API before it is known to be well formed.
"""

from __future__ import annotations

import re
from datetime import datetime
from enum import Enum

import pydantic.main
from pydantic import BaseModel, ConfigDict, Field

from tpulab.contract import (
    KIND_LABEL,
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
    OWNER_LABEL,
    RUN_ID_LABEL,
)
from tpulab.errors import ConfigError

__all__ = [
    "DEFER_BUILD",
    "MANAGED_BY_LABEL",
    "MANAGED_BY_VALUE",
    "PLATFORMS",
    "RUN_ID_LABEL",
    "NodeInfo",
    "NodeRequest",
    "NodeState",
    "check_label",
    "check_node_name",
    "check_project",
    "check_run_id",
    "check_zone",
    "tpulab_labels",
]


# Each model defers building its validator to its first use (`defer_build`), so that a
# command pays only for the models it validates (a dry run imports some 50 and validates
# few; tests/test_startup.py). Before pydantic 2.14 that first build is not thread-safe
# (pydantic issue 13419: a second thread validating meanwhile may use a half-built
# model), and tpulab validates on threads: `list` reads its zones on one thread each and
# `teardown` deletes its nodes on several, each thread making NodeInfos; a library caller
# may run tpulab on threads of its own. So it defers only where pydantic builds under its
# lock (added in 2.14, pydantic PR 13438); looking for the lock rather than at the
# version can only err towards building at import.
DEFER_BUILD = hasattr(pydantic.main, "_rebuild_lock")

# The JAX platforms a payload can be required to run on (`jax.devices(platform)`).
PLATFORMS: tuple[str, ...] = ("cpu", "tpu", "gpu")

_NODE_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
# Documented TPU zones include "AI zones" such as us-central1-ai1a and us-south1-ai1b.
_ZONE = re.compile(r"^[a-z]+-[a-z]+[0-9]+-[a-z0-9]+$")
# Project ids are 6-30 of [a-z0-9-], a letter first; legacy ones carry a "domain:" prefix.
# Shorter ids are let through because a local emulator accepts any (tests use "p").
_PROJECT = re.compile(r"^(?:[a-z][a-z0-9.-]*[a-z0-9]:)?[a-z](?:[a-z0-9-]*[a-z0-9])?$")
# GCP label rules: keys start with a lowercase letter; both <= 63 of [a-z0-9_-].
_LABEL_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")


class NodeState(str, Enum):
    STATE_UNSPECIFIED = "STATE_UNSPECIFIED"
    CREATING = "CREATING"
    READY = "READY"
    RESTARTING = "RESTARTING"
    REIMAGING = "REIMAGING"
    DELETING = "DELETING"
    REPAIRING = "REPAIRING"
    STOPPED = "STOPPED"
    STOPPING = "STOPPING"
    STARTING = "STARTING"
    PREEMPTED = "PREEMPTED"
    TERMINATED = "TERMINATED"
    HIDING = "HIDING"
    HIDDEN = "HIDDEN"
    UNHIDING = "UNHIDING"
    UNKNOWN = "UNKNOWN"


class NodeRequest(BaseModel):
    """What `create_node` sends: everything but the project, zone and node id."""

    model_config = ConfigDict(defer_build=DEFER_BUILD, frozen=True, extra="forbid")

    accelerator_type: str
    runtime_version: str
    labels: dict[str, str] = Field(default_factory=dict)
    metadata: dict[str, str] = Field(default_factory=dict)
    spot: bool = False
    description: str = ""
    external_ips: bool = True  # what lets a laptop outside the VPC reach the VM
    # The VM's identity (Node.serviceAccount): an empty email is the project's default
    # compute service account; no scopes and no email: the field is not sent at all.
    service_account_email: str = ""
    service_account_scopes: tuple[str, ...] = ()
    # The VPC (networkConfig.network / .subnetwork); empty: the API's `default`.
    network: str = ""
    subnetwork: str = ""


class WorkerEndpoint(BaseModel):
    """One worker VM of a node: `Node.networkEndpoints[i]` is worker i (gcloud's
    `tpu-vm ssh --worker` indexes them so); a single-host node has one."""

    model_config = ConfigDict(defer_build=DEFER_BUILD, frozen=True)

    ip_address: str | None = None
    external_ip: str | None = None


class NodeInfo(BaseModel):
    """A node as the API reports it, independent of the client library's types.
    `ip_address` / `external_ip` are worker 0's; `workers` lists every worker's."""

    model_config = ConfigDict(defer_build=DEFER_BUILD, frozen=True)

    project: str
    zone: str
    name: str  # the short node id, not the full resource path
    accelerator_type: str = ""
    runtime_version: str = ""
    state: NodeState = NodeState.STATE_UNSPECIFIED
    health: str = ""
    labels: dict[str, str] = Field(default_factory=dict)
    metadata: dict[str, str] = Field(default_factory=dict)
    ip_address: str | None = None
    external_ip: str | None = None
    workers: tuple[WorkerEndpoint, ...] = ()
    spot: bool = False
    create_time: datetime | None = None

    @property
    def managed_by_tpulab(self) -> bool:
        return self.labels.get(MANAGED_BY_LABEL) == MANAGED_BY_VALUE

    @property
    def run_id(self) -> str | None:
        return self.labels.get(RUN_ID_LABEL)

    @property
    def kind(self) -> str | None:
        """ "run" or "session" (None: a node made before tpulab labelled it)."""
        return self.labels.get(KIND_LABEL)

    @property
    def owner(self) -> str | None:
        """The id of the tpulab home that made it (None: made before it was labelled)."""
        return self.labels.get(OWNER_LABEL)


def tpulab_labels(
    run_id: str, *, kind: str | None = None, owner: str | None = None
) -> dict[str, str]:
    """The labels every node tpulab creates carries; teardown finds nodes by them, and
    by `kind` (run or session) and `owner` (the tpulab home) tells whose work it is."""
    labels = {MANAGED_BY_LABEL: MANAGED_BY_VALUE, RUN_ID_LABEL: check_label(RUN_ID_LABEL, run_id)}
    if kind is not None:
        labels[KIND_LABEL] = check_label(KIND_LABEL, kind)
    if owner is not None:
        labels[OWNER_LABEL] = check_label(OWNER_LABEL, owner)
    return labels


def check_node_name(name: str) -> str:
    if len(name) > 63 or not _NODE_NAME.match(name):
        raise ConfigError(
            f"Invalid node name {name!r}.",
            hint="Use 1-63 characters: a lowercase letter first, then lowercase letters, "
            "digits or hyphens, not ending in a hyphen.",
        )
    return name


def check_zone(zone: str) -> str:
    if not _ZONE.match(zone):
        raise ConfigError(
            f"Invalid zone {zone!r}.",
            hint="A zone looks like us-central1-a or us-central1-ai1a (region, then the "
            "zone's suffix); see `gcloud compute tpus locations list`.",
        )
    return zone


def check_project(project: str) -> str:
    if len(project) > 100 or not _PROJECT.match(project):
        raise ConfigError(
            f"Invalid project id {project!r}.",
            hint="A project id looks like my-project-123: 6-30 lowercase letters, digits "
            "or hyphens, starting with a letter (the id, not the display name).",
        )
    return project


def check_run_id(run_id: str) -> str:
    """A run id names one run; empty would match every run, so it is refused."""
    if not run_id:
        raise ConfigError(
            "The run id is empty.",
            hint="Pass the id of one run (`tpulab list` shows them), or leave "
            "--run-id out to look at every run.",
        )
    return check_label(RUN_ID_LABEL, run_id)


def check_label(key: str, value: str) -> str:
    if not _LABEL_KEY.match(key) or not _LABEL_VALUE.match(value):
        raise ConfigError(
            f"Invalid label {key}={value!r}.",
            hint="Label keys and values use lowercase letters, digits, '_' and '-', "
            "at most 63 characters; keys start with a letter.",
        )
    return value
