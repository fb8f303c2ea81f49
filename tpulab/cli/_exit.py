"""Exit statuses: the contract, the mapping from TpuLabError, and how an error is shown.

A module of its own (re-exported by `tpulab.cli`) so that every command module can use
it without importing the package that registers them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, NoReturn, TypeVar

import typer

from tpulab import errors as E
from tpulab.cli._console import print_json, print_stderr
from tpulab.exits import exit_status_for

if TYPE_CHECKING:
    from tpulab.envelope import Envelope, ErrorReport

__all__ = [
    "error_report",
    "guarded",
    "json_or_guarded",
    "print_envelope",
    "report_error",
]

T = TypeVar("T")


def report_error(error: E.TpuLabError) -> NoReturn:
    """Print a TpuLabError the way a user can act on, then exit with its status."""
    from rich.markup import escape

    lines = [f"[bold red]error:[/] {escape(error.message)}"]
    if isinstance(error, E.CloudError) and error.api_message:
        lines.append(f"  API said: {escape(error.api_message)}")
    if isinstance(error, E.VerificationError):
        lines.extend(f"  - {escape(str(failure))}" for failure in error.failures)
    if (
        isinstance(error, (E.CommandFailedError, E.LocalRunError, E.WorkloadFailedError))
        and error.output_tail
    ):
        lines.append("  last output:\n" + escape(error.output_tail))
    if error.hint:
        lines.append(f"[yellow]hint:[/] {escape(error.hint)}")
    print_stderr("\n".join(lines))
    raise typer.Exit(exit_status_for(error))


def guarded(action: Callable[[], T]) -> T:
    """Run a command body, turning TpuLabError into a message and an exit status."""
    try:
        return action()
    except E.TpuLabError as error:
        report_error(error)


def error_report(error: E.TpuLabError) -> ErrorReport:
    """An error as the `error` member of a JSON envelope, with the exit status it causes."""
    from tpulab.envelope import error_report

    return error_report(error)


def print_envelope(
    document: Envelope | Mapping[str, object], failure: E.TpuLabError | None
) -> None:
    """Print a --json envelope on stdout; exit with the failure's status if there is one."""
    from tpulab.envelope import Envelope

    if isinstance(document, Envelope):
        typer.echo(document.to_json())
    else:
        print_json(document)
    if failure is not None:
        raise typer.Exit(exit_status_for(failure))


def json_or_guarded(command: str, as_json: bool, action: Callable[[], None]) -> None:
    """Like guarded(), but with --json the error is the envelope on stdout as well."""
    if not as_json:
        guarded(action)
        return
    from tpulab.envelope import ErrorEnvelope

    try:
        action()
    except E.TpuLabError as error:
        failure = error
    else:
        return
    print_envelope(ErrorEnvelope(command=command, error=error_report(failure)), failure)
