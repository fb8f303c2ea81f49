"""`tpulab exec`: a run attached to a session's kept node, never deleting it.

    validate (the workload's selection and caps; nothing is sent)
    -> connect (the session's key, the host key `up` pinned; the session's exec lock
       taken, held by this connection until the exec ends; refused, with nothing
       changed on the VM, while another exec holds the lock or a command an earlier
       exec started still runs there; the idle lease renewed at once, then in the
       background while the command runs)
    -> sync -> install -> workload -> fetch       (tpulab.run.workload, as for `run -- CMD`)
    finally: stop renewing, close SSH -- on success, failure, Ctrl-C or SIGTERM alike.

There is no create, bootstrap or verifier: the gate of DESIGN §3.9 (the command runs
only on a node whose receipt verified) is the receipt `tpulab up` verified on this very
node, whose id the session keeps and the exec's run.json records. There is no teardown
either: the node belongs to the session, guarded by its watchdog (--ttl, --idle) until
`tpulab down`. A node that disappears under an exec is named for what deleted it
(`Attachment.vanished`, through tpulab.run.lease.vanished).

`AttachedRun` is the third driver over the run's context (tpulab.run.context): the same
phases, observer, signals and run record as `tpulab run`'s, and `build_attached_plan`
(tpulab.run.attach_plan) is that same driver over the recording seams of
tpulab.run.recording: `tpulab exec --dry-run`.
"""

from __future__ import annotations

import os
import shlex
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from tpulab.errors import (
    CloudError,
    ConfigError,
    InterruptedRun,
    NodeVanishedError,
    RemoteError,
    TpuLabError,
    WorkloadFailedError,
)
from tpulab.run import verifier
from tpulab.run.context import RunContext
from tpulab.run.lease import look_up, vanished
from tpulab.run.outcome import RunOutcome
from tpulab.run.progress import Phase
from tpulab.run.workers import Worker

if TYPE_CHECKING:
    from tpulab.config import RunSpec
    from tpulab.models import NodeInfo
    from tpulab.remote import bootstrap as boot
    from tpulab.remote import workload as wl
    from tpulab.remote.keys import RunKey, SshTarget
    from tpulab.remote.watchdog import WatchdogConfig
    from tpulab.run.session_state import SessionState

__all__ = [
    "AttachedRun",
    "Attachment",
    "describe_holder",
]


@dataclass(frozen=True)
class Attachment:
    """What an attached run needs of the session: where its node is and how to log in,
    its watchdog (to renew the lease), the receipt that gated it, and its deadline."""

    session: str
    target: SshTarget  # worker 0
    key: RunKey
    watchdog: WatchdogConfig
    receipt_id: str | None
    deadline_at: float  # the watchdog's hard deadline (--ttl), wall clock
    wall_clock: Callable[[], float] = time.time
    # A slice: workers 1..N-1 (the command runs on every worker, as `run -- CMD` does),
    # and where their JAX processes meet.
    others: tuple[SshTarget, ...] = ()
    coordinator: str | None = None

    @classmethod
    def of(cls, state: SessionState, key: RunKey) -> Attachment:
        return cls(
            session=state.name,
            target=state.ssh_target(),
            key=key,
            watchdog=state.watchdog_config(),
            receipt_id=state.receipt_id,
            deadline_at=state.deadline_at,
            others=tuple(state.worker_targets()[1:]),
            coordinator=state.coordinator,
        )

    def workers(self) -> list[Worker]:
        """The session's workers as the run engine holds them, worker 0 first."""
        return [Worker(index, t) for index, t in enumerate((self.target, *self.others))]

    def check_node(self, life: RunContext) -> None:
        """Ask the API (GetNode) before connecting: a node its watchdog deleted since the
        last command must not cost an SSH connect timeout to find out. RemoteError if it
        is gone or DELETING (the lifecycle then names why: `vanished`). A node that is
        there is connected to where it is now (`follow_address`)."""
        state, node = look_up(life.api, life.spec.zone.value, life.spec.node_name)
        if state is not None:
            raise RemoteError(f"GetNode says node {life.spec.node_name} is {state}")
        if node is not None:  # None: the API could not say; the connect will tell
            self.follow_address(life, node)

    def follow_address(self, life: RunContext, node: NodeInfo) -> None:
        """Connect where the node's workers are now (tpulab.run.session.worker_addresses):
        a restarted VM's new external IP, or a restarted emulator's new port, would
        otherwise cost the connect timeout and end as "unreachable". Only the addresses
        change: the host keys stay the ones `up` pinned, so a different machine there is
        refused."""
        from dataclasses import replace

        from tpulab.run.session import worker_addresses

        found = worker_addresses(life.api, node, len(life.workers), ask_port=life.spec.emulated)
        for worker, address in zip(life.workers, found or (), strict=False):
            old = (worker.target.host, worker.target.port)
            if address == old:
                continue
            worker.target = replace(worker.target, host=address[0], port=address[1])
            whose = "node" if len(life.workers) == 1 else f"worker {worker.index}"
            life.observer.note(
                f"session {self.session}'s {whose} moved from {old[0]}:{old[1]} to "
                f"{address[0]}:{address[1]} (GetNode); its pinned host key must still "
                "match there"
            )

    def take_lock(self, session: wl.HoldingShell, run_id: str) -> None:
        """Take the session's exec lock for this exec, before anything else is sent: two
        execs started together would both pass the busy check below, then swap each
        other's workspace and both run. The lock is held by a process on the VM that
        lives as long as this SSH connection and its heartbeat (tpulab.remote.ssh `hold`),
        so it goes with the exec however it ends -- a SIGKILLed laptop at once, one that
        lost power or its network after LOCK_SILENCE_SECONDS: no stale lock, ever.
        RemoteError if another exec holds it (nothing is synced or started)."""
        from tpulab.remote import workload as wl

        argv = wl.lock_command(run_id=run_id, host=socket.gethostname(), pid=os.getpid())
        answer = session.hold(
            argv,
            timeout=wl.LOCK_HOLD_SECONDS,
            answer_within=wl.LOCK_ANSWER_SECONDS,
            beat_every=wl.LOCK_BEAT_SECONDS,
        )
        try:
            holder = wl.parse_lock_report(answer.stdout)
        except ValueError as error:
            said = f"exit status {answer.exit_status}" if answer.exit_status is not None else ""
            tail = (answer.stderr.strip().splitlines() or [""])[-1][-200:]
            raise RemoteError(
                f"Cannot take session {self.session}'s exec lock ({error}"
                + (f"; {said}" if said else "")
                + (f"; {tail}" if tail else "")
                + "). Nothing was synced or started.",
                hint="Check the node with `tpulab ssh " + self.session + " -- python3 -V`.",
            ) from None
        if holder is None and answer.exit_status is None:
            return  # ours, until this connection closes
        if holder is None:
            raise RemoteError(
                f"Session {self.session}'s exec lock ended as soon as it was taken "
                f"(exit status {answer.exit_status}). Nothing was synced or started.",
                hint="Check the node with `tpulab ssh " + self.session + " -- python3 -V`.",
            )
        if holder.is_down:
            raise RemoteError(
                f"Session {self.session} is being taken down: `tpulab down` holds its "
                f"lock ({describe_holder(holder)}) to delete its node. Nothing was synced "
                "or started.",
                hint=f"`tpulab up` a new session to run more; `tpulab list` shows when "
                f"{self.session} is gone.",
            )
        raise RemoteError(
            f"Session {self.session} is busy: another exec holds its lock "
            f"({describe_holder(holder)}). Nothing was synced or started.",
            hint="Wait for that exec to finish, or look at the node with "
            f"`tpulab ssh {self.session}`, then exec again. An exec whose laptop lost "
            f"power or its network lets go within {wl.LOCK_SILENCE_SECONDS:g} s.",
        )

    def check_not_busy(self, session: boot.RemoteShell, worker: int | None = None) -> None:
        """Refuse, before the sync swaps the workspace and the launcher clears the run
        dir, while a command an earlier exec started still runs on the node (an exec that
        was SIGKILLed, or one in another terminal): a second command beside it would, on
        a real TPU, not even open the chips the first one holds. RemoteError if busy.
        `worker`: a slice's worker, checked as each of them is (its hint names it)."""
        from tpulab.remote import workload as wl

        ssh = f"tpulab ssh {self.session}" + (f" --worker {worker}" if worker else "")
        result = session.run(wl.busy_command(), timeout=_BUSY_CHECK_TIMEOUT)
        try:
            busy = wl.parse_busy_report(result.stdout)
        except ValueError as error:
            raise RemoteError(
                f"Cannot tell whether a command still runs on session {self.session}'s "
                f"node ({error}; exit status {result.exit_status}).",
                hint=f"Check the node with `{ssh} -- true`.",
            ) from None
        if busy is None:
            return
        runs = f" ({shlex.join(busy.command)})" if busy.command else ""
        since = ""
        if busy.started_at is not None:
            started = datetime.fromtimestamp(busy.started_at, tz=timezone.utc)
            since = f", since {started:%Y-%m-%d %H:%M:%S} UTC"
        # `-s TERM`: `kill -TERM -- -PGID` fails in dash, a login shell a VM may have.
        stop = f"{ssh} -- kill -s TERM -- -{busy.pgid}"
        raise RemoteError(
            f"Session {self.session} is busy: a command an earlier exec started still "
            f"runs on its node, process group {busy.pgid}{runs}{since}. Nothing was "
            "synced or started.",
            hint=f"Wait for it to finish, or stop it with `{stop}`, then exec again.",
        )

    def vanished(self, life: RunContext, error: TpuLabError) -> NodeVanishedError | None:
        """The session's node gone (or DELETING) under the exec, named for what deleted
        it; None when the node is still there (the error was something else)."""
        phase = life.current_phase
        where = phase.label.lower() if phase is not None else "the exec"
        deadline_passed = self.wall_clock() >= self.deadline_at
        found = vanished(
            life.api,
            life.spec.zone.value,
            life.spec.node_name,
            phase=where,
            error=error,
            renewer=life.renewer,
            deadline_passed=deadline_passed,
        )
        if found is None:
            return None
        during = "during your command" if phase in _COMMAND_PHASES else f"during {where}"
        name = self.session
        if deadline_passed:
            cause = f"deleted itself: its --ttl deadline passed {during}"
            hint = "Start a new session with a longer --ttl (at most 24h) with `tpulab up`."
        elif life.renewer is not None and life.renewer.lapsed():
            cause = f"deleted itself: its --idle lease lapsed {during} (no renewal reached it)"
            hint = "A suspended laptop or a lost network lets the lease lapse; start a new session."
        else:
            cause = f"is gone: deleted by its watchdog or externally {during}"
            hint = "Check who deleted it in the project's audit log; start a new session."
        return NodeVanishedError(
            f"Session {name}'s node {life.spec.node_name} {cause} ({error.message}).",
            hint=hint,
        )


def describe_holder(holder: wl.LockHolder) -> str:
    """'run R from laptop H (pid P), since T UTC', with what the holder wrote."""
    who = f"run {holder.run_id}" if holder.run_id else "an exec"
    if holder.host:
        who += f" from {holder.host}"
    if holder.pid is not None:
        who += f" (pid {holder.pid})"
    if holder.since is not None:
        started = datetime.fromtimestamp(holder.since, tz=timezone.utc)
        who += f", since {started:%Y-%m-%d %H:%M:%S} UTC"
    return who


_COMMAND_PHASES = (Phase.SYNC, Phase.INSTALL, Phase.WORKLOAD, Phase.FETCH)
# The busy check reads two small files and signals nothing: seconds, even on a slow VM.
_BUSY_CHECK_TIMEOUT = 30.0


class AttachedRun(RunContext):
    """`tpulab exec`: validate, connect to the session's node, the workload; then --
    whatever happened -- stop the renewer and close SSH. Never a DeleteNode: the node
    stays the session's."""

    def __init__(self, spec: RunSpec, *, attachment: Attachment, **seams: Any) -> None:
        super().__init__(spec, **seams)
        self.attachment = attachment
        # Its key, pinned host keys (every worker's) and watchdog are the session's.
        self.key, self.workers = attachment.key, attachment.workers()
        self.coordinator = attachment.coordinator
        self.watchdog = attachment.watchdog
        self.session_name = attachment.session
        self.gate_receipt_id = attachment.receipt_id
        # A holder of the session's TPU may be the user's own work: the busy check
        # refuses instead (Attachment.check_not_busy), nothing is killed.
        self.frees_stale_tpu = False

    def run(self) -> RunOutcome:
        """Raises the first failure (KeyboardInterrupt as InterruptedRun, a failed command
        as WorkloadFailedError); returns only when the command exited 0 and its
        artifacts came back."""
        primary: BaseException | None = None
        try:
            self._phases()
        except BaseException as error:  # every exit path must close what it opened
            primary = error
        with self.shield(f"ending the exec on session {self.attachment.session}"):
            self.release()
            self.conclude(error=primary, seconds=self.elapsed())
            self.record_end()
        if isinstance(primary, KeyboardInterrupt):
            raise InterruptedRun("SIGINT") from None
        if primary is not None:
            raise primary
        if not self.outcome.succeeded:
            # Unreachable unless the phases and the outcome disagree: never exit 0 then.
            workload = self.outcome.workload
            raise WorkloadFailedError(
                "The exec ended without your command succeeding and its artifacts fetched.",
                exit_status=workload.exit_status if workload else None,
            )
        return self.outcome

    def _phases(self) -> None:
        # The session's node is READY and verified (its receipt gates the command).
        try:
            self.phase(Phase.VALIDATE, self._validate)
            self.record_start()
            self.phase(Phase.CONNECT, self._connect)
            assert self.workload is not None
            self.workload.run()
        except (RemoteError, CloudError) as error:
            explained = self.attachment.vanished(self, error)
            if explained is None:
                raise
            raise explained from error

    def _validate(self) -> str:
        """Only the exec's workload is new (the node, key and receipt are the session's)."""
        if self.spec.workload is None:
            raise ConfigError(
                "An exec needs a command after --.", hint="e.g. tpulab exec -- python train.py"
            )
        checked = verifier.validate_workload(self)
        receipt = self.attachment.receipt_id or "not recorded"
        return (
            f"session {self.attachment.session}: node {self.spec.node_name}, verified "
            f"receipt {receipt}; {checked}"
        )

    def _connect(self) -> str:
        attachment = self.attachment
        attachment.check_node(self)  # a session's node that is gone: say so at once
        where = verifier.open_ssh(self)
        assert self.session is not None
        # Before the lease or anything changes: the lock first (two execs at once would
        # both pass the busy check), held until the connection closes.
        attachment.take_lock(self.session, self.spec.run_id)
        slice_ = len(self.workers) > 1

        def not_busy(worker: Worker) -> None:
            assert worker.session is not None
            attachment.check_not_busy(worker.session, worker.index if slice_ else None)

        self.on_workers(not_busy, "busy check")
        # Every worker's lease (each worker's watchdog reads its own): verifier.arm_lease.
        return f"{where}; {verifier.arm_lease(self)}"

    def reattached(self, worker: Worker) -> None:
        """The exec lock lived on the lost connection and let go with it: take it again,
        so a `down` or another exec meets it while this exec follows its command. Taken
        meanwhile (a `down`, which then deletes the node): said, and the follow goes on
        until the node goes."""
        if worker.index != 0 or worker.session is None:
            return  # the lock is held on worker 0's connection only
        try:
            self.attachment.take_lock(worker.session, self.spec.run_id)
        except RemoteError as error:
            self.observer.note(f"could not take the session's exec lock again: {error.message}")

    def last_renewal_at(self) -> float | None:
        """When (wall clock) the exec last renewed the session's lease; None if never."""
        renewer = self.renewer
        if renewer is None or renewer.last_renewed is None:
            return None
        return self.attachment.wall_clock() - (self.clock() - renewer.last_renewed)
