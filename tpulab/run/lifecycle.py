"""One run, start to finish: create a TPU VM, prove JAX ran on it, delete it, confirm.

    validate -> create -> wait READY -> host key -> connect -> bootstrap -> stage
             -> execute -> collect -> verify        (each a method with its contract)
             [-> sync -> install -> workload -> fetch: the user's `-- CMD`, run/workload.py]
    finally: teardown = delete, wait, list until this run's node is gone (teardown.py)

Invariants kept here (docs/architecture.md §3): nothing is sent before the input is valid and the
journal has the run; every node carries this run's labels and its per-run SSH key; every
exit after create was sent -- success, error, Ctrl-C, SIGTERM -- goes through teardown,
wrapped in `shield` so a second Ctrl-C cannot abort it; the receipt is saved before the
delete is sent; success needs a verified receipt AND a confirmed teardown; a teardown
that cannot be confirmed raises TeardownError, which outranks every other failure.

The seams are arguments: `api` (a TpuApi: Google or an emulator), `connect` (an SSH
connection factory), `journal`, `observer`, `shield`, `clock`, `sleep`, and `new_key` /
`new_nonce` (the run's secrets). `tpulab run --dry-run` is this class over recording
seams (tpulab.run.recording), so the plan cannot drift from the run.
"""

from __future__ import annotations

import contextlib
import hashlib
import secrets
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from tpulab import paths
from tpulab.cloud.api import TpuApi
from tpulab.config import RunSpec
from tpulab.contract import (
    EMULATOR_SSH_USER_ATTRIBUTE,
    GUEST_ATTRIBUTES_METADATA,
    OS_LOGIN_METADATA,
    SSH_KEYS_METADATA,
    STARTUP_SCRIPT_METADATA,
)
from tpulab.errors import (
    AlreadyExistsError,
    CloudError,
    CommandFailedError,
    ConfigError,
    DeadlineError,
    InterruptedRun,
    InvalidArgumentError,
    LeakedNode,
    LocationError,
    NotFoundError,
    OutcomeUnknownError,
    PermissionDeniedError,
    PreemptedError,
    QuotaError,
    RemoteError,
    TeardownError,
    TpuLabError,
    TransientError,
    UnreachableError,
    VerificationError,
)
from tpulab.models import NodeInfo, NodeRequest, NodeState
from tpulab.polling import Backoff, poll_until, retry_call
from tpulab.remote import bootstrap as boot
from tpulab.remote import workload as wl
from tpulab.remote.workspace import StreamShell
from tpulab.run.lease import LeaseRenewer, read_state, vanished, watchdog_config
from tpulab.run.progress import NullObserver, Phase, RunJournal, RunObserver, TeardownStatus
from tpulab.run.teardown import TeardownReport, delete_and_confirm
from tpulab.run.workload import Skippable, WorkloadOutcome, WorkloadRunner, no_skip

if TYPE_CHECKING:
    from tpulab.evidence.judge import Judgement, Verdict
    from tpulab.evidence.receipt import Expectation
    from tpulab.evidence.store import KeptReceipt, ReceiptStore
    from tpulab.remote.ssh import RunKey, SshTarget
    from tpulab.remote.watchdog import WatchdogState
    from tpulab.run.attach import Attachment
    from tpulab.run.record import RecordState, ReportError, RunRecord

__all__ = [
    "Connect",
    "Lifecycle",
    "RemoteSession",
    "RunOutcome",
    "Shield",
]

# The states in which Google reports a reclaimed spot TPU VM (see `_preemption`).
_RECLAIMED = frozenset(
    {NodeState.PREEMPTED.value, NodeState.TERMINATED.value, NodeState.STOPPED.value}
)
# How long a failed spot run asks the API whether its node was preempted: the state can
# lag the VM stopping by about a minute (SkyPilot #849); twice that, bounded.
PREEMPTION_WAIT_SECONDS = 120.0

# Sync refusals: the API said no before creating anything, so there is nothing to delete.
_REFUSED = (
    LocationError,
    QuotaError,
    InvalidArgumentError,
    AlreadyExistsError,
    PermissionDeniedError,
    NotFoundError,
)


class RemoteSession(boot.RemoteShell, StreamShell, wl.HoldingShell, Protocol):
    """What the lifecycle needs from `tpulab.ssh.Connection`: the bootstrap's `run`,
    plus opening, closing, file transfer and `hold` (an exec's lock)."""

    def open(self) -> None: ...

    def close(self) -> None: ...

    def put(self, local: Path | bytes, remote: str) -> str: ...

    def get(self, remote: str, local: Path, *, max_bytes: int) -> str: ...


Connect = Callable[["SshTarget", "RunKey"], RemoteSession]


class Shield(Protocol):
    """`tpulab.signals.shield`: refuse interrupts while the body (the teardown) runs."""

    def __call__(
        self, describe: str, *, manual: str | None = None
    ) -> AbstractContextManager[object]: ...


def _no_shield(describe: str, *, manual: str | None = None) -> AbstractContextManager[object]:
    del describe, manual
    return contextlib.nullcontext()


_TEARDOWN_ATTEMPTS = 3
# How long a teardown keeps listing after a CreateNode whose outcome is unknown.
_CREATE_SETTLE_SECONDS = 30.0
# What the watchdog's service account may do with its metadata token: deleting the node
# needs the Cloud TPU API, which cloud-platform covers.
_CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"


@dataclass
class RunOutcome:
    """Everything a report needs about one run, filled in as the run goes."""

    spec: RunSpec
    started: datetime = field(default_factory=lambda: datetime.now(timezone.utc))
    node: NodeInfo | None = None
    create_sent: bool = False
    create_accepted: bool = False
    bootstrap: boot.BootstrapResult | None = None
    payload_exit: int | None = None
    receipt: KeptReceipt | None = None
    judgement: Judgement | None = None  # None until a receipt was collected and judged
    teardown: TeardownReport | None = None
    teardown_status: TeardownStatus = "not-created"
    error: BaseException | None = None
    api_calls: int = 0
    seconds: float = 0.0
    billed_seconds: float = 0.0
    milestones: dict[str, float] = field(default_factory=dict)
    phase_seconds: dict[str, float] = field(default_factory=dict)  # phase -> duration
    workload: WorkloadOutcome | None = None  # set when the spec has a `-- CMD`
    run_record: Path | None = None  # <out>/run.json once written
    watchdog: WatchdogState | None = None  # what the VM's watchdog published, once read
    lease_renewals: int = 0
    lease_failures: int = 0
    kept: bool = False  # `tpulab up`: verified and handed over, deliberately not deleted
    # `tpulab exec` (run/attach.py): the session it ran on, and the receipt `up` verified
    # on that node -- the gate of its command, since an exec verifies nothing itself.
    session: str | None = None
    gate_receipt_id: str | None = None

    @property
    def verdict(self) -> Verdict | None:
        return self.judgement.verdict if self.judgement else None

    @property
    def failures(self) -> list[str]:
        return [str(f) for f in self.judgement.failures] if self.judgement else []

    @property
    def per_device_sums(self) -> list[float]:
        return list(self.judgement.per_device_sums) if self.judgement else []

    @property
    def observed_total(self) -> float | None:
        return self.judgement.observed_total if self.judgement else None

    @property
    def expected_total(self) -> int | None:
        return self.judgement.expected_total if self.judgement else None

    @property
    def succeeded(self) -> bool:
        """Receipt verified AND teardown confirmed -- and, with a `-- CMD`, the command
        exited 0 and its artifacts came back."""
        if self.session is not None:
            # An exec: its node stays, and a session exists only once `up`'s receipt
            # verified on it (run/session.py bring_up): the gate is behind it.
            return self.workload is not None and self.workload.ok
        return (
            self.judgement is not None
            and self.judgement.verified
            and self.teardown_status == "confirmed"
            and (self.spec.workload is None or (self.workload is not None and self.workload.ok))
        )

    @property
    def estimated_cost(self) -> float:
        return self.spec.accelerator.estimated_cost(self.billed_seconds, spot=self.spec.spot)


class Lifecycle:
    """Drives one RunSpec through the phases; `outcome` is readable even after a failure."""

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
        keep_on_success: bool = False,
        attach: Attachment | None = None,
        preemption_wait: float = PREEMPTION_WAIT_SECONDS,
    ) -> None:
        self.spec = spec
        self.preemption_wait = preemption_wait
        self.api = api
        self.connect = connect
        self.journal = journal
        self.observer: RunObserver = observer or NullObserver()
        self.shield: Shield = shield or _no_shield
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
        self.outcome = RunOutcome(spec)
        self.nonce = ""
        self.payload_bytes = b""
        self.key: RunKey | None = None
        self.target: SshTarget | None = None
        self.session: RemoteSession | None = None
        self.payload_output: list[str] = []
        self.raw_receipt = b""
        self.workload: WorkloadRunner | None = None
        # The VM's watchdog (None: --no-watchdog) and the thread that renews its lease.
        self.watchdog = watchdog_config(spec)
        self.renew_in_background = renew_in_background
        self.renewer: LeaseRenewer | None = None
        # `tpulab up`: a verified run hands its node over (run/session.py) instead of
        # deleting it; every failure before that still goes through the teardown.
        self.keep_on_success = keep_on_success
        # `tpulab exec`: attached to a session's kept node (run/attach.py): no create,
        # bootstrap, verifier or teardown; its key, pinned host key and watchdog are the
        # session's.
        self.attach = attach
        if attach is not None:
            self.key, self.target, self.watchdog = attach.key, attach.target, attach.watchdog
            self.outcome.session = attach.session
            self.outcome.gate_receipt_id = attach.receipt_id
        self._journalled = False
        self._record_started = False  # a start run.json was (tried to be) written
        self._current: Phase | None = None
        self._t0 = clock()

    # -- plumbing -----------------------------------------------------------------------

    def _milestone(self, name: str, at: float | None = None) -> None:
        when = self.clock() if at is None else at
        self.outcome.milestones.setdefault(name, when)
        self.observer.milestone(name, when)

    def _phase(self, phase: Phase, action: Callable[[], str]) -> None:
        self._current = phase
        self._journal_phase(phase)
        self.observer.phase_started(phase)
        started = self.clock()
        try:
            detail = action()
        except BaseException as error:
            self._took(phase, started)
            self.observer.phase_failed(phase, self.clock() - started, error)
            raise
        self._took(phase, started)
        self.observer.phase_finished(phase, self.clock() - started, detail)

    def _took(self, phase: Phase, started: float) -> None:
        seconds = self.outcome.phase_seconds
        seconds[phase.value] = seconds.get(phase.value, 0.0) + self.clock() - started

    def _connect(self, target: SshTarget, key: RunKey) -> RemoteSession:
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

    def _journal_phase(self, phase: Phase) -> None:
        # The row exists only once `create` has written it (validation needs no row).
        if self.journal is not None and self._journalled:
            self.journal.phase_changed(self.spec.run_id, phase.value)

    def _on_line(self, stream: str, line: str) -> None:
        self.observer.remote_output(stream, line)

    # -- the run ------------------------------------------------------------------------

    def run(self) -> RunOutcome:
        """Run every phase, then always tear down; return the outcome or raise.

        Raises TeardownError when deletion was not confirmed (whatever else happened),
        otherwise the first failure of the phases (KeyboardInterrupt as InterruptedRun,
        any other BaseException -- e.g. a signal turned into one -- unchanged); returns
        only when the receipt verified and the node is confirmed gone.
        """
        if self.attach is not None:
            from tpulab.run.attach import run_attached

            return run_attached(self)  # a session's node: never torn down by an exec
        primary: BaseException | None = None
        try:
            self._phases()
        except BaseException as error:  # every exit path must reach the teardown
            primary = error
        if primary is None and self.keep_on_success and self._verified():
            return self._hand_over()
        leaked: TeardownError | None = None
        attempts = 0
        # `while True`, not `for ... in range()`: no call stands between here and the
        # `try`, which leaves a first signal the least room to skip the teardown.
        while True:
            try:
                leaked = self._teardown(primary)
                break
            except BaseException as late:  # an interrupt that beat the shield: go again
                primary = primary or late
                attempts += 1
                if attempts >= _TEARDOWN_ATTEMPTS:
                    leaked = self._unconfirmed(primary, "teardown was interrupted repeatedly")
                    break
        # Recording the end and choosing the verdict are shielded too: a first signal
        # arriving now must not turn "teardown NOT confirmed" into "interrupted".
        manual = self.spec.leaked_node().what_to_do()
        with self.shield(f"recording the end of run {self.spec.run_id}", manual=manual):
            if leaked is None and _is_interrupt(primary) and self.outcome.succeeded:
                # Ctrl-C (or SIGTERM) after the receipt verified: the teardown it asked
                # for is exactly what ran, and it was confirmed. The run succeeded.
                self.observer.note("interrupted after the receipt verified: the run is complete")
                primary = None
            self._finish(primary, leaked)
            if leaked is not None:
                raise leaked from primary
            if isinstance(primary, KeyboardInterrupt):
                raise InterruptedRun("SIGINT") from None
            if primary is not None:
                raise primary
            if not self.outcome.succeeded:
                # Unreachable unless the verdict and the phases disagree: never exit 0
                # on a run whose receipt did not verify or whose teardown is unconfirmed.
                raise VerificationError(
                    f"The run ended without a verified receipt and a confirmed teardown "
                    f"(verdict {self.outcome.verdict}, teardown {self.outcome.teardown_status})."
                )
        return self.outcome

    def _verified(self) -> bool:
        judgement = self.outcome.judgement
        return judgement is not None and judgement.verified and self.outcome.create_accepted

    def _hand_over(self) -> RunOutcome:
        """Keep the verified node: stop renewing (from now on the watchdog's idle lease
        and hard deadline guard it) and close SSH. The journal row stays open: the node
        is still billing until `tpulab down` confirms it gone."""
        self.outcome.kept = True
        self._release()
        self.outcome.seconds = self.clock() - self._t0
        with contextlib.suppress(Exception):
            self.outcome.api_calls = self.api.call_count
        return self.outcome

    def _release(self) -> None:
        """Stop renewing the lease, then close SSH: the first thing every end of a run
        does (teardown, `up`'s hand-over, the end of an exec). The renewer stops first,
        so it cannot race to reopen the session; a dead connection must not delay what
        follows (the delete), so closing never raises."""
        if self.renewer is not None:
            self.renewer.stop()
            self.outcome.lease_renewals = self.renewer.renewals
            self.outcome.lease_failures = len(self.renewer.failures)
        if self.session is not None:
            session, self.session = self.session, None
            with contextlib.suppress(Exception):
                session.close()

    def _phases(self) -> None:
        try:
            self._each_phase()
        except (RemoteError, CloudError) as error:
            explained = self._preemption(error) or self._vanished(error)
            if explained is None:
                raise
            raise explained from error

    def _vanished(self, error: TpuLabError) -> TpuLabError | None:
        """A node its watchdog (or anyone) deleted under us: say so, not the symptom."""
        if self.attach is not None:
            return self.attach.vanished(self, error)
        # Only a node that booted has a watchdog that could have fired.
        if self.watchdog is None or "ready_seen" not in self.outcome.milestones:
            return None
        created = self.outcome.milestones.get("create_sent", self._t0)
        return vanished(
            self.api,
            self.spec.zone.value,
            self.spec.node_name,
            phase=self._current.label.lower() if self._current else "the run",
            error=error,
            renewer=self.renewer,
            # The watchdog starts at boot, after the create was sent: not earlier.
            deadline_passed=self.clock() - created >= self.watchdog.max_duration_seconds,
        )

    def _preemption(self, error: TpuLabError) -> PreemptedError | None:
        """A spot node reclaimed under us shows up as a dropped SSH session or a failed
        call; ask the API, so the user hears "preempted" rather than a symptom.

        Google reports it late and in more than one way: the state can stay READY for
        about a minute after the VM stopped (SkyPilot #849), and a reclaimed TPU VM may
        end TERMINATED or STOPPED rather than PREEMPTED, or simply vanish (SkyPilot
        #1468). So the node is polled for up to `preemption_wait` seconds (a command's
        own non-zero exit is no symptom: one look then), and any of those counts."""
        if (
            not self.spec.spot
            or isinstance(error, PreemptedError)
            or not self.outcome.create_accepted
            or self.attach is not None
        ):
            return None
        own_exit = isinstance(error, CommandFailedError) and error.exit_status >= 0
        wait = 0.0 if own_exit else self.preemption_wait
        if wait > 0:
            self.observer.note(
                f"spot node {self.spec.node_name}: {_describe(error)}; asking the API for up "
                f"to {wait:g} s whether it was preempted (its state can lag the VM)"
            )
        seen = self._reclaimed_state(wait)
        if seen is None:
            return None
        phase = self._current.label if self._current else "the run"
        return PreemptedError(
            f"Spot node {self.spec.node_name} was preempted during {phase.lower()} "
            f"(the API says {seen}; {error.message}).",
            status="PREEMPTED",
            hint="Spot capacity was reclaimed by Google; nothing is wrong with the run. "
            "Retry later, or run without --spot (on-demand costs about five times more).",
        )

    def _reclaimed_state(self, wait: float) -> str | None:
        """The state that says a spot node was reclaimed (or "gone"), polled for up to
        `wait` s; None if it still looks alive then, or if its own watchdog (or someone)
        is deleting it, which `_vanished` explains."""
        zone, name = self.spec.zone.value, self.spec.node_name
        last: list[str] = []

        def look() -> str:
            try:
                state = self.api.get_node(zone, name).state.value
            except NotFoundError:
                state = "gone"
            if not last or last[-1] != state:
                if last:
                    self.observer.note(f"spot node {name}: {state}")
                last.append(state)
            return state

        settled = {*_RECLAIMED, NodeState.DELETING.value, "gone"}
        try:
            state = poll_until(
                look,
                lambda found: found in settled,
                timeout=wait,
                clock=self.clock,
                sleep=self.sleep,
                backoff=self.poll,
                retry_if=lambda failure: isinstance(failure, TransientError),
                describe=lambda _found: f"spot node {name} to show whether it was preempted",
            )
        except DeadlineError:
            return None  # still READY (or similar) all along: not a preemption
        except CloudError:
            return None  # the API cannot say; the original error stands
        if state == NodeState.DELETING.value:
            return None
        if state == "gone" and self._watchdog_fired():
            return None
        return state

    def _watchdog_fired(self) -> bool:
        """Would this run's own watchdog have deleted the node by now?"""
        if self.watchdog is None:
            return False
        created = self.outcome.milestones.get("create_sent", self._t0)
        if self.clock() - created >= self.watchdog.max_duration_seconds:
            return True
        return self.renewer is not None and self.renewer.lapsed()

    def _each_phase(self) -> None:
        if self.attach is not None:
            # The session's node is READY and verified (its receipt gates the command).
            self._phase(Phase.VALIDATE, self.validate)
            self._record_start()
            self._phase(Phase.CONNECT, self.open_session)
            assert self.workload is not None
            self.workload.run()
            return
        self._phase(Phase.VALIDATE, self.validate)
        self._record_start()
        self._phase(Phase.CREATE, self.create)
        self._phase(Phase.WAIT_READY, self.wait_ready)
        self._phase(Phase.HOST_KEY, self.pin_host_key)
        self._phase(Phase.CONNECT, self.open_session)
        self._phase(Phase.BOOTSTRAP, self.bootstrap)
        self._phase(Phase.STAGE, self.stage)
        self._phase(Phase.EXECUTE, self.execute)
        self._phase(Phase.COLLECT, self.collect)
        self._phase(Phase.VERIFY, self.verify)
        if self.workload is not None:
            # Only here, after the receipt verified on this node (DESIGN §3.9).
            self.workload.run()

    # -- phases -------------------------------------------------------------------------

    def validate(self) -> str:
        """Read the payload, probe that its receipt can be kept, make the run's nonce and
        SSH key. Sends nothing anywhere."""
        from tpulab.remote.payload import check_nonce
        from tpulab.remote.ssh import RunKey

        if self.attach is not None:
            return self._validate_attached()
        try:
            source = self.spec.payload or paths.payload_path()
            self.payload_bytes = source.read_bytes()
        except OSError as error:
            raise ConfigError(
                f"Cannot read the payload: {error}",
                hint="Reinstall tpulab (the verifier ships inside it), or pass a readable file.",
            ) from None
        self._receipt_store().check_writable()  # a receipt that cannot be kept = a wasted VM
        self.nonce = check_nonce(self.new_nonce())
        self.key = self.new_key() if self.new_key is not None else RunKey()
        detail = f"{self.spec.accelerator.name} in {self.spec.zone.value}, payload {source.name}"
        if self.spec.workload is not None:
            self.workload = WorkloadRunner(self, self.spec.workload)
            self.outcome.workload = self.workload.outcome
            detail += "; " + self.workload.validate()
        return detail

    def _validate_attached(self) -> str:
        """An exec: only its workload is new (the node, key and receipt are the session's)."""
        assert self.attach is not None
        if self.spec.workload is None:
            raise ConfigError(
                "An exec needs a command after --.", hint="e.g. tpulab exec -- python train.py"
            )
        self.workload = WorkloadRunner(self, self.spec.workload)
        self.outcome.workload = self.workload.outcome
        receipt = self.attach.receipt_id or "not recorded"
        return (
            f"session {self.attach.session}: node {self.spec.node_name}, verified receipt "
            f"{receipt}; {self.workload.validate()}"
        )

    def create(self) -> str:
        """Journal the run, send CreateNode with labels + ssh key, wait for the operation.

        Sets `create_sent` just before the request leaves and `create_accepted` once the
        API took it; teardown uses them to decide what may exist.
        """
        assert self.key is not None
        if self.journal is not None:
            self.journal.run_started(self.spec)
            self._journalled = True
            self._journal_phase(Phase.CREATE)
        request = NodeRequest(
            accelerator_type=self.spec.accelerator.name,
            runtime_version=self.spec.accelerator.runtime_version,
            labels=self.spec.labels,
            metadata={
                SSH_KEYS_METADATA: self.key.metadata_entry(self.spec.ssh_user),
                # Our key reaches the VM only through ssh-keys, which OS Login would
                # make the guest agent ignore; the host key only through guest attributes.
                OS_LOGIN_METADATA: "FALSE",
                GUEST_ATTRIBUTES_METADATA: "TRUE",
                **self._watchdog_metadata(),
            },
            spot=self.spec.spot,
            description=f"tpulab run {self.spec.run_id}",
            external_ips=not self.spec.internal_ip,
            service_account_email=self.spec.service_account or "",
            # The watchdog's token must reach the TPU API; without a watchdog the VM
            # keeps the API's default scopes unless an account was asked for.
            service_account_scopes=(_CLOUD_PLATFORM_SCOPE,)
            if self.watchdog is not None or self.spec.service_account
            else (),
        )
        if self.spec.queued:
            return self._create_through_queue(request)
        zone, name = self.spec.zone.value, self.spec.node_name
        deadline = self.clock() + self.spec.timeouts.create
        attempts = 0

        def send() -> str | None:
            """One CreateNode; None when an earlier attempt's node turns out to exist."""
            nonlocal attempts
            attempts += 1
            try:
                return self.api.create_node(zone, name, request)
            except AlreadyExistsError as taken:
                if attempts == 1:
                    raise
                # A resend after a refusal meets the node an earlier attempt created
                # after all (the API acted, then failed to answer): ours by run label.
                try:
                    ours = self._ours_exists()
                except CloudError as check:
                    # Ours or not, something exists: never report "nothing created".
                    raise OutcomeUnknownError(
                        f"{taken.message} Whether the node is this run's could not be "
                        f"checked ({check.message}).",
                        status=taken.status,
                        api_message=taken.api_message,
                    ) from None
                if ours:
                    return None
                raise

        seen_before_resend = ""

        def refused_and_absent(error: Exception) -> bool:
            # Resend only an ANSWERED refusal (503, rate-limit 429): never a request whose
            # fate is unknown (timeout, reset) -- and only once GetNode proves no node of
            # this name exists, or that it is this run's (the resend then hears 409 and
            # adopts it). The name is ours to choose, so a resend cannot make a second
            # node; the check is what keeps us from mistaking someone else's for ours.
            nonlocal seen_before_resend
            if not isinstance(error, TransientError) or isinstance(
                error, UnreachableError | OutcomeUnknownError
            ):
                return False
            try:
                node = self._node_named_like_ours()
            except CloudError:
                return False  # cannot prove anything: leave it to the full teardown
            if node is None:
                seen_before_resend = "no such node exists"
                return True
            if node.managed_by_tpulab and node.run_id == self.spec.run_id:
                seen_before_resend = "this run's node exists after all"
                return True
            return False  # a stranger's node has the name: resending cannot help

        def on_retry(error: Exception, delay: float) -> None:
            message = error.message if isinstance(error, TpuLabError) else str(error)
            self.observer.note(
                f"create of {name} refused ({message}); {seen_before_resend}, "
                f"sending it again in {delay:.1f} s"
            )

        self.outcome.create_sent = True
        self._milestone("create_sent")
        try:
            operation = retry_call(
                send,
                retry_if=refused_and_absent,
                timeout=self.spec.timeouts.create,
                clock=self.clock,
                sleep=self.sleep,
                backoff=self.poll if self.poll is not None else Backoff(1.0, 10.0),
                on_retry=on_retry,
            )
        except (*_REFUSED, UnreachableError):
            # Refused synchronously, or never sent (connection refused, DNS): every
            # earlier attempt was proven absent before resending, so nothing exists.
            self.outcome.create_sent = False
            raise
        self.outcome.create_accepted = True
        if operation is None:
            self.observer.note(f"node {name} was created by an earlier attempt; using it")
            return f"node {name} (adopted after a refused create)"
        try:
            self.api.wait_operation(operation, timeout=max(0.0, deadline - self.clock()))
        except AlreadyExistsError:
            # The name belongs to a node someone else created: it is not ours, so the
            # teardown must only confirm that nothing with this run's label exists.
            self.outcome.create_accepted = False
            raise
        return f"node {name}" + (" (spot)" if self.spec.spot else "")

    def _watchdog_metadata(self) -> dict[str, str]:
        """The startup-script that arms the VM's watchdog at boot (none with --no-watchdog)."""
        if self.watchdog is None:
            return {}
        from tpulab.remote.watchdog import startup_script

        return {STARTUP_SCRIPT_METADATA: startup_script(self.watchdog)}

    def _create_through_queue(self, request: NodeRequest) -> str:
        """--queued: the same node request, through a QueuedResource (run/queued.py)."""
        from tpulab.run.queued import create_through_queue

        def sent() -> None:
            self.outcome.create_sent = True
            self._milestone("create_sent")

        def refused() -> None:
            self.outcome.create_sent = False

        def accepted() -> None:
            self.outcome.create_accepted = True

        return create_through_queue(
            self.api,
            self.spec,
            request,
            on_sent=sent,
            on_refused=refused,
            on_accepted=accepted,
            note=self.observer.note,
            poll=self.poll,
            clock=self.clock,
            sleep=self.sleep,
        )

    def _node_named_like_ours(self) -> NodeInfo | None:
        """GetNode by this run's node name; None on NOT_FOUND."""
        try:
            return self.api.get_node(self.spec.zone.value, self.spec.node_name)
        except NotFoundError:
            return None

    def _ours_exists(self) -> bool:
        node = self._node_named_like_ours()
        return node is not None and node.managed_by_tpulab and node.run_id == self.spec.run_id

    def wait_ready(self) -> str:
        """Poll the node until READY; PreemptedError if a spot node is reclaimed."""
        from tpulab.cloud.polling import wait_for_state

        node = wait_for_state(
            self.api,
            self.spec.zone.value,
            self.spec.node_name,
            {NodeState.READY},
            timeout=self.spec.timeouts.ready,
            poll=self.poll,
            clock=self.clock,
            sleep=self.sleep,
        )
        self._milestone("ready_seen")
        self.outcome.node = node
        self._check_reachable(node)
        return f"READY at {node.external_ip or node.ip_address or 'no address'}"

    def pin_host_key(self) -> str:
        """Wait for the host key guest attribute and pin it; nothing is sent over SSH."""
        from tpulab.remote.ssh import SshTarget, ssh_port_from, wait_for_host_key

        seen: dict[str, str] = {}

        def fetch() -> dict[str, str]:
            seen.clear()
            seen.update(self.api.guest_attributes(self.spec.zone.value, self.spec.node_name))
            return dict(seen)

        host_key = wait_for_host_key(
            fetch, timeout=self.spec.timeouts.host_key, sleep=self.sleep, clock=self.clock
        )
        # The address may be assigned after READY (the emulator does so once the node's
        # SSH host runs); ask again now that the guest agent is up.
        node = self.outcome.node = self.api.get_node(self.spec.zone.value, self.spec.node_name)
        address = self._check_reachable(node)
        user = self.spec.ssh_user
        if self.spec.emulated:
            # An emulated OpenSSH host can only log in an existing account; it says which.
            # Honoured for emulated runs only: a real VM's attributes never pick the user.
            user = seen.get(EMULATOR_SSH_USER_ATTRIBUTE) or user
        self.target = SshTarget(address, ssh_port_from(seen), user, host_key)
        return f"{host_key.key_type} pinned for {address}:{self.target.port}"

    def _check_reachable(self, node: NodeInfo) -> str:
        """The address SSH will use; RemoteError at once (not after the SSH timeouts) when
        the node has none this machine can reach."""
        if self.spec.internal_ip:
            if node.ip_address:
                return node.ip_address
            raise RemoteError(
                f"Node {node.name} reports no internal IP address.",
                hint="Check the node's network in the console; retry the run.",
            )
        if node.external_ip:
            return node.external_ip
        raise RemoteError(
            f"Node {node.name} has no external IP, so this machine cannot reach it over SSH"
            + (f" (its internal address is {node.ip_address})." if node.ip_address else "."),
            hint="An organisation policy (constraints/compute.vmExternalIpAccess) or the "
            "network may forbid external IPs. Run from inside the VM's VPC with "
            "--internal-ip, or ask an admin to allow external IPs for TPU VMs.",
        )

    def open_session(self) -> str:
        """Open SSH with the per-run key against the pinned host key (waits for sshd)."""
        assert self.target is not None
        assert self.key is not None
        if self.attach is not None:
            self.attach.check_node(self)  # a session's node that is gone: say so at once
        self.session = self._connect(self.target, self.key)
        # Connections open lazily; opening here makes this phase own the waiting for sshd.
        self.session.open()
        if self.attach is not None:
            # Before the lease or anything changes: the lock first (two execs at once
            # would both pass the busy check), held until the connection closes.
            self.attach.take_lock(self.session, self.spec.run_id)
            self.attach.check_not_busy(self.session)
        where = f"{self.target.user}@{self.target.host}:{self.target.port}"
        if self.watchdog is None:
            return f"{where}; no watchdog (--no-watchdog)"
        return f"{where}; {self._arm_lease(self.session)}"

    def _arm_lease(self, session: RemoteSession) -> str:
        """First lease renewal (ends the watchdog's boot grace), the renewer thread, and
        the watchdog's state as the VM published it. Never fails the run."""
        assert self.watchdog is not None
        self.renewer = LeaseRenewer(
            session,
            self.watchdog,
            note=self.observer.note,
            background=self.renew_in_background,
            clock=self.clock,
        )
        self.renewer.start()
        state = self.outcome.watchdog = read_state(
            self.api,
            self.spec.zone.value,
            self.spec.node_name,
            clock=self.clock,
            sleep=self.sleep,
        )
        if not state.armed:
            self.observer.note(f"watchdog not armed: {state.reason}")
            fix = state.fix(self.spec.service_account)
            if fix:
                self.observer.note(fix)
        lease = f"lease {self.watchdog.lease_seconds:g}s"
        return f"watchdog {state.describe()}; {lease}"

    def bootstrap(self) -> str:
        """Ensure ~/jax-tpu-lab/.venv holds JAX for the platform (see bootstrap.py)."""
        assert self.session is not None
        result = boot.bootstrap(
            self.session,
            platform=self.spec.platform,
            installer=self.installer,
            python=self.spec.python,
            jax_version=self.spec.jax_version,
            timeout=self.spec.timeouts.bootstrap,
            on_line=self._on_line,
            note=self.observer.note,
            clock=self.clock,
        )
        self.outcome.bootstrap = result
        jax = result.versions.get("jax") or "?"
        python = result.versions.get("python") or "?"
        return f"{result.venv_path}; install {result.install}; python {python}, jax {jax}"

    def stage(self) -> str:
        """Upload the payload, check its sha256, remove any receipt a past run left."""
        assert self.session is not None
        local = self._stage_file(self.payload_bytes, boot.STAGED_PAYLOAD, "payload")
        self.session.run(["rm", "-f", boot.RECEIPT_PATH], timeout=60, check=True)
        return f"{len(self.payload_bytes)} bytes, sha256 {local[:12]}"

    def _stage_file(self, data: bytes, remote_path: str, what: str) -> str:
        """Put `data` at `remote_path`; RemoteError unless the VM's sha256 is ours."""
        assert self.session is not None
        local = hashlib.sha256(data).hexdigest()
        remote = self.session.put(data, remote_path)
        if remote != local:
            raise RemoteError(
                f"The staged {what}'s sha256 {remote[:12]} differs from ours {local[:12]}.",
                hint="The upload was corrupted or the remote disk is full; retry the run.",
            )
        return local

    def execute(self) -> str:
        """Run the payload with JAX_PLATFORMS set, our nonce and the payload timeout.

        A non-zero exit is not raised here: the payload writes a receipt naming its
        error, which `collect` and `verify` bring back and keep first.
        """
        from tpulab.remote.payload import payload_command, payload_env

        assert self.session is not None
        argv = payload_command(
            boot.VENV_PYTHON,
            boot.STAGED_PAYLOAD,
            platform=self.spec.platform,
            nonce=self.nonce,
            out=boot.RECEIPT_PATH,
            emulated=self.spec.emulated,
        )
        env = payload_env(self.spec.platform, self.spec.accelerator.devices_per_host)

        def on_line(stream: str, line: str) -> None:
            if len(self.payload_output) < 400:
                self.payload_output.append(line)
            self._on_line(stream, line)

        result = self.session.run(
            argv, env=env, timeout=self.spec.timeouts.payload, on_line=on_line
        )
        self.outcome.payload_exit = result.exit_status
        if not self.payload_output:
            self.payload_output = (result.stdout + "\n" + result.stderr).splitlines()[-400:]
        return f"exit {result.exit_status}"

    def collect(self) -> str:
        """Fetch the receipt file (sha256-checked by the transfer), bounded in size."""
        from tpulab.evidence.judge import payload_failure
        from tpulab.evidence.receipt import MAX_RECEIPT_BYTES

        assert self.session is not None
        # The bytes go to memory and then to the receipt store; the download is scratch.
        with tempfile.TemporaryDirectory(prefix="tpulab-receipt-") as scratch:
            local = Path(scratch) / "receipt.json"
            try:
                self.session.get(boot.RECEIPT_PATH, local, max_bytes=MAX_RECEIPT_BYTES)
            except RemoteError as error:
                raise payload_failure(
                    "wrote no receipt",
                    f"fetching {boot.RECEIPT_PATH} failed: {error.message}",
                    exit_status=self.outcome.payload_exit,
                    output=self.payload_output,
                    where="vm",
                ) from None
            self.raw_receipt = local.read_bytes()
        return f"{len(self.raw_receipt)} bytes"

    def verify(self) -> str:
        """Judge the receipt against the catalog and our nonce; keep it before teardown.

        The receipt is kept whatever the verdict (it is the evidence of a failure too).
        """
        from tpulab.evidence.judge import failure_of, judge
        from tpulab.evidence.receipt import expectation_for

        expectation = expectation_for(
            self.spec.accelerator.name, emulated=self.spec.emulated, nonce=self.nonce
        )
        judgement = (self.judge or judge)(self.raw_receipt, expectation)
        self._keep(judgement, expectation)
        problem = failure_of(
            judgement,
            expectation,
            payload_exit=self.outcome.payload_exit,
            output=self.payload_output,
            where="vm",
        )
        if problem is not None:
            raise problem
        return f"VERIFIED: {expectation.describe()}"

    # -- helpers of the phases ----------------------------------------------------------

    def _receipt_store(self) -> ReceiptStore:
        if self.store is None:
            from tpulab.evidence.store import ReceiptStore

            self.store = ReceiptStore()
        return self.store

    def _keep(self, judgement: Judgement, expectation: Expectation) -> None:
        from tpulab.evidence.store import Provenance, Source

        provenance = Provenance(
            source=Source.RUN,
            run_id=self.spec.run_id,
            node_name=self.spec.node_name,
            project=self.spec.project.value,
            zone=self.spec.zone.value,
            accelerator_type=self.spec.accelerator.name,
            emulated=self.spec.emulated,
            payload_exit_status=self.outcome.payload_exit,
        )
        self.outcome.judgement = judgement
        self.outcome.receipt = self._receipt_store().keep(
            self.raw_receipt, expectation, judgement, provenance
        )
        self._milestone("receipt_saved")

    # -- teardown -----------------------------------------------------------------------

    def _teardown(self, primary: BaseException | None) -> TeardownError | None:
        """Delete and confirm if anything may exist; the TeardownError, or None.

        Everything, closing the SSH session included, happens inside the shield, so a
        second Ctrl-C cannot cut it short.
        """
        zone, name = self.spec.zone.value, self.spec.node_name
        manual = self.spec.leaked_node().what_to_do()
        with self.shield(f"deleting node {name} in {zone}", manual=manual):
            self._release()
            if not self.outcome.create_sent:
                self.outcome.teardown_status = "not-created"
                return None
            self.observer.phase_started(Phase.TEARDOWN)
            self._journal_phase(Phase.TEARDOWN)
            started = self.clock()
            try:
                report = delete_and_confirm(
                    self.api,
                    zone,
                    name,
                    run_id=self.spec.run_id,
                    known_ours=self.outcome.create_accepted,
                    # Sent but not known to be accepted (e.g. the reply was lost): the
                    # node may still appear, so an empty list is believed only later.
                    settle=0.0
                    if self.outcome.create_accepted
                    else min(_CREATE_SETTLE_SECONDS, self.spec.timeouts.teardown / 4),
                    timeout=self.spec.timeouts.teardown,
                    poll=self.teardown_poll,
                    # The cap scales with the first interval (10 s for the default 2 s),
                    # so a fast-polling caller rides out a DeleteNode storm just as fast.
                    max_poll=min(10.0, self.teardown_poll * 5),
                    clock=self.clock,
                    sleep=self.sleep,
                    notify=self.observer.note,
                    on_delete_sent=lambda at: self._milestone("delete_sent", at),
                    queued_resource=name if self.spec.queued else None,
                )
            except TeardownError as error:
                failure = self._unconfirmed(
                    primary, error.message, error.leaked, delete_attempts=error.delete_attempts
                )
            except Exception as error:  # any failure here means "not confirmed"
                failure = self._unconfirmed(primary, f"teardown failed unexpectedly: {error}")
            else:
                self.outcome.teardown = report
                self.outcome.teardown_status = "confirmed"
                self.outcome.phase_seconds[Phase.TEARDOWN.value] = self.clock() - started
                self._milestone("teardown_confirmed")
                how = (
                    "already gone" if report.already_gone else f"{report.delete_attempts} delete(s)"
                )
                self.observer.phase_finished(
                    Phase.TEARDOWN, self.clock() - started, f"confirmed by list ({how})"
                )
                return None
            self.observer.phase_failed(Phase.TEARDOWN, self.clock() - started, failure)
            return failure

    def _unconfirmed(
        self,
        primary: BaseException | None,
        why: str,
        leaked: Sequence[LeakedNode] = (),
        *,
        delete_attempts: int = 0,
    ) -> TeardownError:
        self.outcome.teardown_status = "unconfirmed"
        ours = self.spec.leaked_node()
        # The teardown knows which names it saw; the run knows their API and run id.
        nodes = [replace(ours, name=node.name) for node in leaked] or [ours]
        message = why
        if primary is not None and not isinstance(primary, TeardownError):
            earlier = primary.message if isinstance(primary, TpuLabError) else repr(primary)
            message += f" (The run had already failed: {earlier})"
        return TeardownError(message, nodes, delete_attempts=delete_attempts)

    def _finish(self, primary: BaseException | None, leaked: TeardownError | None) -> None:
        outcome = self.outcome
        outcome.error = leaked or primary
        outcome.seconds = self.clock() - self._t0
        end = outcome.milestones.get("teardown_confirmed", self.clock())
        begin = outcome.milestones.get("create_sent")
        outcome.billed_seconds = max(0.0, end - begin) if begin is not None else 0.0
        with contextlib.suppress(Exception):
            outcome.api_calls = self.api.call_count
        try:
            if self._record_started:
                self._write_run_record()  # replaces the start record
        finally:
            # Whatever the record did, the journal row says how the teardown ended: a row
            # left open would later read as a run "deleted by its watchdog".
            if self.journal is not None and self._journalled:
                detail = "ok" if outcome.error is None else _describe(outcome.error)
                self.journal.run_finished(self.spec.run_id, outcome.teardown_status, detail)

    def _record_start(self) -> None:
        """A `-- CMD` run's run.json saying it started ("running"), once its input is valid
        and before anything can bill or change a VM: a run killed from here on (SIGKILL,
        power loss) still leaves its trace and out dir for `tpulab runs`. Its end
        replaces it (`_finish`, or `run_attached` for an exec) whatever happens."""
        if self.workload is None:
            return
        self._record_started = True
        self._write_run_record(state="running")

    def _write_run_record(self, *, state: RecordState = "finished") -> None:
        """<out>/run.json: the run's record (tpulab.run.record), beside its artifacts.
        A disk that refuses it is a note, never a reason to misreport the run."""
        from tpulab.run.record import run_record, write_run_record

        assert self.spec.workload is not None
        write = self.write_record or write_run_record
        record = None
        try:
            record = run_record(self.outcome, state=state, report_error=self.report_error)
            self.outcome.run_record = write(record, self.spec.workload.out)
        except Exception as error:  # a disk's refusal, or a value the record cannot hold
            said = f"{type(error).__name__}: {error}"
            self.observer.note(f"could not write run.json: {said}")
            if record is None or isinstance(error, OSError):
                return  # nothing to fall back to, or a disk that will refuse that too
            # The file lists (every name the upload and the fetch saw) are what a record
            # can fail on; without them (their counts stay in `workload`) it still says
            # truthfully how the run ended, rather than leaving the start's "running".
            reduced = record.model_copy(update={"upload": [], "fetch": [], "upload_sent": None})
            try:
                self.outcome.run_record = write(reduced, self.spec.workload.out)
            except Exception as again:
                self.observer.note(f"could not write run.json without its file lists: {again}")
            else:
                self.observer.note("run.json was written without its file lists")


def _is_interrupt(error: BaseException | None) -> bool:
    """Ctrl-C, or a signal that `tpulab.run.signals` turned into an exception."""
    from tpulab.run.signals import SignalInterrupt

    return isinstance(error, KeyboardInterrupt | SignalInterrupt | InterruptedRun)


def _describe(error: BaseException) -> str:
    if isinstance(error, TpuLabError):
        return f"{type(error).__name__}: {error.message}"
    return f"{type(error).__name__}: {error}"
