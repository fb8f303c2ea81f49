"""The worker VMs of a node: one for a single-host type, several for a multi-host slice.

A slice (v4-16, v5litepod-16, ...) is ONE node in the Cloud TPU API with several worker
VMs. The API lists them as `Node.networkEndpoints[]`, one entry per worker in worker
order (gcloud's `tpu-vm ssh --worker=N|all` indexes that list: its
command_lib/compute/tpus/tpu_vm/ssh.py `ParseWorkerFlag`), and getGuestAttributes
answers per worker. Each worker is its own VM: its own SSH host, host keys, guest
attributes, metadata server (`agent-worker-number`), startup-script run and disk.

In the node record worker 0 keeps the fields a single-host node has always had (`host`,
`guest_attributes`, `guest`), so single-host records, and state files written before
slices, are unchanged; workers 1.. live under `workers` ({"1": {"host", "guest",
"guest_attributes"}, ...}), absent in older state files.

Emulated workers are SSH hosts on this machine: worker w listens on 127.0.0.(1+w) (Linux
routes all of 127/8 to the loopback device), all on one port when the backend can, so a
client that can only give one port for every worker (`gcloud ... --worker=all
--ssh-flag=-p<port>`) reaches each of them as it would reach port 22 online.

Each emulated worker's HOME and /tmp are directories of its own, where a real slice's
workers share one path for each; `same_paths_env` keeps that difference out of the
programs jax compiles on them, which must be alike on every worker.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

__all__ = [
    "SOURCE_PATH_REGEX_ENV",
    "WORKERS_FIELD",
    "loopback_address",
    "same_paths_env",
    "set_worker_part",
    "worker_address",
    "worker_attributes",
    "worker_count",
    "worker_key",
    "worker_network_endpoints",
    "worker_part",
    "worker_suffix",
    "writable_attributes",
]

Record = dict[str, Any]

WORKERS_FIELD = "workers"
# The internal address a worker without an SSH host shows (no host backend, or before
# its boot). Worker 0's is what single-host nodes always showed.
_FAKE_SUBNET_SECOND_OCTET = 128


_TYPE_NAME = re.compile(r"^(?P<family>[a-z0-9]+)-(?P<size>\d+)$")
# Families whose type names count TensorCores, 8 to a host (4 chips of 2 cores: v2, v3;
# v4 and v5p too, whose megacore chips the names still count as 2 cores); the others
# (v5litepod, v6e) count chips: up to 8 on one host, 4 per host in larger slices.
# From the Cloud TPU "System architecture" pages; the emulator keeps this rule itself
# rather than read tpulab's catalog (a wrong row shared by both could never fail a
# test), and tests/test_emulator_slices.py checks that the two agree.
_CORES_PER_HOST = {"v2": 8, "v3": 8, "v4": 8, "v5p": 8}
_CHIPS_PER_HOST = {"v5litepod": 4, "v6e": 4}
_SINGLE_HOST_CHIPS = 8


def worker_count(accelerator_type: str) -> int:
    """How many worker VMs (hosts) a node of this type has; 1 for a name the rule does
    not know."""
    shape = _TYPE_NAME.match(accelerator_type)
    if shape is None:
        return 1
    family, size = shape["family"], int(shape["size"])
    if family in _CORES_PER_HOST:
        return max(1, size // _CORES_PER_HOST[family])
    if family in _CHIPS_PER_HOST and size > _SINGLE_HOST_CHIPS:
        return size // _CHIPS_PER_HOST[family]
    return 1


def worker_suffix(worker: int) -> str:
    """What tells worker w's files from worker 0's (empty for worker 0, whose files are
    a single-host node's). A node name matches [a-z]([-a-z0-9]*[a-z0-9])?, so no name
    ends in ".worker-N" and no sibling can collide with another node's files."""
    return f".worker-{worker}" if worker else ""


def worker_key(node_key: str, worker: int) -> str:
    """The key under which a host backend knows worker w's SSH host."""
    return node_key + worker_suffix(worker)


def loopback_address(worker: int) -> str:
    """Where worker w's SSH host listens: 127.0.0.(1+w), all on loopback."""
    if not 0 <= worker < 254:
        raise ValueError(f"worker {worker} has no loopback address (at most 254 workers)")
    return f"127.0.0.{1 + worker}"


def worker_part(node: Record, worker: int, part: str) -> Any:
    """`host`, `guest` or `guest_attributes` of worker w as recorded (None if not)."""
    if worker == 0:
        return node.get(part)
    record = (node.get(WORKERS_FIELD) or {}).get(str(worker)) or {}
    return record.get(part)


def set_worker_part(node: Record, worker: int, part: str, value: Any) -> None:
    if worker == 0:
        node[part] = value
        return
    node.setdefault(WORKERS_FIELD, {}).setdefault(str(worker), {})[part] = value


def worker_attributes(node: Record, worker: int) -> dict[str, str]:
    """Worker w's guest attributes (a live reference; empty when it has none)."""
    return worker_part(node, worker, "guest_attributes") or {}


def writable_attributes(node: Record, worker: int) -> dict[str, str]:
    """Worker w's guest attributes, created when missing, to write into."""
    if worker == 0:
        return node.setdefault("guest_attributes", {})  # type: ignore[no-any-return]
    record = node.setdefault(WORKERS_FIELD, {}).setdefault(str(worker), {})
    return record.setdefault("guest_attributes", {})  # type: ignore[no-any-return]


def worker_address(node: Record, worker: int) -> str:
    """Worker w's internal address: its SSH host's when it has one, otherwise a made-up
    address in the node's subnet (10.128.0.0/20 for worker 0, as before slices)."""
    host = worker_part(node, worker, "host") or {}
    if host.get("host"):
        return str(host["host"])
    number = int(node.get("number") or 0)  # (a record made by hand may lack it)
    second = _FAKE_SUBNET_SECOND_OCTET + worker
    return f"10.{second}.{number // 250}.{number % 250 + 2}"


def worker_network_endpoints(node: Record) -> str:
    """The `worker-network-endpoints` metadata attribute every worker's metadata server
    serves: "unknown:unknown:<ip>" per worker, comma-separated, in worker order. JAX's
    jax/_src/clusters/cloud_tpu_cluster.py takes `entry.split(':')[2]` of each entry as
    the worker's IP (and the first entry as the coordinator's host)."""
    count = worker_count(str(node["accelerator_type"]))
    return ",".join(f"unknown:unknown:{worker_address(node, w)}" for w in range(count))


# jax's own variable for its `jax_hlo_source_file_canonicalization_regex` option
# (jax/_src/config.py): jax removes every match, `re.sub(value, "", path)`, from each
# source file path it writes into a program's debug information.
SOURCE_PATH_REGEX_ENV = "JAX_HLO_SOURCE_FILE_CANONICALIZATION_REGEX"


def same_paths_env(home: Path, tmp: Path) -> dict[str, str]:
    """What makes a worker's programs name their source files as every other worker's do.

    On a real slice every worker VM has the same HOME (/home/<user>) and /tmp, so a
    script staged under ~/jax-tpu-lab has one absolute path on all workers. Here worker
    w's HOME is its own directory (`<node>.worker-w`) and so is its /tmp. jax writes the
    path of the calling script into each compiled program, and jaxlib 0.12.1 stalls a
    cross-process CPU (gloo) psum whose programs differ only in those paths: every rank
    connects, the all-reduce never completes. So jax is told to drop this worker's HOME
    and /tmp prefix from them (keeping the "/" after it): every worker's program is then
    the same, as on a real slice. `tpulab exec --env` can still set the variable itself."""
    prefixes: list[str] = []
    for directory in (home, tmp):
        for spelling in (str(directory), os.path.realpath(directory)):
            if spelling not in prefixes:
                prefixes.append(spelling)
    # Longest first, so a prefix that is another's parent never cuts a path short.
    alternatives = "|".join(re.escape(p) for p in sorted(prefixes, key=len, reverse=True))
    return {SOURCE_PATH_REGEX_ENV: f"^(?:{alternatives})(?=/)"}
