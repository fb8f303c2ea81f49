"""`tpulab doctor`: check a project before any money is spent (tpulab.app.doctor).

Each check prints as ok / problem / unknown with its fix; the provider (--provider, or
the --accelerator's default: Compute Engine for tpu7x-8) chooses whose checks. Exit 0
only when nothing is a problem; 2 when the credentials or the project are; 3 for any
other (the cloud project's). The core is imported inside the function so --help stays light.
"""

from typing import Annotated

import typer

__all__ = ["doctor_command"]

_MARKS = {"ok": "[green]ok[/]     ", "problem": "[red]problem[/]", "unknown": "[yellow]unknown[/]"}


def _doctor(
    *,
    project: str | None,
    zone: str | None,
    accelerator: str | None,
    service_account: str | None,
    network: str | None,
    subnetwork: str | None,
    internal_ip: bool,
    provider: str | None,
    api_endpoint: str | None,
    emulate: bool,
    as_json: bool,
) -> None:
    from rich.markup import escape

    from tpulab.app.doctor import doctor, envelope
    from tpulab.cli._console import console
    from tpulab.cli._target import adc_project
    from tpulab.config.doctor import doctor_inputs

    inputs = doctor_inputs(
        project=project,
        zone=zone,
        accelerator=accelerator,
        service_account=service_account,
        network=network,
        subnetwork=subnetwork,
        internal_ip=internal_ip,
        provider=provider,
        emulate=emulate,
        api_endpoint=api_endpoint,
        adc_project=adc_project,
    )
    account, checks = doctor(inputs)
    document = envelope(inputs, account, checks)
    if as_json:
        typer.echo(document.to_json())
    else:
        out = console()
        for check in checks:
            out.print(f"{_MARKS[check.status]}  {check.name:<14} {escape(check.summary)}")
            if check.fix:
                out.print(f"{'':<24} fix: {escape(check.fix)}")
        problems = sum(check.status == "problem" for check in checks)
        unknown = sum(check.status == "unknown" for check in checks)
        verdict = "ready for a run" if not problems else f"{problems} problem(s) to fix first"
        out.print(f"\n{verdict}" + (f"; {unknown} check(s) unknown." if unknown else "."))
    if document.exit_status:
        raise typer.Exit(document.exit_status)


def doctor_command(
    project: Annotated[str | None, typer.Option("--project", help="Google Cloud project.")] = None,
    zone: Annotated[
        str | None, typer.Option("--zone", help="The zone a run would use (with --accelerator).")
    ] = None,
    accelerator: Annotated[
        str | None,
        typer.Option(
            "--accelerator",
            help="Check that the zone offers this type (on Compute: its machine type, asked "
            "of the zone).",
        ),
    ] = None,
    provider: Annotated[
        str | None,
        typer.Option(
            "--provider",
            metavar="tpu-api|compute",
            help="Whose checks: the Cloud TPU API's or Compute Engine's (default: the "
            "--accelerator's, as a run chooses; without one, tpu-api).",
        ),
    ] = None,
    service_account: Annotated[
        str | None,
        typer.Option(
            "--service-account",
            help="The VM's account (default: the project's default compute account).",
        ),
    ] = None,
    network: Annotated[
        str | None,
        typer.Option(
            "--network", metavar="VPC", help="The VPC a run would use (default: `default`)."
        ),
    ] = None,
    subnetwork: Annotated[
        str | None,
        typer.Option(
            "--subnetwork",
            metavar="SUBNET",
            help="The subnetwork a run would use (default: the network's in the zone's region).",
        ),
    ] = None,
    internal_ip: Annotated[
        bool,
        typer.Option(
            "--internal-ip",
            help="Also check what a VM without an external IP needs: Private Google Access "
            "on its subnetwork.",
        ),
    ] = False,
    api_endpoint: Annotated[
        str | None,
        typer.Option("--api-endpoint", help="An emulator URL serving Google's APIs."),
    ] = None,
    emulate: Annotated[
        bool, typer.Option("--emulate", help="Check against the embedded emulator.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON envelope.")] = False,
) -> None:
    """Check credentials, project, the provider's API (Cloud TPU or Compute Engine),
    permissions, the VM's account and the network (with --internal-ip, its subnetwork's
    Private Google Access; on Compute with --accelerator, the zone's machine type) before
    a run spends anything; each with its fix."""
    from tpulab.cli._exit import json_or_guarded

    json_or_guarded(
        "doctor",
        as_json,
        lambda: _doctor(
            project=project,
            zone=zone,
            accelerator=accelerator,
            service_account=service_account,
            network=network,
            subnetwork=subnetwork,
            internal_ip=internal_ip,
            provider=provider,
            api_endpoint=api_endpoint,
            emulate=emulate,
            as_json=as_json,
        ),
    )
