"""What starts and stops an emulated VM: its guests and SSH hosts (docs/architecture.md §2).

A machine is one record of the emulated cloud with something booted behind it: a Cloud
TPU node (`server.py`'s TPU routes) or a Compute Engine instance with a TPU machine type
(`instances.py`). Both boot the same way, here: each worker's guest (its metadata server
and startup-script, `guest.py`), then each worker's SSH host, whose host keys and port
are published as guest attributes as the GCE guest agent does. `Machines` is that one
mechanism; the emulator's ticker decides when (`start` for a READY record whose booting
emulator is gone, `stop` when it leaves READY) and owns the HTTP side.

Surface: `Machines.start(record)`, `.stop(key)`, `.rekey(key, ssh_keys, workers)`,
`.authorized_keys(metadata)`, `.owned()`, `.guests_of(key)`, and the record-level helpers
`kill_boot`, `clear_boot`, `owner_alive`, `set_live` (which emulators of this process are
serving, so a record booted by a stopped one is booted again).
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol, TypeVar

from tpulab.contract import (
    EMULATED_TMP_ENV,
    EMULATOR_COORDINATOR_PORT_ATTRIBUTE,
    EMULATOR_SSH_PORT_ATTRIBUTE,
    EMULATOR_SSH_USER_ATTRIBUTE,
    HOST_KEY_NAMESPACE,
    OS_LOGIN_METADATA,
    SSH_KEYS_METADATA,
)
from tpulab.emulator.faults import FaultPlan, unreachable_index_env
from tpulab.emulator.guest import Guest, StateLink
from tpulab.emulator.hostenv import BackendImage, ImageEnv
from tpulab.emulator.hosts import AddressedHostBackend, HostBackend, HostEndpoint
from tpulab.emulator.persist import StateFile
from tpulab.emulator.processes import common_free_port, kill_tagged, reserve_port
from tpulab.emulator.state import CloudState
from tpulab.emulator.workers import (
    WORKERS_FIELD,
    loopback_address,
    same_paths_env,
    set_worker_part,
    worker_count,
    worker_key,
    worker_part,
    writable_attributes,
)

__all__ = ["MachineHost", "Machines", "clear_boot", "each", "kill_boot", "owner_alive", "set_live"]

log = logging.getLogger(__name__)

Record = dict[str, Any]
_T = TypeVar("_T")
_R = TypeVar("_R")

# Emulators alive in this process, by owner token: a machine whose SSH host was started
# by an emulator that is no longer here (stopped, or its process died) gets a new one.
_LIVE_OWNERS: set[str] = set()
_LIVE_LOCK = threading.Lock()
# How often a slice's hosts are started again on another common port when one was
# taken between probing it and binding it (workers.py: one port for every worker).
_COMMON_PORT_ATTEMPTS = 5


class MachineHost(Protocol):
    """What `Machines` asks of its emulator, late (a caller may set `host_backend`
    after construction: `tpulab emulator serve` does)."""

    host_backend: HostBackend | None
    faults: FaultPlan
    url: str

    @property
    def guests(self) -> bool: ...

    def machine_key(self, record: Record) -> str: ...

    def machine_home(self, record: Record, worker: int) -> Path: ...

    def machine_clock_file(self, record: Record, worker: int) -> Path: ...

    def machine_tmp(self, record: Record, worker: int) -> Path: ...


class Machines:
    """The guests and SSH hosts one emulator started, by machine key."""

    def __init__(
        self,
        host: MachineHost,
        *,
        owner: str,
        state_file: StateFile,
        transaction: Callable[[], AbstractContextManager[CloudState]],
        clock: Callable[[], float],
    ) -> None:
        self._host = host
        self._owner = owner
        self._file = state_file
        self._transaction = transaction
        self._clock = clock
        self._guests: dict[str, dict[int, Guest]] = {}  # machine key -> worker -> its boot
        # Machine keys whose SSH hosts (and guests) this emulator started -> how many workers.
        self._hosts: dict[str, int] = {}
        self._hosts_lock = threading.Lock()

    def owned(self) -> set[str]:
        """The keys of the machines booted here and not yet stopped."""
        with self._hosts_lock:
            return set(self._hosts)

    def guests_of(self, key: str) -> dict[int, Guest]:
        """The booted guests of machine `key`, by worker (empty when none)."""
        with self._hosts_lock:
            return dict(self._guests.get(key) or {})

    def authorized_keys(self, metadata: dict[str, str]) -> str:
        """The ssh-keys lines the guest agent would install, as the GCE agent decides:
        none under the project's OS Login unless the instance turns it off."""
        os_login_off = metadata.get(OS_LOGIN_METADATA, "").strip().lower() == "false"
        if self._host.faults.project_os_login and not os_login_off:
            return ""
        return metadata.get(SSH_KEYS_METADATA, "")

    def rekey(self, key: str, ssh_keys: str, count: int) -> None:
        assert self._host.host_backend is not None
        for worker in range(count):
            try:
                self._host.host_backend.update_keys(worker_key(key, worker), ssh_keys)
            except Exception:
                log.exception("could not give the SSH host of %s its new ssh-keys", key)

    def start(self, node: Record) -> None:
        """Boot a READY node: each worker's guest (metadata server, startup-script), then
        each worker's SSH host, whose sessions get that guest's environment too. A
        single-host node has one worker, 0; a slice one per host (workers.py). Each
        worker has its own HOME and its own /tmp (EMULATED_TMP_ENV), as each VM has."""
        key = self._host.machine_key(node)
        count = worker_count(node["accelerator_type"])
        with self._hosts_lock:
            self._hosts[key] = count  # from now on stop() stops every worker
        sandboxes = [self._host.machine_home(node, worker) for worker in range(count)]
        for sandbox in sandboxes:
            sandbox.mkdir(parents=True, exist_ok=True)
        envs: list[dict[str, str]] = []
        for worker, sandbox in enumerate(sandboxes):
            tmp = self._host.machine_tmp(node, worker)
            tmp.mkdir(parents=True, exist_ok=True)
            guest = self._boot_guest(key, node, worker, sandbox) if self._host.guests else None
            booted = guest.env if guest is not None else {}
            # Sessions see the worker's /tmp with or without a booted guest: a renewal
            # lands where that worker's watchdog (if any) reads it. And with or without
            # one, jax names source files alike on every worker (same_paths_env).
            own_tmp = {EMULATED_TMP_ENV: str(tmp), **same_paths_env(sandbox, tmp)}
            envs.append({**booted, **own_tmp, **unreachable_index_env(self._host.faults)})
        if self._host.host_backend is None:
            self._record_boot(key, count, [], "")
            return
        ssh_keys = self.authorized_keys(node["metadata"])
        try:
            endpoints = self._start_workers(key, sandboxes, ssh_keys, envs)
        except Exception as error:
            log.exception("could not start an SSH host for %s", key)
            with self._file.transaction() as data:
                current = data["nodes"].get(key)
                if current is not None and current.get("host", {}).get("owner") == self._owner:
                    current["host"] = {"owner": self._owner, "error": str(error)}
            return
        self._record_boot(key, count, endpoints, ssh_keys)

    def _start_workers(
        self, key: str, sandboxes: list[Path], ssh_keys: str, envs: list[dict[str, str]]
    ) -> list[HostEndpoint]:
        """Every worker's SSH host, in worker order. One worker: as a single host always
        was (127.0.0.1, any port). Several, on a backend that can: worker w on
        127.0.0.(1+w), all on one port, the whole set again on another port should a
        port be taken on some address; otherwise each on its own 127.0.0.1 port."""
        backend = self._host.host_backend
        assert backend is not None

        def start(worker: int, address: str | None, port: int) -> HostEndpoint:
            options: dict[str, Any] = {
                "refuse_for": self._host.faults.refuse_for(worker),
                "ensurepip_missing": self._host.faults.ensurepip_missing,
                "env": envs[worker],
            }
            name = worker_key(key, worker)
            if address is None:
                return backend.start(name, sandboxes[worker], ssh_keys, **options)
            assert isinstance(backend, AddressedHostBackend)
            return backend.start_at(
                name, sandboxes[worker], ssh_keys, address=address, port=port, **options
            )

        count = len(sandboxes)
        separate = [None] * count
        if count == 1 or not isinstance(backend, AddressedHostBackend):
            return each(lambda w: start(w, separate[w], 0), range(count))
        addresses = [loopback_address(worker) for worker in range(count)]

        def start_set(port: int) -> list[HostEndpoint]:
            return each(lambda w: start(w, addresses[w], port), range(count))

        for attempt in range(_COMMON_PORT_ATTEMPTS):
            try:
                port = common_free_port(addresses)
            except OSError as error:
                if error.errno != errno.EADDRNOTAVAIL:
                    raise
                # Only 127.0.0.1 on this machine's loopback (macOS): a port each there.
                log.info("no 127.0.0.x addresses here (%s): each worker on a port", error)
                return each(lambda w: start(w, separate[w], 0), range(count))
            try:
                return start_set(port)
            except BaseException as error:
                for worker in range(count):
                    backend.stop(worker_key(key, worker))
                taken = isinstance(error, OSError) and error.errno == errno.EADDRINUSE
                if not taken or attempt + 1 == _COMMON_PORT_ATTEMPTS:
                    raise
                # Taken between the probe and the bind: the whole set on another port.
                log.info("port %d of %s was taken (%s); trying another", port, key, error)
        raise AssertionError("unreachable")  # the loop returns or raises

    def _boot_guest(self, key: str, node: Record, worker: int, sandbox: Path) -> Guest | None:
        guest = Guest(
            node,
            sandbox,
            StateLink(key, self._transaction, self._clock, worker=worker),
            api_url=self._host.url,
            image=self._guest_image(),
            clock_skip=self._host.machine_clock_file(node, worker),
            tmp_dir=self._host.machine_tmp(node, worker),
        )
        try:
            guest.start()
        except Exception:
            log.exception(
                "could not boot the guest (metadata server, startup-script) of %s worker %d",
                key,
                worker,
            )
            guest.stop()
            return None
        with self._hosts_lock:
            self._guests.setdefault(key, {})[worker] = guest
        with self._file.transaction() as data:
            current = data["nodes"].get(key)
            if current is not None and (current.get("host") or {}).get("owner") == self._owner:
                set_worker_part(
                    current,
                    worker,
                    "guest",
                    {
                        "metadata": guest.metadata.address,
                        "tag": guest.startup.tag if guest.startup is not None else None,
                        "init_pid": guest.startup.pid if guest.startup is not None else None,
                    },
                )
        return guest

    def _guest_image(self) -> ImageEnv:
        """The image the node's SSH sessions get (for its boot-time processes too)."""
        images = getattr(self._host.host_backend, "images", None)
        if isinstance(images, BackendImage):
            return images.for_node(ensurepip_missing=self._host.faults.ensurepip_missing)
        return ImageEnv(path=("/usr/bin", "/bin"), name="minimal (no SSH host)")

    def _record_boot(
        self, key: str, count: int, endpoints: list[HostEndpoint], ssh_keys: str
    ) -> None:
        """Publish each worker's SSH host as its guest agent would; `endpoints` is empty
        when there is no host backend (guests only)."""
        with self._hosts_lock:
            self._hosts[key] = count
        # A slice's workers find JAX's coordinator on worker 0 at this port (contract.py).
        coordinator = _free_loopback_port() if endpoints and count > 1 else None
        login_user = getattr(self._host.host_backend, "login_user", None)
        key_types = self._host.faults.host_key_types
        keep = False
        with self._file.transaction() as data:
            current = data["nodes"].get(key)
            if current is not None and (current.get("host") or {}).get("owner") == self._owner:
                keep = current["state"] in {"READY", "DELETING"}
                for worker, endpoint in enumerate(endpoints):
                    host: Record = {"host": endpoint.host, "port": endpoint.port}
                    if worker == 0:
                        host = {
                            "owner": self._owner,
                            **host,
                            "ssh_keys": ssh_keys,  # what it accepts; the ticker compares
                        }
                    host["tag"] = endpoint.tag  # its sessions' processes: see kill_boot
                    set_worker_part(current, worker, "host", host)
                    # As each worker's guest agent does: one `hostkeys/<type>` per key its
                    # sshd serves, beside what the worker's processes wrote since boot.
                    attributes = writable_attributes(current, worker)
                    attributes.update(
                        {
                            f"{HOST_KEY_NAMESPACE}/{t}": b64
                            for t, b64 in endpoint.host_keys.items()
                            if not key_types or t in key_types
                        }
                    )
                    attributes[EMULATOR_SSH_PORT_ATTRIBUTE] = str(endpoint.port)
                    if isinstance(login_user, str) and login_user:
                        attributes[EMULATOR_SSH_USER_ATTRIBUTE] = login_user
                    if coordinator is not None:
                        attributes[EMULATOR_COORDINATOR_PORT_ATTRIBUTE] = str(coordinator)
        if not keep:
            self.stop(key)

    def stop(self, key: str) -> None:
        with self._hosts_lock:
            count = self._hosts.pop(key, None)
            if count is None:
                return
            guests = self._guests.pop(key, {})

        def stop_guest(guest: Guest) -> None:
            try:
                guest.stop()  # the power goes off: its processes die first
            except Exception:
                log.exception("could not stop the guest of %s worker %d", key, guest.worker)

        each(stop_guest, list(guests.values()))
        backend = self._host.host_backend
        if backend is None:
            return

        def stop_host(worker: int) -> None:
            try:
                backend.stop(worker_key(key, worker))
            except Exception:
                log.exception("could not stop the SSH host for %s worker %d", key, worker)

        each(stop_host, range(count))


def kill_boot(node: Record) -> None:
    """Kill whatever a boot of `node` left running: each worker's startup-script tree
    (its guest's tag) and SSH sessions' processes (its host's tag), as powering off a
    VM does. The emulator that booted it stops its own on delete; one that died
    (SIGKILL) leaves them orphaned on this machine, and only these recorded tags find
    them again."""
    recorded = {int(w) for w in node.get(WORKERS_FIELD) or {} if str(w).isdigit()}
    for worker in sorted({0, *recorded}):
        for part in ("guest", "host"):
            tag = (worker_part(node, worker, part) or {}).get("tag")
            if tag:
                kill_tagged(tag)


def clear_boot(node: Record, host: Record | None) -> None:
    """Forget the node's boot in its record: no SSH hosts, no guest attributes, on any
    worker (`host` becomes worker 0's host record: the new boot's owner, or None). The
    guests' records stay, so their tags can still be killed (kill_boot)."""
    node["host"] = host
    node["guest_attributes"] = {}
    for record in (node.get(WORKERS_FIELD) or {}).values():
        record["host"] = None
        record["guest_attributes"] = {}


def each(work: Callable[[_T], _R], items: Iterable[_T]) -> list[_R]:
    """`work` on every item, concurrently when there are several (a slice's workers boot
    together, as its VMs do), in item order; once all have ended, the first failure (in
    item order) is raised."""
    todo = list(items)
    if len(todo) <= 1:
        return [work(item) for item in todo]
    with ThreadPoolExecutor(len(todo), thread_name_prefix="tpu-emulator-worker") as pool:
        futures = [pool.submit(work, item) for item in todo]
        wait(futures)
    for future in futures:
        error = future.exception()
        if error is not None:
            raise error
    return [future.result() for future in futures]


def _free_loopback_port() -> int:
    """A port free on 127.0.0.1 now (for a process of the node to bind later)."""
    with reserve_port("127.0.0.1") as sock:
        return int(sock.getsockname()[1])


def owner_alive(owner: str | None) -> bool:
    """Is the emulator that started this node's SSH host still running?"""
    if not owner:
        return False
    pid_text, _, _ = owner.partition(":")
    if not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if pid == os.getpid():
        with _LIVE_LOCK:
            return owner in _LIVE_OWNERS
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def set_live(owner: str, alive: bool) -> None:
    """Say whether the emulator `owner` of this process is serving (owner_alive)."""
    with _LIVE_LOCK:
        if alive:
            _LIVE_OWNERS.add(owner)
        else:
            _LIVE_OWNERS.discard(owner)
