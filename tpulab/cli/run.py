"""`tpulab run`: create a TPU VM, run the JAX verifier on it, check the receipt, delete it.

tpulab.run.lifecycle drives the run and tpulab.run.report builds the summary and envelope;
this module wires the progress display, the signals, the journal and the target
(Google, the embedded emulator or an --api-endpoint), and prints the outcome.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from tpulab import errors as E
from tpulab.cli._console import console, print_json, print_lines, print_stderr
from tpulab.cli._exit import (
    EXIT_TEARDOWN,
    error_json,
    json_or_guarded,
    print_envelope,
    report_error,
)
from tpulab.cli._run_display import RunDisplay
from tpulab.cli._target import adc_project, api_context

if TYPE_CHECKING:
    from tpulab.config import RunSpec

__all__ = ["run_command"]


def _run_dry(spec: RunSpec, installer: str, as_json: bool) -> None:
    from rich.markup import escape

    from tpulab.run.plan import build_plan, plan_envelope

    steps = build_plan(spec, installer="pip" if installer == "pip" else "uv")
    if as_json:
        print_json(plan_envelope(spec, steps))
        return
    out = console()
    accel = spec.accelerator
    tag = " (EMULATED)" if spec.emulated else ""
    out.print(
        f"[bold]Plan for run {spec.run_id}[/]{tag}: {accel.name} as node {spec.node_name}, "
        f"project {escape(spec.project.value)} ({escape(spec.project.source)}), zone "
        f"{spec.zone.value} ({escape(spec.zone.source)}); est. "
        f"${accel.price_per_hour(spot=spec.spot):.2f}/h. Nothing is contacted."
    )
    for number, step in enumerate(steps, 1):
        out.print(
            f"{number:>2}. [cyan]{step.kind:<5}[/] [bold]{step.phase}[/] {escape(step.action)}"
        )
        if step.why:
            out.print(f"          [dim]{escape(step.why)}[/]")


def _run(
    *,
    spec: RunSpec,
    ssh_backend: str,
    installer: str,
    as_json: bool,
    verbose: bool,
) -> None:
    from tpulab.cleanup.journal import RunJournalAdapter
    from tpulab.run.lifecycle import Lifecycle
    from tpulab.run.progress import FanOut, Recorder
    from tpulab.run.report import run_envelope, summary_lines
    from tpulab.run.signals import shield, signals_to_teardown

    recorder = Recorder()
    display = RunDisplay(verbose=verbose, quiet=as_json)
    life: Lifecycle | None = None
    failure: E.TpuLabError | None = None
    journal = RunJournalAdapter()
    try:
        with api_context(
            spec.project.value,
            emulate=spec.mode == "emulate",
            api_endpoint=spec.api_endpoint,
            ssh="openssh" if ssh_backend == "openssh" else "embedded",
        ) as api:
            life = Lifecycle(
                spec,
                api=api,
                journal=journal,
                observer=FanOut([recorder, display]),
                shield=shield,
                installer="pip" if installer == "pip" else "uv",
            )
            with signals_to_teardown(print_stderr, force_exit_status=EXIT_TEARDOWN):
                life.run()
    except E.TpuLabError as error:
        failure = error
    finally:
        display.stop()
    for warning in journal.warnings:
        print_stderr(f"[yellow]warning:[/] {warning}")
    if as_json:
        report = error_json(failure) if failure else None
        if life is None:
            from tpulab.evidence.report import envelope

            document = envelope("run", ok=False, run_id=spec.run_id, error=report)
        else:
            document = run_envelope(life.outcome, recorder, error=report)
        print_envelope(document, failure)
        return
    if life is not None and (life.outcome.create_sent or life.outcome.verdict):
        print_lines(summary_lines(life.outcome))
    if failure is not None:
        report_error(failure)


def run_command(
    accelerator: Annotated[
        str, typer.Option("--accelerator", help="TPU type, e.g. v5litepod-4, v6e-1, v4-8.")
    ],
    zone: Annotated[
        str | None,
        typer.Option("--zone", help="Zone, e.g. us-central1-a (else TPULAB_ZONE, gcloud)."),
    ] = None,
    project: Annotated[
        str | None, typer.Option("--project", help="Project (else TPULAB_PROJECT, gcloud, ADC).")
    ] = None,
    name: Annotated[
        str | None, typer.Option("--name", help="Node name (default tpulab-<run id>).")
    ] = None,
    spot: Annotated[
        bool, typer.Option("--spot", help="Use a spot VM (cheaper, preemptible).")
    ] = False,
    emulate: Annotated[
        bool, typer.Option("--emulate", help="Run the whole lifecycle against a local emulator.")
    ] = False,
    api_endpoint: Annotated[
        str | None,
        typer.Option("--api-endpoint", help="Cloud TPU API URL, e.g. `tpulab emulator serve`'s."),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print every request and command; contact nothing.")
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print a versioned JSON envelope.")
    ] = False,
    verbose: Annotated[
        bool, typer.Option("-v", "--verbose", help="Show remote output live.")
    ] = False,
    timeout: Annotated[
        float, typer.Option("--timeout", help="Seconds the payload may run before it is killed.")
    ] = 600.0,
    teardown_timeout: Annotated[
        float,
        typer.Option("--teardown-timeout", help="Seconds to wait for the deletion to be proven."),
    ] = 600.0,
    installer: Annotated[
        str, typer.Option("--installer", help="Remote package installer: uv (default) or pip.")
    ] = "uv",
    ssh_backend: Annotated[
        str,
        typer.Option(
            "--ssh-backend", help="With --emulate: embedded (default) or openssh.", hidden=True
        ),
    ] = "embedded",
    python: Annotated[
        str | None,
        typer.Option(
            "--python",
            help="The VM venv's python: X.Y (uv-managed; default 3.12, emulated >=3.11), "
            ">=X.Y, or system (the image's 3.10, which limits jax to 0.6.x).",
        ),
    ] = None,
    jax_version: Annotated[
        str | None,
        typer.Option("--jax-version", help="Pin jax on the VM (default: the newest)."),
    ] = None,
) -> None:
    """Create a TPU VM, run the JAX verifier on it, check the receipt, delete the VM.

    Succeeds (exit 0) only when the receipt verified AND the deletion was confirmed.
    """

    def action() -> None:
        from tpulab.config import build_run_spec

        if installer not in ("uv", "pip"):
            raise E.ConfigError(f"Unknown installer {installer!r}.", hint="Use uv or pip.")
        if ssh_backend not in ("embedded", "openssh"):
            raise E.ConfigError(
                f"Unknown SSH backend {ssh_backend!r}.", hint="Use embedded or openssh."
            )
        if emulate and api_endpoint:
            raise E.ConfigError(
                "--emulate and --api-endpoint exclude each other.",
                hint="--emulate starts an emulator in this process; --api-endpoint uses one "
                "served by `tpulab emulator serve`.",
            )
        from tpulab.config import Timeouts

        spec = build_run_spec(
            timeouts=Timeouts(teardown=teardown_timeout),
            accelerator=accelerator,
            mode="emulate" if emulate else "endpoint" if api_endpoint else "google",
            project=project,
            zone=zone,
            name=name,
            spot=spot,
            api_endpoint=api_endpoint,
            payload_timeout=timeout,
            adc_project=None if dry_run else adc_project,
            python=python,
            jax_version=jax_version,
        )
        if dry_run:
            _run_dry(spec, installer, as_json)
            return
        _run(
            spec=spec,
            ssh_backend=ssh_backend,
            installer=installer,
            as_json=as_json,
            verbose=verbose,
        )

    json_or_guarded("run", as_json, action)
