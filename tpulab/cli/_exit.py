"""Exit statuses: the contract, the mapping from TpuLabError, and how an error is shown.

A module of its own (re-exported by `tpulab.cli`) so that every command module can use
it without importing the package that registers them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NoReturn, TypeVar

import typer

from tpulab import errors as E
from tpulab.cli._console import print_json, print_stderr

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
    "error_json",
    "exit_status_for",
    "guarded",
    "json_or_guarded",
    "print_envelope",
    "report_error",
]

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
    if isinstance(error, E.CommandFailedError) and error.output_tail:
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


def error_json(error: E.TpuLabError) -> dict[str, object]:
    """An error as the `error` member of a JSON envelope."""
    failures = error.failures if isinstance(error, E.VerificationError) else []
    return {
        "type": type(error).__name__,
        "message": error.message,
        "hint": error.hint,
        "exit_status": exit_status_for(error),
        "failures": [
            {"requirement": f.requirement, "expected": f.expected, "observed": f.observed}
            for f in failures
        ],
    }


def print_envelope(document: object, failure: E.TpuLabError | None) -> None:
    """Print a --json envelope on stdout; exit with the failure's status if there is one."""
    print_json(document)
    if failure is not None:
        raise typer.Exit(exit_status_for(failure))


def json_or_guarded(command: str, as_json: bool, action: Callable[[], None]) -> None:
    """Like guarded(), but with --json the error is the envelope on stdout as well."""
    if not as_json:
        guarded(action)
        return
    from tpulab.evidence.report import envelope

    try:
        action()
    except E.TpuLabError as error:
        failure = error
    else:
        return
    print_envelope(envelope(command, ok=False, error=error_json(failure)), failure)
