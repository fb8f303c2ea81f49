"""The verifier's phases: validate the input, connect (and arm the watchdog's lease),
bootstrap JAX, stage the payload, execute it, collect its receipt, verify it.

Each is a function of the run's context (tpulab.run.context) and returns the line the
progress display shows. Nothing here deletes anything: every failure goes back to the
driver, whose teardown runs whatever happened (tpulab.run.ending).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from tpulab import paths
from tpulab.errors import ConfigError, RemoteError
from tpulab.remote import bootstrap as boot
from tpulab.run.lease import LeaseRenewer, read_state
from tpulab.run.workload import WorkloadRunner

if TYPE_CHECKING:
    from tpulab.evidence.judge import Judgement
    from tpulab.evidence.receipt import Expectation
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
    ctx.outcome.workload = ctx.workload.outcome
    return ctx.workload.validate()


def open_ssh(ctx: RunContext) -> str:
    """Open SSH with the run's key against the pinned host key (waits for sshd)."""
    assert ctx.target is not None
    assert ctx.key is not None
    ctx.session = ctx.connect_ssh(ctx.target, ctx.key)
    # Connections open lazily; opening here makes this phase own the waiting for sshd.
    ctx.session.open()
    return f"{ctx.target.user}@{ctx.target.host}:{ctx.target.port}"


def open_session(ctx: RunContext) -> str:
    """The CONNECT phase of a run: SSH, then the watchdog's lease."""
    return f"{open_ssh(ctx)}; {arm_lease(ctx)}"


def arm_lease(ctx: RunContext) -> str:
    """First lease renewal (ends the watchdog's boot grace), the renewer thread, and the
    watchdog's state as the VM published it. Never fails the run."""
    if ctx.watchdog is None:
        return "no watchdog (--no-watchdog)"
    assert ctx.session is not None
    ctx.renewer = LeaseRenewer(
        ctx.session,
        ctx.watchdog,
        note=ctx.observer.note,
        background=ctx.renew_in_background,
        clock=ctx.clock,
    )
    ctx.renewer.start()
    state = ctx.outcome.watchdog = read_state(
        ctx.api, ctx.spec.zone.value, ctx.spec.node_name, clock=ctx.clock, sleep=ctx.sleep
    )
    if not state.armed:
        ctx.observer.note(f"watchdog not armed: {state.reason}")
        fix = state.fix(ctx.spec.service_account)
        if fix:
            ctx.observer.note(fix)
    return f"watchdog {state.describe()}; lease {ctx.watchdog.lease_seconds:g}s"


def bootstrap(ctx: RunContext) -> str:
    """Ensure ~/jax-tpu-lab/.venv holds JAX for the platform (see bootstrap.py)."""
    assert ctx.session is not None
    spec = ctx.spec
    result = boot.bootstrap(
        ctx.session,
        platform=spec.platform,
        installer=ctx.installer,
        python=spec.python,
        jax_version=spec.jax_version,
        timeout=spec.timeouts.bootstrap,
        on_line=ctx.on_line,
        note=ctx.observer.note,
        clock=ctx.clock,
    )
    ctx.outcome.bootstrap = result
    jax = result.versions.get("jax") or "?"
    python = result.versions.get("python") or "?"
    return f"{result.venv_path}; install {result.install}; python {python}, jax {jax}"


def stage(ctx: RunContext) -> str:
    """Upload the payload, check its sha256, remove any receipt a past run left."""
    assert ctx.session is not None
    local = ctx.stage_file(ctx.payload_bytes, boot.STAGED_PAYLOAD, "payload")
    ctx.session.run(["rm", "-f", boot.RECEIPT_PATH], timeout=60, check=True)
    return f"{len(ctx.payload_bytes)} bytes, sha256 {local[:12]}"


def execute(ctx: RunContext) -> str:
    """Run the payload with JAX_PLATFORMS set, our nonce and the payload timeout.

    A non-zero exit is not raised here: the payload writes a receipt naming its error,
    which `collect` and `verify` bring back and keep first.
    """
    from tpulab.remote.payload import payload_command, payload_env

    assert ctx.session is not None
    spec = ctx.spec
    argv = payload_command(
        boot.VENV_PYTHON,
        boot.STAGED_PAYLOAD,
        platform=spec.platform,
        nonce=ctx.nonce,
        out=boot.RECEIPT_PATH,
        emulated=spec.emulated,
    )
    env = payload_env(spec.platform, spec.accelerator.devices_per_host)

    def on_line(stream: str, line: str) -> None:
        if len(ctx.payload_output) < _OUTPUT_LINES:
            ctx.payload_output.append(line)
        ctx.on_line(stream, line)

    result = ctx.session.run(argv, env=env, timeout=spec.timeouts.payload, on_line=on_line)
    ctx.outcome.payload_exit = result.exit_status
    if not ctx.payload_output:
        both = result.stdout + "\n" + result.stderr
        ctx.payload_output = both.splitlines()[-_OUTPUT_LINES:]
    return f"exit {result.exit_status}"


def collect(ctx: RunContext) -> str:
    """Fetch the receipt file (sha256-checked by the transfer), bounded in size."""
    from tpulab.evidence.judge import payload_failure
    from tpulab.evidence.receipt import MAX_RECEIPT_BYTES

    assert ctx.session is not None
    # The bytes go to memory and then to the receipt store; the download is scratch.
    with tempfile.TemporaryDirectory(prefix="tpulab-receipt-") as scratch:
        local = Path(scratch) / "receipt.json"
        try:
            ctx.session.get(boot.RECEIPT_PATH, local, max_bytes=MAX_RECEIPT_BYTES)
        except RemoteError as error:
            raise payload_failure(
                "wrote no receipt",
                f"fetching {boot.RECEIPT_PATH} failed: {error.message}",
                exit_status=ctx.outcome.payload_exit,
                output=ctx.payload_output,
                where="vm",
            ) from None
        ctx.raw_receipt = local.read_bytes()
    return f"{len(ctx.raw_receipt)} bytes"


def verify(ctx: RunContext) -> str:
    """Judge the receipt against the catalog and our nonce; keep it before teardown.

    The receipt is kept whatever the verdict (it is the evidence of a failure too).
    """
    from tpulab.evidence.judge import failure_of, judge
    from tpulab.evidence.receipt import expectation_for

    spec = ctx.spec
    expectation = expectation_for(spec.accelerator.name, emulated=spec.emulated, nonce=ctx.nonce)
    judgement = (ctx.judge or judge)(ctx.raw_receipt, expectation)
    _keep(ctx, judgement, expectation)
    problem = failure_of(
        judgement,
        expectation,
        payload_exit=ctx.outcome.payload_exit,
        output=ctx.payload_output,
        where="vm",
    )
    if problem is not None:
        raise problem
    return f"VERIFIED: {expectation.describe()}"


def _keep(ctx: RunContext, judgement: Judgement, expectation: Expectation) -> None:
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
        payload_exit_status=ctx.outcome.payload_exit,
    )
    ctx.outcome.judgement = judgement
    ctx.outcome.receipt = ctx.receipt_store().keep(
        ctx.raw_receipt, expectation, judgement, provenance
    )
    ctx.milestone("receipt_saved")
