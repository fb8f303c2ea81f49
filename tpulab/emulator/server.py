"""The emulator, `Emulator`: what the API answers, and the hosts behind its nodes.

It answers the Cloud TPU v2 REST paths (docs/architecture.md §5), served over HTTP by
`http_front.py`, from the state machine in `state.py`, persisted by `persist.py`. A
background ticker applies time-based transitions and, when a node is READY, asks the
`HostBackend` for an SSH server and publishes its host key and port as guest attributes;
before that it boots the node's inside (`guest.py`: a metadata server of its own and its
startup-script), whose token the API accepts as the node's identity (`iam.py`; Resource
Manager's testIamPermissions answers for it too). Admin endpoints under `/_emulator/`
let another process inject faults and inspect state. Every API request is
also kept, as it arrived on the wire, in a bounded log (`Emulator.requests()`, `GET
/_emulator/requests`): tests compare it with what `tpulab run --dry-run` says it sends.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
import socket
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, parse_qsl, unquote, urlsplit

from tpulab.contract import (
    RUN_ID_LABEL,
)
from tpulab.emulator import project_apis, queued
from tpulab.emulator.compute import COMPUTE_ROUTES, compute_project, subnetwork
from tpulab.emulator.faults import GUEST_ATTRIBUTE_ERRORS, FaultPlan
from tpulab.emulator.hosts import HostBackend
from tpulab.emulator.http_front import ApiServer, api_handler, reachable
from tpulab.emulator.iam import (
    ROUTE_PERMISSIONS,
    TOKEN_PREFIX,
    check_permissions,
    granted,
    permission_denied,
    principal,
)
from tpulab.emulator.instances import INSTANCE_ROUTES, InstanceApi, instance_key, is_instance
from tpulab.emulator.machines import Machines, clear_boot, kill_boot, owner_alive, set_live
from tpulab.emulator.persist import EmulatorStateError, StateFile, read_settings_file
from tpulab.emulator.project_apis import PROJECT_ROUTES
from tpulab.emulator.startup import startup_log
from tpulab.emulator.state import (
    CloudState,
    node_json,
    node_key,
    node_path,
    operation_json,
    zone_or_403,
)
from tpulab.emulator.timing import Timing
from tpulab.emulator.wire import ApiError, error_body
from tpulab.emulator.workers import (
    worker_count,
    worker_suffix,
)
from tpulab.emulator.zones import ZONES, Zone

__all__ = ["Emulator"]

log = logging.getLogger(__name__)

Record = dict[str, Any]
Handler = Callable[["_Request"], tuple[int, Record]]

# Enough for any single run (a few hundred requests); old entries fall off the front.
_REQUEST_LOG_SIZE = 10_000
# What tells a Compute instance's files from a TPU node's of the same name.
_INSTANCE_SUFFIX = ".instance"

_P = r"(?P<project>[^/]+)"
_Z = r"(?P<zone>[^/]+)"
_ROUTES: list[tuple[str, re.Pattern[str], str]] = [
    (m, re.compile(r"^/v2(?:alpha1)?/projects/" + _P + p + "$"), name)
    for m, p, name in (
        ("GET", r"/locations", "list_locations"),
        ("GET", r"/locations/" + _Z, "get_location"),
        ("GET", r"/locations/" + _Z + r"/nodes", "list_nodes"),
        ("POST", r"/locations/" + _Z + r"/nodes", "create_node"),
        ("GET", r"/locations/" + _Z + r"/nodes/(?P<node>[^/:]+)", "get_node"),
        ("DELETE", r"/locations/" + _Z + r"/nodes/(?P<node>[^/:]+)", "delete_node"),
        ("PATCH", r"/locations/" + _Z + r"/nodes/(?P<node>[^/:]+)", "update_node"),
        (
            "POST",
            r"/locations/" + _Z + r"/nodes/(?P<node>[^/:]+):getGuestAttributes",
            "get_guest_attributes",
        ),
        ("GET", r"/locations/" + _Z + r"/queuedResources", "list_queued_resources"),
        ("POST", r"/locations/" + _Z + r"/queuedResources", "create_queued_resource"),
        ("GET", r"/locations/" + _Z + r"/queuedResources/(?P<qr>[^/:]+)", "get_queued_resource"),
        (
            "DELETE",
            r"/locations/" + _Z + r"/queuedResources/(?P<qr>[^/:]+)",
            "delete_queued_resource",
        ),
        ("GET", r"/locations/" + _Z + r"/operations", "list_operations"),
        ("GET", r"/locations/" + _Z + r"/operations/(?P<op>[^/]+)", "get_operation"),
        ("GET", r"/locations/" + _Z + r"/acceleratorTypes", "list_accelerator_types"),
        ("GET", r"/locations/" + _Z + r"/acceleratorTypes/(?P<item>[^/]+)", "get_accelerator_type"),
        ("GET", r"/locations/" + _Z + r"/runtimeVersions", "list_runtime_versions"),
        ("GET", r"/locations/" + _Z + r"/runtimeVersions/(?P<item>[^/]+)", "get_runtime_version"),
    )
] + COMPUTE_ROUTES  # gcloud's tpu-vm ssh asks Compute for the project (compute.py)
# Compute's instances API for TPU machine types (instances.py).
_ROUTES.extend(INSTANCE_ROUTES)
# Resource Manager v1, for the node identity's "may I delete myself?" (docs/architecture.md §10).
_ROUTES.append(
    (
        "POST",
        re.compile(r"^/v1/projects/(?P<project>[^/:]+):testIamPermissions$"),
        "test_iam_permissions",
    )
)
# Service Usage, getIamPolicy and Compute networks/firewalls, for `tpulab doctor`.
_ROUTES.extend(PROJECT_ROUTES)

# A zone's catalogs as the TPU API names them: collection -> (each entry's field, the
# entry's noun in a NOT_FOUND, what the zone offers).
_ZONE_CATALOGS: dict[str, tuple[str, str, Callable[[Zone], list[str]]]] = {
    "acceleratorTypes": ("type", "Accelerator type", Zone.accelerator_types),
    "runtimeVersions": ("version", "Runtime version", Zone.runtime_versions),
}


class _Request:
    def __init__(
        self,
        params: dict[str, str],
        query: dict[str, list[str]],
        body: Record,
        *,
        path: str = "",
        caller: Record | None = None,
    ) -> None:
        self.params = params
        self.query = query
        self.body = body
        self.path = path
        self.caller = caller
        """The node whose metadata-server token authorised the call; None: the controller."""
        alt = ";".join(query.get("$alt", []))
        self.as_int = "enum-encoding=int" in alt

    def arg(self, name: str) -> str:
        values = self.query.get(name)
        return values[0] if values else ""

    @property
    def project(self) -> str:
        return self.params["project"]

    @property
    def zone(self) -> str:
        return self.params["zone"]


# Emulated VMs share this machine's /tmp, where a tpulab node's watchdog keeps its files
# (its lease, log and pid: `tpulab-<what>-<run id>[.ext]`, tpulab.remote.watchdog). On a
# real VM they go with its disk; here they go with the node, or every emulated run
# leaves three files behind (thousands over a few test runs).
_SHARED_TMP = Path("/tmp")  # the VM's /tmp, as the watchdog names it


def _forget_tmp_files(node: Record) -> None:
    run_id = str((node.get("labels") or {}).get(RUN_ID_LABEL) or "")
    if not re.fullmatch(r"[a-z0-9][a-z0-9_-]{5,62}", run_id):
        return  # not a tpulab node, or a label this cannot match safely
    ours = re.compile(rf"tpulab-[a-z]+-{re.escape(run_id)}(\.[a-z]+)?")
    for path in _SHARED_TMP.glob(f"tpulab-*-{run_id}*"):
        if ours.fullmatch(path.name):
            with suppress(OSError):
                path.unlink()


class Emulator:
    """The offline Cloud TPU API. `start()` returns its URL; use as a context manager.

    `state_dir` holds `state.json` (the cloud) and `sandboxes/<project>/<zone>/<node>`
    (each node's home directory; worker w > 0 of a multi-host slice has its own,
    `<node>.worker-<w>`, beside it), and `tmp/<project>/<zone>/<node>` likewise (each
    worker's /tmp: `vm_tmp`). A `faults.json` there, if present, seeds `faults`.
    `guests` (default: when there is a host backend) boots each READY node's inside:
    its metadata server and its `startup-script` (see `guest.py`).
    """

    def __init__(
        self,
        state_dir: Path,
        *,
        host_backend: HostBackend | None = None,
        timing: Timing | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        clock: Callable[[], float] = time.time,
        guests: bool | None = None,
    ) -> None:
        self.state_dir = Path(state_dir)
        self.host_backend = host_backend
        self._guests_choice = guests
        self.timing = timing if timing is not None else Timing()
        self.faults = FaultPlan()
        self.calls: Counter[str] = Counter()
        self._requests: deque[Record] = deque(maxlen=_REQUEST_LOG_SIZE)
        self._requests_lock = threading.Lock()
        self._bind = (host, port)
        self._clock = clock
        self._wake = threading.Event()
        self._file = StateFile(self.state_dir, on_change=self._wake.set)
        self._owner = f"{os.getpid()}:{uuid.uuid4().hex}"
        self._server: ApiServer | None = None
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()
        # When the ticker's last transaction found the next timed transition due
        # (CloudState.next_due, in this emulator's clock).
        self._next_due = math.inf
        self.ticks = 0
        """How many times `tick` ran (tests tell a sleeping ticker from a polling one)."""
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        self.url = ""
        self.failure: EmulatorStateError | None = None
        """Set when the state on disk became unusable while serving; the owner stops."""
        # The guests and SSH hosts behind READY nodes and RUNNING instances (machines.py).
        self._machines = Machines(
            self,
            owner=self._owner,
            state_file=self._file,
            transaction=self._transaction,
            clock=self._clock,
        )
        self._instances = InstanceApi(
            self._transaction, self._clock, self.faults, wake=self._wake.set
        )
        self._seed_faults(self.state_dir / "faults.json")

    @property
    def guests(self) -> bool:
        """Boot READY nodes' insides? Asked late: a caller may set `host_backend` after
        construction (`tpulab emulator serve` does)."""
        if self._guests_choice is None:
            return self.host_backend is not None
        return self._guests_choice

    def _seed_faults(self, faults_file: Path) -> None:
        hint = "Fix it (field names as GET /_emulator/faults shows) or delete it."
        values = read_settings_file(faults_file, "faults file", hint=hint)
        if values is None:
            return
        try:
            self.faults.update(values)
        except ValueError as error:
            raise EmulatorStateError(
                f"The emulator faults file {faults_file} is not a valid fault plan ({error}).",
                hint=hint,
            ) from None

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> str:
        if self._server is not None:
            return self.url
        self._file.read()  # an unusable state directory fails here, before anything runs
        self.failure = None
        set_live(self._owner, True)
        self._stopping.clear()
        server = ApiServer(self._bind, api_handler(self))
        server.daemon_threads = True
        self._server = server
        host, port = server.server_address[:2]
        self.url = f"http://{reachable(str(host))}:{port}"
        serve = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},  # so stop() returns promptly
            name="tpu-emulator-http",
            daemon=True,
        )
        tick = threading.Thread(target=self._tick_loop, name="tpu-emulator-tick", daemon=True)
        self._threads = [serve, tick]
        for thread in self._threads:
            thread.start()
        self.tick()
        return self.url

    def stop(self) -> None:
        """Stop serving and stop the SSH hosts we started; the state stays on disk."""
        server, self._server = self._server, None
        if server is None:
            return
        self._stopping.set()
        self._wake.set()
        server.shutdown()
        server.server_close()
        with self._connections_lock:
            for connection in list(self._connections):
                with suppress(OSError):
                    connection.shutdown(socket.SHUT_RDWR)
        for thread in self._threads:
            thread.join(timeout=5)
        set_live(self._owner, False)
        owned = self._machines.owned()
        for key in owned:
            self._machines.stop(key)  # (it skips keys no longer booted: take no copy first)
        # A state file that went bad cannot record that our hosts are gone; the next
        # emulator restarts them anyway (their owner is no longer alive).
        with suppress(EmulatorStateError), self._file.transaction() as data:
            for key in owned:
                node = data["nodes"].get(key)
                if node is not None and (node.get("host") or {}).get("owner") == self._owner:
                    clear_boot(node, None)

    def __enter__(self) -> Emulator:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def check_state(self) -> None:
        """The state directory usable and its state file, if any, readable: the
        EmulatorStateError that says why not, before anything is built in them. Writes
        nothing (a fresh directory is made, no state file)."""
        self._file.read()

    # -- inspection (tests, admin endpoint) -------------------------------------------

    def snapshot(self) -> Record:
        """The whole state after applying due transitions (a deep copy)."""
        with self._transaction() as cloud:
            return json.loads(json.dumps(cloud.data))  # type: ignore[no-any-return]

    def node_names(self, project: str | None = None) -> list[str]:
        """Names of the nodes that exist (any state), optionally in one project."""
        nodes = self.snapshot()["nodes"].values()
        return sorted(
            n["name"]
            for n in nodes
            if not is_instance(n) and (project is None or n["project"] == project)
        )

    def sandbox(self, project: str, zone: str, node: str, worker: int = 0) -> Path:
        """The home directory of the node's worker `worker` (0: a single host's)."""
        return self.state_dir / "sandboxes" / project / zone / (node + worker_suffix(worker))

    def instance_home(self, project: str, zone: str, instance: str) -> Path:
        """The home directory of a Compute instance's VM (beside nodes' sandboxes; no
        node name ends in ".instance")."""
        return self.state_dir / "sandboxes" / project / zone / (instance + _INSTANCE_SUFFIX)

    def instance_names(self, project: str | None = None) -> list[str]:
        """Names of the Compute instances that exist (any status)."""
        records = self.snapshot()["nodes"].values()
        return sorted(
            r["name"]
            for r in records
            if is_instance(r) and (project is None or r["project"] == project)
        )

    def clock_skip_file(self, project: str, zone: str, node: str, worker: int = 0) -> Path:
        """How far the worker's clock was moved forward (beside, not in, its home)."""
        return self.state_dir / "clocks" / project / zone / (node + worker_suffix(worker))

    def vm_tmp(self, project: str, zone: str, node: str, worker: int = 0) -> Path:
        """The directory that is the worker's /tmp (contract.EMULATED_TMP_ENV): where its
        watchdog keeps its files and reads the lease renewed on that worker. Beside,
        not in, its home; it goes with the node."""
        return self.state_dir / "tmp" / project / zone / (node + worker_suffix(worker))

    def skip_vm_clock(
        self, project: str, zone: str, node: str, seconds: float, *, instance: bool = False
    ) -> float:
        """Move a booted node's clock `seconds` forward, as if that long had passed on the
        VM with nothing else happening: its watchdog's --ttl deadline and lease come that
        much sooner, so a test need not wait minutes of real time for them. The total
        skipped since the node booted; KeyError when the node has no booted guest.
        Every worker of a slice moves together (worker 0's total is returned).
        `instance`: `node` names a Compute instance (instances.py), not a TPU node."""
        key = (instance_key if instance else node_key)(project, zone, node)
        guests = self._machines.guests_of(key)
        if 0 not in guests:
            raise KeyError(f"{key} has no booted guest")
        totals = {worker: guest.skip_clock(seconds) for worker, guest in guests.items()}
        return totals[0]

    def startup_log(self, project: str, zone: str, node: str, worker: int = 0) -> Path:
        """Where the worker's startup-script output goes (in its sandbox, while it exists)."""
        return startup_log(self.sandbox(project, zone, node, worker))

    def instance_startup_log(self, project: str, zone: str, instance: str) -> Path:
        """Where a Compute instance's startup-script output goes (in its home)."""
        return startup_log(self.instance_home(project, zone, instance))

    def requests(self) -> list[Record]:
        """The API requests received so far, oldest first, as they arrived on the wire:
        `method`, `path` (percent-decoded), `query` (decoded [name, value] pairs in the
        order sent) and `body` (the parsed JSON object, None when there was none).
        A request made with a node's metadata-server token (its own processes: the
        watchdog) also has `caller`, that node's resource name; the controller's have no
        `caller`, so what a controller sent is `[r for r in requests() if "caller" not in r]`.
        Admin calls under /_emulator/ are not API requests and are not logged."""
        with self._requests_lock:
            return json.loads(json.dumps(list(self._requests)))  # type: ignore[no-any-return]

    def clear_requests(self) -> None:
        with self._requests_lock:
            self._requests.clear()

    # -- state and hosts -------------------------------------------------------------

    @contextmanager
    def _transaction(self) -> Iterator[CloudState]:
        gone: list[Record] = []
        with self._file.transaction() as data:
            cloud = CloudState(data, self.timing, self.faults)
            now = self._clock()
            gone = cloud.advance(now)
            queued.advance_queued(cloud, now)  # may start or delete nodes: next advance
            yield cloud
        self._forget(gone)
        if gone:
            self._wake.set()

    def _forget(self, gone: list[Record]) -> None:
        for node in gone:
            self._machines.stop(self.machine_key(node))
            kill_boot(node)  # booted by an emulator that died: nobody else will
            for worker in range(worker_count(node["accelerator_type"])):
                shutil.rmtree(self.machine_home(node, worker), True)
                self.machine_clock_file(node, worker).unlink(missing_ok=True)
                shutil.rmtree(self.machine_tmp(node, worker), True)
            _forget_tmp_files(node)

    def _tick_loop(self) -> None:
        """Tick when woken (a write to the state: a request, or the last tick itself),
        when the next timed transition is due, and at least every idle_tick_seconds (a
        write by another process on the same state, an owner that died): an idle
        emulator no longer reads its state 20 times a second, and a transition still
        starts or stops its hosts within a tick of when it is due."""
        tick, idle = self.timing.tick_seconds, self.timing.idle_tick_seconds
        last = -math.inf
        while not self._stopping.is_set():
            until_due = self._next_due - self._clock()
            self._wake.wait(min(idle, max(tick, until_due)))
            self._wake.clear()
            # However often writes wake it, no more than one tick per tick_seconds.
            self._stopping.wait(max(0.0, last + tick - time.monotonic()))
            if self._stopping.is_set():
                return
            last = time.monotonic()
            try:
                self.tick()
            except EmulatorStateError as error:
                # Every further tick would fail the same way: say it once and stop.
                log.error("%s %s", error, error.hint)
                self.failure = error
                return
            except Exception:
                log.exception("emulator tick failed")

    def tick(self) -> None:
        """Apply due transitions, then start or stop SSH hosts to match node states."""
        to_start: list[Record] = []
        to_stop: list[str] = []
        to_rekey: list[tuple[str, str, int]] = []
        self.ticks += 1
        with self._transaction() as cloud:
            self._next_due = cloud.next_due
            for key, node in cloud.nodes.items():
                host = node.get("host") or {}
                mine = host.get("owner") == self._owner
                ssh_keys = self._machines.authorized_keys(node["metadata"])
                if mine and "port" in host and host.get("ssh_keys") != ssh_keys:
                    host["ssh_keys"] = ssh_keys  # UpdateNode (or OS Login) changed them
                    # Every worker's guest agent installs the node's keys.
                    to_rekey.append((key, ssh_keys, worker_count(node["accelerator_type"])))
                # A preempted VM stops at once, while the API may still say READY.
                stopped = node.get("vm_stopped_at") is not None
                if mine and (stopped or node["state"] not in {"READY", "DELETING"}):
                    to_stop.append(key)
                    published = dict(node.get("guest_attributes") or {})
                    clear_boot(node, None)
                    if stopped and node["state"] == "READY":
                        # Reclaimed with the state lagging: what worker 0 published before
                        # its VM stopped (the watchdog's `tpulab/preempted` above all) is
                        # held by the API, not the VM, and stays readable meanwhile.
                        node["guest_attributes"] = published
                elif (
                    (self.host_backend is not None or self.guests)
                    and node["state"] == "READY"
                    and not stopped
                    and not owner_alive(host.get("owner"))
                ):
                    # A new boot. The old one's init died with its emulator; should any
                    # process of it have survived, it goes now (its tag is on record).
                    kill_boot(node)
                    clear_boot(node, {"owner": self._owner})
                    to_start.append(dict(node))
        for key in to_stop:
            self._machines.stop(key)
        for key, ssh_keys, count in to_rekey:
            self._machines.rekey(key, ssh_keys, count)
        for node in to_start:
            self._machines.start(node)

    # -- where a machine's files live (machines.MachineHost) ------------------------

    def machine_key(self, record: Record) -> str:
        """The state key of a node or instance record."""
        project, zone, name = record["project"], record["zone"], record["name"]
        if is_instance(record):
            return instance_key(project, zone, name)
        return node_key(project, zone, name)

    def machine_home(self, record: Record, worker: int) -> Path:
        """The home directory of a record's worker (`sandbox` of a node, and of an
        instance `instance_home`: a node and an instance may share a name)."""
        if is_instance(record):
            return self.instance_home(record["project"], record["zone"], record["name"])
        return self.sandbox(record["project"], record["zone"], record["name"], worker)

    def machine_clock_file(self, record: Record, worker: int) -> Path:
        name = record["name"] + (_INSTANCE_SUFFIX if is_instance(record) else "")
        return self.clock_skip_file(record["project"], record["zone"], name, worker)

    def machine_tmp(self, record: Record, worker: int) -> Path:
        name = record["name"] + (_INSTANCE_SUFFIX if is_instance(record) else "")
        return self.vm_tmp(record["project"], record["zone"], name, worker)

    # -- request handling --------------------------------------------------------------

    def handle(
        self,
        method: str,
        raw_path: str,
        body: Record,
        *,
        has_body: bool = True,
        authorization: str = "",
    ) -> tuple[int, Record]:
        """Answer one API request: (HTTP status, JSON body). `has_body` is False when
        the request carried no body at all (the log tells that apart from `{}`).
        `authorization` is the request's header: a node's metadata-server token makes
        the call that node's identity's; anything else is the controller's, as before."""
        split = urlsplit(raw_path)
        path = unquote(split.path)
        query = parse_qs(split.query, keep_blank_values=True)
        if path.startswith("/_emulator/"):
            return self._admin(method, path, body)
        entry: Record = {
            "method": method,
            "path": path,
            "query": [list(pair) for pair in parse_qsl(split.query, keep_blank_values=True)],
            "body": body if has_body else None,
        }
        caller: Record | None = None
        refused: ApiError | None = None
        try:
            caller = self._caller(authorization)
        except ApiError as error:
            refused = error
        if caller is not None:
            entry["caller"] = node_path(caller["project"], caller["zone"], caller["name"])
        elif refused is not None:
            entry["caller"] = "an invalid or expired node token"
        with self._requests_lock:
            self._requests.append(json.loads(json.dumps(entry)))
        for route_method, pattern, name in _ROUTES:
            match = pattern.match(path)
            if match and route_method == method:
                self.calls[name] += 1
                try:
                    if refused is not None:
                        raise refused
                    request = _Request(match.groupdict(), query, body, path=path, caller=caller)
                    return self._dispatch(name, request)
                except ApiError as error:
                    return error.http_code, error_body(error)
        return 404, error_body(ApiError(404, "NOT_FOUND", f"No such method: {method} {path}"))

    def _dispatch(self, name: str, request: _Request) -> tuple[int, Record]:
        if request.params.get("project") in self.faults.deny_projects:
            raise ApiError(
                403,
                "PERMISSION_DENIED",
                f"Permission denied on resource project {request.project} (or it may not "
                "exist). Cloud TPU API has not been used in project "
                f"{request.project} before or it is disabled.",
                reason="SERVICE_DISABLED",
            )
        if name in ROUTE_PERMISSIONS and "tpu.googleapis.com" in self.faults.disabled_services:
            raise project_apis.service_disabled(request.project)
        if self.faults.take_rate_limited(name):
            raise ApiError(
                429,
                "RESOURCE_EXHAUSTED",
                "Quota exceeded for quota metric 'Requests' and limit 'Requests per minute' "
                "of service 'tpu.googleapis.com'.",
                reason="RATE_LIMIT_EXCEEDED",
            )
        if self.faults.take_transient(name):
            raise ApiError(
                503, "UNAVAILABLE", "The service is currently unavailable.", reason="UNAVAILABLE"
            )
        if name in self._INSTANCE_CALLS:
            return self._instances.handle(name, request)  # its own auth and error shape
        self._authorize(name, request)
        handler: Callable[[_Request], tuple[int, Record]] = getattr(self, f"_api_{name}")
        answer = handler(request)
        if name == "create_node" and self.faults.take_create_lost_reply():
            raise ApiError(
                503, "UNAVAILABLE", "The service is currently unavailable.", reason="UNAVAILABLE"
            )
        return answer

    _INSTANCE_CALLS = frozenset(name for _, _, name in INSTANCE_ROUTES)

    def _caller(self, authorization: str) -> Record | None:
        if TOKEN_PREFIX not in authorization:
            return None  # no node token: the controller, with the project owner's rights
        with self._transaction() as cloud:
            node = principal(cloud.nodes.values(), authorization, self._clock())
            return None if node is None else json.loads(json.dumps(node))

    def _authorize(self, name: str, request: _Request) -> None:
        """A node identity may do what its IAM grants, in its own project only."""
        caller = request.caller
        permission = ROUTE_PERMISSIONS.get(name)
        if permission is None:
            return
        if caller is None:  # the controller: the owner, less what `caller_lacks` takes
            if permission in self.faults.caller_lacks:
                raise permission_denied(permission, request.path.split("/", 2)[-1])
            return
        if caller["project"] != request.project or not granted(caller, self.faults, [permission]):
            resource = request.path.split("/", 2)[-1].split(":", 1)[0]
            raise permission_denied(permission, resource)

    def _api_test_iam_permissions(self, request: _Request) -> tuple[int, Record]:
        """Resource Manager v1 projects.testIamPermissions: the asked permissions the
        caller holds on the project (the controller: all of them, as the owner)."""
        asked = check_permissions(request.body.get("permissions", []))
        caller = request.caller
        if caller is None:
            held = [p for p in asked if p not in self.faults.caller_lacks]
        elif caller["project"] != request.project:
            held = []
        else:
            held = granted(caller, self.faults, asked)
        return 200, ({"permissions": held} if held else {})

    def _page(self, request: _Request, items: list[Record], key: str) -> Record:
        size = self.timing.page_size
        asked = request.arg("pageSize")
        if asked:
            if not asked.isdigit():
                raise ApiError(400, "INVALID_ARGUMENT", f"Invalid pageSize {asked!r}.")
            size = min(int(asked), size) or size
        start = 0
        token = request.arg("pageToken")
        if token:
            if not token.isdigit() or int(token) > len(items):
                raise ApiError(400, "INVALID_ARGUMENT", f"Invalid pageToken {token!r}.")
            start = int(token)
        end = start + size
        page: Record = {key: items[start:end]}
        if end < len(items):
            page["nextPageToken"] = str(end)
        return page

    def _api_list_nodes(self, request: _Request) -> tuple[int, Record]:
        with self._transaction() as cloud:
            nodes = [
                node_json(n, as_int=request.as_int)
                for n in cloud.list_nodes(request.project, request.zone)
            ]
        page = self._page(request, nodes, "nodes")
        page["unreachable"] = []
        return 200, page

    def _api_create_node(self, request: _Request) -> tuple[int, Record]:
        now = self._clock()
        with self._transaction() as cloud:
            operation = cloud.create_node(
                request.project, request.zone, request.arg("nodeId"), request.body, now
            )
            node = cloud.nodes.get(node_key(request.project, request.zone, operation["node"]))
            answer = operation_json(operation, node, now=now, as_int=request.as_int)
        self._wake.set()
        return 200, answer

    def _api_get_node(self, request: _Request) -> tuple[int, Record]:
        with self._transaction() as cloud:
            node = cloud.get_node(request.project, request.zone, request.params["node"])
            return 200, node_json(node, as_int=request.as_int)

    def _api_delete_node(self, request: _Request) -> tuple[int, Record]:
        if self.faults.take_garbled_delete():
            # JSON, but no google.longrunning.Operation: `done` must be a boolean.
            return 200, {"name": "operations/garbled", "done": "garbled"}
        now = self._clock()
        with self._transaction() as cloud:
            operation = cloud.delete_node(
                request.project, request.zone, request.params["node"], now
            )
            answer = operation_json(operation, None, now=now, as_int=request.as_int)
        self._wake.set()
        return 200, answer

    def _api_update_node(self, request: _Request) -> tuple[int, Record]:
        now = self._clock()
        with self._transaction() as cloud:
            operation = cloud.update_node(
                request.project,
                request.zone,
                request.params["node"],
                request.body,
                request.arg("updateMask"),
                now,
            )
            node = cloud.nodes.get(node_key(request.project, request.zone, operation["node"]))
            answer = operation_json(operation, node, now=now, as_int=request.as_int)
        self._wake.set()
        return 200, answer

    def _api_get_guest_attributes(self, request: _Request) -> tuple[int, Record]:
        """GetGuestAttributes: one `guestAttributes[]` entry per asked worker, in the
        order asked; `workerIds` empty (or gcloud's [""]) asks for every worker, in worker
        order (GetGuestAttributesRequest: "If it is empty, all workers' GuestAttributes
        will be returned"). An entry is {queryPath, queryValue.items[]}: the v2
        GuestAttributes message has no worker field (google-cloud-tpu's cloud_tpu.py,
        gcloud's tpu_v2_messages.py), so clients index the answer by position (gcloud's
        tpu_vm/ssh.py GetFromGuestAttributes(guest_attributes, worker, key))."""
        query_path = str(request.body.get("queryPath") or request.body.get("query_path") or "")
        now = self._clock()
        with self._transaction() as cloud:
            node = cloud.get_node(request.project, request.zone, request.params["node"])
            self._guest_attributes_fault(node, now)
            workers = _asked_workers(request.body, node)
            answers = [cloud.guest_attributes(node, query_path, now, w) for w in workers]
        return 200, {
            "guestAttributes": [
                {"queryPath": query_path, "queryValue": {"items": _items(attributes)}}
                for attributes in answers
            ]
        }

    def _guest_attributes_fault(self, node: Record, now: float) -> None:
        """The `guest_attributes_error_for` fault: an error until that long after READY;
        `guest_attributes_disabled`: the org policy's refusal, always."""
        if self.faults.guest_attributes_disabled:
            constraint = "constraints/compute.disableGuestAttributesAccess"
            subject = f"projects/{node['project']}"
            raise ApiError(
                400,
                "FAILED_PRECONDITION",
                f"Constraint {constraint} violated for {subject}: access to guest "
                "attributes is disabled by an organization policy.",
                reason="CONSTRAINT_VIOLATED",
                details=[
                    {
                        "@type": "type.googleapis.com/google.rpc.PreconditionFailure",
                        "violations": [
                            {
                                "type": constraint,
                                "subject": subject,
                                "description": "Guest attributes access is disabled.",
                            }
                        ],
                    }
                ],
            )
        error_for = self.faults.guest_attributes_error_for
        ready_time = node.get("ready_time")
        if error_for <= 0 or (ready_time is not None and now >= ready_time + error_for):
            return
        status = self.faults.guest_attributes_error
        raise ApiError(
            GUEST_ATTRIBUTE_ERRORS[status],
            status,
            f"Guest attributes of node {node['name']} are not available yet.",
        )

    def _api_get_operation(self, request: _Request) -> tuple[int, Record]:
        name = (
            f"projects/{request.project}/locations/{request.zone}/operations/{request.params['op']}"
        )
        now = self._clock()
        with self._transaction() as cloud:
            operation = cloud.get_operation(request.project, request.zone, name)
            return 200, self._operation_json(cloud, operation, now, request.as_int)

    def _operation_json(self, cloud: CloudState, op: Record, now: float, as_int: bool) -> Record:
        if queued.is_queued_operation(op):
            record = cloud.data.get("queued_resources", {}).get(
                node_key(op["project"], op["zone"], op["node"])
            )
            return queued.queued_operation_json(op, record, now=now, as_int=as_int)
        node = cloud.nodes.get(node_key(op["project"], op["zone"], op["node"]))
        return operation_json(op, node, now=now, as_int=as_int)

    def _api_list_operations(self, request: _Request) -> tuple[int, Record]:
        now = self._clock()
        with self._transaction() as cloud:
            operations = [
                self._operation_json(cloud, op, now, request.as_int)
                for op in cloud.list_operations(request.project, request.zone)
            ]
        return 200, self._page(request, operations, "operations")

    def _api_get_compute_project(self, request: _Request) -> tuple[int, Record]:
        return 200, compute_project(request.project, os_login=self.faults.project_os_login)

    # -- the project's other APIs (project_apis.py), for `tpulab doctor` ----------------

    def _api_get_service(self, request: _Request) -> tuple[int, Record]:
        return 200, project_apis.service(request.project, request.params["service"], self.faults)

    def _api_get_tokeninfo(self, request: _Request) -> tuple[int, Record]:
        return 200, project_apis.tokeninfo()

    def _api_get_iam_policy(self, request: _Request) -> tuple[int, Record]:
        return 200, project_apis.iam_policy(request.project, self.faults)

    def _api_get_network(self, request: _Request) -> tuple[int, Record]:
        return project_apis.network(request.project, request.params["network"], self.faults)

    def _api_list_firewalls(self, request: _Request) -> tuple[int, Record]:
        return project_apis.firewall_list(request.project, self.faults)

    def _api_get_subnetwork(self, request: _Request) -> tuple[int, Record]:
        networks = project_apis.project_networks(self.faults)
        private_access = self.faults.private_google_access
        region, name = request.params["region"], request.params["subnetwork"]
        return subnetwork(
            request.project, region, name, networks=networks, private_google_access=private_access
        )

    # -- queued resources (the logic is queued.py's) ----------------------------------

    def _api_create_queued_resource(self, request: _Request) -> tuple[int, Record]:
        now = self._clock()
        with self._transaction() as cloud:
            operation = queued.create_queued_resource(
                cloud,
                request.project,
                request.zone,
                request.arg("queuedResourceId"),
                request.body,
                now,
            )
            answer = self._operation_json(cloud, operation, now, request.as_int)
        self._wake.set()
        return 200, answer

    def _api_get_queued_resource(self, request: _Request) -> tuple[int, Record]:
        with self._transaction() as cloud:
            record = queued.get_queued_resource(
                cloud, request.project, request.zone, request.params["qr"]
            )
            return 200, queued.queued_resource_json(record, as_int=request.as_int)

    def _api_list_queued_resources(self, request: _Request) -> tuple[int, Record]:
        with self._transaction() as cloud:
            records = [
                queued.queued_resource_json(r, as_int=request.as_int)
                for r in queued.list_queued_resources(cloud, request.project, request.zone)
            ]
        page = self._page(request, records, "queuedResources")
        page["unreachable"] = []
        return 200, page

    def _api_delete_queued_resource(self, request: _Request) -> tuple[int, Record]:
        now = self._clock()
        force = request.arg("force").lower() in {"true", "1"}
        with self._transaction() as cloud:
            operation = queued.delete_queued_resource(
                cloud, request.project, request.zone, request.params["qr"], force, now
            )
            answer = self._operation_json(cloud, operation, now, request.as_int)
        self._wake.set()
        return 200, answer

    def _api_list_locations(self, request: _Request) -> tuple[int, Record]:
        locations = [_location(request.project, zone) for zone in sorted(ZONES)]
        return 200, self._page(request, locations, "locations")

    def _api_get_location(self, request: _Request) -> tuple[int, Record]:
        zone_or_403(request.project, request.zone)
        return 200, _location(request.project, request.zone)

    def _api_list_accelerator_types(self, request: _Request) -> tuple[int, Record]:
        return self._zone_catalog(request, "acceleratorTypes")

    def _api_get_accelerator_type(self, request: _Request) -> tuple[int, Record]:
        return self._zone_catalog(request, "acceleratorTypes", request.params["item"])

    def _api_list_runtime_versions(self, request: _Request) -> tuple[int, Record]:
        return self._zone_catalog(request, "runtimeVersions")

    def _api_get_runtime_version(self, request: _Request) -> tuple[int, Record]:
        return self._zone_catalog(request, "runtimeVersions", request.params["item"])

    def _zone_catalog(
        self, request: _Request, collection: str, item: str | None = None
    ) -> tuple[int, Record]:
        """One of a zone's catalogs (`collection`, see _ZONE_CATALOGS): a page of it, or
        with `item` that one entry (NOT_FOUND where the zone does not offer it)."""
        zone = zone_or_403(request.project, request.zone)
        field, noun, offered = _ZONE_CATALOGS[collection]
        parent = f"projects/{request.project}/locations/{request.zone}/{collection}"
        if item is None:
            entries = [{"name": f"{parent}/{v}", field: v} for v in offered(zone)]
            return 200, self._page(request, entries, collection)
        if item not in offered(zone):
            raise ApiError(404, "NOT_FOUND", f"{noun} {item} not found in {zone.name}")
        return 200, {"name": f"{parent}/{item}", field: item}

    def _admin(self, method: str, path: str, body: Record) -> tuple[int, Record]:
        if path == "/_emulator/faults" and method == "GET":
            return 200, self.faults.to_dict()
        if path == "/_emulator/faults" and method == "POST":
            try:
                self.faults.update(body)
            except ValueError as error:
                return 400, error_body(ApiError(400, "INVALID_ARGUMENT", str(error)))
            self._wake.set()  # a new fault may time a transition (a preemption) sooner
            return 200, self.faults.to_dict()
        if path == "/_emulator/state" and method == "GET":
            return 200, {**self.snapshot(), "calls": dict(self.calls)}
        if path == "/_emulator/requests" and method == "GET":
            return 200, {"requests": self.requests()}
        if path == "/_emulator/requests" and method == "DELETE":
            self.clear_requests()
            return 200, {}
        return 404, error_body(ApiError(404, "NOT_FOUND", f"No such admin call: {method} {path}"))

    # -- connection bookkeeping (so stop() can end keep-alive sessions) ----------------

    def track_connection(self, connection: socket.socket, alive: bool) -> None:
        """Called by the HTTP front (http_front.py) as each connection opens and closes."""
        with self._connections_lock:
            if alive:
                self._connections.add(connection)
            else:
                self._connections.discard(connection)


def _asked_workers(body: Record, node: Record) -> list[int]:
    count = worker_count(node["accelerator_type"])
    asked = body.get("workerIds", body.get("worker_ids")) or []
    if not isinstance(asked, list):
        raise ApiError(400, "INVALID_ARGUMENT", f"Invalid workerIds {asked!r}: want a list.")
    if not asked or "" in asked:
        return list(range(count))
    workers: list[int] = []
    for worker in asked:
        text = str(worker)
        if not (text.isascii() and text.isdigit() and int(text) < count):
            # The emulator's refusal (the real words are not on record).
            raise ApiError(
                400,
                "INVALID_ARGUMENT",
                f"Invalid worker ID {worker!r}: node {node['name']} has workers 0 to {count - 1}.",
            )
        workers.append(int(text))
    return workers


def _items(attributes: dict[str, str]) -> list[Record]:
    return [
        {"namespace": k.split("/", 1)[0], "key": k.split("/", 1)[1], "value": v}
        for k, v in sorted(attributes.items())
    ]


def _location(project: str, zone: str) -> Record:
    return {"name": f"projects/{project}/locations/{zone}", "locationId": zone}
