"""A kept node (`tpulab up`): what a session is, how it is brought up and taken down.

- `SessionState`: everything later commands need to reach the node again -- name, run
  id, node, zone, project, API endpoint and provider (a Cloud TPU API node, or a Compute
  Engine instance: docs/reference/providers.md), SSH user/address/port, the pinned host key, the
  watchdog's config (to renew its lease), the hard deadline and the idle expiry (wall
  clock, UTC epoch seconds). A multi-host slice's other workers (`WorkerAddress`: each
  its own address, port and pinned host key) and where its JAX processes meet are kept
  too: every worker's watchdog reads its own lease, so every command that renews the
  lease must reach them all (`worker_targets`). The private key is not in it: the store
  keeps that in a 0600 file beside it (tpulab.cleanup.sessions).
- `bring_up(life)`: a `KeptRun` (tpulab.run.lifecycle), so a failed `up` goes through
  the very teardown of `run` and only a verified one keeps its node.
- `take_down(api, state)`: the run's teardown (`delete_and_confirm`) for a kept node.
- `exec_lock_for_down(state, key)`: `down` takes the session's exec lock (the one each
  `exec` takes: tpulab.run.attach) before it deletes, so it never deletes a node under a
  running exec (which would lose its artifacts), and no exec starts meanwhile.
- `renew_argv(state)`: the watchdog's lease renewal as one remote command.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from tpulab.catalog import Provider, vm_kind
from tpulab.errors import NodeVanishedError, TpuLabError, VerificationError
from tpulab.remote.watchdog import WatchdogConfig, renew_command
from tpulab.run.teardown import TeardownReport, delete_and_confirm

if TYPE_CHECKING:
    from tpulab.cloud.api import TpuApi
    from tpulab.models import NodeInfo
    from tpulab.remote.keys import RunKey, SshTarget
    from tpulab.remote.workload import LockHolder
    from tpulab.run.lifecycle import KeptRun
    from tpulab.run.workers import Worker

__all__ = [
    "DownLock",
    "SessionState",
    "WorkerAddress",
    "abandon",
    "address_of",
    "bring_up",
    "exec_lock_for_down",
    "readdressed",
    "renew_argv",
    "take_down",
    "worker_addresses",
]


@dataclass(frozen=True)
class WorkerAddress:
    """Where one of a slice's other workers listens, and the host key `up` pinned for it
    (each worker VM has its own)."""

    host: str
    port: int
    host_key_type: str
    host_key_b64: str

    @classmethod
    def of(cls, target: SshTarget) -> WorkerAddress:
        return cls(target.host, target.port, target.host_key.key_type, target.host_key.b64)


@dataclass(frozen=True)
class SessionState:
    name: str
    run_id: str
    node_name: str
    zone: str
    project: str
    api_endpoint: str | None  # None: Google's default endpoint
    accelerator_type: str
    spot: bool
    ssh_user: str
    ssh_host: str
    ssh_port: int
    host_key_type: str
    host_key_b64: str
    watchdog: dict[str, Any]  # WatchdogConfig's fields
    started_at: float  # wall clock (epoch seconds) when the create was sent, roughly
    deadline_at: float  # the watchdog's hard deadline (--ttl), epoch seconds
    idle_seconds: float  # the lease (--idle)
    renewed_at: float  # the last lease renewal, epoch seconds
    # The id of the receipt `up` verified on this node: the gate every `exec` passes
    # (DESIGN §3.9). A default, so a session.json written before it existed still loads.
    receipt_id: str | None = None
    # A slice's workers 1..N-1, in worker order (worker 0 is ssh_host, ssh_port and the
    # host_key_* fields above, as for a single host); empty for a single host, and in a
    # session.json written before slices had sessions (which then loads as one worker).
    other_workers: tuple[WorkerAddress, ...] = ()
    # A slice's "address:port" where its JAX processes meet (worker 0's internal
    # address): what `exec` passes as JAX_COORDINATOR_ADDRESS. None for a single host.
    coordinator: str | None = None
    # Which API the node lives behind: "tpu-api" (a TPU node) or "compute" (a Compute
    # Engine instance); every later command rebuilds that API to find, follow and delete
    # it. A session.json written before Compute had sessions loads as "tpu-api". No image
    # is kept: only a create sends one, and a session's node exists already.
    provider: Provider = "tpu-api"

    @property
    def vm_kind(self) -> str:
        """What its provider calls the VM, for what the user reads: "node" (Cloud TPU
        API) or "instance" (Compute Engine), as gcloud names them."""
        return vm_kind(self.provider)

    @property
    def idle_expires_at(self) -> float:
        return self.renewed_at + self.idle_seconds

    @property
    def worker_count(self) -> int:
        return 1 + len(self.other_workers)

    def watchdog_config(self) -> WatchdogConfig:
        return WatchdogConfig(**self.watchdog)

    def ssh_target(self) -> SshTarget:
        """Where its node listens, with the host key `up` pinned."""
        from tpulab.remote.keys import HostKey, SshTarget

        host_key = HostKey(self.host_key_type, self.host_key_b64)
        return SshTarget(self.ssh_host, self.ssh_port, self.ssh_user, host_key)

    def worker_targets(self) -> list[SshTarget]:
        """Every worker's target, worker 0 first (one for a single host)."""
        from tpulab.remote.keys import HostKey, SshTarget

        others = [
            SshTarget(w.host, w.port, self.ssh_user, HostKey(w.host_key_type, w.host_key_b64))
            for w in self.other_workers
        ]
        return [self.ssh_target(), *others]

    def check_worker(self, worker: int) -> None:
        """ConfigError (exit 2) for a worker the node has not, before anything is sent."""
        from tpulab.errors import ConfigError

        count = self.worker_count
        if 0 <= worker < count:
            return
        have = "one worker (0)" if count == 1 else f"{count} workers (0-{count - 1})"
        raise ConfigError(
            f"Session {self.name}'s node ({self.accelerator_type}) has {have}: "
            f"there is no worker {worker}.",
            hint=f"Pass --worker between 0 and {count - 1}.",
        )

    def worker_target(self, worker: int) -> SshTarget:
        """Worker `worker`'s target (`check_worker` first)."""
        self.check_worker(worker)
        return self.worker_targets()[worker]

    def renewed(self, at: float) -> SessionState:
        return replace(self, renewed_at=at)

    def moved_to(self, addresses: Sequence[tuple[str, int]]) -> SessionState:
        """The session with its workers at `addresses` (host, port; worker 0 first, one
        per worker); their pinned host keys stay as they are."""
        (host, port), others = addresses[0], addresses[1:]
        moved = tuple(
            replace(worker, host=address[0], port=address[1])
            for worker, address in zip(self.other_workers, others, strict=True)
        )
        return replace(self, ssh_host=host, ssh_port=port, other_workers=moved)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> SessionState:
        """Parse a session.json strictly (types included: a port of "22" or a missing
        deadline would fail later, in the middle of a command); ValueError saying what
        is wrong, in a few words."""
        from pydantic import TypeAdapter, ValidationError

        if not text.strip():
            raise ValueError("the file is empty")
        try:
            return TypeAdapter(cls).validate_json(text, strict=True)
        except ValidationError as error:
            raise ValueError(_what_is_wrong(error)) from None


def _what_is_wrong(error: Any) -> str:
    """A pydantic ValidationError in one short phrase (a dozen missing fields would
    otherwise fill the screen)."""
    problems: list[dict[str, Any]] = list(error.errors())
    missing = [".".join(map(str, p["loc"])) for p in problems if p["type"] == "missing"]
    if missing and len(missing) == len(problems):
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        return f"fields missing: {', '.join(missing[:3])}{more}"
    first = problems[0]
    where = ".".join(map(str, first["loc"]))
    said = f"{where}: {first['msg']}" if where else str(first["msg"])
    if first["type"] == "dataclass_type":
        said = "not a JSON object"
    return said + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")


def bring_up(
    life: KeptRun, *, session_name: str, now: Callable[[], float] = time.time
) -> SessionState:
    """Run `life` and describe the node it kept.

    Raises whatever the run raises; a run that ends without keeping its node (which
    only a verified receipt allows) has already been torn down by the lifecycle.
    """
    started = now()
    outcome = life.run()
    if not outcome.kept or life.target is None or life.watchdog is None:
        raise VerificationError(
            f"Run {life.spec.run_id} did not keep its node "
            f"(teardown {outcome.teardown_status}); no session was created."
        )
    spec, target, watchdog = life.spec, life.target, life.watchdog
    deadline = started + watchdog.max_duration_seconds
    if now() >= deadline:
        # The watchdog deletes the node at its deadline, during or just after `up`: a
        # session that cannot be used is not a success (the caller deletes the node).
        raise NodeVanishedError(
            f"Session {session_name}'s --ttl "
            f"({watchdog.max_duration_seconds:g} s) passed while `up` was still bringing it "
            f"up ({now() - started:.0f} s): its node deletes itself, so it is not kept.",
            hint="Pass a longer --ttl (the default is 2h).",
        )
    return SessionState(
        name=session_name,
        run_id=spec.run_id,
        node_name=spec.node_name,
        zone=spec.zone.value,
        project=spec.project.value,
        api_endpoint=spec.api_endpoint,
        accelerator_type=spec.accelerator.name,
        spot=spec.spot,
        ssh_user=target.user,
        ssh_host=target.host,
        ssh_port=target.port,
        host_key_type=target.host_key.key_type,
        host_key_b64=target.host_key.b64,
        watchdog=asdict(watchdog),
        started_at=started,
        # The watchdog counts from boot, a little after `started`: this is the earliest.
        deadline_at=deadline,
        idle_seconds=watchdog.lease_seconds,
        renewed_at=now(),
        receipt_id=life.outcome.receipt.id if life.outcome.receipt is not None else None,
        other_workers=_other_workers(life.workers),
        coordinator=life.coordinator,
        provider=spec.provider,
    )


def _other_workers(workers: list[Worker]) -> tuple[WorkerAddress, ...]:
    """A slice's workers after worker 0, as the session keeps them."""
    return tuple(WorkerAddress.of(worker.target) for worker in workers[1:])


def address_of(
    api: TpuApi, node: NodeInfo, *, ask_port: bool = True, worker: int = 0
) -> tuple[str, int] | None:
    """A node's (or its worker `worker`'s) SSH address: its external IP (what `up`
    connected to) and the port (22, or the emulator's published one, a guest attribute:
    `ask_port`). None without an external IP or when the port cannot be read. A VM's
    ephemeral external IP can change (a restart), and a restarted emulator gives its
    nodes new ports: a session's saved address is only where the node was. The host key
    is not read here: the session's pinned one still has to match at the new address."""
    from tpulab.errors import CloudError, RemoteError
    from tpulab.remote.keys import ssh_port_from

    if worker == 0:
        external = node.external_ip
    else:
        external = node.workers[worker].external_ip if worker < len(node.workers) else None
    if not external:
        return None
    try:
        attributes = api.guest_attributes(node.zone, node.name, worker=worker) if ask_port else {}
        port = ssh_port_from(attributes) if ask_port else 22
    except (CloudError, RemoteError):
        return None
    return external, port


def worker_addresses(
    api: TpuApi, node: NodeInfo, count: int, *, ask_port: bool = True
) -> list[tuple[str, int]] | None:
    """Every worker's SSH address now, worker 0 first (`address_of` each); None when the
    API cannot say where one of them is (then nothing may be concluded)."""
    found: list[tuple[str, int]] = []
    for worker in range(count):
        address = address_of(api, node, ask_port=ask_port, worker=worker)
        if address is None:
            return None
        found.append(address)
    return found


def readdressed(api: TpuApi, state: SessionState) -> SessionState | None:
    """The session at its node's current addresses (every worker's) when the API says
    it moved; None when it did not (or the API cannot say)."""
    from tpulab.errors import CloudError

    try:
        node = api.get_node(state.zone, state.node_name)
    except CloudError:
        return None
    found = worker_addresses(api, node, state.worker_count)
    was = [(t.host, t.port) for t in state.worker_targets()]
    if found is None or found == was:
        return None
    return state.moved_to(found)


def renew_argv(state: SessionState, *, now: Callable[[], float] = time.time) -> list[str]:
    """The remote command that renews the session's lease once."""
    return renew_command(state.watchdog_config(), int(now()))


def take_down(
    api: TpuApi,
    state: SessionState,
    *,
    timeout: float = 600.0,
    poll: float = 2.0,
    notify: Callable[[str], None] = lambda _message: None,
) -> TeardownReport:
    """Delete the session's node and confirm by list, exactly as a run's teardown does.
    A node the watchdog already deleted comes back as `already_gone`."""
    return delete_and_confirm(
        api,
        state.zone,
        state.node_name,
        run_id=state.run_id,
        known_ours=True,
        settle=0.0,
        timeout=timeout,
        poll=poll,
        max_poll=min(10.0, poll * 5),
        notify=notify,
    )


@dataclass(frozen=True)
class DownLock:
    """What `down` found of the session's exec lock: `holder` when an exec holds it
    (deleting would kill that exec); `unchecked` saying why it could not be looked at;
    neither when `down` holds it now (until the context ends)."""

    holder: LockHolder | None = None
    unchecked: str | None = None


# `down` waits this long for the node's SSH server: a node that does not answer in time
# cannot be serving an exec either, and `down` goes on to delete it (saying so).
DOWN_CONNECT_SECONDS = 20.0


@contextmanager
def exec_lock_for_down(
    state: SessionState, key: RunKey, *, connect_timeout: float = DOWN_CONNECT_SECONDS
) -> Iterator[DownLock]:
    """Take the session's exec lock for `down`, exactly as an exec takes it, and hold it
    for the context (the delete): an exec started meanwhile is refused, never deleted
    under. Yields who holds it instead, or why it could not be checked; never raises for
    an unreachable node (the caller decides)."""
    from tpulab.remote import workload as wl
    from tpulab.remote.ssh import Connection

    with Connection(state.ssh_target(), key, connect_timeout=connect_timeout) as connection:
        argv = wl.lock_command(
            run_id=f"down-{state.run_id}", host=socket.gethostname(), pid=os.getpid()
        )
        try:
            answer = connection.hold(
                argv,
                timeout=wl.LOCK_HOLD_SECONDS,
                answer_within=wl.LOCK_ANSWER_SECONDS,
                beat_every=wl.LOCK_BEAT_SECONDS,
            )
            holder = wl.parse_lock_report(answer.stdout)
        except TpuLabError as error:
            found = DownLock(unchecked=error.message)
        except ValueError as error:
            found = DownLock(unchecked=f"the lock script answered {error}")
        else:
            if holder is None and answer.exit_status is not None:
                ended = f"the lock ended as soon as it was taken (exit {answer.exit_status})"
                found = DownLock(unchecked=ended)
            else:
                found = DownLock(holder=holder)
        yield found


def abandon(life: KeptRun) -> TeardownReport:
    """Delete a node the lifecycle kept but nobody recorded as a session, and close its
    journal row: the run's teardown, run late."""
    spec = life.spec
    report = delete_and_confirm(
        life.api,
        spec.zone.value,
        spec.node_name,
        run_id=spec.run_id,
        known_ours=True,
        timeout=spec.timeouts.teardown,
        notify=life.observer.note,
    )
    if life.journal is not None:
        life.journal.run_finished(spec.run_id, "confirmed", "up did not record its session")
    return report
