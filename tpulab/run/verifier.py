"""The verifier's phases: validate the input, connect (and arm the watchdog's lease),
bootstrap JAX, stage the payload, execute it, collect its receipt, verify it.

Each is a function of the run's context (tpulab.run.context) and returns the line the
progress display shows. Nothing here deletes anything: every failure goes back to the
driver, whose teardown runs whatever happened (tpulab.run.ending).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from tpulab import paths
from tpulab.errors import ConfigError, ConnectError, ReceiptStoreError, RemoteError
from tpulab.remote import bootstrap as boot
from tpulab.run.dropped import again_after_a_drop, again_on_every_worker, stop_dropped_payload
from tpulab.run.lease import LeaseRenewer, read_state
from tpulab.run.outcome import Judged
from tpulab.run.workers import FanOut, Worker
from tpulab.run.workload import WorkloadRunner

if TYPE_CHECKING:
    from tpulab.evidence.judge import Judgement
    from tpulab.evidence.receipt import Expectation
    from tpulab.remote.payload import SliceRole
    from tpulab.run.context import RunContext

__all__ = [
    "arm_lease",
    "bootstrap",
    "collect",
    "execute",
    "open_session",
    "open_ssh",
    "stage",
    "validate",
    "verify",
]

# How much of the payload's output a failure report quotes.
_OUTPUT_LINES = 400
# How long a slice's payload waits for every worker to join (and bounds its psum and
# shutdown by): JAX's import and the TPU's start on each worker, which begin within the
# fan-out's second; on a loaded 2-core machine emulating 4 workers, imports differed by
# 15 s (tests/test_slice_receipt.py measured it).
SLICE_INIT_SECONDS = 180


def validate(ctx: RunContext) -> str:
    """Read the payload, probe that its receipt can be kept, make the run's nonce and SSH
    key, check the workload's input. Sends nothing anywhere."""
    from tpulab.remote.keys import RunKey
    from tpulab.remote.payload import check_nonce

    spec = ctx.spec
    try:
        source = spec.payload or paths.payload_path()
        ctx.payload_bytes = source.read_bytes()
    except OSError as error:
        raise ConfigError(
            f"Cannot read the payload: {error}",
            hint="Reinstall tpulab (the verifier ships inside it), or pass a readable file.",
        ) from None
    ctx.receipt_store().check_writable()  # a receipt that cannot be kept = a wasted VM
    ctx.nonce = check_nonce(ctx.new_nonce())
    ctx.key = ctx.new_key() if ctx.new_key is not None else RunKey()
    detail = f"{spec.accelerator.name} in {spec.zone.value}, payload {source.name}"
    if spec.workload is not None:
        detail += "; " + validate_workload(ctx)
    return detail


def validate_workload(ctx: RunContext) -> str:
    """The `-- CMD`'s runner and its checks (the upload's selection and caps)."""
    assert ctx.spec.workload is not None
    ctx.workload = WorkloadRunner(ctx, ctx.spec.workload)
    return ctx.workload.validate()


def open_ssh(ctx: RunContext) -> str:
    """Open SSH with the run's key against each worker's pinned host key (waits for
    sshd); a slice opens its workers' sessions at once."""
    assert ctx.workers
    key = ctx.key
    assert key is not None

    def connect(worker: Worker) -> str:
        session = ctx.connect_ssh(worker.target, key)
        worker.session = session
        # Connections open lazily; opening here makes this phase own the waiting for sshd.
        session.open()
        target = worker.target
        return f"{target.user}@{target.host}:{target.port}"

    done = ctx.on_workers(connect, "connect")
    return done.results[0] if len(done.results) == 1 else done.describe()


def open_session(ctx: RunContext) -> str:
    """The CONNECT phase of a run: SSH, then the watchdog's lease."""
    return f"{open_ssh(ctx)}; {arm_lease(ctx)}"


def arm_lease(ctx: RunContext) -> str:
    """First lease renewal on every worker (ends its watchdog's boot grace: each worker
    runs the startup-script, so each has a watchdog whose lease must be kept), the
    renewer threads, and the watchdog's state as worker 0 published it. Never fails the
    run."""
    watchdog = ctx.watchdog
    if watchdog is None:
        return "no watchdog (--no-watchdog)"

    def renew(worker: Worker) -> None:
        assert worker.session is not None
        note: Callable[[str], None] = ctx.observer.note
        if len(ctx.workers) > 1:  # a failed renewal names the worker whose lease it missed
            note = _worker_note(ctx, worker.index)
        worker.renewer = LeaseRenewer(
            worker.session,
            watchdog,
            note=note,
            background=ctx.renew_in_background,
            clock=ctx.clock,
        )
        worker.renewer.start()

    ctx.on_workers(renew, "lease")
    state = ctx.watchdog_state = read_state(
        ctx.api, ctx.spec.zone.value, ctx.spec.node_name, clock=ctx.clock, sleep=ctx.sleep
    )
    if not state.armed:
        ctx.observer.note(f"watchdog not armed: {state.reason}")
        fix = state.fix(ctx.spec.service_account)
        if fix:
            ctx.observer.note(fix)
    return f"watchdog {state.describe()}; lease {watchdog.lease_seconds:g}s"


def _worker_note(ctx: RunContext, index: int) -> Callable[[str], None]:
    return lambda message: ctx.observer.note(f"worker {index}: {message}")


def bootstrap(ctx: RunContext) -> str:
    """Ensure ~/jax-tpu-lab/.venv holds JAX for the platform on every worker, all at once
    (see bootstrap.py: idempotent per worker). Worker 0's output is shown."""
    spec = ctx.spec

    def install(worker: Worker) -> boot.BootstrapResult:
        assert worker.session is not None
        first = worker.index == 0
        return boot.bootstrap(
            worker.session,
            platform=spec.platform,
            installer=ctx.installer,
            python=spec.python,
            jax_version=spec.jax_version,
            timeout=spec.timeouts.bootstrap,
            on_line=ctx.on_line if first else None,
            note=ctx.observer.note if first else _quiet,
            clock=ctx.clock,
        )

    def again(worker: Worker) -> boot.BootstrapResult:
        # Each step finds what an earlier one made (uv locks the venv it installs into).
        return again_after_a_drop(ctx, worker, install, "bootstrap", "bootstrapping again")

    done = ctx.on_workers(again, "bootstrap")
    result = ctx.bootstrapped = done.results[0]
    jax = result.versions.get("jax") or "?"
    python = result.versions.get("python") or "?"
    detail = f"{result.venv_path}; install {result.install}; python {python}, jax {jax}"
    return _with_workers(detail, done)


def stage(ctx: RunContext) -> str:
    """Upload the payload to every worker, check its sha256, remove any receipt a past
    run left."""

    def put(worker: Worker) -> str:
        assert worker.session is not None
        local = ctx.stage_file(ctx.payload_bytes, boot.STAGED_PAYLOAD, "payload", worker.session)
        worker.session.run(["rm", "-f", boot.RECEIPT_PATH], timeout=60, check=True)
        return local

    done = ctx.on_workers(
        lambda worker: again_after_a_drop(ctx, worker, put, "staging", "staging again"), "stage"
    )
    return _with_workers(f"{len(ctx.payload_bytes)} bytes, sha256 {done.results[0][:12]}", done)


def execute(ctx: RunContext) -> str:
    """Run the payload with JAX_PLATFORMS set, our nonce and the payload timeout; on a
    slice, on every worker at once (its JAX joins the others through
    jax.distributed.initialize), worker 0's output shown.

    A non-zero exit is not raised here: the payload writes a receipt naming its error,
    which `collect` and `verify` bring back and keep first.
    """
    from tpulab.remote.payload import payload_command, payload_env

    spec = ctx.spec
    env = payload_env(spec.platform, spec.accelerator.devices_per_host)

    def run(worker: Worker) -> int:
        assert worker.session is not None
        argv = payload_command(
            boot.VENV_PYTHON,
            boot.STAGED_PAYLOAD,
            platform=spec.platform,
            nonce=ctx.nonce,
            out=boot.RECEIPT_PATH,
            emulated=spec.emulated,
            slice_role=_slice_role(ctx, worker),
        )
        kept = worker.payload_output
        kept.clear()  # run again after a drop: its own output only
        shown = ctx.on_line if worker.index == 0 else None

        def on_line(stream: str, line: str) -> None:
            if len(kept) < _OUTPUT_LINES:
                kept.append(line)
            if shown is not None:
                shown(stream, line)

        result = worker.session.run(argv, env=env, timeout=spec.timeouts.payload, on_line=on_line)
        worker.payload_exit = result.exit_status
        if not kept:
            both = result.stdout + "\n" + result.stderr
            kept.extend(both.splitlines()[-_OUTPUT_LINES:])
        return result.exit_status

    def again(worker: Worker) -> int:
        stop = "stopping the run the drop left on the VM and running it again"
        before = partial(stop_dropped_payload, ctx)
        return again_after_a_drop(ctx, worker, run, "verifier's run", stop, before=before)

    if len(ctx.workers) > 1:  # one program: every worker's run is made again together
        done = again_on_every_worker(ctx, run, "verifier's run", "execute")
    else:
        done = ctx.on_workers(again, "execute")
    ctx.payload_exit = _worst(done.results)
    return _with_workers(f"exit {ctx.payload_exit}", done)


def collect(ctx: RunContext) -> str:
    """Fetch every worker's receipt file (sha256-checked by the transfer), bounded in
    size. A single host without one fails here; a slice's missing receipt is judged
    (and named) by `verify` with the others."""
    from tpulab.evidence.judge import payload_failure
    from tpulab.evidence.receipt import MAX_RECEIPT_BYTES

    slice_run = len(ctx.workers) > 1

    def read(worker: Worker) -> bytes:
        assert worker.session is not None
        return worker.session.read(boot.RECEIPT_PATH, max_bytes=MAX_RECEIPT_BYTES)

    def fetch(worker: Worker) -> int:
        # Into memory, and from there to the receipt store (`verify`): nothing on this
        # machine's disk can fail the download and read as the VM's fault.
        try:
            worker.raw_receipt = again_after_a_drop(
                ctx, worker, read, "receipt's fetch", "fetching it again"
            )
        except ConnectError:
            raise  # the link, not the payload: no receipt judged missing
        except RemoteError as error:
            if slice_run:
                worker.payload_output.append(f"fetching {boot.RECEIPT_PATH}: {error.message}")
                return 0
            raise payload_failure(
                "wrote no receipt",
                f"fetching {boot.RECEIPT_PATH} failed: {error.message}",
                exit_status=worker.payload_exit,
                output=worker.payload_output,
                where="vm",
            ) from None
        return len(worker.raw_receipt)

    done = ctx.on_workers(fetch, "collect")
    if not slice_run:
        return f"{done.results[0]} bytes"
    got = sum(1 for worker in ctx.workers if worker.raw_receipt is not None)
    return f"{got}/{len(ctx.workers)} receipts, {sum(done.results)} bytes"


def _quiet(_message: str) -> None:
    """A non-zero worker's notes: worker 0's say the same about the same image."""


def _with_workers(detail: str, done: FanOut[Any]) -> str:
    said = done.describe()
    return f"{detail}; {said}" if said else detail


def _slice_role(ctx: RunContext, worker: Worker) -> SliceRole | None:
    """A slice worker's part in the payload's jax.distributed group (None: one host).
    The join is bounded (SLICE_INIT_SECONDS, within the payload's own limit), so a
    missing or late worker fails the verifier with its name, not after JAX's 5 min."""
    from tpulab.remote.payload import SliceRole

    hosts = ctx.spec.accelerator.hosts
    if hosts == 1:
        return None
    assert ctx.coordinator is not None, "pin_host_key sets the coordinator with the workers"
    init_timeout = int(min(SLICE_INIT_SECONDS, ctx.spec.timeouts.payload))
    return SliceRole(hosts, worker.index, ctx.coordinator, max(init_timeout, 1))


def _worst(statuses: list[int]) -> int:
    """A slice's payload status: the first non-zero one (0 only if every worker's was)."""
    return next((status for status in statuses if status != 0), 0)


def verify(ctx: RunContext) -> str:
    """Judge the receipt against the catalog and our nonce; keep it before teardown.

    The receipt is kept whatever the verdict (it is the evidence of a failure too).
    """
    from tpulab.evidence.judge import failure_of, judge
    from tpulab.evidence.receipt import expectation_for

    spec = ctx.spec
    worker = ctx.workers[0]
    raw = worker.raw_receipt or b""
    expectation = expectation_for(spec.accelerator.name, emulated=spec.emulated, nonce=ctx.nonce)
    if len(ctx.workers) > 1:
        return _verify_slice(ctx, expectation)
    judgement = (ctx.judge or judge)(raw, expectation)
    _keep(ctx, raw, judgement, expectation)
    problem = failure_of(
        judgement,
        expectation,
        payload_exit=ctx.payload_exit,
        output=worker.payload_output,
        where="vm",
    )
    if problem is not None:
        raise problem
    return f"VERIFIED: {expectation.describe()}"


def _verify_slice(ctx: RunContext, expectation: Expectation) -> str:
    """Every worker's receipt and the slice they make (tpulab.evidence.slice_judge);
    each receipt there is kept (with its own judgement, and its own payload status),
    worker 0's as the run's, with the slice's judgement. (The `judge` seam is a single
    host's: a slice is judged by judge_slice only.)"""
    from tpulab.evidence.slice_judge import judge_slice, slice_failure_of

    workers = ctx.workers
    judged = judge_slice([w.raw_receipt for w in workers], expectation)
    for worker, alone in zip(workers[1:], judged.workers[1:], strict=True):
        if worker.raw_receipt is not None and alone is not None:
            _keep(ctx, worker.raw_receipt, alone, expectation, worker=worker)
    first = workers[0].raw_receipt
    if first is not None:
        _keep(ctx, first, judged.as_judgement(), expectation, worker=workers[0])
    else:
        ctx.judged = Judged(judged.as_judgement())
    problem = slice_failure_of(
        judged,
        payload_exits=[w.payload_exit for w in workers],
        outputs=[w.payload_output for w in workers],
        where="vm",
    )
    if problem is not None:
        raise problem
    return judged.describe()


def _keep(
    ctx: RunContext,
    raw: bytes,
    judgement: Judgement,
    expectation: Expectation,
    *,
    worker: Worker | None = None,
) -> None:
    """Keep `raw` with its judgement; the run's own receipt (one host's, or a slice's
    worker 0's) becomes the outcome's. A slice's other workers' are kept beside it,
    named by worker, each with its own payload status."""
    from tpulab.evidence.store import Provenance, Source

    spec = ctx.spec
    provenance = Provenance(
        source=Source.RUN,
        run_id=spec.run_id,
        node_name=spec.node_name,
        project=spec.project.value,
        zone=spec.zone.value,
        accelerator_type=spec.accelerator.name,
        emulated=spec.emulated,
        payload_exit_status=ctx.payload_exit if worker is None else worker.payload_exit,
        worker=worker.index if worker is not None else None,
    )
    try:
        kept = ctx.receipt_store().keep(raw, expectation, judgement, provenance)
    except ReceiptStoreError:
        if worker is None or worker.index == 0:
            # Judged, though not kept (a disk that filled up since the store's probe):
            # the summary shows the verdict, not "NOT COLLECTED", beside the error.
            ctx.judged = Judged(judgement)
        raise
    if worker is not None and worker.index > 0:
        return
    ctx.judged = Judged(judgement, kept)
    ctx.milestone("receipt_saved")
