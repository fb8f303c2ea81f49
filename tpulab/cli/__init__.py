"""The command line: flags in, core calls, text and exit statuses out.

This package is the only place that prints or chooses an exit status. Each command
group is a module (run, teardown, listing, verify, receipts, emulator) that imports
the core lazily inside its functions, so that `tpulab --help` does not pay for jax,
paramiko or google-cloud (a test checks `sys.modules`). This module builds the typer
app and registers the commands in the order `tpulab --help` lists them.

The modules that declare commands do without `from __future__ import annotations`:
typer reads every command's signature on every start, and string annotations are parsed
and evaluated again each time (~15 ms of a ~0.1 s `--help`; tests/test_startup.py pins
it). Names they import only for type checking are quoted where used.
"""

import sys
from typing import Annotated

import typer
import typer.core
import typer.main

from tpulab import __version__
from tpulab import errors as E
from tpulab.cli import (
    costs,
    doctor,
    emulator,
    exec,
    forward,
    listing,
    notebook,
    receipts,
    run,
    runs,
    session,
    teardown,
    verify,
)
from tpulab.cli._click import UsageError
from tpulab.cli._console import print_stderr
from tpulab.cli._exit import guarded, json_or_guarded, report_error
from tpulab.cli._panels import HelpInPanels, panel_the_options
from tpulab.exits import EXIT_CONFIG, EXIT_INTERRUPTED, EXIT_OK

__all__ = [
    "app",
    "guarded",
    "main",
    "report_error",
]

app = HelpInPanels(
    name="tpulab",
    help=(
        "Run a JAX experiment on a Cloud TPU VM, prove it really ran there, and never "
        "leave a VM billing.\n\nStart offline: `tpulab run --accelerator v5litepod-4 "
        "--emulate` rehearses the whole lifecycle against a local emulator."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"tpulab {__version__}")
        raise typer.Exit(EXIT_OK)


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version_callback, is_eager=True, help="Show the version."
        ),
    ] = False,
) -> None:
    """Run a JAX experiment on a Cloud TPU VM and never leave it billing."""


# typer lists commands in registration order: the lifecycle first, then the tools.
app.command("run")(run.run_command)
app.command("up")(session.up_command)
app.command("exec", cls=session.DashDashCommand)(exec.exec_command)
app.command("ssh", cls=session.DashDashCommand)(session.ssh_command)
app.command("ssh-config")(forward.ssh_config_command)
app.command("notebook")(notebook.notebook_command)
app.command("down")(session.down_command)
app.command("teardown")(teardown.teardown_command)
app.command("list")(listing.list_command)
app.command("costs")(costs.costs_command)
app.command("doctor")(doctor.doctor_command)
app.command("verify")(verify.verify_command)
app.add_typer(receipts.receipts_app, name="receipts")
app.add_typer(runs.runs_app, name="runs")
app.add_typer(emulator.emulator_app, name="emulator")


def _name_the_values(command: object) -> None:
    """Help shows `--zone ZONE` and a bare `--spot`, not typer's `--zone <str>` and
    `--spot <bool>`, which read as if every flag took a value of that type."""
    params = list(getattr(command, "params", []))
    context_class = getattr(command, "context_class", None)
    if context_class is not None:
        # The --help option is made (once, then cached) when help is first rendered.
        help_option = command.get_help_option(context_class(command))  # type: ignore[attr-defined]
        params.append(help_option)
        _help_needs_no_coercion(help_option)
    for param in params:
        if isinstance(param, typer.core.TyperOption) and param.metavar is None:
            param.metavar = "" if param.is_flag else (param.name or "value").upper()
    for sub in getattr(command, "commands", {}).values():
        _name_the_values(sub)


def _help_needs_no_coercion(help_option: object) -> None:
    """An absent --help is False, not None: typer (0.2x) coerces a flag's None through a
    pydantic TypeAdapter, so `tpulab run --help` loaded pydantic (~0.15 s) for the root
    group's unused --help, while a bool passes through untouched."""
    if help_option is not None and getattr(help_option, "default", False) is None:
        help_option.default = False  # type: ignore[attr-defined]


def main() -> None:
    from tpulab.cli._streams import install_forgiving_streams

    # A closed pipe or terminal must not fail a run that is creating or deleting a VM.
    install_forgiving_streams()
    command = typer.main.get_command(app)
    _name_the_values(command)
    panel_the_options(command)
    try:
        status = command.main(prog_name="tpulab", standalone_mode=False)
    except UsageError as error:
        raise SystemExit(_usage_error(error)) from None
    except typer.Abort:
        # Ctrl-C at a prompt (e.g. teardown's "Delete 1 node(s)?"): nothing was done.
        print_stderr("Interrupted at the prompt; nothing was changed.")
        raise SystemExit(EXIT_INTERRUPTED) from None
    raise SystemExit(status if isinstance(status, int) else EXIT_OK)


def _extra_argument_hint(error: UsageError) -> str | None:
    """`tpulab up lesson-3`: every other session command takes the name first, so `up`
    is typed that way; say where its name goes instead of only that it was extra."""
    path = error.ctx.command_path if error.ctx is not None else ""
    if path != "tpulab up" or "unexpected extra argument" not in error.format_message():
        return None
    return "`tpulab up` takes the session's name as a flag: `tpulab up --name NAME ...`."


def _usage_error(error: UsageError) -> int:
    """Bad flags exit 2 as any ConfigError does; with --json, as an error envelope."""
    if "--json" not in sys.argv[1:]:
        error.show()  # typer's own box (or the help, for a bare `tpulab`)
        hint = _extra_argument_hint(error)
        if hint:
            print_stderr(f"hint: {hint}")
        return int(error.exit_code)
    path = error.ctx.command_path if error.ctx is not None else "tpulab"
    name = path.removeprefix("tpulab").strip() or "tpulab"
    failure = E.ConfigError(error.format_message(), hint="See `tpulab " + name + " --help`.")

    def fail() -> None:
        raise failure

    try:
        json_or_guarded(name, True, fail)
    except typer.Exit as done:
        return int(done.exit_code)
    return EXIT_CONFIG
