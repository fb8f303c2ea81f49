"""`tpulab exec [S] -- CMD`: the workload of `run` on a session's kept, verified VM.

The Lifecycle attached to the session's node (tpulab.run.attach): connect with the
session's key and pinned host key, renew its idle lease (at once, then in the background
while the command runs), sync, install, run, fetch -- and never delete the node, whatever
happens. Its flags are `run`'s workload flags, validated by the same config (and the
workspace's [tool.tpulab]); every check happens before anything is sent.
"""

import time
from typing import TYPE_CHECKING, Annotated

import typer

from tpulab import errors as E
from tpulab.cli import _workload_options as wo
from tpulab.cli._console import console, print_lines, print_stderr
from tpulab.cli._exit import error_report, print_envelope, report_error
from tpulab.cli.session import AFTER_DASHES
from tpulab.exits import EXIT_INTERRUPTED

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from tpulab.cleanup.sessions import SessionFiles, SessionStore
    from tpulab.config import RunSpec, TimeoutFlags, WorkloadFlags
    from tpulab.config.commands import Installer, RunInputs
    from tpulab.run.attach import AttachedRun
    from tpulab.run.outcome import RunOutcome
    from tpulab.run.record import RunRecord
    from tpulab.run.session_state import SessionState
    from tpulab.run.summary import Line

__all__ = ["exec_command"]


def exec_command(
    ctx: typer.Context,
    name: Annotated[
        str | None,
        typer.Argument(metavar="S", help="The session (omit if only one is up)."),
    ] = None,
    workdir: wo.Workdir = None,
    with_packages: wo.WithPackages = None,
    requirements: wo.Requirements = None,
    fetch: wo.Fetch = None,
    exclude: wo.Exclude = None,
    out: wo.Out = None,
    env: wo.Env = None,
    timeout: wo.Timeout = None,
    max_upload: wo.MaxUpload = None,
    max_fetch: wo.MaxFetch = None,
    allow_secret: wo.AllowSecret = None,
    quiet: wo.Quiet = False,
    all_output: wo.AllOutput = False,
    installer: Annotated[
        str, typer.Option("--installer", help="Installer for --with: uv (default) or pip.")
    ] = "uv",
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print every request and command; contact nothing.")
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the exec's record (run.json) as JSON.")
    ] = False,
    verbose: Annotated[
        bool, typer.Option("-v", "--verbose", help="Show remote output live.")
    ] = False,
) -> None:
    """Run `-- CMD` on a session's VM (from `tpulab up`): sync, install, run, fetch.

    The same workload as `tpulab run -- CMD`, without the create, bootstrap and verifier
    (the session's node passed them at `up`) and without the delete: the VM stays up
    for the next exec until `tpulab down`, --ttl or --idle. Each exec renews the idle
    lease, and its artifacts land in their own --out:

    tpulab exec lesson-1 --fetch ckpt/ -- python train.py --steps 5

    Ctrl-C stops the command on the VM and fetches what it wrote (a second Ctrl-C skips
    the fetch); the session stays up. Exit 0 when the command exited 0 and its artifacts
    came back; 9 when it failed (its own status is in the summary).
    """
    from tpulab.config import WorkloadFlags

    command = tuple(ctx.meta.get(AFTER_DASHES, ()))
    flags = WorkloadFlags(
        command=command,
        workdir=workdir,
        out=out,
        env=tuple(env or ()),
        with_packages=tuple(with_packages or ()),
        requirements=requirements,
        fetch=tuple(fetch or ()),
        exclude=tuple(exclude or ()),
        allow_secrets=tuple(allow_secret or ()),
        max_upload=max_upload,
        max_fetch=max_fetch,
        timeout=timeout,
        quiet=quiet,
        all_output=all_output,
    )
    try:
        _exec(name, flags, installer, dry_run=dry_run, as_json=as_json, verbose=verbose)
    except E.TpuLabError as error:
        if as_json:
            from tpulab.envelope import ErrorEnvelope

            print_envelope(ErrorEnvelope(command="exec", error=error_report(error)), error)
        report_error(error)


def _exec(
    name: str | None,
    flags: "WorkloadFlags",
    installer: str,
    *,
    dry_run: bool,
    as_json: bool,
    verbose: bool,
) -> None:
    from tpulab.cli._session_reach import session_store

    with session_store() as store:  # warns of damaged state files before the exec
        files = store.resolve(name)
    inputs = _exec_inputs(files, flags, installer)
    if dry_run:
        _dry_run(inputs.spec, files, inputs.installer, as_json=as_json)
        return
    _run(store, files, inputs.spec, inputs.installer, as_json=as_json, verbose=verbose)


def _exec_inputs(files: "SessionFiles", flags: "WorkloadFlags", installer: str) -> "RunInputs":
    """The exec as a RunSpec on the session's node (a fresh id names its --out and
    TPULAB_RUN_ID); every check of input happens here, before anything is sent."""
    from tpulab.config import CapacityFlags, PythonFlags, TargetFlags, run_inputs

    state = files.state
    if not flags.command:
        raise E.ConfigError(
            "tpulab exec needs a command after --.",
            hint=f"e.g. `tpulab exec {state.name} -- python train.py --steps 5`.",
        )
    if time.time() >= state.deadline_at:
        raise E.ConfigError(
            f"Session {state.name} has expired: its --ttl deadline passed, so its node has "
            "deleted itself (or is about to).",
            hint=f"`tpulab down {state.name}` confirms it gone and removes its key; "
            "then start a new one with `tpulab up`.",
        )
    if not files.key_path.is_file():
        raise E.ConfigError(
            f"Session {state.name} has no key file at {files.key_path}.",
            hint=f"End it with `tpulab down {state.name}` and start a new one.",
        )
    return run_inputs(
        target=TargetFlags(
            accelerator=state.accelerator_type,
            api_endpoint=state.api_endpoint,
            project=state.project,
            zone=state.zone,
            name=state.node_name,
            # The session's provider, never the type's default or a project file's: the
            # exec asks about the node through the API it lives behind.
            provider=state.provider,
        ),
        capacity=CapacityFlags(spot=state.spot),
        timeouts=exec_timeouts(),
        python=PythonFlags(installer=installer),
        workload=flags,
        adc_project=None,  # the session names its project
    )


def exec_timeouts() -> "TimeoutFlags":
    """`run`'s timeouts but one: the node has been up since `up`, so a minute for sshd to
    answer, not a boot's three."""
    from tpulab.config import TimeoutFlags

    return TimeoutFlags(boot=60.0)


def _dry_run(
    spec: "RunSpec", files: "SessionFiles", installer: "Installer", *, as_json: bool
) -> None:
    from rich.markup import escape

    from tpulab.cli.run import print_plan_steps
    from tpulab.run.attach import Attachment
    from tpulab.run.attach_plan import build_attached_plan
    from tpulab.run.plan import plan_envelope
    from tpulab.run.recording import PlaceholderKey

    attachment = Attachment.of(files.state, PlaceholderKey())
    steps = build_attached_plan(spec, attachment, installer=installer)
    plan = plan_envelope(spec, steps, installer=installer).model_copy(update={"command": "exec"})
    if as_json:
        typer.echo(plan.to_json())
        return
    state = files.state
    console().print(
        f"[bold]Plan for exec {plan.run_id}[/] on session {escape(state.name)}: node "
        f"{plan.node_name} ({plan.accelerator_type}) in {plan.zone}, verified by receipt "
        f"{escape(state.receipt_id or 'not recorded')} at `tpulab up`. Recorded from the "
        "exec itself over recording seams: nothing is contacted. No create, bootstrap, "
        "verifier or delete: the node stays the session's."
    )
    print_plan_steps(plan)


def _run(
    store: "SessionStore",
    files: "SessionFiles",
    spec: "RunSpec",
    installer: "Installer",
    *,
    as_json: bool,
    verbose: bool,
) -> None:
    from tpulab.cli._run_display import RunDisplay
    from tpulab.cli._session_reach import session_api
    from tpulab.remote.keys import RunKey
    from tpulab.run.attach import AttachedRun, Attachment
    from tpulab.run.progress import FanOut, Recorder
    from tpulab.run.signals import shield, signals_to_teardown, skippable

    state = files.state
    try:
        key = RunKey.from_openssh_private(files.key_path.read_bytes())
    except (OSError, ValueError) as error:
        raise E.ConfigError(
            f"Cannot read session {state.name}'s key {files.key_path}: {error}",
            hint=f"End it with `tpulab down {state.name}` and start a new one.",
        ) from None
    assert spec.workload is not None
    display = RunDisplay(verbose=verbose, quiet=as_json, command_quiet=spec.workload.quiet)
    life = AttachedRun(
        spec,
        attachment=Attachment.of(state, key),
        api=session_api(state),
        observer=FanOut([Recorder(), display]),
        shield=shield,
        skippable=skippable,
        installer=installer,
        write_record=_record_writer(state.run_id),
        report_error=error_report,
    )
    failure: E.TpuLabError | None = None
    try:
        with signals_to_teardown(
            display.alert, force_exit_status=EXIT_INTERRUPTED, keeps_node=True
        ):
            life.run()
    except E.NodeVanishedError as gone:
        failure = _conclude_gone(store, files, gone, renewed_at=life.last_renewal_at())
    except E.TpuLabError as error:
        failure = error
    finally:
        display.stop()
        _save_session(store, state, life)
    _report(life.outcome, failure, as_json=as_json)


def _save_session(store: "SessionStore", state: "SessionState", life: "AttachedRun") -> None:
    """What the exec learnt of its session: the last lease renewal, and its workers'
    addresses if the API said they moved (Attachment.follow_address)."""
    updated = state
    if len(life.workers) == state.worker_count:  # every worker's address, worker 0 first
        updated = state.moved_to([(w.target.host, w.target.port) for w in life.workers])
    renewed = life.last_renewal_at()
    if renewed is not None:
        updated = updated.renewed(renewed)
    if updated != state and store.exists(state.name):
        store.save(updated)


def _record_writer(session_run_id: str) -> "Callable[[RunRecord, Path], Path]":
    """run.json through run.record's one writer; the start record is also pointed at from
    the journal then, so that an exec killed mid-command is listed by `tpulab runs` (an
    exec opens no journal row, whose start points a run's record)."""
    from tpulab.run.record import write_run_record

    def write(record: "RunRecord", out: "Path") -> "Path":
        path = write_run_record(record, out)
        if record.state == "running":
            _remember_record(record.run_id, path, session_run_id)
        return path

    return write


def _remember_record(run_id: str, path: "Path", session_run_id: str) -> None:
    """Let `tpulab runs` find the exec's run.json, as it finds a run's."""
    from tpulab.cleanup.journal import Journal

    try:
        Journal().set_run_record(run_id, path, session_run_id=session_run_id)
    except E.JournalError as error:
        print_stderr(f"[yellow]warning:[/] the journal could not point at run.json: {error}")


def _conclude_gone(
    store: "SessionStore",
    files: "SessionFiles",
    gone: E.NodeVanishedError,
    *,
    renewed_at: float | None,
) -> E.NodeVanishedError:
    """The session's node deleted itself under the exec: the shared cleanup (key, state,
    journal row), then the lifecycle's explanation, which knows the phase."""
    from tpulab.cleanup.sessions import conclude_gone, why_gone

    state = files.state
    if renewed_at is not None:
        # This exec kept the lease alive until the end: judge the idle expiry from that,
        # not from the renewal on disk before it.
        state = state.renewed(renewed_at)
    done = conclude_gone(
        store, state, why_gone(state, now=time.time()), seen_by="tpulab exec (GetNode)"
    )
    for warning in done.warnings:
        print_stderr(f"[yellow]warning:[/] the journal could not record it: {warning}")
    if done.vanish.cause != "ttl":
        # The lease lapsed before this exec (or someone deleted the node): the
        # session's own times say which, better than the exec's phase can.
        return done.error()
    return E.NodeVanishedError(f"{gone.message} Its key and state are removed.", hint=gone.hint)


def _report(outcome: "RunOutcome", failure: E.TpuLabError | None, *, as_json: bool) -> None:
    from tpulab.run.record import run_record

    if as_json:
        if outcome.workload is None:
            if failure is not None:
                raise failure
            return
        record = run_record(outcome)
        if failure is not None:
            record = record.model_copy(update={"error": error_report(failure)})
        print_envelope(record, failure)
        return
    if outcome.workload is not None:
        # A node that vanished under the exec was concluded gone (key and state removed):
        # the summary must not call the session up right above the error saying so.
        ended = isinstance(failure, E.NodeVanishedError)
        print_lines(exec_summary_lines(outcome, session_ended=ended))
    if failure is not None:
        raise failure


def exec_summary_lines(outcome: "RunOutcome", *, session_ended: bool = False) -> "list[Line]":
    """The end of an exec: where it ran, each phase's time (no create, bootstrap or
    verifier: the session's node had them), what was uploaded, the command, what came back."""
    from tpulab.run.summary import workload_lines

    spec = outcome.spec
    tag = " EMULATED" if spec.emulated else ""
    receipt = outcome.gate_receipt_id or "not recorded"
    phases = ", ".join(f"{phase} {took:.1f}s" for phase, took in outcome.phase_seconds.items())
    where = f"{spec.node_name} ({spec.accelerator.name}) in {spec.zone.value}"
    lines: list[Line] = [
        [
            ("Exec ", "bold"),
            (spec.run_id, "bold cyan"),
            (tag, "bold magenta"),
            (f" on session {outcome.session}", "bold"),
        ],
        [("  node      ", "dim"), (where, "")],
        [("  gate      ", "dim"), (f"receipt {receipt}, verified at `tpulab up`", "")],
        [
            ("  phases    ", "dim"),
            (phases, ""),
            ("  (no create, bootstrap or verifier: the session's node)", "dim"),
        ],
    ]
    workload = outcome.workload
    if workload is not None:
        lines.append([("  upload    ", "dim"), (_upload_text(outcome), "")])
    lines.extend(workload_lines(outcome))
    if session_ended:
        lines.append([("  session   ", "dim"), ("ended: its node is gone", "bold red")])
        return lines
    ended = f"`tpulab down {outcome.session}` ends it"
    lines.append([("  session   ", "dim"), ("still up", "bold green"), (f" ({ended})", "dim")])
    return lines


def _upload_text(outcome: "RunOutcome") -> str:
    workload = outcome.workload
    assert workload is not None
    upload = workload.upload
    if upload is None:
        return "nothing sent (the exec stopped before the sync)"
    return f"{upload.describe()}; {upload.wire_bytes} bytes on the wire"
