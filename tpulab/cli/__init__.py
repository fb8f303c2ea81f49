"""The command line: flags in, core calls, text and exit statuses out.

This is the only module that prints or chooses an exit status. It imports the core
lazily inside each command so that `tpulab --help` does not pay for jax, paramiko or
google-cloud (a test checks `sys.modules`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, NoReturn, TypeVar

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
        typer.Option(
            "--version", callback=_version_callback, is_eager=True, help="Show the version."
        ),
    ] = False,
) -> None:
    """Run a JAX experiment on a Cloud TPU VM and never leave it billing."""


# --- verify and receipts --------------------------------------------------------------
# The core builds report lines (tpulab.render) and raises; this section only prints them
# and picks the exit status. Imports stay inside the commands so --help stays light.

if TYPE_CHECKING:
    from tpulab.receipts import Expectation

_LOCAL_MAX_DEVICES = 64
_DEFAULT_LOCAL_DEVICES = 4


def _print_lines(lines: list[list[tuple[str, str]]]) -> None:
    from rich.console import Console
    from rich.text import Text

    # soft_wrap: piped output keeps one report line per line instead of wrapping at 80.
    console = Console(highlight=False, soft_wrap=True)
    for line in lines:
        console.print(Text.assemble(*line))


def _print_json(data: object) -> None:
    import json

    typer.echo(json.dumps(data, indent=2, sort_keys=False, default=str))


def _error_json(error: E.TpuLabError) -> dict[str, object]:
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


def _json_or_guarded(command: str, as_json: bool, action: Callable[[], None]) -> None:
    """Like guarded(), but with --json the error is the envelope on stdout as well."""
    if not as_json:
        guarded(action)
        return
    from tpulab.render import envelope

    try:
        action()
    except E.TpuLabError as error:
        _print_json(envelope(command, ok=False, error=_error_json(error)))
        raise typer.Exit(exit_status_for(error)) from None


def _local_expectation(
    accelerator: str | None, devices: int | None, expect_platform: str | None
) -> tuple[Expectation, str]:
    from tpulab.localrun import new_nonce
    from tpulab.receipts import PLATFORMS, Expectation, expectation_for

    if accelerator is not None and devices is not None:
        raise E.ConfigError(
            "--accelerator and --devices both set the device count.",
            hint="Give one: --accelerator v5litepod-4, or --devices 4.",
        )
    if expect_platform is not None and expect_platform not in PLATFORMS:
        raise E.ConfigError(
            f"Unknown platform {expect_platform!r} for --expect-platform.",
            hint="Use one of: " + ", ".join(PLATFORMS),
        )
    if devices is not None and not 1 <= devices <= _LOCAL_MAX_DEVICES:
        raise E.ConfigError(
            f"--devices {devices} is out of range for a local run.",
            hint=f"Use 1 to {_LOCAL_MAX_DEVICES} devices.",
        )
    nonce = new_nonce()
    if accelerator is not None:
        if expect_platform == "gpu":
            raise E.ConfigError(
                f"{accelerator} is a TPU; it cannot be expected on gpu.",
                hint="Use --expect-platform tpu, or cpu to emulate it (the default).",
            )
        # Locally, an accelerator is emulated on CPU unless the user insists on the
        # real TPU backend, which must then be present.
        emulated = expect_platform in (None, "cpu")
        return expectation_for(accelerator, emulated=emulated, nonce=nonce), nonce
    platform = expect_platform or "cpu"
    count = devices if devices is not None else _DEFAULT_LOCAL_DEVICES
    return Expectation(platform=platform, local_devices=count, nonce=nonce), nonce


def _verify_local(
    accelerator: str | None,
    devices: int | None,
    expect_platform: str | None,
    timeout: float,
    as_json: bool,
) -> None:
    import json

    from tpulab import render
    from tpulab.localrun import run_local_payload
    from tpulab.receipt_store import check_and_keep

    expectation, nonce = _local_expectation(accelerator, devices, expect_platform)
    if timeout <= 0:
        raise E.ConfigError(f"--timeout {timeout:g} must be positive.", hint="Try 300.")
    result = run_local_payload(
        devices=expectation.local_devices,
        platform=expectation.platform,
        nonce=nonce,
        emulated=expectation.emulated,
        timeout=timeout,
    )
    checked = check_and_keep(
        result.raw,
        expectation,
        source="local",
        extra_meta={
            "payload_exit_status": result.exit_status,
            "duration_s": round(result.duration, 3),
        },
    )
    receipt, results, kept = checked.receipt, checked.results, checked.stored
    if receipt is None:  # unreadable bytes: kept, and there is nothing to report on
        assert checked.error is not None
        raise checked.error
    if as_json:
        _print_json(
            render.envelope(
                "verify",
                ok=checked.verified,
                verdict=kept.verdict,
                expectation=expectation.to_dict(),
                requirements=[r.to_dict() for r in results],
                receipt_id=kept.id,
                receipt_path=str(kept.path),
                payload={"exit_status": result.exit_status, "duration_s": result.duration},
                receipt=json.loads(result.raw),
                error=_error_json(checked.error) if checked.error else None,
            )
        )
        if checked.error is not None:
            raise typer.Exit(exit_status_for(checked.error))
        return
    title = f"tpulab verify --local: {expectation.describe()}"
    _print_lines(
        [
            [(title, "bold")],
            *render.receipt_lines(receipt, expectation),
            *render.requirement_lines(results),
            render.verdict_line(results, expectation),
            *render.stored_lines(kept),
        ]
    )
    checked.raise_for_failure()


@app.command("verify")
def verify_command(
    local: Annotated[
        bool, typer.Option("--local", help="Run the payload on this machine (required for now).")
    ] = False,
    accelerator: Annotated[
        str | None,
        typer.Option(
            "--accelerator",
            help="Emulate this accelerator's host on CPU (its device count and sums).",
        ),
    ] = None,
    devices: Annotated[
        int | None,
        typer.Option(
            "--devices", help=f"CPU devices to run on (default {_DEFAULT_LOCAL_DEVICES})."
        ),
    ] = None,
    expect_platform: Annotated[
        str | None,
        typer.Option(
            "--expect-platform",
            help="Platform the run must use: cpu, tpu or gpu. An absent backend fails.",
        ),
    ] = None,
    timeout: Annotated[
        float, typer.Option("--timeout", help="Seconds before the payload is stopped.")
    ] = 300.0,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print a versioned JSON envelope instead.")
    ] = False,
) -> None:
    """Run the verifier payload locally and check its receipt (the CPU reference run)."""

    def action() -> None:
        if not local:
            raise E.ConfigError(
                "Only local verification is a separate command: pass --local.",
                hint="Remote verification is `tpulab run --accelerator TYPE`, which checks "
                "the receipt on the TPU VM before deleting it.",
            )
        _verify_local(accelerator, devices, expect_platform, timeout, as_json)

    _json_or_guarded("verify", as_json, action)


receipts_app = typer.Typer(
    help="Receipts kept on this machine (every verify and run keeps one).",
    no_args_is_help=False,
)
app.add_typer(receipts_app, name="receipts")


def _receipts_list(as_json: bool) -> None:
    from tpulab import render
    from tpulab.receipt_store import ReceiptStore

    kept = ReceiptStore().list()
    if as_json:
        summaries = [r.summary() for r in kept]
        _print_json(render.envelope("receipts list", ok=True, receipts=summaries))
        return
    _print_lines(render.receipts_table(kept))


@receipts_app.callback(invoke_without_command=True)
def _receipts_root(ctx: typer.Context) -> None:
    """Receipts kept on this machine; without a subcommand, list them."""
    if ctx.invoked_subcommand is None:
        guarded(lambda: _receipts_list(False))


@receipts_app.command("list")
def receipts_list_command(
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON envelope.")] = False,
) -> None:
    """List kept receipts, newest first."""
    _json_or_guarded("receipts list", as_json, lambda: _receipts_list(as_json))


def _receipts_show(receipt_id: str, as_json: bool) -> None:
    import json

    from tpulab import render
    from tpulab.receipt_store import ReceiptStore
    from tpulab.receipts import evaluate_receipt, parse_receipt

    kept = ReceiptStore().get(receipt_id)
    raw = kept.read_bytes()
    expectation = kept.expectation()
    parse_error: E.VerificationError | None = None
    try:
        receipt = parse_receipt(raw)
    except E.VerificationError as error:
        receipt, parse_error = None, error
    results = evaluate_receipt(receipt, expectation) if receipt and expectation else []
    if as_json:
        try:
            document: object = json.loads(raw)
        except ValueError:
            document = raw.decode("utf-8", "replace")
        _print_json(
            render.envelope(
                "receipts show",
                ok=True,
                stored=kept.summary(),
                receipt=document,
                recheck=[r.to_dict() for r in results],
                parse_error=_error_json(parse_error) if parse_error else None,
            )
        )
        return
    header: list[list[tuple[str, str]]] = [
        [("receipt ", "dim"), (kept.id, "bold"), (f"  {kept.verdict}", "bold")],
        [("  kept ", "dim"), (f"{kept.created.isoformat()}  {kept.path}", "")],
        [("  run ", "dim"), (f"{kept.run_id or '-'}  accelerator {kept.accelerator or '-'}", "")],
    ]
    if receipt is None:
        assert parse_error is not None
        _print_lines([*header, [("  unreadable: ", "bold red"), (parse_error.message, "red")]])
        return
    body = render.receipt_lines(receipt, expectation)
    if expectation is not None:
        body += [*render.requirement_lines(results), render.verdict_line(results, expectation)]
    _print_lines(header + body)


@receipts_app.command("show")
def receipts_show_command(
    receipt_id: Annotated[str, typer.Argument(help="A receipt id, or a unique prefix of one.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON envelope.")] = False,
) -> None:
    """Show one kept receipt, re-checked against the expectation it was verified with."""
    _json_or_guarded("receipts show", as_json, lambda: _receipts_show(receipt_id, as_json))


# --- end of verify and receipts -------------------------------------------------------


# --- teardown --verify (helper E) -----------------------------------------------------
# The sweep is tpulab.sweep; this section asks, prints and picks the exit status: 0 only
# when no tpulab node remains in scope, EXIT_TEARDOWN (with manual commands) otherwise.

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from tpulab.cloud import TpuApi
    from tpulab.sweep import Candidate, Scope, SweepPlan, SweepResult


def _age_text(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{minutes}m{int(seconds % 60):02d}s"
    return f"{minutes // 60}h{minutes % 60:02d}m"


def _cost_text(cost: float | None) -> str:
    return "?" if cost is None else f"~${cost:.2f}"


def _teardown_api(scope: Scope) -> AbstractContextManager[TpuApi]:
    from contextlib import nullcontext

    if scope.emulate:
        from tpulab.emulator.embedded import emulated_api

        return emulated_api(scope.project)
    from tpulab.cloud import GoogleTpuApi

    return nullcontext(GoogleTpuApi(scope.project, api_endpoint=scope.api_endpoint))


def _candidate_json(candidate: Candidate) -> dict[str, object]:
    node = candidate.node
    return {
        "project": node.project,
        "zone": node.zone,
        "name": node.name,
        "run_id": node.run_id,
        "state": node.state.value,
        "accelerator": node.accelerator_type,
        "age_seconds": candidate.age_seconds,
        "estimated_cost_usd": candidate.estimated_cost,
        "source": candidate.source,
        "live": candidate.live,
    }


def _print_plan(plan: SweepPlan) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from tpulab.catalog import PRICE_DATE
    from tpulab.sweep import sweep_command_for

    console = Console(highlight=False, soft_wrap=True)
    if not console.is_terminal:
        console = Console(highlight=False, soft_wrap=True, width=200)  # one row per line
    where = f"project {plan.project}, {plan.target}, zones {', '.join(plan.zones)}"
    if plan.run_id:
        where += f", run {plan.run_id}"
    console.print(f"Looked for tpulab nodes in {escape(where)}.")
    found = [*plan.candidates, *plan.live]
    if found:
        table = Table(box=None, pad_edge=False)
        for column in ("ZONE", "NODE", "STATE", "RUN ID", "AGE", "EST. COST", "FOUND BY"):
            table.add_column(column)
        for c in found:
            table.add_row(
                c.node.zone,
                c.node.name,
                c.node.state.value,
                c.run_id or "-",
                _age_text(c.age_seconds),
                _cost_text(c.estimated_cost),
                c.source + (" [yellow](run in progress)[/]" if c.live else ""),
            )
        console.print(table)
        console.print(f"Costs are estimates from list prices ({PRICE_DATE}).")
    else:
        console.print("No tpulab node found.")
    for c in plan.live:
        pid = c.row.pid if c.row else "?"
        console.print(
            f"[yellow]{escape(c.node.name)} belongs to a run still in progress (pid {pid}); "
            "it deletes its own node. Re-run when it ends, or pass --include-live.[/]"
        )
    for node in plan.lookalikes:
        console.print(f"Left alone: {escape(node.name)} has no tpulab labels (not ours).")
    for zone, message in plan.list_errors.items():
        console.print(f"[red]Could not list {escape(zone)}: {escape(message)}[/]")
    if plan.journal_error:
        console.print(
            f"[yellow]Journal unreadable; searched by labels only. {escape(plan.journal_error)}[/]"
        )
    if plan.stale_rows:
        ids = ", ".join(row.run_id for row in plan.stale_rows)
        console.print(f"Journal rows with no node left (will be closed): {escape(ids)}")
    for row in plan.other_rows:
        console.print(
            f"Open journal row for another target: run {escape(row.run_id)}; check it with "
            f"`{escape(sweep_command_for(row))}`"
        )


def _teardown_verify(
    *,
    zones: list[str],
    run_id: str | None,
    yes: bool,
    dry_run: bool,
    as_json: bool,
    emulate: bool,
    api_endpoint: str | None,
    project: str | None,
    include_live: bool,
    timeout: float,
) -> None:
    from tpulab.journal import Journal
    from tpulab.signals import shield, signals_to_teardown
    from tpulab.sweep import find_orphans, resolve_scope, sweep

    if not 0 < timeout <= 86400:
        raise E.ConfigError(f"--timeout {timeout:g} is out of range.", hint="Use 1 to 86400 s.")
    scope = resolve_scope(
        project=project,
        zones=zones,
        emulate=emulate,
        api_endpoint=api_endpoint,
        run_id=run_id,
        adc_project=_adc_project,
    )
    journal = Journal()
    result: SweepResult | None = None
    declined = ""
    with _teardown_api(scope) as api:
        plan = find_orphans(
            api,
            target=scope.target,
            zones=scope.zones,
            run_id=run_id,
            journal=journal,
            include_live=include_live,
        )
        if not as_json:
            _print_plan(plan)
        if dry_run:
            declined = "dry run: nothing was deleted"
        elif plan.candidates and not yes:
            if not sys.stdin.isatty():
                declined = "not deleted: stdin is not a terminal and --yes was not given"
            elif not typer.confirm(f"Delete {len(plan.candidates)} node(s)?", default=False):
                declined = "not deleted: declined at the prompt"
        if not declined:
            names = ", ".join(c.node.name for c in plan.candidates) or "nothing"
            commands = "\n  ".join(c.leaked().manual_delete_command() for c in plan.candidates)
            with (
                signals_to_teardown(_stderr, force_exit_status=EXIT_TEARDOWN),
                shield(f"deleting {names}", manual=commands or None),
            ):
                result = sweep(api, plan, journal=journal, timeout=timeout, notify=_stderr)
    _teardown_report(plan, result, declined, as_json)


def _teardown_error(
    plan: SweepPlan, result: SweepResult | None, declined: str
) -> E.TeardownError | None:
    """None when verified clean; otherwise the error naming every node that may remain."""
    if result is not None:
        if result.ok:
            return None
        leaked = result.leaked()
        problems = [f"{c.node.name}: {err.message}" for c, err in result.failed]
        errors = result.list_errors
        if result.remaining:
            problems.append("still listed: " + ", ".join(n.name for n in result.remaining))
    else:
        if plan.clean:
            return None
        leaked = [c.leaked() for c in [*plan.candidates, *plan.live]]
        problems = [f"{len(leaked)} tpulab node(s) remain ({declined})"] if declined else []
        if plan.live:
            problems.append(f"{len(plan.live)} belong to runs still in progress")
        errors = plan.list_errors
    problems += [f"zone {zone} could not be listed ({message})" for zone, message in errors.items()]
    return E.TeardownError(
        "Teardown NOT confirmed, resources may still be billing: " + "; ".join(problems) + ".",
        leaked,
    )


def _teardown_report(
    plan: SweepPlan, result: SweepResult | None, declined: str, as_json: bool
) -> None:
    from tpulab.render import envelope
    from tpulab.sweep import sweep_command_for

    error = _teardown_error(plan, result, declined)
    if as_json:
        failures = result.failed if result else []
        failed = [{"name": c.node.name, "error": e.message} for c, e in failures]
        _print_json(
            envelope(
                "teardown",
                ok=error is None,
                dry_run=declined.startswith("dry run"),
                project=plan.project,
                target=plan.target,
                zones=plan.zones,
                run_id=plan.run_id,
                found=[_candidate_json(c) for c in [*plan.candidates, *plan.live]],
                deleted=[c.node.name for c in result.deleted] if result else [],
                failed=failed,
                remaining=[n.name for n in result.remaining] if result else None,
                closed_journal_rows=result.closed_rows if result else [],
                untouched_unlabelled=[n.name for n in plan.lookalikes],
                list_errors=result.list_errors if result else plan.list_errors,
                other_targets=[sweep_command_for(row) for row in plan.other_rows],
                journal_error=plan.journal_error,
                not_deleted_because=declined or None,
                manual_commands=[n.manual_delete_command() for n in error.leaked] if error else [],
                error=_error_json(error) if error else None,
            )
        )
        if error is not None:
            raise typer.Exit(EXIT_TEARDOWN)
        return
    if result is not None:
        for candidate in result.deleted:
            typer.echo(f"Deleted and confirmed gone: {candidate.node.name}")
        if result.closed_rows:
            typer.echo("Closed journal rows: " + ", ".join(result.closed_rows))
        for warning in result.journal_warnings:
            _stderr(f"journal: {warning}")
    if error is not None:
        report_error(error)
    scope = f" for run {plan.run_id}" if plan.run_id else ""
    typer.echo(f"Verified: no tpulab node remains{scope} in {', '.join(plan.zones)}.")


@app.command("teardown")
def teardown_command(
    verify: Annotated[
        bool,
        typer.Option(
            "--verify",
            help="Find tpulab nodes left behind (journal + labels), delete them and confirm "
            "with a list. Required.",
        ),
    ] = False,
    zone: Annotated[
        list[str] | None,
        typer.Option("--zone", help="A zone to search (repeatable); journal zones are added."),
    ] = None,
    run_id: Annotated[
        str | None, typer.Option("--run-id", help="Only this run's node and journal row.")
    ] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Delete without asking.")] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show what would be deleted; delete nothing.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON envelope.")] = False,
    emulate: Annotated[
        bool, typer.Option("--emulate", help="Use the embedded emulator's state.")
    ] = False,
    api_endpoint: Annotated[
        str | None,
        typer.Option("--api-endpoint", help="A Cloud TPU API endpoint, e.g. an emulator URL."),
    ] = None,
    project: Annotated[str | None, typer.Option("--project", help="Google Cloud project.")] = None,
    include_live: Annotated[
        bool,
        typer.Option("--include-live", help="Also delete nodes of runs still in progress here."),
    ] = False,
    timeout: Annotated[
        float, typer.Option("--timeout", help="Seconds to wait for deletes to be confirmed.")
    ] = 600.0,
) -> None:
    """Delete every tpulab node a crashed or killed run left behind, and prove it.

    Exit 0 only when no tpulab node remains in the searched zones; otherwise exit 6
    with the manual delete commands (also for --dry-run when something was found).
    Nodes without tpulab's labels are never touched.
    """

    def action() -> None:
        if not verify:
            raise E.ConfigError(
                "teardown needs --verify.",
                hint="Run `tpulab teardown --verify` (add --dry-run to only look).",
            )
        _teardown_verify(
            zones=list(zone or []),
            run_id=run_id,
            yes=yes,
            dry_run=dry_run,
            as_json=as_json,
            emulate=emulate,
            api_endpoint=api_endpoint,
            project=project,
            include_live=include_live,
            timeout=timeout,
        )

    _json_or_guarded("teardown", as_json, action)


# --- end of teardown --verify ---------------------------------------------------------


# --- list and emulator serve (helper B) ------------------------------------------------
# tpulab.listing reads the nodes and prices them; this section prints them. `emulator
# serve` runs tpulab.emulator in the foreground until Ctrl-C or SIGTERM.

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from tpulab.cloud import TpuApi
    from tpulab.listing import Listing


def _list_age(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{minutes}m{int(seconds % 60):02d}s"
    return f"{minutes // 60}h{minutes % 60:02d}m"


def _list_table(listing: Listing, journal_states: dict[tuple[str, str, str], str]) -> None:
    from rich.console import Console
    from rich.table import Table

    from tpulab.catalog import PRICE_DATE

    console = Console(highlight=False, soft_wrap=True)
    if not console.is_terminal:
        # Piped output (scripts, grep) keeps one row per line instead of wrapping at 80.
        console = Console(highlight=False, soft_wrap=True, width=200)
    where = f"{', '.join(listing.zones)} (project {listing.project})"
    if not listing.nodes:
        extra = f"; {listing.hidden} other node(s): use --all" if listing.hidden else ""
        which = "nodes" if listing.include_all else "tpulab-managed nodes"
        console.print(f"No {which} in {where}{extra}.")
        return
    table = Table(box=None, pad_edge=False)
    for column in ("NAME", "ZONE", "TYPE", "STATE", "AGE", "RUN ID", "EST. COST"):
        table.add_column(column)
    if journal_states:
        table.add_column("JOURNAL")
    for item in listing.nodes:
        node = item.node
        row = [
            node.name,
            node.zone,
            node.accelerator_type + (" (spot)" if node.spot else ""),
            node.state.value,
            _list_age(item.age_seconds),
            node.run_id or "-",
            "?" if item.estimated_cost is None else f"~${item.estimated_cost:.2f}",
        ]
        if journal_states:
            row.append(journal_states.get((node.project, node.zone, node.name), "-"))
        table.add_row(*row)
    console.print(table)
    hidden = f"; {listing.hidden} non-tpulab node(s) hidden (--all)" if listing.hidden else ""
    console.print(
        f"{len(listing.nodes)} node(s) in {where}{hidden}. Estimated cost so far "
        f"~${listing.estimated_total:.2f} at {PRICE_DATE} list prices (an estimate, not a bill)."
    )


def _list(
    *,
    zones: list[str],
    include_all: bool,
    as_json: bool,
    emulate: bool,
    api_endpoint: str | None,
    project: str | None,
) -> None:
    from contextlib import nullcontext

    from tpulab.journal import journal_view
    from tpulab.listing import list_nodes
    from tpulab.sweep import resolve_scope

    scope = resolve_scope(project=project, zones=zones, emulate=emulate, api_endpoint=api_endpoint)
    if not scope.zones:
        raise E.ConfigError(
            "No zone to list.",
            hint="Pass --zone (repeatable), set TPULAB_ZONE, or run `gcloud config set "
            "compute/zone ZONE`.",
        )
    if scope.emulate:
        from tpulab.emulator.embedded import emulated_api

        context: AbstractContextManager[TpuApi] = emulated_api(scope.project)
    else:
        from tpulab.cloud import GoogleTpuApi

        context = nullcontext(GoogleTpuApi(scope.project, api_endpoint=scope.api_endpoint))
    with context as api:
        listing = list_nodes(api, scope.zones, include_all=include_all)
    view = journal_view([item.node for item in listing.nodes], zones=scope.zones)
    if as_json:
        from tpulab.catalog import PRICE_DATE
        from tpulab.render import envelope

        nodes = []
        for item in listing.nodes:
            key = (item.node.project, item.node.zone, item.node.name)
            nodes.append({**item.to_json(), "journal": view.states.get(key)})
        _print_json(
            envelope(
                "list",
                ok=True,
                project=listing.project,
                zones=listing.zones,
                include_all=include_all,
                nodes=nodes,
                hidden=listing.hidden,
                estimated_total_usd=round(listing.estimated_total, 4),
                price_date=PRICE_DATE,
                journal_missing=[
                    {"run_id": r.run_id, "zone": r.zone, "node": r.node_name} for r in view.missing
                ],
                journal_error=view.error,
            )
        )
        return
    _list_table(listing, view.states)
    for row in view.missing:
        _stderr(
            f"[yellow]journal:[/] run {row.run_id} (node {row.node_name} in {row.zone}) is "
            "still open but the API does not list its node; `tpulab teardown --verify` "
            "closes it."
        )
    if view.error:
        _stderr(f"[yellow]journal unreadable:[/] {view.error}")


@app.command("list")
def list_command(
    zone: Annotated[
        list[str] | None,
        typer.Option("--zone", help="A zone to list (repeatable); default: the configured zone."),
    ] = None,
    include_all: Annotated[
        bool, typer.Option("--all", help="Show every node, not only tpulab's.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON envelope.")] = False,
    project: Annotated[str | None, typer.Option("--project", help="Google Cloud project.")] = None,
    api_endpoint: Annotated[
        str | None,
        typer.Option("--api-endpoint", help="A Cloud TPU API endpoint, e.g. an emulator URL."),
    ] = None,
    emulate: Annotated[
        bool, typer.Option("--emulate", help="List the embedded emulator's nodes.")
    ] = False,
) -> None:
    """List tpulab's TPU nodes with zone, type, state, age, run id and estimated cost."""
    _json_or_guarded(
        "list",
        as_json,
        lambda: _list(
            zones=list(zone or []),
            include_all=include_all,
            as_json=as_json,
            emulate=emulate,
            api_endpoint=api_endpoint,
            project=project,
        ),
    )


emulator_app = typer.Typer(
    help="The offline Cloud TPU API emulator (also usable with gcloud).",
    no_args_is_help=True,
)
app.add_typer(emulator_app, name="emulator")


@emulator_app.command("serve")
def emulator_serve_command(
    port: Annotated[int, typer.Option("--port", help="Port to listen on (0: any free).")] = 8470,
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    state: Annotated[
        str | None,
        typer.Option("--state", help="State directory (default: tpulab's emulator state)."),
    ] = None,
    ssh: Annotated[
        str,
        typer.Option("--ssh", help="SSH hosts behind READY nodes: embedded, openssh or none."),
    ] = "embedded",
    create_seconds: Annotated[
        float, typer.Option("--create-seconds", help="Seconds from CREATING to READY.")
    ] = 3.0,
    delete_seconds: Annotated[
        float, typer.Option("--delete-seconds", help="Seconds from DELETING to gone.")
    ] = 1.0,
) -> None:
    """Serve the Cloud TPU API emulator in the foreground until Ctrl-C."""

    def action() -> None:
        _serve(port, host, state, ssh, create_seconds, delete_seconds)

    guarded(action)


def _serve(
    port: int, host: str, state: str | None, ssh: str, create_seconds: float, delete_seconds: float
) -> None:
    import signal
    import threading
    from pathlib import Path

    from tpulab import paths
    from tpulab.config import EMULATED_PROJECT, EMULATED_ZONE
    from tpulab.emulator import Emulator, Timing

    if ssh not in {"embedded", "openssh", "none"}:
        raise E.ConfigError(f"Unknown --ssh {ssh!r}.", hint="Use embedded, openssh or none.")
    if create_seconds < 0 or delete_seconds < 0 or not 0 <= port <= 65535:
        raise E.ConfigError(
            "Invalid --port, --create-seconds or --delete-seconds.",
            hint="Seconds must be >= 0 and the port 0..65535.",
        )
    state_dir = Path(state).expanduser() if state else paths.emulator_state_dir()
    backend = None
    if ssh != "none":
        from tpulab.emulator.backends import make_host_backend

        backend = make_host_backend("openssh" if ssh == "openssh" else "embedded", state_dir)
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    emulator = Emulator(
        state_dir,
        host_backend=backend,
        timing=Timing(create_seconds=create_seconds, delete_seconds=delete_seconds),
        host=host,
        port=port,
    )
    try:
        try:
            url = emulator.start()
        except OSError as error:
            raise E.ConfigError(
                f"Cannot listen on {host}:{port}: {error.strerror or error}.",
                hint="Pick another --port (or --port 0 for any free one).",
            ) from None
        typer.echo(f"Cloud TPU API emulator listening on {url}", err=False)
        typer.echo(f"  state: {state_dir}  ssh hosts: {ssh}")
        typer.echo(
            f"  tpulab: tpulab run --accelerator v5litepod-4 --api-endpoint {url} "
            f"--project {EMULATED_PROJECT} --zone {EMULATED_ZONE}"
        )
        typer.echo(
            f"  gcloud: export CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU={url}/ "
            f"CLOUDSDK_AUTH_DISABLE_CREDENTIALS=true CLOUDSDK_CORE_PROJECT={EMULATED_PROJECT}"
        )
        typer.echo(f"  faults: curl -X POST {url}/_emulator/faults -d '{{\"stockout\": true}}'")
        typer.echo("Press Ctrl-C to stop.")
        if host not in {"127.0.0.1", "localhost", "::1"}:
            _stderr(
                f"[yellow]warning:[/] listening on {host}: anyone who can reach it can create "
                "nodes and inject faults (the emulator has no authentication)."
            )
        sys.stdout.flush()
        try:
            while not stop.wait(0.5):
                pass
        except KeyboardInterrupt:
            pass
    finally:
        emulator.stop()
        if backend is not None:
            backend.close()
        signal.signal(signal.SIGTERM, previous)
    typer.echo("Emulator stopped; its state is kept in " + str(state_dir))


# --- end of list and emulator serve ----------------------------------------------------


# --- run (helper D) -------------------------------------------------------------------
# tpulab.lifecycle drives the run and tpulab.run_report builds the summary and envelope;
# this section draws the progress (one line per phase, spinner and elapsed time), wires
# the signals, the journal and the target (Google, embedded emulator or an endpoint).

if TYPE_CHECKING:
    from contextlib import ExitStack

    from rich.console import RenderableType
    from rich.live import Live

    from tpulab.cloud import TpuApi
    from tpulab.config import RunSpec
    from tpulab.progress import Phase


class _RunDisplay:
    """Draws the run's progress (a RunObserver): a live spinner on a terminal, one plain
    line per phase otherwise; remote output only with -v."""

    def __init__(self, *, verbose: bool, quiet: bool) -> None:
        from rich.console import Console

        self.quiet = quiet
        self.verbose = verbose
        # With --json stdout carries only the envelope; everything else goes to stderr.
        self.console = Console(highlight=False, soft_wrap=True, stderr=quiet)
        self._live: Live | None = None
        self._current: tuple[Phase, float] | None = None

    def __rich__(self) -> RenderableType:
        import time

        from rich.spinner import Spinner

        if self._current is None:
            return ""
        phase, started = self._current
        return Spinner("dots", text=f"{phase.label}  {time.monotonic() - started:5.1f}s")

    def _print(self, text: object) -> None:
        if self._live is not None:
            self._live.console.print(text)
        else:
            self.console.print(text)

    def phase_started(self, phase: Phase) -> None:
        import time

        self._current = (phase, time.monotonic())
        if self.quiet:
            return
        if self.console.is_terminal and self._live is None:
            from rich.live import Live

            live = Live(self, console=self.console, refresh_per_second=10, transient=True)
            live.start()
            self._live = live
        elif not self.console.is_terminal:
            self.console.print(f"... {phase.label}")

    def _done(self, phase: Phase, seconds: float, mark: str, detail: str) -> None:
        from rich.markup import escape

        # The spinner lives only while a phase runs; stopping it before printing the
        # phase's line keeps a transient live area from ever overwriting that line.
        self.stop()
        self._current = None
        if not self.quiet:
            self.console.print(f"{mark} {phase.label:<24} {seconds:6.1f}s  {escape(detail)}")

    def phase_finished(self, phase: Phase, seconds: float, detail: str) -> None:
        self._done(phase, seconds, "[green]✓[/]", detail)

    def phase_failed(self, phase: Phase, seconds: float, error: BaseException) -> None:
        message = error.message if isinstance(error, E.TpuLabError) else type(error).__name__
        self._done(phase, seconds, "[red]✗[/]", message)

    def remote_output(self, stream: str, line: str) -> None:
        from rich.text import Text

        if self.verbose:
            style = "dim" if stream == "stdout" else "dim yellow"
            self._print(Text(f"  │ {line}", style=style))

    def note(self, message: str) -> None:
        from rich.text import Text

        if not self.quiet:
            self._print(Text(f"  · {message}", style="dim"))

    def milestone(self, name: str, at: float) -> None:
        pass

    def stop(self) -> None:
        live, self._live = self._live, None
        if live is not None:
            live.stop()


def _run_target(spec: RunSpec, ssh_backend: str, stack: ExitStack) -> TpuApi:
    """The API a run talks to; an embedded emulator lives as long as `stack`."""
    if spec.mode == "emulate":
        from tpulab.emulator.embedded import emulated_target

        target = stack.enter_context(
            emulated_target(
                spec.project.value,
                spec.zone.value,
                ssh="openssh" if ssh_backend == "openssh" else "embedded",
            )
        )
        # Its OpenSSH hosts publish the login user they need (tpulab-emulator/ssh-user).
        return target.api
    from tpulab.cloud import GoogleTpuApi

    return GoogleTpuApi(spec.project.value, api_endpoint=spec.api_endpoint)


def _adc_project() -> str | None:
    # Imported here: google.auth is heavy and only a real (non-dry) run needs it.
    from tpulab.cloud import adc_project

    return adc_project()


def _run_dry(spec: RunSpec, installer: str, as_json: bool) -> None:
    from rich.console import Console
    from rich.markup import escape

    from tpulab.plan import build_plan, plan_envelope

    steps = build_plan(spec, installer="pip" if installer == "pip" else "uv")
    if as_json:
        _print_json(plan_envelope(spec, steps))
        return
    console = Console(highlight=False, soft_wrap=True)
    accel = spec.accelerator
    tag = " (EMULATED)" if spec.emulated else ""
    console.print(
        f"[bold]Plan for run {spec.run_id}[/]{tag}: {accel.name} as node {spec.node_name}, "
        f"project {escape(spec.project.value)} ({escape(spec.project.source)}), zone "
        f"{spec.zone.value} ({escape(spec.zone.source)}); est. "
        f"${accel.price_per_hour(spot=spec.spot):.2f}/h. Nothing is contacted."
    )
    for number, step in enumerate(steps, 1):
        console.print(
            f"{number:>2}. [cyan]{step.kind:<5}[/] [bold]{step.phase}[/] {escape(step.action)}"
        )
        if step.why:
            console.print(f"          [dim]{escape(step.why)}[/]")


def _run(
    *,
    spec: RunSpec,
    ssh_backend: str,
    installer: str,
    as_json: bool,
    verbose: bool,
) -> None:
    from contextlib import ExitStack

    from tpulab.journal import RunJournalAdapter
    from tpulab.lifecycle import Lifecycle
    from tpulab.progress import FanOut, Recorder
    from tpulab.run_report import run_envelope, summary_lines
    from tpulab.signals import shield, signals_to_teardown

    recorder = Recorder()
    display = _RunDisplay(verbose=verbose, quiet=as_json)
    life: Lifecycle | None = None
    failure: E.TpuLabError | None = None
    journal = RunJournalAdapter()
    try:
        with ExitStack() as stack:
            api = _run_target(spec, ssh_backend, stack)
            life = Lifecycle(
                spec,
                api=api,
                journal=journal,
                observer=FanOut([recorder, display]),
                shield=shield,
                installer="pip" if installer == "pip" else "uv",
            )
            with signals_to_teardown(lambda m: _stderr(m), force_exit_status=EXIT_TEARDOWN):
                life.run()
    except E.TpuLabError as error:
        failure = error
    finally:
        display.stop()
    for warning in journal.warnings:
        _stderr(f"[yellow]warning:[/] {warning}")
    if as_json:
        report = _error_json(failure) if failure else None
        if life is None:
            from tpulab.render import envelope

            _print_json(envelope("run", ok=False, run_id=spec.run_id, error=report))
        else:
            _print_json(run_envelope(life.outcome, recorder, error=report))
        if failure is not None:
            raise typer.Exit(exit_status_for(failure))
        return
    if life is not None and (life.outcome.create_sent or life.outcome.verdict):
        _print_lines(summary_lines(life.outcome))
    if failure is not None:
        report_error(failure)


@app.command("run")
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
            adc_project=None if dry_run else _adc_project,
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

    _json_or_guarded("run", as_json, action)


# --- end of run -----------------------------------------------------------------------


def main() -> None:
    app(prog_name="tpulab")


if __name__ == "__main__":
    main()
