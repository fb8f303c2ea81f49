"""The state of one run and its seams: what every phase of the run engine works on.

`RunContext` holds the run's spec, its seams (the TPU API, SSH connect, journal,
observer, shield, clock, secrets) and what the phases learn as they go (the key, the
pinned target, the SSH session, each phase's frozen record, the progress the ending
reads), from which it builds the run's frozen `RunOutcome` once, when the run ends
(`conclude`). Phases are functions of a context
(tpulab.run.provision, tpulab.run.verifier, tpulab.run.workload); the drivers that order
them are subclasses that add only `run()`: `Lifecycle` (`tpulab run`) and `KeptRun`
(`tpulab up`) in tpulab.run.lifecycle, `AttachedRun` (`tpulab exec`) in tpulab.run.attach.

The public surface the phases use -- `phase`, `milestone`, `stage_file`, `on_line`,
`connect_ssh`, `release`, `record_start`, `write_run_record`, `receipt_store`, the
create's progress (`create_is_sent`, `create_is_accepted`) and the one attribute each
phase sets to the frozen record it produced -- is the only way they touch the run: no
phase reaches into another's private state.
"""

from __future__ import annotations

import contextlib
import hashlib
import secrets
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from tpulab.cloud.api import TpuApi
from tpulab.config import RunSpec
from tpulab.errors import RemoteError
from tpulab.remote import bootstrap as boot
from tpulab.run.lease import LeaseRenewer, stop_renewers, watchdog_config
from tpulab.run.outcome import RunOutcome
from tpulab.run.progress import NullObserver, Phase, RunJournal, RunObserver
from tpulab.run.remote_session import Connect, RemoteSession
from tpulab.run.signals import Shield, Skippable, no_shield, no_skip
from tpulab.run.workers import MAX_PARALLEL, FanOut, Worker, fan_out
from tpulab.run.workload import WorkloadRunner

if TYPE_CHECKING:
    from tpulab.cloud.project_apis import Check
    from tpulab.evidence.judge import Judgement
    from tpulab.evidence.receipt import Expectation
    from tpulab.evidence.store import ReceiptStore
    from tpulab.models import NodeInfo
    from tpulab.remote.keys import RunKey, SshTarget
    from tpulab.remote.watchdog import WatchdogConfig, WatchdogState
    from tpulab.run.outcome import Judged, TeardownEnd
    from tpulab.run.record import RecordState, ReportError, RunRecord

__all__ = ["RunContext", "Shield"]

T = TypeVar("T")

# How long a failed spot run asks the API whether its node was preempted: the state can
# lag the VM stopping by about a minute (SkyPilot #849); twice that, bounded.
PREEMPTION_WAIT_SECONDS = 120.0


class RunContext:
    """One RunSpec's seams and state; `outcome` is readable even after a failure."""

    def __init__(
        self,
        spec: RunSpec,
        *,
        api: TpuApi,
        connect: Connect | None = None,
        journal: RunJournal | None = None,
        observer: RunObserver | None = None,
        shield: Shield | None = None,
        skippable: Skippable | None = None,
        store: ReceiptStore | None = None,
        installer: boot.Installer = "uv",
        poll: Iterable[float] | None = None,
        teardown_poll: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        new_key: Callable[[], RunKey] | None = None,
        new_nonce: Callable[[], str] = lambda: secrets.token_hex(16),
        judge: Callable[[bytes, Expectation], Judgement] | None = None,
        write_record: Callable[[RunRecord, Path], Path] | None = None,
        report_error: ReportError | None = None,
        renew_in_background: bool = True,
        preemption_wait: float = PREEMPTION_WAIT_SECONDS,
        parallel_workers: int = MAX_PARALLEL,
        preflight: Callable[[], Sequence[Check]] | None = None,
    ) -> None:
        self.spec = spec
        self.api = api
        self.connect = connect
        self.journal = journal
        self.observer: RunObserver = observer or NullObserver()
        self.shield: Shield = shield or no_shield
        # `tpulab.run.signals.skippable`: lets a second Ctrl-C skip the artifact fetch.
        self.skippable: Skippable = skippable or no_skip
        self.store = store
        self.installer = installer
        self.poll = poll
        self.teardown_poll = teardown_poll
        self.clock = clock
        self.sleep = sleep
        self.new_key = new_key
        self.new_nonce = new_nonce
        # The one judgement (evidence.judge.judge); a dry run's recorder supplies the
        # verdict a plan assumes, so the plan can show what follows a verified receipt.
        self.judge = judge
        # Writes <out>/run.json (run.record.write_run_record); a dry run's records instead.
        self.write_record = write_record
        # The CLI's error report (it picks exit statuses): run.json's `error` then says
        # what ended a failed run, as the --json envelope does.
        self.report_error = report_error
        self.renew_in_background = renew_in_background
        self.preemption_wait = preemption_wait
        # How many of a slice's workers a step runs on at once (a dry run: 1, in order).
        self.parallel_workers = parallel_workers
        # The project's cheap checks before the create (tpulab.cloud.preflight: the TPU
        # API enabled, the caller's permissions); a definite problem refuses the run
        # with nothing created. None: not asked (the tests' rigs, unless they pass one).
        self.preflight = preflight
        # Before the command, kill what still holds the TPU (tpulab.remote.tpu_release):
        # only on a node this run made; on a session's node a holder may be the user's.
        self.frees_stale_tpu = True
        # A slice: worker 0's "address:port" where JAX's processes meet (the payload's
        # --coordinator, the command's JAX_COORDINATOR_ADDRESS); set with the workers.
        self.coordinator: str | None = None
        self.started_at = clock()
        self._start_records(spec)

    def _start_records(self, spec: RunSpec) -> None:
        """What the phases learn and what the run's outcome is built from
        (`conclude`), none of it known yet."""
        # What the phases learn, in order.
        self.nonce = ""
        self.payload_bytes = b""
        self.key: RunKey | None = None
        # The node's worker VMs (one; a slice's several), each with its pinned target,
        # SSH session and lease renewer; `target`, `session`, `renewer` are worker 0's.
        self.workers: list[Worker] = []
        self.workload: WorkloadRunner | None = None
        # The VM's watchdog (None: --no-watchdog); every worker renews its own lease.
        self.watchdog: WatchdogConfig | None = watchdog_config(spec)
        self.current_phase: Phase | None = None
        self.journalled = False  # the journal has this run's row (written by create)
        self.record_started = False  # a start run.json was (tried to be) written
        self.started_wall = datetime.now(timezone.utc)
        # What the phases produced, each a frozen record its phase sets once it knows it.
        self.node: NodeInfo | None = None  # provision: wait_ready's, then pin_host_key's
        self.watchdog_state: WatchdogState | None = None  # verifier.arm_lease
        self.bootstrapped: boot.BootstrapResult | None = None  # verifier.bootstrap (worker 0)
        self.payload_exit: int | None = None  # verifier.execute (a slice's worst)
        self.judged: Judged | None = None  # verifier.verify
        self.teardown_end: TeardownEnd | None = None  # ending.teardown
        # Progress the ending reads whenever an interrupt lands; each has one writer.
        self.create_sent = False  # create_is_sent
        self.create_accepted = False  # create_is_accepted
        self.kept = False  # KeptRun._hand_over: handed over to a session, not deleted
        # Accounting gathered as the run goes, copied into the outcome.
        self.milestones: dict[str, float] = {}
        self.phase_seconds: dict[str, float] = {}  # phase -> duration
        self.worker_seconds: dict[str, list[float]] = {}  # step -> [worker 0, ...]
        self.api_calls = 0
        self.lease_renewals = 0
        self.lease_failures = 0
        self.run_record: Path | None = None  # <out>/run.json once written
        # `tpulab exec` (run/attach.py): its session, and the receipt that gated it.
        self.session_name: str | None = None
        self.gate_receipt_id: str | None = None
        self._outcome: RunOutcome | None = None  # built by `conclude`

    # -- worker 0: what `exec`, `up`'s hand-over and the workload use -----------------

    @property
    def target(self) -> SshTarget | None:
        return self.workers[0].target if self.workers else None

    @target.setter
    def target(self, value: SshTarget) -> None:
        if self.workers:
            self.workers[0].target = value
        else:
            self.workers = [Worker(0, value)]

    @property
    def session(self) -> RemoteSession | None:
        return self.workers[0].session if self.workers else None

    @property
    def renewer(self) -> LeaseRenewer | None:
        return self.workers[0].renewer if self.workers else None

    def on_workers(self, step: Callable[[Worker], T], what: str) -> FanOut[T]:
        """`step` on every worker at once (tpulab.run.workers.fan_out); each worker's
        time is kept per phase for the summary."""
        done = fan_out(
            self.workers, step, what=what, clock=self.clock, max_parallel=self.parallel_workers
        )
        if len(self.workers) > 1:
            self.worker_seconds[what] = [round(s, 3) for s in done.seconds]
        return done

    # -- what every phase uses ----------------------------------------------------------

    def milestone(self, name: str, at: float | None = None) -> None:
        when = self.clock() if at is None else at
        self.milestones.setdefault(name, when)
        self.observer.milestone(name, when)

    def phase(self, phase: Phase, action: Callable[[], str]) -> None:
        """Run one phase: journal it, time it, tell the observer how it ended."""
        self.current_phase = phase
        self.journal_phase(phase)
        self.observer.phase_started(phase)
        started = self.clock()
        try:
            detail = action()
        except BaseException as error:
            self.took(phase, started)
            self.observer.phase_failed(phase, self.clock() - started, error)
            raise
        self.took(phase, started)
        self.observer.phase_finished(phase, self.clock() - started, detail)

    def took(self, phase: Phase, started: float) -> None:
        """Count the time since `started` to `phase` (phases the ending runs too)."""
        seconds = self.phase_seconds
        seconds[phase.value] = seconds.get(phase.value, 0.0) + self.clock() - started

    def journal_phase(self, phase: Phase) -> None:
        # The row exists only once `create` has written it (validation needs no row).
        if self.journal is not None and self.journalled:
            self.journal.phase_changed(self.spec.run_id, phase.value)

    def on_line(self, stream: str, line: str) -> None:
        self.observer.remote_output(stream, line)

    def elapsed(self) -> float:
        return self.clock() - self.started_at

    def count_api_calls(self) -> None:
        with contextlib.suppress(Exception):
            self.api_calls = self.api.call_count

    # -- progress: what the ending must know, whenever an interrupt lands ---------------

    def create_is_sent(self, sent: bool = True) -> None:
        """True just before CreateNode (or the queued resource) leaves: from here on
        something may exist. False once a refusal proves nothing was acted on."""
        self.create_sent = sent
        if sent:
            self.milestone("create_sent")

    def create_is_accepted(self, accepted: bool = True) -> None:
        """True once the API took the create (a node with this run's labels exists);
        False when the name turned out to be someone else's node."""
        self.create_accepted = accepted

    def connect_ssh(self, target: SshTarget, key: RunKey) -> RemoteSession:
        """A connection over the `connect` seam, or paramiko's (imported only here)."""
        if self.connect is not None:
            return self.connect(target, key)
        from tpulab.remote.ssh import Connection

        # A real VM's guest agent installs the metadata key some seconds after sshd
        # starts, so a refused key is retried there; the emulator installs it up front.
        return Connection(
            target,
            key,
            connect_timeout=self.spec.timeouts.connect,
            auth_retry_for=0.0 if self.spec.emulated else min(90.0, self.spec.timeouts.connect),
            sleep=self.sleep,
            clock=self.clock,
        )

    def stage_file(
        self, data: bytes, remote_path: str, what: str, session: RemoteSession | None = None
    ) -> str:
        """Put `data` at `remote_path` (on worker 0, or `session`'s worker); RemoteError
        unless the VM's sha256 is ours."""
        session = session or self.session
        assert session is not None
        local = hashlib.sha256(data).hexdigest()
        remote = session.put(data, remote_path)
        if remote != local:
            raise RemoteError(
                f"The staged {what}'s sha256 {remote[:12]} differs from ours {local[:12]}.",
                hint="The upload was corrupted or the remote disk is full; retry the run.",
            )
        return local

    def receipt_store(self) -> ReceiptStore:
        if self.store is None:
            from tpulab.evidence.store import ReceiptStore

            self.store = ReceiptStore()
        return self.store

    def reattached(self, worker: Worker) -> None:
        """`worker`'s connection was lost under the running command and opened again
        (tpulab.run.command follows the command over it). Whatever lived on the old
        connection is gone with it: a driver that held something there takes it again
        (an exec, its session's exec lock). A run holds nothing there."""

    def release(self) -> None:
        """Stop renewing the lease, then close SSH: the first thing every end of a run
        does (teardown, `up`'s hand-over, the end of an exec). The renewer stops first,
        so it cannot race to reopen the session; a dead connection must not delay what
        follows (the delete), so closing never raises."""
        renewers = [w.renewer for w in self.workers if w.renewer is not None]
        stop_renewers(renewers)
        if renewers:
            self.lease_renewals = sum(r.renewals for r in renewers)
            self.lease_failures = sum(len(r.failures) for r in renewers)
        for worker in self.workers:
            if worker.session is not None:
                session, worker.session = worker.session, None
                with contextlib.suppress(Exception):
                    session.close()

    # -- run.json -----------------------------------------------------------------------

    def record_start(self) -> None:
        """A `-- CMD` run's run.json saying it started ("running"), once its input is valid
        and before anything can bill or change a VM: a run killed from here on (SIGKILL,
        power loss) still leaves its trace and out dir for `tpulab runs`. Its end
        replaces it (`record_end`) whatever happens."""
        if self.workload is None:
            return
        self.record_started = True
        self.write_run_record(state="running")

    def record_end(self) -> None:
        """The final run.json, replacing the start one. Bad input, refused in VALIDATE,
        wrote neither: it creates nothing, not even a run.json."""
        if self.record_started:
            self.write_run_record()

    def write_run_record(self, *, state: RecordState = "finished") -> None:
        """<out>/run.json: the run's record (tpulab.run.record), beside its artifacts; a
        disk that refuses it is a note (`write_or_reduce`)."""
        from tpulab.run.record import run_record, write_or_reduce, write_run_record

        assert self.spec.workload is not None
        try:
            record = run_record(self.outcome, state=state, report_error=self.report_error)
        except Exception as error:  # a value the record cannot hold: nothing to write
            self.observer.note(f"could not write run.json: {type(error).__name__}: {error}")
            return
        write = self.write_record or write_run_record
        path = write_or_reduce(record, self.spec.workload.out, write=write, note=self.observer.note)
        if path is not None:
            self._recorded(path)

    def _recorded(self, path: Path) -> None:
        # The end's run.json is written from the built outcome, which then names it.
        self.run_record = path
        if self._outcome is not None:
            self._outcome = replace(self._outcome, run_record=path)

    # -- the outcome ----------------------------------------------------------------------

    @property
    def outcome(self) -> RunOutcome:
        """The outcome `conclude` built when the run ended; before that (a start run.json,
        a reader of a run cut short), what the phases have produced so far."""
        return self._outcome if self._outcome is not None else self._outcome_now()

    def conclude(
        self, *, error: BaseException | None, seconds: float, billed_seconds: float = 0.0
    ) -> RunOutcome:
        """Build the run's outcome, once, as the run ends (tpulab.run.ending, the drivers)."""
        self.count_api_calls()
        self._outcome = self._outcome_now(error, seconds, billed_seconds)
        return self._outcome

    def _outcome_now(
        self, error: BaseException | None = None, seconds: float = 0.0, billed: float = 0.0
    ) -> RunOutcome:
        workload = self.workload.outcome() if self.workload is not None else None
        bootstrap = self.bootstrapped
        if bootstrap is not None and workload is not None and workload.extras is not None:
            bootstrap = replace(bootstrap, extras=workload.extras)  # the venv as it ended
        judged, ended = self.judged, self.teardown_end
        return RunOutcome(
            self.spec,
            started=self.started_wall,
            node=self.node,
            create_sent=self.create_sent,
            create_accepted=self.create_accepted,
            bootstrap=bootstrap,
            payload_exit=self.payload_exit,
            receipt=judged.receipt if judged is not None else None,
            judgement=judged.judgement if judged is not None else None,
            teardown=ended.report if ended is not None else None,
            teardown_status=ended.status if ended is not None else "not-created",
            error=error,
            api_calls=self.api_calls,
            seconds=seconds,
            billed_seconds=billed,
            milestones=dict(self.milestones),
            phase_seconds=dict(self.phase_seconds),
            worker_seconds={step: list(took) for step, took in self.worker_seconds.items()},
            workload=workload,
            run_record=self.run_record,
            watchdog=self.watchdog_state,
            lease_renewals=self.lease_renewals,
            lease_failures=self.lease_failures,
            kept=self.kept,
            session=self.session_name,
            gate_receipt_id=self.gate_receipt_id,
        )
