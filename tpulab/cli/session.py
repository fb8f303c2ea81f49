"""`tpulab up` / `ssh` / `down`: keep a verified TPU VM for a session, reach it, end it.

`up` is `run`'s phases driven by KeptRun (tpulab.run.lifecycle, tpulab.run.session): every
failure still goes through the run's teardown; only a verified node is kept, guarded by its watchdog
(hard deadline --ttl, idle lease --idle). `ssh` uses the system OpenSSH client with the
pinned host key and renews the lease first; `down` is the run's delete-and-confirm.
"""

import contextlib
import dataclasses
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Annotated

import typer

from tpulab import errors as E
from tpulab.cli import _run_options as ro
from tpulab.cli._console import print_stderr
from tpulab.cli._exit import guarded, json_or_guarded
from tpulab.cli._panels import PanelledCommand
from tpulab.cli._session_reach import session_store
from tpulab.exits import EXIT_TEARDOWN

if TYPE_CHECKING:
    from tpulab.cleanup.sessions import SessionFiles, SessionStore
    from tpulab.config.commands import Installer
    from tpulab.run.lifecycle import KeptRun
    from tpulab.run.progress import Recorder
    from tpulab.run.session_state import SessionState
    from tpulab.run.teardown import TeardownReport

__all__ = [
    "DashDashCommand",
    "down_command",
    "ssh_command",
    "up_command",
]


def up_command(
    accelerator: Annotated[
        str | None, typer.Option("--accelerator", help="TPU type, e.g. v5litepod-4.")
    ] = None,
    name: Annotated[
        str | None, typer.Option("--name", help="The session's name (default: s-<run id>).")
    ] = None,
    ttl: Annotated[
        str | None,
        typer.Option(
            "--ttl",
            help="Hard deadline: the VM deletes itself after this (default 2h, at most 24h).",
        ),
    ] = None,
    idle: Annotated[
        str | None,
        typer.Option(
            "--idle",
            help="The VM deletes itself this long after the last `tpulab ssh` (default 30m).",
        ),
    ] = None,
    zones: Annotated[
        list[str] | None,
        typer.Option(
            "--zone",
            metavar="ZONE",
            # up keeps one node: it does not fail over (run does), so the first zone is used.
            help="Zone, e.g. us-central1-a (else TPULAB_ZONE, [tool.tpulab], gcloud); `up` "
            "uses the first zone given (no failover).",
        ),
    ] = None,
    project: ro.Project = None,
    spot: Annotated[bool, typer.Option("--spot", help="Use a spot VM.")] = False,
    emulate: Annotated[
        bool, typer.Option("--emulate", help="Refused: see --api-endpoint.")
    ] = False,
    api_endpoint: ro.ApiEndpoint = None,
    boot_timeout: ro.BootTimeout = 180.0,
    bootstrap_timeout: ro.BootstrapTimeout = 1200.0,
    payload_timeout: ro.PayloadTimeout = 600.0,
    teardown_timeout: ro.TeardownTimeout = 600.0,
    python: ro.Python = None,
    jax_version: ro.JaxVersion = None,
    installer: ro.Installer = "uv",
    service_account: ro.ServiceAccount = None,
    network: ro.Network = None,
    subnetwork: ro.Subnetwork = None,
    provider: ro.Provider = None,
    image: ro.Image = None,
    verbose: ro.Verbose = False,
    as_json: Annotated[
        bool,
        typer.Option("--json", help="Print the session as a JSON envelope (progress on stderr)."),
    ] = False,
) -> None:
    """Create a TPU VM, verify JAX on it, and KEEP it for `tpulab ssh`, until `tpulab down`.

    The VM deletes itself at --ttl, or --idle after the last `tpulab ssh`.
    """

    def action() -> None:
        from tpulab.config import groups, run_inputs
        from tpulab.config.sessions import check_session_name, session_name_flag, session_times

        # Every check before any API call: the name and the bound on --ttl first.
        chosen_name = session_name_flag(name)
        times = session_times(ttl, idle)
        if emulate:
            raise E.ConfigError(
                "A session cannot use --emulate: its emulator ends with this process.",
                hint="Serve one with `tpulab emulator serve` and pass its --api-endpoint.",
            )
        inputs = run_inputs(
            target=groups.TargetFlags(
                accelerator=accelerator,
                zones=tuple(zones or ()),
                project=project,
                api_endpoint=api_endpoint,
                network=network,
                subnetwork=subnetwork,
                provider=provider,
                image=image,
                service_account=service_account,
            ),
            capacity=groups.CapacityFlags(spot=spot),
            timeouts=groups.TimeoutFlags(
                payload=payload_timeout,
                teardown=teardown_timeout,
                boot=boot_timeout,
                bootstrap=bootstrap_timeout,
            ),
            python=groups.PythonFlags(python=python, jax_version=jax_version, installer=installer),
            watchdog=times,
            adc_project=_adc_project,
        )
        from tpulab.contract import KIND_SESSION

        session_name = chosen_name or check_session_name(f"s-{inputs.spec.run_id.split('-')[-1]}")
        # Labelled a session: `teardown --verify` elsewhere then knows it is kept on purpose.
        spec = dataclasses.replace(inputs.spec, kind=KIND_SESSION)
        _up(spec, session_name, inputs.installer, verbose=verbose, as_json=as_json)

    json_or_guarded("up", as_json, action)


def _adc_project() -> str | None:
    from tpulab.cli._target import adc_project

    return adc_project()


def _up(
    spec: object, session_name: str, installer: "Installer", *, verbose: bool, as_json: bool
) -> None:
    from tpulab.cleanup.journal import RunJournalAdapter
    from tpulab.cleanup.sessions import SESSION_PHASE, SessionStore
    from tpulab.cli._run_display import RunDisplay
    from tpulab.cli._target import tpu_api
    from tpulab.config import RunSpec
    from tpulab.remote.ssh import RunKey
    from tpulab.run.lifecycle import KeptRun
    from tpulab.run.progress import FanOut, Recorder
    from tpulab.run.session import abandon, bring_up
    from tpulab.run.signals import shield, signals_to_teardown

    assert isinstance(spec, RunSpec)
    store = SessionStore()
    key = RunKey()
    # With --json the envelope alone is on stdout; the progress goes to stderr.
    display = RunDisplay(verbose=verbose, quiet=False, command_quiet=False, stderr=as_json)
    recorder = Recorder()
    journal = RunJournalAdapter()
    from tpulab.app.doctor import preflight_for

    life = KeptRun(
        spec,
        # The provider's API (a TPU node, or a Compute instance with --image), as `run`
        # builds it; the session records the provider so later commands rebuild it.
        api=tpu_api(
            spec.project.value,
            api_endpoint=spec.api_endpoint,
            provider=spec.provider,
            image=spec.image,
        ),
        # The provider's own checks (the Cloud TPU API's, or Compute's), as `run` asks.
        preflight=preflight_for(spec, spec.api_endpoint),
        journal=journal,
        observer=FanOut([recorder, display]),
        shield=shield,
        installer=installer,
        new_key=lambda: key,
    )
    # The key file exists before the node does, so a name in use is refused first.
    store.reserve(session_name, key.openssh_private_bytes())
    try:
        # The save is inside the signal guard with the hand-over: a SIGTERM or Ctrl-C
        # after the node was kept but before session.json records it then raises here,
        # and the node is deleted below, instead of killing `up` with a kept node that no
        # session file names (the default SIGTERM would, once the guard had ended).
        with signals_to_teardown(display.alert, force_exit_status=EXIT_TEARDOWN):
            state = bring_up(life, session_name=session_name)
            store.save(state)
    except BaseException as error:
        display.stop()
        if life.outcome.kept:
            # Handed over but never recorded (e.g. Ctrl-C, or the state could not be
            # written): nobody could `down` it, so it is deleted now, shielded.
            with shield(f"deleting node {spec.node_name}", manual=spec.leaked_node().what_to_do()):
                abandon(life)
        store.remove(session_name)  # the run's teardown already ran: no node, no key
        if as_json and isinstance(error, E.TpuLabError):
            _up_envelope(life, recorder, None, error)
        raise
    display.stop()
    journal.phase_changed(state.run_id, SESSION_PHASE)
    if as_json:
        _up_envelope(life, recorder, store.load(state.name), None)
        return
    left = max(0.0, state.deadline_at - time.time())
    # Under a minute left reads in seconds (a rounded "0 min", or "-0 min", said nothing).
    in_left = f"{left / 60:.0f} min" if left >= 60 else f"{left:.0f} s"
    workers = f", {state.worker_count} workers" if state.worker_count > 1 else ""
    where = "worker 0 at " if state.worker_count > 1 else ""
    typer.echo(
        f"Session {state.name} is up: {state.vm_kind} {state.node_name} ({state.accelerator_type}"
        f"{workers}) in {state.zone}, {where}{state.ssh_user}@{state.ssh_host}:"
        f"{state.ssh_port}. It deletes "
        f"itself in {in_left} (--ttl) or {state.idle_seconds / 60:.1f} min after "
        f"the last `tpulab ssh` (--idle). End it with `tpulab down {state.name}`."
    )


def _up_envelope(
    life: "KeptRun", recorder: "Recorder", files: "SessionFiles | None", error: E.TpuLabError | None
) -> None:
    """`up --json`'s envelope: the session, and the run as `run --json` reports it (on
    failure exactly that run's envelope, with the same error and exit status)."""
    from tpulab.cleanup.report import UpEnvelope, session_report
    from tpulab.cli._exit import error_report, print_envelope
    from tpulab.run.report import run_envelope

    report = error_report(error) if error is not None else None
    run = run_envelope(life.outcome, recorder, error=report)
    if files is not None:
        # Kept on purpose: verified, and not deleted (run's `ok` wants a confirmed delete).
        run = run.model_copy(update={"ok": True})
    session = session_report(files, now=time.time()) if files is not None else None
    print_envelope(UpEnvelope(ok=error is None, session=session, run=run, error=report), error)


def down_command(
    name: Annotated[
        str | None, typer.Argument(help="The session (omit if only one is up).")
    ] = None,
    all_sessions: Annotated[bool, typer.Option("--all", help="End every session.")] = False,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Delete even while an exec runs on the session (it loses its artifacts).",
        ),
    ] = False,
) -> None:
    """Delete a session's VM, confirm it gone by list, and remove its key and state.

    Refused (exit 4, nothing deleted) while an exec holds the session's lock, unless
    --force: `down` takes that lock itself for the delete, so no exec starts meanwhile.
    """

    def action() -> None:
        if all_sessions and name is not None:
            raise E.ConfigError("Pass a session name or --all, not both.")
        with session_store() as store:
            chosen = store.all() if all_sessions else [store.resolve(name)]
            for files in chosen:
                _down(store, files, force=force)

    guarded(action)


def _down(store: "SessionStore", files: "SessionFiles", *, force: bool) -> None:
    from tpulab.cli._session_reach import session_api
    from tpulab.run.lease import node_gone
    from tpulab.run.session import take_down
    from tpulab.run.signals import shield, signals_to_teardown

    state = files.state
    api = session_api(state)
    target = E.target_for(state.api_endpoint)
    node = E.LeakedNode(
        state.project, state.zone, state.node_name, target, state.run_id, provider=state.provider
    )
    # As a run's teardown: a Ctrl-C before the delete ends `down` (nothing deleted); from
    # the delete on, signals are refused and `down` finishes, unless forced (the third
    # quick Ctrl-C prints how to finish by hand). Without the guard a Ctrl-C ended it
    # silently, the delete sent and the session's state left as it was.
    with signals_to_teardown(print_stderr, force_exit_status=EXIT_TEARDOWN):
        try:
            with contextlib.ExitStack() as held:
                # A node still there may have an exec running on it: `down` holds the
                # exec lock for the delete, or refuses (unless --force). A gone node has
                # none.
                if not force and node_gone(api, state.zone, state.node_name) is None:
                    held.enter_context(_exec_lock_held(files))
                held.enter_context(
                    shield(
                        f"deleting {state.vm_kind} {state.node_name} (session {state.name})",
                        manual=f"tpulab down {state.name}\n  or: {node.what_to_do()}",
                    )
                )
                # Google takes a minute or more to delete a TPU VM: say what the wait is.
                print_stderr(
                    f"Deleting {state.vm_kind} {state.node_name} of session {state.name}; "
                    "waiting until a list confirms it gone..."
                )
                report = take_down(api, state, notify=lambda message: print_stderr(message))
        except E.TeardownError as error:
            # The session stays (its key, its state): `down` is what finishes it, for
            # the API the node lives behind.
            raise E.TeardownError(
                f"{error.message} Session {state.name} is kept: run "
                f"`tpulab down {state.name}` again once the API answers.",
                [dataclasses.replace(n, target=target, run_id=state.run_id) for n in error.leaked],
                delete_attempts=error.delete_attempts,
            ) from None
        with shield(f"removing session {state.name}'s key and state"):
            _forget(store, state, report)


def _forget(store: "SessionStore", state: "SessionState", report: "TeardownReport") -> None:
    """A session whose node `down` deleted (or found gone): close its journal row,
    remove its key and state, and say so."""
    from tpulab.cleanup.journal import Journal
    from tpulab.cleanup.sessions import conclude_gone, why_gone

    if report.already_gone:
        # Nothing for `down` to delete: it went on its own (or someone deleted it).
        concluded = conclude_gone(
            store, state, why_gone(state, now=time.time()), seen_by="tpulab down"
        )
        for warning in concluded.warnings:
            print_stderr(f"[yellow]journal:[/] {warning}")
        typer.echo(
            f"Session {state.name} is down: its {state.vm_kind} {state.node_name} was already gone "
            f"(it {concluded.vanish.reason}); key removed."
        )
        return
    try:
        Journal().close_run(state.run_id, "confirmed", "session ended by tpulab down")
    except (E.JournalError, ValueError) as error:
        print_stderr(f"[yellow]warning:[/] the journal could not record it: {error}")
    store.remove(state.name)
    typer.echo(
        f"Session {state.name} is down: {state.vm_kind} {state.node_name} deleted, "
        "confirmed by list; key removed."
    )


@contextlib.contextmanager
def _exec_lock_held(files: "SessionFiles") -> Iterator[None]:
    """Hold the session's exec lock for the delete; RemoteError (exit 4, nothing
    deleted) while an exec holds it. A lock that cannot be checked is said, not fatal:
    a node `down` cannot reach is no node an exec is using either."""
    from tpulab.remote.keys import RunKey
    from tpulab.run.attach import describe_holder
    from tpulab.run.session import exec_lock_for_down

    state = files.state
    try:
        key = RunKey.from_openssh_private(files.key_path.read_bytes())
    except (OSError, ValueError) as error:
        print_stderr(f"[yellow]note:[/] cannot check for a running exec (the key: {error}).")
        yield
        return
    with exec_lock_for_down(state, key) as lock:
        if lock.holder is not None and lock.holder.is_down:
            raise E.RemoteError(
                f"Session {state.name} is being taken down already: another `tpulab down` "
                f"holds its lock ({describe_holder(lock.holder)}) and deletes its "
                f"{state.vm_kind}. Nothing was done here.",
                hint=f"Let that one finish; `tpulab list` shows when session {state.name} "
                f"is gone (if that `down` was killed, `tpulab down {state.name}` again).",
            )
        if lock.holder is not None:
            raise E.RemoteError(
                f"Session {state.name} is in use: an exec holds its lock "
                f"({describe_holder(lock.holder)}). Deleting its node now would end that "
                "exec and lose its artifacts. Nothing was deleted.",
                hint=f"Wait for the exec to finish, then `tpulab down {state.name}`; or "
                f"`tpulab down {state.name} --force` to delete it anyway.",
            )
        if lock.unchecked is not None:
            print_stderr(
                f"[yellow]note:[/] could not check session {state.name} for a running "
                f"exec ({lock.unchecked}); deleting its node anyway."
            )
        yield


class DashDashCommand(PanelledCommand):
    """Keeps what follows `--` apart from the positional arguments, so that in
    `tpulab ssh [S] -- CMD` the session name is never mistaken for the command's first
    word (click alone would merge them); `ctx.meta[AFTER_DASHES]` holds the command."""

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:  # type: ignore[override]
        if "--" in args:
            at = args.index("--")
            args, ctx.meta[AFTER_DASHES] = args[:at], args[at + 1 :]
        return super().parse_args(ctx, args)


AFTER_DASHES = "tpulab.after_dashes"


def ssh_command(
    ctx: typer.Context,
    name: Annotated[
        str | None, typer.Argument(help="The session (omit if only one is up).")
    ] = None,
    forwards: Annotated[
        list[str] | None,
        typer.Option(
            "-L",
            metavar="[BIND:]PORT[:HOST:HOSTPORT]",
            help="Forward this laptop's PORT to HOST:HOSTPORT as the VM sees it (default "
            "localhost:PORT), as OpenSSH's -L (repeatable).",
        ),
    ] = None,
    forward_only: Annotated[
        bool, typer.Option("-N", help="Forward only (-L), no shell: until Ctrl-C.")
    ] = False,
    worker: Annotated[
        int,
        typer.Option(
            "--worker", metavar="N", help="A multi-host slice's worker to reach (default 0)."
        ),
    ] = 0,
) -> None:
    """Open a shell on the session's VM (OpenSSH, pinned host key), or run `-- CMD`.

    One argument after `--` is a command line for the remote shell (`-- 'cd x && y'`),
    as with ssh; several are run as exactly those words. Renews the session's idle lease
    first (on every worker of a slice), and keeps renewing it while -L forwards are
    open: `tpulab ssh S -L 6006 -N` shows the VM's TensorBoard at localhost:6006.
    """
    command = list(ctx.meta.get(AFTER_DASHES, ()))

    def action() -> int:
        from tpulab.cli.forward import ssh_session
        from tpulab.config.forward import parse_forwards

        # The -L specs first: a bad one is refused before any session file is read.
        parsed = parse_forwards(forwards or [])
        if forward_only and not parsed:
            raise E.ConfigError("-N forwards only: give at least one -L.", hint=_L_EXAMPLE)
        if forward_only and command:
            raise E.ConfigError("-N runs no command: drop -N, or the command after --.")
        with session_store() as store:  # warns of damaged state files before the shell
            files = store.resolve(name)
        return ssh_session(store, files, command, parsed, forward_only=forward_only, worker=worker)

    status = guarded(action)
    raise typer.Exit(status if isinstance(status, int) else 0)


_L_EXAMPLE = "e.g. `tpulab ssh S -L 18080:localhost:8000 -N`."
