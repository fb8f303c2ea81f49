"""A kept node (`tpulab up`): what a session is, how it is brought up and taken down.

- `SessionState` (tpulab.run.session_state): what later commands read to reach the node.
- `bring_up(life)`: a `KeptRun` (tpulab.run.lifecycle), so a failed `up` goes through
  the very teardown of `run` and only a verified one keeps its node.
- `take_down(api, state)`: the run's teardown (`delete_and_confirm`) for a kept node.
- `exec_lock_for_down(state, key)`: `down` takes the session's exec lock (the one each
  `exec` takes: tpulab.run.attach) before it deletes, so it never deletes a node under a
  running exec (which would lose its artifacts), and no exec starts meanwhile.
- `renew_argv(state)`: the watchdog's lease renewal as one remote command.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from tpulab.errors import NodeVanishedError, TpuLabError, VerificationError
from tpulab.remote.watchdog import renew_command
from tpulab.run.session_state import SessionState, WorkerAddress
from tpulab.run.teardown import TeardownReport, delete_and_confirm

if TYPE_CHECKING:
    from tpulab.cloud.api import TpuApi
    from tpulab.models import NodeInfo
    from tpulab.remote.keys import RunKey
    from tpulab.remote.workload import LockHolder
    from tpulab.run.lifecycle import KeptRun
    from tpulab.run.workers import Worker

__all__ = [
    "DownLock",
    "abandon",
    "address_of",
    "bring_up",
    "exec_lock_for_down",
    "readdressed",
    "renew_argv",
    "take_down",
    "worker_addresses",
]


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
            run_id=f"{wl.DOWN_LOCK_PREFIX}{state.run_id}",
            host=socket.gethostname(),
            pid=os.getpid(),
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
