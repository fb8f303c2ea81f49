"""What one run produced: `RunOutcome`, read by the summary, the envelope and run.json.

The phases hand their results to the run's context (tpulab.run.context) as frozen
records, each built once, when its phase knows it (`Judged`, `TeardownEnd`, ...); the
context builds the frozen `RunOutcome` from them once, when the run ends. The readers
(tpulab.run.summary, tpulab.run.report, tpulab.run.record, the CLI) only read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from tpulab.config import RunSpec
from tpulab.errors import WorkloadFailedError
from tpulab.models import NodeInfo
from tpulab.run.progress import TeardownStatus

if TYPE_CHECKING:
    from tpulab.evidence.judge import Judgement, Verdict
    from tpulab.evidence.store import KeptReceipt
    from tpulab.remote import bootstrap as boot
    from tpulab.remote.manifest import Manifest
    from tpulab.remote.watchdog import WatchdogState
    from tpulab.remote.workspace import UploadResult
    from tpulab.run.teardown import TeardownReport

__all__ = ["Judged", "RunOutcome", "TeardownEnd", "WorkloadOutcome"]


@dataclass(frozen=True)
class Judged:
    """The verify phase's result: the run's judgement, and its receipt as kept (None: a
    slice whose worker 0 wrote none, judged with the others all the same)."""

    judgement: Judgement
    receipt: KeptReceipt | None = None


@dataclass(frozen=True)
class TeardownEnd:
    """How the teardown ended: its status, and the report of a confirmed one."""

    status: TeardownStatus
    report: TeardownReport | None = None


@dataclass(frozen=True)
class WorkloadOutcome:
    """What happened to the user's command, built from what its phases produced
    (`WorkloadRunner.outcome`)."""

    command: tuple[str, ...]
    env_names: tuple[str, ...]
    out: Path
    upload: UploadResult | None = None  # the workspace on the VM and what was sent
    upload_description: str = ""
    extras: boot.ExtrasResult | None = None
    started: bool = False
    exit_status: int | None = None
    timed_out: bool = False
    stopped: str | None = None  # why tpulab stopped it ("interrupted by SIGINT", ...)
    seconds: float | None = None
    fetch: Manifest | None = None
    fetch_problem: str | None = None  # why nothing (or not everything) came back
    kept: Manifest | None = None  # what a fetch cut short kept (files that fully arrived)
    output_tail: tuple[str, ...] = ()
    # A slice: each worker's exit status (None: timed out, stopped or never reported), and
    # the worker whose command failed first (the others were stopped then).
    worker_exits: tuple[int | None, ...] = ()
    failed_worker: int | None = None
    # How often the SSH connection dropped under the running command and was opened
    # again to follow it (tpulab.run.command): the command ran on each time.
    reconnects: int = 0

    @property
    def ok(self) -> bool:
        return (
            self.started
            and self.exit_status == 0
            and not self.timed_out
            and self.stopped is None
            and self.fetch is not None
        )

    def failure(self, timeout: float) -> WorkloadFailedError | None:
        """What the user must hear when the command failed (ran past `timeout`, the
        run's --timeout, or exited non-zero); None when it did not."""
        tail = "\n".join(self.output_tail[-20:])
        if self.timed_out:
            return WorkloadFailedError(
                f"Your command ran past its {timeout:g} s --timeout and was "
                "killed on the VM (its whole process group). Its artifacts were fetched.",
                exit_status=None,
                timed_out=True,
                output_tail=tail,
                hint="Give it longer with --timeout, or make it checkpoint and resume.",
            )
        if self.exit_status not in (0, None):
            where = "the verified VM"
            if self.failed_worker is not None:
                count = len(self.worker_exits)
                where = (
                    f"worker {self.failed_worker} of {count} (the first to fail; the "
                    "others were stopped)"
                )
            return WorkloadFailedError(
                f"Your command exited with status {self.exit_status} on {where}. "
                f"Its log and run directory were fetched into {self.out}.",
                exit_status=self.exit_status,
                output_tail=tail,
                hint="See the command's output above and output.log in the --out directory.",
            )
        return None


@dataclass(frozen=True)
class RunOutcome:
    """Everything a report needs about one run, built once when the run ends."""

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
    # Copies of the context's accounting, taken when the outcome is built.
    milestones: dict[str, float] = field(default_factory=dict)
    phase_seconds: dict[str, float] = field(default_factory=dict)  # phase -> duration
    # A slice's per-worker time of each step run on every worker: step -> [worker 0, ...].
    worker_seconds: dict[str, list[float]] = field(default_factory=dict)
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
    def verified(self) -> bool:
        """The receipt verified on a node this run created (what `up` may keep)."""
        judgement = self.judgement
        return judgement is not None and judgement.verified and self.create_accepted

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
