"""What a run tells the outside world while it happens: phases, remote output, milestones.

The core never prints. The lifecycle calls a `RunObserver`; the CLI's observer draws
spinners, the benchmark's records timestamps, and helper E's journal follows the phase
column. `RunJournal` is the narrower contract of the local ledger: its `run_started` must
be durable before the node is requested, so a crash right after create can still be
cleaned up.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    from tpulab.config import RunSpec

__all__ = [
    "COMMAND_STREAM",
    "MILESTONES",
    "WORKLOAD_PHASES",
    "FanOut",
    "NullObserver",
    "Phase",
    "PhaseRecord",
    "Recorder",
    "RunJournal",
    "RunObserver",
    "TeardownStatus",
    "command_stream_worker",
    "worker_command_stream",
]


class Phase(str, Enum):
    """The phases of docs/architecture.md §3, in the order a run goes through them."""

    VALIDATE = "validate"
    CREATE = "create"
    WAIT_READY = "wait-ready"
    HOST_KEY = "host-key"
    CONNECT = "connect"
    BOOTSTRAP = "bootstrap"
    STAGE = "stage"
    EXECUTE = "execute"
    COLLECT = "collect"
    VERIFY = "verify"
    # The user's experiment (`-- CMD`), only after the receipt verified (DESIGN §3.9).
    SYNC = "sync"
    INSTALL = "install"
    WORKLOAD = "workload"
    FETCH = "fetch"
    TEARDOWN = "teardown"

    @property
    def label(self) -> str:
        return _TITLES[self]


# The phases only a run with a `-- CMD` goes through.
WORKLOAD_PHASES = frozenset({Phase.SYNC, Phase.INSTALL, Phase.WORKLOAD, Phase.FETCH})

_TITLES = {
    Phase.VALIDATE: "Validate input",
    Phase.CREATE: "Create TPU VM",
    Phase.WAIT_READY: "Wait for READY",
    Phase.HOST_KEY: "Pin SSH host key",
    Phase.CONNECT: "Connect over SSH",
    Phase.BOOTSTRAP: "Bootstrap venv + JAX",
    Phase.STAGE: "Stage payload",
    Phase.EXECUTE: "Run payload",
    Phase.COLLECT: "Collect receipt",
    Phase.VERIFY: "Verify receipt",
    Phase.SYNC: "Upload workspace",
    Phase.INSTALL: "Install extra packages",
    Phase.WORKLOAD: "Run your command",
    Phase.FETCH: "Fetch artifacts",
    Phase.TEARDOWN: "Delete VM and confirm",
}

# Moments the benchmark measures between (monotonic clock of the lifecycle).
MILESTONES = (
    "create_sent",
    "ready_seen",
    "receipt_saved",
    "delete_sent",
    "teardown_confirmed",
)

# The `stream` of remote_output lines printed by the user's command (styled apart).
COMMAND_STREAM = "command"


def worker_command_stream(worker: int) -> str:
    """The stream of one slice worker's command output under --all-output ("command:w3")."""
    return f"{COMMAND_STREAM}:w{worker}"


def command_stream_worker(stream: str) -> int | None:
    """The worker of a `worker_command_stream`; None for any other stream."""
    head, _, worker = stream.partition(":w")
    return int(worker) if head == COMMAND_STREAM and worker.isdigit() else None


TeardownStatus = Literal["confirmed", "unconfirmed", "not-created"]


class RunObserver(Protocol):
    """Callbacks of one run. They must be quick and must not raise."""

    def phase_started(self, phase: Phase) -> None: ...

    def phase_finished(self, phase: Phase, seconds: float, detail: str) -> None: ...

    def phase_failed(self, phase: Phase, seconds: float, error: BaseException) -> None: ...

    def remote_output(self, stream: str, line: str) -> None:
        """One line the VM printed: stream is "stdout" or "stderr" for tpulab's own
        commands, COMMAND_STREAM for the user's command (its combined output), and
        `worker_command_stream(w)` for worker w's under --all-output."""
        ...

    def note(self, message: str) -> None:
        """A fact worth telling the user (which venv path was taken, a retry...)."""
        ...

    def milestone(self, name: str, at: float) -> None:
        """One of MILESTONES happened at monotonic time `at`."""
        ...


class RunJournal(Protocol):
    """The local ledger's view of a run (helper E's journal adapts to this)."""

    def run_started(self, spec: RunSpec) -> None:
        """Record the run durably; called before create_node is sent. Raising aborts."""
        ...

    def phase_changed(self, run_id: str, phase: str) -> None: ...

    def run_finished(self, run_id: str, teardown: TeardownStatus, detail: str) -> None: ...


class NullObserver:
    """Observes nothing; the default."""

    def phase_started(self, phase: Phase) -> None:
        pass

    def phase_finished(self, phase: Phase, seconds: float, detail: str) -> None:
        pass

    def phase_failed(self, phase: Phase, seconds: float, error: BaseException) -> None:
        pass

    def remote_output(self, stream: str, line: str) -> None:
        pass

    def note(self, message: str) -> None:
        pass

    def milestone(self, name: str, at: float) -> None:
        pass


@dataclass
class PhaseRecord:
    phase: Phase
    seconds: float
    ok: bool
    detail: str


@dataclass
class Recorder(NullObserver):
    """Keeps phases, notes, milestones and (bounded) remote output for reports."""

    phases: list[PhaseRecord] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    milestones: dict[str, float] = field(default_factory=dict)
    output: list[tuple[str, str]] = field(default_factory=list)
    max_output_lines: int = 2000

    def phase_finished(self, phase: Phase, seconds: float, detail: str) -> None:
        self.phases.append(PhaseRecord(phase, seconds, True, detail))

    def phase_failed(self, phase: Phase, seconds: float, error: BaseException) -> None:
        message = getattr(error, "message", None) or str(error) or type(error).__name__
        self.phases.append(PhaseRecord(phase, seconds, False, message))

    def remote_output(self, stream: str, line: str) -> None:
        if len(self.output) < self.max_output_lines:
            self.output.append((stream, line))

    def note(self, message: str) -> None:
        self.notes.append(message)

    def milestone(self, name: str, at: float) -> None:
        self.milestones.setdefault(name, at)


class FanOut:
    """Passes every callback to several observers; one that raises is not allowed to
    break the run (observers are UI, the run is the thing that must finish)."""

    def __init__(self, observers: Sequence[RunObserver]) -> None:
        self._observers = list(observers)

    def _each(self, call: Callable[[RunObserver], None]) -> None:
        for observer in self._observers:
            try:
                call(observer)
            except Exception:  # noqa: S112 - a broken display must not leak a VM
                continue

    def phase_started(self, phase: Phase) -> None:
        self._each(lambda o: o.phase_started(phase))

    def phase_finished(self, phase: Phase, seconds: float, detail: str) -> None:
        self._each(lambda o: o.phase_finished(phase, seconds, detail))

    def phase_failed(self, phase: Phase, seconds: float, error: BaseException) -> None:
        self._each(lambda o: o.phase_failed(phase, seconds, error))

    def remote_output(self, stream: str, line: str) -> None:
        self._each(lambda o: o.remote_output(stream, line))

    def note(self, message: str) -> None:
        self._each(lambda o: o.note(message))

    def milestone(self, name: str, at: float) -> None:
        self._each(lambda o: o.milestone(name, at))
