"""`tpulab run`: create a TPU VM, run the JAX verifier on it, check the receipt, delete it.

tpulab.run.lifecycle drives the run; tpulab.run.summary builds the summary lines and
tpulab.run.report the envelope. This module wires the progress display, the signals,
the journal and the target (Google, the embedded emulator or an --api-endpoint), and
prints the outcome.
"""

import json
import textwrap
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, Any

import typer

from tpulab import errors as E
from tpulab.cli import _run_options as ro
from tpulab.cli import _workload_options as wo
from tpulab.cli._console import console, print_lines, print_stderr
from tpulab.cli._exit import (
    error_report,
    json_or_guarded,
    print_envelope,
    report_error,
)
from tpulab.cli._run_display import RunDisplay
from tpulab.cli._target import adc_project

if TYPE_CHECKING:
    from collections.abc import Iterator

    from tpulab.app.runs import RunTpu
    from tpulab.config import RunSpec
    from tpulab.config.commands import Installer, SshBackend
    from tpulab.run.plan import PlanEnvelope
    from tpulab.run.progress import Recorder

__all__ = ["print_plan_steps", "run_command"]


def _run_dry(spec: "RunSpec", installer: "Installer", as_json: bool) -> None:
    from rich.markup import escape

    from tpulab.run.plan import build_plan, plan_envelope

    plan = plan_envelope(spec, build_plan(spec, installer=installer), installer=installer)
    if as_json:
        typer.echo(plan.to_json())
        return
    out = console()
    tag = " (EMULATED)" if plan.emulated else ""
    out.print(
        f"[bold]Plan for run {plan.run_id}[/]{tag}: {plan.accelerator_type} as node "
        f"{plan.node_name}, project {escape(plan.project)} ({escape(plan.project_source)}), "
        f"zone {plan.zone} ({escape(plan.zone_source)}); {_rate(plan)}. "
        "Recorded from the run itself over "
        f"recording seams: nothing is contacted. API base {escape(plan.endpoint)}."
    )
    if spec.capacity.may_retry:
        zones = ", ".join(zone.value for zone in spec.zone_order)
        retry = ""
        if spec.retry_until_up:
            retry = f"; passes again until up{_for(spec.retry_for)}"
        recover = f"; recovers from {spec.recover} preemption(s)" if spec.recover else ""
        out.print(
            f"Attempts: {escape(zones)}, in order{retry}{recover}. The steps below are "
            "the first attempt's; each later one is the same run in its zone, as "
            f"{spec.run_id}-aN."
        )
    out.print(
        f"Provider: {spec.provider} ({escape(spec.provider_source)})"
        + (f", machine type {spec.accelerator.machine_type}" if spec.provider == "compute" else "")
        + "."
    )
    pin = f", jax {spec.jax_version}" if spec.jax_version else ""
    out.print(f"The VM's venv: python {escape(spec.python)} ({escape(spec.python_source)}){pin}.")
    given = [f"{key} ({where})" for key, where in plan.sources.items() if where != "default"]
    left = [key for key, where in plan.sources.items() if where == "default"]
    rest = f"; defaults: {', '.join(left)}" if left else ""
    out.print(f"[dim]Where values came from: {escape(', '.join(given) + rest)}.[/]")
    print_plan_steps(plan)


def _rate(plan: "PlanEnvelope") -> str:
    if plan.estimated_cost_per_hour_usd is None:
        return f"no list price is cited for {plan.accelerator_type} (cost unknown)"
    return f"est. ${plan.estimated_cost_per_hour_usd:.2f}/h (list prices of {plan.price_date})"


def print_plan_steps(plan: "PlanEnvelope") -> None:
    """The plan's numbered steps and its placeholders (`tpulab exec --dry-run` too)."""
    from rich.markup import escape

    out = console()
    for number, step in enumerate(plan.steps, 1):
        head = f"{number:>2}. [cyan]{step.kind:<5}[/] [bold]{step.phase:<9}[/]"
        if step.kind == "api":
            out.print(f"{head} {step.method} {escape(step.path or '')}")
            if step.body is not None:
                out.print(
                    f"      body {escape(json.dumps(_shown_body(step.body), sort_keys=True))}"
                )
        elif step.kind == "ssh":
            where = step.target or step.remote_path or ""
            out.print(f"{head} {step.action} {escape(where)}".rstrip())
            if step.command:
                out.print(escape(textwrap.indent(step.command, "      $ ")))
            if step.detail:
                out.print(f"      [dim]{escape(step.detail)}[/]")
        else:
            out.print(f"{head} {escape(step.action)}")
        if step.poll is not None:
            out.print(
                f"      [dim]repeated until {escape(step.poll.until)}: every "
                f"{escape(step.poll.schedule)}, at most {step.poll.timeout_seconds:g} s[/]"
            )
    out.print("[dim]Placeholders (only a real run has these values):[/]")
    for marker, meaning in plan.placeholders.items():
        out.print(f"  [dim]{escape(marker)}: {escape(meaning)}[/]")


def _shown_body(body: dict[str, Any]) -> dict[str, Any]:
    """A request body as the human plan prints it: CreateNode's startup-script (the
    watchdog's whole source) summarised; `--json` carries it verbatim."""
    import hashlib

    from tpulab.contract import STARTUP_SCRIPT_METADATA

    def summary(script: str) -> str:
        digest = hashlib.sha256(script.encode()).hexdigest()[:12]
        return f"<the tpulab watchdog: {len(script)} bytes, sha256 {digest}; --json shows it>"

    metadata = body.get("metadata")
    if not isinstance(metadata, dict):
        return body
    if isinstance(metadata.get("items"), list):  # Compute's Metadata: {items: [{key, value}]}
        items = [
            {**item, "value": summary(str(item.get("value", "")))}
            if isinstance(item, dict) and item.get("key") == STARTUP_SCRIPT_METADATA
            else item
            for item in metadata["items"]
        ]
        return {**body, "metadata": {**metadata, "items": items}}
    if STARTUP_SCRIPT_METADATA not in metadata:
        return body
    script = str(metadata[STARTUP_SCRIPT_METADATA])
    return {**body, "metadata": {**metadata, STARTUP_SCRIPT_METADATA: summary(script)}}


def _for(seconds: float | None) -> str:
    return "" if seconds is None else f" for {seconds:g} s"


def _run(
    *,
    spec: "RunSpec",
    ssh_backend: "SshBackend",
    installer: "Installer",
    as_json: bool,
    verbose: bool,
) -> None:
    from tpulab.app.runs import RunTpu
    from tpulab.cleanup.journal import RunJournalAdapter
    from tpulab.cli._target import reach_notice
    from tpulab.run.progress import FanOut, Recorder

    recorder = Recorder()
    display = RunDisplay(
        verbose=verbose,
        quiet=as_json,
        command_quiet=spec.workload is not None and spec.workload.quiet,
    )
    journal = RunJournalAdapter()
    run = RunTpu(
        spec,
        # Refusals go through the display, which keeps them clear of its spinner.
        alert=display.alert,
        installer=installer,
        ssh_backend=ssh_backend,
        observer=FanOut([recorder, display]),
        journal=journal,
        notify=reach_notice,
    )
    failure: E.TpuLabError | None = None
    try:
        run()
    except E.TpuLabError as error:
        failure = error
    finally:
        display.stop()
    # The run is over (its node deleted or reported): a signal now must not cut the
    # summary short or turn the run's status into death by SIGINT.
    with _signals_ignored():
        _report(spec, run, recorder, journal.warnings, failure, as_json=as_json)


def _report(
    spec: "RunSpec",
    run: "RunTpu",
    recorder: "Recorder",
    warnings: list[str],
    failure: E.TpuLabError | None,
    *,
    as_json: bool,
) -> None:
    from tpulab.run.outcome import RunOutcome
    from tpulab.run.report import run_envelope
    from tpulab.run.summary import summary_lines

    for warning in warnings:
        print_stderr(f"[yellow]warning:[/] {warning}")
    life, attempts = run.last, run.attempts
    if as_json:
        # No Lifecycle (the API could not be set up): nothing was created, and the
        # envelope says so in the same shape as any other run's.
        outcome = life.outcome if life is not None else RunOutcome(spec)
        report = error_report(failure) if failure else None
        print_envelope(run_envelope(outcome, recorder, attempts=attempts, error=report), failure)
        return
    if life is not None and (life.outcome.create_sent or life.outcome.verdict or len(attempts) > 1):
        print_lines(summary_lines(life.outcome, attempts=attempts))
    if failure is not None:
        report_error(failure)


@contextmanager
def _signals_ignored() -> "Iterator[None]":
    import signal

    names = [name for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)]
    numbers = [getattr(signal, name) for name in names]
    previous = [signal.signal(number, signal.SIG_IGN) for number in numbers]
    try:
        yield
    finally:
        for number, handler in zip(numbers, previous, strict=True):
            signal.signal(number, handler)


def run_command(
    command: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="-- CMD ARGS",
            # Taught by the docstring (with an example); typer's argument panel would
            # only add the Python type of the list.
            hidden=True,
        ),
    ] = None,
    accelerator: Annotated[
        str | None,
        typer.Option(
            "--accelerator",
            help="TPU type, e.g. v5litepod-4, v6e-1, v4-8 (else [tool.tpulab] accelerator).",
        ),
    ] = None,
    zones: ro.Zones = None,
    project: ro.Project = None,
    name: Annotated[
        str | None, typer.Option("--name", help="Node name (default tpulab-<run id>).")
    ] = None,
    spot: Annotated[
        bool, typer.Option("--spot", help="Use a spot VM (cheaper, preemptible).")
    ] = False,
    recover: Annotated[
        int,
        typer.Option(
            "--recover",
            metavar="N",
            help="With --spot: after a preemption, delete the node and start again (next "
            "zone first), up to N times.",
        ),
    ] = 0,
    retry_until_up: Annotated[
        bool,
        typer.Option(
            "--retry-until-up",
            help="When no zone has capacity, pass over the zones again after a pause "
            "(default: one pass).",
        ),
    ] = False,
    retry_for: Annotated[
        str | None,
        typer.Option(
            "--retry-for",
            metavar="DURATION",
            help="With --retry-until-up: how long to keep trying, e.g. 20m, 1h.",
        ),
    ] = None,
    queued: Annotated[
        bool,
        typer.Option(
            "--queued",
            help="Ask for the VM through a queued resource: the service waits for capacity "
            "(states ACCEPTED, WAITING_FOR_RESOURCES, PROVISIONING, ACTIVE).",
        ),
    ] = False,
    valid_for: Annotated[
        str | None,
        typer.Option(
            "--valid-for",
            help="With --queued: how long it may wait for capacity (e.g. 30s, 10m, 6h); "
            "past that it FAILS and the run ends (exit 3).",
        ),
    ] = None,
    emulate: Annotated[
        bool, typer.Option("--emulate", help="Run the whole lifecycle against a local emulator.")
    ] = False,
    api_endpoint: ro.ApiEndpoint = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print every request and command; contact nothing.")
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print a versioned JSON envelope.")
    ] = False,
    verbose: ro.Verbose = False,
    timeout: wo.Timeout = None,
    payload_timeout: ro.PayloadTimeout = 600.0,
    teardown_timeout: ro.TeardownTimeout = 600.0,
    boot_timeout: ro.BootTimeout = 180.0,
    bootstrap_timeout: ro.BootstrapTimeout = 1200.0,
    internal_ip: Annotated[
        bool,
        typer.Option(
            "--internal-ip",
            help="Create the VM without an external IP and connect to its internal address "
            "(when this machine is inside the VM's VPC).",
        ),
    ] = False,
    installer: ro.Installer = "uv",
    ssh_backend: Annotated[
        str,
        typer.Option(
            "--ssh-backend", help="With --emulate: embedded (default) or openssh.", hidden=True
        ),
    ] = "embedded",
    python: ro.Python = None,
    jax_version: ro.JaxVersion = None,
    workdir: wo.Workdir = None,
    with_packages: wo.WithPackages = None,
    requirements: wo.Requirements = None,
    fetch: wo.Fetch = None,
    exclude: wo.Exclude = None,
    out: wo.Out = None,
    env: wo.Env = None,
    max_upload: wo.MaxUpload = None,
    max_fetch: wo.MaxFetch = None,
    allow_secret: wo.AllowSecret = None,
    quiet: wo.Quiet = False,
    all_output: wo.AllOutput = False,
    lease: Annotated[
        str | None,
        typer.Option(
            "--lease",
            help="The VM deletes itself this long after the last renewal by a live tpulab "
            "(default 10m; e.g. 15s, 10m, 1h).",
        ),
    ] = None,
    boot_grace: Annotated[
        str | None,
        typer.Option(
            "--boot-grace",
            help="The lease before the first SSH renewal (default: twice --boot-timeout + 2m).",
        ),
    ] = None,
    max_duration: Annotated[
        str | None,
        typer.Option(
            "--max-duration",
            help="The VM deletes itself this long after boot, whatever tpulab says "
            "(default: the run's timeouts added up + 10m).",
        ),
    ] = None,
    no_watchdog: Annotated[
        bool,
        typer.Option(
            "--no-watchdog",
            help="Do not arm the VM's self-deletion; only this machine's teardown protects it.",
        ),
    ] = False,
    service_account: ro.ServiceAccount = None,
    network: ro.Network = None,
    subnetwork: ro.Subnetwork = None,
    provider: ro.Provider = None,
    image: ro.Image = None,
) -> None:
    """Create a TPU VM, run the JAX verifier on it, check the receipt, delete the VM.

    With `-- CMD ARGS...` your command runs after the verifier passed, in the uploaded
    --workdir, inside the VM's venv; --fetch paths and $TPULAB_RUN_DIR come back to --out.
    Everything after `--` is the command's, options included:

    tpulab run --accelerator v5litepod-4 --fetch ckpt/ -- python train.py --steps 8

    Defaults may live in the workspace's pyproject.toml [tool.tpulab] (or tpulab.toml):
    accelerator, zone, project, python, with, requirements, fetch, env, exclude. Flags
    override them (--env and --exclude add to them); --dry-run shows where each value
    came from. Succeeds (exit 0) only when the receipt verified AND the deletion was
    confirmed.
    """

    def action() -> None:
        from tpulab.config import groups, run_inputs
        from tpulab.config.watchdog import WatchdogRequest
        from tpulab.config.workload import WorkloadFlags

        inputs = run_inputs(
            target=groups.TargetFlags(
                accelerator=accelerator,
                zones=tuple(zones or ()),
                project=project,
                name=name,
                emulate=emulate,
                api_endpoint=api_endpoint,
                internal_ip=internal_ip,
                network=network,
                subnetwork=subnetwork,
                provider=provider,
                image=image,
                service_account=service_account,
            ),
            capacity=groups.CapacityFlags(
                spot=spot,
                recover=recover,
                retry_until_up=retry_until_up,
                retry_for=retry_for,
                queued=queued,
                valid_for=valid_for,
            ),
            timeouts=groups.TimeoutFlags(
                payload=payload_timeout,
                teardown=teardown_timeout,
                boot=boot_timeout,
                bootstrap=bootstrap_timeout,
            ),
            python=groups.PythonFlags(python=python, jax_version=jax_version, installer=installer),
            workload=WorkloadFlags(
                command=tuple(command or ()),
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
            ),
            watchdog=WatchdogRequest(
                enabled=not no_watchdog,
                lease=lease,
                boot_grace=boot_grace,
                max_duration=max_duration,
            ),
            ssh_backend=ssh_backend,
            adc_project=None if dry_run else adc_project,
        )
        spec = inputs.spec
        if no_watchdog:
            print_stderr(
                "[yellow]warning:[/] --no-watchdog: the VM will not delete itself; if this "
                "process dies, run `tpulab teardown --verify` or it keeps billing."
            )
        if dry_run:
            _run_dry(spec, inputs.installer, as_json)
            return
        _run(
            spec=spec,
            ssh_backend=inputs.ssh_backend,
            installer=inputs.installer,
            as_json=as_json,
            verbose=verbose,
        )

    json_or_guarded("run", as_json, action)
