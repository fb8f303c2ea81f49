"""`<out>/run.json`: the record of a `tpulab run ... -- CMD`, beside its artifacts.

A versioned Envelope (its schema pinned in tests/schemas/RunRecord.json like every
`--json` output), so `tpulab runs show ID --json` prints exactly what the file holds and
a script reads both the same way. It says what ran where and what came of it: the node
and its accelerator, the verifier's receipt id and verdict (the gate), the venv's
versions (extras included), the command argv, the NAMES of the environment it was given
(never the values: they may be secrets), its exit status, every phase's duration, the
upload and fetch manifests (path, bytes, sha256; for the upload also what was sent: an
incremental sync sends only new or changed files), the API calls and the estimated cost.
The journal's `records` table points to the file (tpulab.cleanup.journal, `set_run_record`).

The file is written twice through `write_run_record`: when the run starts (after its
input validated, before anything can bill or change a VM) with `state` "running" and
nothing yet to report, and at the end, replaced by the whole record ("finished"). A run
killed in between (SIGKILL, a laptop losing power) leaves the first: `tpulab runs`
shows it as interrupted, with its out dir, once the process that wrote it is gone.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

from tpulab.catalog import PRICE_DATE
from tpulab.envelope import Envelope, ErrorReport
from tpulab.evidence.judge import Verdict
from tpulab.models import DEFER_BUILD
from tpulab.run.progress import TeardownStatus

if TYPE_CHECKING:
    from tpulab.errors import TpuLabError
    from tpulab.remote.manifest import Manifest
    from tpulab.run.outcome import RunOutcome, WorkloadOutcome

__all__ = [
    "RUN_RECORD_NAME",
    "FetchLeft",
    "FileEntry",
    "RecordState",
    "ReportError",
    "RunRecord",
    "WorkloadSummary",
    "read_run_record",
    "run_record",
    "workload_summary",
    "write_run_record",
]

RUN_RECORD_NAME = "run.json"
# "running": written at the start, to be replaced at the end; "finished": the end's.
RecordState = Literal["running", "finished"]


class _Part(BaseModel):
    model_config = ConfigDict(defer_build=DEFER_BUILD, extra="forbid", frozen=True)


class FetchLeft(_Part):
    files: int
    bytes: int
    first: list[str]
    complete: bool  # False: the VM stopped looking (a huge workspace); "at least" files


class FileEntry(_Part):
    path: str
    bytes: int
    sha256: str


class WorkloadSummary(_Part):
    """The user's command and what came of it (also in `tpulab run --json`)."""

    command: list[str]
    env_names: list[str]  # names only: values may be secrets
    exit_status: int | None  # the command's own status; None: killed, or never started
    started: bool
    timed_out: bool
    stopped: str | None  # why tpulab stopped it (an interrupt), if it did
    seconds: float | None
    out: str
    upload_files: int  # the whole workspace on the VM after the sync
    upload_bytes: int
    # What the sync sent to get there (None: no sync happened, or a record written before
    # uploads were incremental, when everything was sent): new or changed files, the
    # files kept from the VM's previous copy, those it dropped, the archive's size.
    upload_sent_files: int | None = None
    upload_sent_bytes: int | None = None
    upload_unchanged: int | None = None
    upload_removed: int | None = None
    upload_wire_bytes: int | None = None
    # Files earlier commands wrote in a session's workspace that its sync kept (None: no
    # sync, or a record written before syncs kept them).
    upload_carried: int | None = None
    # Synced files changed on the VM since their sync that the sync replaced or removed:
    # how many, and where on the VM their copies were set aside (None: none).
    upload_replaced: int | None = None
    upload_replaced_dir: str | None = None
    fetched_files: int | None  # None: nothing was fetched (see fetch_problem)
    fetched_bytes: int | None
    fetch_missing: list[str]  # --fetch patterns that matched nothing
    # Links the fetch left out because they lead out of the workspace or the run
    # directory ("workspace/link -> where it leads"); empty in records before this field.
    fetch_skipped: list[str] = Field(default_factory=list)
    # Files the command wrote in the workspace that no --fetch pattern brought (on a run,
    # deleted with the VM): how many, their bytes, the first few paths. None: nothing
    # fetched, the command never started, or a record written before this field.
    fetch_left: FetchLeft | None = None
    fetch_problem: str | None
    extras_install: str | None
    extras: dict[str, str | None]
    # A slice (more than one worker): each worker's exit status in worker order (None:
    # stopped or never started), and the first whose command failed, which stopped the
    # others. A single host: [its status] and None.
    worker_exits: list[int | None] = Field(default_factory=list)
    failed_worker: int | None = None
    # How often the SSH connection dropped under the command and was opened again to
    # follow it (the command ran on); 0 in records before this field.
    reconnects: int = 0


class RunRecord(Envelope):
    """<out>/run.json (schema_version 1)."""

    command: Literal["run", "exec"] = "run"  # exec: a command on a session's kept node
    # A file without it predates start records: it was written at the end.
    state: RecordState = "finished"
    run_id: str
    started: datetime
    seconds: float
    node_name: str
    project: str
    zone: str
    accelerator_type: str
    emulated: bool
    spot: bool
    receipt_id: str | None
    verdict: Verdict | None
    versions: dict[str, str | None]
    workload: WorkloadSummary
    phase_seconds: dict[str, float]
    # A slice: seconds each worker took in every step run on all of them, in worker order
    # ("bootstrap": [41.2, 38.0, ...]); empty for a single host.
    worker_seconds: dict[str, list[float]] = Field(default_factory=dict)
    upload: list[FileEntry]  # the whole workspace on the VM after the sync
    fetch: list[FileEntry]
    upload_sent: list[FileEntry] | None = None  # what went over the wire (None: see above)
    api_calls: int
    teardown: TeardownStatus
    estimated_cost_usd: float
    price_date: str
    failure: str | None  # what ended the run, when it did not succeed
    # `tpulab exec`: the session whose node ran it (never deleted by the exec, so
    # `teardown` stays "not-created"); `receipt_id` is then the one `up` verified there.
    session: str | None = None


def _entries(manifest: Manifest | None) -> list[FileEntry]:
    if manifest is None:
        return []
    return [FileEntry(path=e.path, bytes=e.bytes, sha256=e.sha256) for e in manifest.entries]


def workload_summary(workload: WorkloadOutcome) -> WorkloadSummary:
    uploaded, fetch = workload.upload, workload.fetch
    upload = uploaded.manifest if uploaded else None
    return WorkloadSummary(
        command=list(workload.command),
        env_names=list(workload.env_names),
        exit_status=workload.exit_status,
        started=workload.started,
        timed_out=workload.timed_out,
        stopped=workload.stopped,
        seconds=workload.seconds,
        out=str(workload.out),
        upload_files=upload.count if upload else 0,
        upload_bytes=upload.total_bytes if upload else 0,
        upload_sent_files=uploaded.sent.count if uploaded else None,
        upload_sent_bytes=uploaded.sent.total_bytes if uploaded else None,
        upload_unchanged=uploaded.unchanged if uploaded else None,
        upload_removed=uploaded.removed if uploaded else None,
        upload_wire_bytes=uploaded.wire_bytes if uploaded else None,
        upload_carried=uploaded.carried if uploaded else None,
        upload_replaced=uploaded.replaced_count if uploaded else None,
        upload_replaced_dir=uploaded.replaced_dir if uploaded else None,
        fetched_files=fetch.count if fetch else None,
        fetched_bytes=fetch.total_bytes if fetch else None,
        fetch_missing=list(fetch.missing) if fetch else [],
        fetch_skipped=list(fetch.skipped) if fetch else [],
        fetch_left=FetchLeft(**fetch.left.to_json_obj()) if fetch and fetch.left else None,
        fetch_problem=workload.fetch_problem,
        extras_install=workload.extras.install if workload.extras else None,
        extras=dict(workload.extras.versions) if workload.extras else {},
        worker_exits=list(workload.worker_exits),
        failed_worker=workload.failed_worker,
        reconnects=workload.reconnects,
    )


ReportError = Callable[["TpuLabError"], ErrorReport]


def _as_reported(error: BaseException) -> TpuLabError:
    """What the CLI reports for `error`: a signal as InterruptedRun, a bug as itself."""
    from tpulab.errors import InterruptedRun, TpuLabError
    from tpulab.run.signals import SignalInterrupt

    if isinstance(error, TpuLabError):
        return error
    if isinstance(error, SignalInterrupt):
        return InterruptedRun(error.signal_name)
    if isinstance(error, KeyboardInterrupt):
        return InterruptedRun("SIGINT")
    return TpuLabError(f"{type(error).__name__}: {error}")  # an internal error (exit 1)


def run_record(
    outcome: RunOutcome, *, state: RecordState = "finished", report_error: ReportError | None = None
) -> RunRecord:
    """The record of a run that had a `-- CMD` (outcome.workload set): at its end, or
    ("running") as far as it got when it starts -- the same fields, most still empty.
    `report_error` (the CLI's, which picks exit statuses) fills `error` for a failure."""
    from tpulab.errors import TpuLabError

    spec = outcome.spec
    workload = outcome.workload
    assert workload is not None
    error = outcome.error
    failure = None
    report = None
    if error is not None:
        failure = error.message if isinstance(error, TpuLabError) else repr(error)
        if report_error is not None:
            report = report_error(_as_reported(error))
    boot = outcome.bootstrap
    return RunRecord(
        error=report,
        command="exec" if outcome.session is not None else "run",
        state=state,
        session=outcome.session,
        ok=state == "finished" and outcome.succeeded and error is None,
        run_id=spec.run_id,
        started=outcome.started,
        seconds=round(outcome.seconds, 3),
        node_name=spec.node_name,
        project=spec.project.value,
        zone=spec.zone.value,
        accelerator_type=spec.accelerator.name,
        emulated=spec.emulated,
        spot=spec.spot,
        receipt_id=outcome.receipt.id if outcome.receipt else outcome.gate_receipt_id,
        # An exec judged nothing itself; its gate is the receipt `up` verified.
        verdict=outcome.verdict
        or (Verdict.VERIFIED if outcome.gate_receipt_id is not None else None),
        versions=dict(boot.versions) if boot else {},
        workload=workload_summary(workload),
        phase_seconds={k: round(v, 3) for k, v in outcome.phase_seconds.items()},
        worker_seconds=dict(outcome.worker_seconds),
        upload=_entries(workload.upload.manifest if workload.upload else None),
        fetch=_entries(workload.fetch or workload.kept),  # what is in `out`
        upload_sent=_entries(workload.upload.sent) if workload.upload else None,
        api_calls=outcome.api_calls,
        teardown=outcome.teardown_status,
        estimated_cost_usd=round(outcome.estimated_cost, 4),
        price_date=PRICE_DATE,
        failure=failure,
    )


def write_run_record(record: RunRecord, out: Path) -> Path:
    """Write `out/run.json` atomically (a reader never sees half a file); its path."""
    out.mkdir(parents=True, exist_ok=True)
    target = out / RUN_RECORD_NAME
    handle, temporary = tempfile.mkstemp(prefix=".run-", suffix=".json", dir=out)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(record.to_json() + "\n")
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return target


def write_or_reduce(
    record: RunRecord,
    out: Path,
    *,
    write: Callable[[RunRecord, Path], Path] = write_run_record,
    note: Callable[[str], None],
) -> Path | None:
    """`record` written by `write` into `out`; its path, or None when the disk refused.
    A refusal is a `note`, never a reason to misreport the run. The file lists (every
    name the upload and the fetch saw) are what a record can fail on: without them
    (their counts stay in `workload`) it still says truthfully how the run ended,
    rather than leaving the start's "running"."""
    try:
        return write(record, out)
    except Exception as error:  # a disk's refusal, or a value the record cannot hold
        note(f"could not write run.json: {type(error).__name__}: {error}")
        if isinstance(error, OSError):
            return None  # a disk that will refuse the reduced record too
    reduced = record.model_copy(update={"upload": [], "fetch": [], "upload_sent": None})
    try:
        path = write(reduced, out)
    except Exception as again:
        note(f"could not write run.json without its file lists: {again}")
        return None
    note("run.json was written without its file lists")
    return path


def read_run_record(path: Path) -> RunRecord:
    """Parse a run.json (strict: what parses is exactly the contract). Bytes, so that a
    file that is not UTF-8 is a ValidationError like any other damage (read_text's
    UnicodeDecodeError escaped `runs list` and hid every record)."""
    return RunRecord.model_validate_json(path.read_bytes())
