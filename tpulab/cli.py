"""The command line: flags in, core calls, text and exit statuses out.

This is the only module that prints or chooses an exit status. It imports the core
lazily inside each command so that `tpulab --help` does not pay for jax, paramiko or
google-cloud (a test checks `sys.modules`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Annotated, NoReturn, TypeVar

import typer

from tpulab import __version__
from tpulab import errors as E

__all__ = ["EXIT_CODES", "app", "main"]

# Exit statuses are a contract (README "Exit codes"); change them only with the README.
EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_CONFIG = 2
EXIT_CLOUD = 3
EXIT_REMOTE = 4
EXIT_VERIFY = 5
EXIT_TEARDOWN = 6
EXIT_PREEMPTED = 7
EXIT_LOCAL_STATE = 8
EXIT_INTERRUPTED = 130

EXIT_CODES: dict[int, str] = {
    EXIT_OK: "success (for run: receipt verified AND teardown confirmed)",
    EXIT_INTERNAL: "unexpected internal error (a bug: please report it)",
    EXIT_CONFIG: "bad input or missing configuration; nothing was created",
    EXIT_CLOUD: "the Cloud TPU API refused or failed (stockout, quota, permission...)",
    EXIT_REMOTE: "SSH, bootstrap or the payload failed on the VM",
    EXIT_VERIFY: "the receipt did not verify (wrong platform, devices, totals, nonce...)",
    EXIT_TEARDOWN: "teardown NOT confirmed: resources may still be billing",
    EXIT_PREEMPTED: "the spot node was preempted during the run",
    EXIT_LOCAL_STATE: "the local journal or receipt store is unreadable",
    EXIT_INTERRUPTED: "interrupted by a signal; teardown ran and was confirmed",
}

_EXIT_FOR_ERROR: tuple[tuple[type[E.TpuLabError], int], ...] = (
    (E.TeardownError, EXIT_TEARDOWN),
    (E.InterruptedRun, EXIT_INTERRUPTED),
    (E.PreemptedError, EXIT_PREEMPTED),
    (E.ConfigError, EXIT_CONFIG),
    (E.CloudError, EXIT_CLOUD),
    (E.RemoteError, EXIT_REMOTE),
    (E.VerificationError, EXIT_VERIFY),
    (E.JournalError, EXIT_LOCAL_STATE),
)

app = typer.Typer(
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

T = TypeVar("T")


def exit_status_for(error: E.TpuLabError) -> int:
    for error_type, status in _EXIT_FOR_ERROR:
        if isinstance(error, error_type):
            return status
    return EXIT_INTERNAL


def _stderr(text: str) -> None:
    from rich.console import Console

    Console(stderr=True, highlight=False).print(text)


def report_error(error: E.TpuLabError) -> NoReturn:
    """Print a TpuLabError the way a user can act on, then exit with its status."""
    from rich.markup import escape

    lines = [f"[bold red]error:[/] {escape(error.message)}"]
    if isinstance(error, E.CloudError) and error.api_message:
        lines.append(f"  API said: {escape(error.api_message)}")
    if isinstance(error, E.VerificationError):
        lines.extend(f"  - {escape(str(failure))}" for failure in error.failures)
    if isinstance(error, E.CommandFailedError) and error.output_tail:
        lines.append("  last output:\n" + escape(error.output_tail))
    if error.hint:
        lines.append(f"[yellow]hint:[/] {escape(error.hint)}")
    _stderr("\n".join(lines))
    raise typer.Exit(exit_status_for(error))


def guarded(action: Callable[[], T]) -> T:
    """Run a command body, turning TpuLabError into a message and an exit status."""
    try:
        return action()
    except E.TpuLabError as error:
        report_error(error)


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"tpulab {__version__}")
        raise typer.Exit(EXIT_OK)


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version_callback, is_eager=True, help="Show the version."),
    ] = False,
) -> None:
    """Run a JAX experiment on a Cloud TPU VM and never leave it billing."""


def main() -> None:
    app(prog_name="tpulab")


if __name__ == "__main__":
    sys.exit(main())
