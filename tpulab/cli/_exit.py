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

if TYPE_CHECKING:
    from tpulab.envelope import Envelope, ErrorReport

__all__ = [
    "EXIT_CLOUD",
    "EXIT_CODES",
    "EXIT_CONFIG",
    "EXIT_INTERNAL",
    "EXIT_INTERRUPTED",
    "EXIT_LOCAL_STATE",
    "EXIT_OK",
    "EXIT_PREEMPTED",
    "EXIT_REMOTE",
    "EXIT_TEARDOWN",
    "EXIT_VERIFY",
    "EXIT_WORKLOAD",
    "error_report",
    "exit_status_for",
    "guarded",
    "json_or_guarded",
    "print_envelope",
    "report_error",
]

# Exit statuses are a contract (docs/reference/exit-status.md, summed up in the README);
# change them only with both.
EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_CONFIG = 2
EXIT_CLOUD = 3
EXIT_REMOTE = 4
EXIT_VERIFY = 5
EXIT_TEARDOWN = 6
EXIT_PREEMPTED = 7
EXIT_LOCAL_STATE = 8
EXIT_WORKLOAD = 9
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
    EXIT_LOCAL_STATE: "the local journal, receipt store or a session's state is unreadable",
    EXIT_WORKLOAD: "your command (`-- CMD`) failed or timed out on the verified VM; "
    "its artifacts were fetched and its own status is in the summary",
    EXIT_INTERRUPTED: "interrupted by a signal; teardown ran and was confirmed",
}

_EXIT_FOR_ERROR: tuple[tuple[type[E.TpuLabError], int], ...] = (
    (E.TeardownError, EXIT_TEARDOWN),
    (E.InterruptedRun, EXIT_INTERRUPTED),
    (E.PreemptedError, EXIT_PREEMPTED),
    (E.WorkloadFailedError, EXIT_WORKLOAD),
    (E.ConfigError, EXIT_CONFIG),
    (E.CloudError, EXIT_CLOUD),
    (E.RemoteError, EXIT_REMOTE),
    (E.VerificationError, EXIT_VERIFY),
    (E.LocalRunError, EXIT_VERIFY),  # verify --local got no receipt: nothing verified
    (E.JournalError, EXIT_LOCAL_STATE),
    (E.ReceiptStoreError, EXIT_LOCAL_STATE),
    (E.StateFileError, EXIT_LOCAL_STATE),
)

T = TypeVar("T")


def exit_status_for(error: E.TpuLabError) -> int:
    for error_type, status in _EXIT_FOR_ERROR:
        if isinstance(error, error_type):
            return status
    return EXIT_INTERNAL


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
    from tpulab.envelope import ErrorReport

    return ErrorReport.from_error(error, exit_status=exit_status_for(error))


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
