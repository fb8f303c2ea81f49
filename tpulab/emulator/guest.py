"""The inside of one booted emulated VM: its metadata server and its startup-script.

`Guest.start()` boots it: the metadata server first (the script's first act is usually
to ask it who it is), then the node's `startup-script`, if it has one. `env` is what
every process of the node sees on top of the image's environment -- the startup-script
and every SSH session alike -- so code written for a real VM finds the metadata server
and the APIs where google-auth would look (docs/architecture.md §7, §8):

    GCE_METADATA_HOST / GCE_METADATA_IP = 127.0.0.1:<this node's metadata port>
    TPULAB_TPU_API_BASE / TPULAB_RESOURCE_MANAGER_BASE = <the emulator's URL>/
    TPULAB_EMULATED_CLOCK_SKIP = <a file: how far this VM's clock was moved forward>
    TPULAB_EMULATED_TMP = <this worker's own directory standing for its /tmp>
    TPULAB_EMULATED_DISK = <the sandbox: the directory standing in for this VM's disk>
    JAX_HLO_SOURCE_FILE_CANONICALIZATION_REGEX = <drops the sandbox and /tmp prefixes
        from the source paths jax compiles in, so every worker's are the same
        (workers.py `same_paths_env`)>

`Guest.stop()` is the power going off: the metadata server stops answering and every
process the script started is killed.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from tpulab.contract import (
    EMULATED_CLOCK_SKIP_ENV,
    EMULATED_DISK_ENV,
    EMULATED_TMP_ENV,
    METADATA_HOST_ENV,
    METADATA_IP_ENV,
    RESOURCE_MANAGER_BASE_ENV,
    STARTUP_SCRIPT_METADATA,
    TPU_API_BASE_ENV,
)
from tpulab.emulator.hostenv import ImageEnv
from tpulab.emulator.iam import current_token
from tpulab.emulator.metadata import MetadataServer
from tpulab.emulator.startup import StartupScript
from tpulab.emulator.state import CloudState
from tpulab.emulator.workers import same_paths_env, worker_key, writable_attributes

__all__ = ["Guest", "StateLink"]

Record = dict[str, Any]
Transaction = Callable[[], AbstractContextManager[CloudState]]


class StateLink:
    """`metadata.NodeLink` over the emulator's state: one transaction per question.
    `worker` is the worker VM whose guest attributes it writes (0: a single host's)."""

    def __init__(
        self,
        node_key: str,
        transaction: Transaction,
        clock: Callable[[], float] = time.time,
        *,
        worker: int = 0,
    ) -> None:
        self.node_key = node_key
        self.worker = worker
        self._transaction = transaction
        self._clock = clock

    def _node(self, cloud: CloudState) -> Record | None:
        return cloud.nodes.get(self.node_key)

    def node(self) -> Record | None:
        with self._transaction() as cloud:
            node = self._node(cloud)
            return None if node is None else _copy(node)

    def token(self) -> tuple[str, int] | None:
        with self._transaction() as cloud:
            node = self._node(cloud)
            return None if node is None else current_token(node, self._clock())

    def set_guest_attribute(self, path: str, value: str | None) -> bool:
        with self._transaction() as cloud:
            node = self._node(cloud)
            # A VM that has stopped (a preempted one, while the API's state may still say
            # READY) runs nothing that could write: what it published before it stopped
            # stays readable (server.py), nothing after. Its processes die only at the
            # server's next tick, so without this one could still publish in between.
            if node is None or node.get("vm_stopped_at") is not None:
                return False
            attributes = writable_attributes(node, self.worker)
            if value is None:
                attributes.pop(path, None)
            else:
                attributes[path] = value
            return True


def _copy(node: Record) -> Record:
    return json.loads(json.dumps(node))  # type: ignore[no-any-return]


class Guest:
    """One boot of one worker VM of a node (worker 0: a single host's only VM):
    `start()`, then `stop()` (idempotent). Every worker of a slice runs the node's
    startup-script itself, as on Cloud TPU (each worker VM boots from the same node
    metadata), in its own HOME, and answers metadata as that worker."""

    def __init__(
        self,
        node: Record,
        sandbox: Path,
        link: StateLink,
        *,
        api_url: str,
        image: ImageEnv,
        clock_skip: Path,
        tmp_dir: Path,
    ) -> None:
        self.node_key = link.node_key
        self.worker = link.worker
        # How far this boot's clock was moved forward (skip_clock); the watchdog reads it.
        self.clock_skip = clock_skip
        self._skipped = 0.0
        # This worker's /tmp: each worker VM of a real slice has its own, where its
        # watchdog reads the lease renewed on it (the workers here share one machine's).
        self.tmp_dir = tmp_dir
        self.sandbox = sandbox
        self.metadata = MetadataServer(link, worker=link.worker)
        self.script = str(node["metadata"].get(STARTUP_SCRIPT_METADATA) or "")
        self._api_base = api_url.rstrip("/") + "/"
        # As a boot-time service sees it: the image's variables and HOME (the sandbox),
        # no login's USER or SHELL.
        self._image_env = {"HOME": str(sandbox), "LANG": "C.UTF-8", **image.as_env()}
        self.env: dict[str, str] = {}
        self.startup: StartupScript | None = None

    def start(self) -> None:
        address = self.metadata.start()
        self._write_skip(0.0)  # a boot's clock starts unskipped, as a VM's monotonic one
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        self.env = {
            METADATA_HOST_ENV: address,
            METADATA_IP_ENV: address,
            TPU_API_BASE_ENV: self._api_base,
            RESOURCE_MANAGER_BASE_ENV: self._api_base,
            EMULATED_CLOCK_SKIP_ENV: str(self.clock_skip),
            EMULATED_TMP_ENV: str(self.tmp_dir),
            # The worker's home is its disk: kept across reboots, removed with the node.
            EMULATED_DISK_ENV: str(self.sandbox),
            # Its HOME and /tmp are its own directories here, one path on a real slice.
            **same_paths_env(self.sandbox, self.tmp_dir),
        }
        if self.script.strip():
            self.startup = StartupScript(
                worker_key(self.node_key, self.worker),
                self.sandbox,
                self.script,
                {**self._image_env, **self.env},
            )
            self.startup.start()

    def skip_clock(self, seconds: float) -> float:
        """Move this VM's clock `seconds` forward (as if that long passed on it, nothing
        else happening); the total skipped since boot."""
        if not 0 <= seconds < 10**7:
            raise ValueError(f"a clock moves forward only, by a sane amount, not {seconds!r}")
        self._write_skip(self._skipped + seconds)
        return self._skipped

    def _write_skip(self, total: float) -> None:
        # Whole or not at all (write, then rename): the watchdog reads it on every tick.
        self.clock_skip.parent.mkdir(parents=True, exist_ok=True)
        partial = self.clock_skip.with_name(self.clock_skip.name + ".partial")
        partial.write_text(f"{total!r}\n", encoding="utf-8")
        os.replace(partial, self.clock_skip)
        self._skipped = total

    def stop(self) -> None:
        if self.startup is not None:
            self.startup.stop()
        self.metadata.stop()
