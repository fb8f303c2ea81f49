"""`tpulab teardown --verify`: delete the tpulab nodes a crashed run left, and prove it.

The sweep is tpulab.cleanup.sweep; this module asks, prints and picks the exit status: 0 only
when no tpulab node remains in scope, EXIT_TEARDOWN (with manual commands) otherwise.
A live session's node (`tpulab up`) is kept unless --include-sessions is given or the
user says yes to its own question; kept sessions do not count as remaining (exit 0):
they are recorded here, guarded by their watchdog, and `tpulab down` ends them. A node
this journal does not know whose watchdog's lease is fresh is live work of another
machine or home ("live elsewhere"): kept the same way, unless --include-live or a yes
at its own question.
`teardown --forget` (tpulab.cleanup.forget) closes the journal rows of an endpoint that
is gone, after seeing it refuse the connection and asking.
"""

import sys
from typing import TYPE_CHECKING, Annotated

import typer

from tpulab.cli._console import age_text, cost_text, print_stderr, table_console
from tpulab.cli._exit import error_report, json_or_guarded, print_envelope, report_error
from tpulab.cli._target import adc_project, reach_notice, tpu_api
from tpulab.errors import TARGET_GOOGLE, ConfigError
from tpulab.exits import EXIT_TEARDOWN

if TYPE_CHECKING:
    from tpulab.cleanup.journal import Journal
    from tpulab.cleanup.sweep import SweepPlan, SweepResult
    from tpulab.cloud.api import TpuApi

__all__ = ["teardown_command"]


def _print_plan(plan: "SweepPlan") -> None:
    from rich.markup import escape
    from rich.table import Table

    from tpulab.catalog import PRICE_DATE
    from tpulab.cleanup.providers import provider_name
    from tpulab.cleanup.sweep import forget_command_for, sweep_command_for

    console = table_console()
    where = f"project {plan.project}, {plan.target}, zones {', '.join(plan.zones)}"
    if plan.run_id:
        where += f", run {plan.run_id}"
    console.print(f"Looked for tpulab nodes in {escape(where)}.")
    found = [*plan.candidates, *plan.live, *plan.sessions, *plan.elsewhere]
    if found:
        table = Table(box=None, pad_edge=False)
        columns = ("ZONE", "NODE", "STATE", "RUN ID", "AGE", "EST. COST", "PROVIDER", "FOUND BY")
        for column in columns:
            table.add_column(column)
        for c in found:
            table.add_row(
                c.node.zone,
                c.node.name,
                c.node.state.value,
                c.run_id or "-",
                age_text(c.age_seconds),
                cost_text(c.estimated_cost),
                c.provider,
                c.source
                + (" [yellow](run in progress)[/]" if c.live else "")
                + (f" (session {escape(c.session)})" if c.session else "")
                + (" [yellow](live elsewhere)[/]" if c in plan.elsewhere else ""),
            )
        console.print(table)
        console.print(f"Costs are estimates from list prices ({PRICE_DATE}).")
    elif plan.list_errors:
        console.print("No tpulab node found in the zones that could be listed.")
    else:
        console.print("No tpulab node found.")
    for c in plan.live:
        pid = c.row.pid if c.row else "?"
        console.print(
            f"[yellow]{escape(c.node.name)} belongs to a run still in progress (pid {pid}); "
            "it deletes its own node. Re-run when it ends, or pass --include-live.[/]"
        )
    for c in plan.sessions:
        console.print(
            f"{escape(c.node.name)} is session {escape(c.session or '?')}'s node, live "
            "(tpulab up): kept unless --include-sessions or you say yes."
        )
    for c in plan.elsewhere:
        assert c.liveness is not None
        console.print(
            f"[yellow]{escape(c.node.name)}: {escape(c.liveness.describe())}; not in this "
            "machine's journal: kept unless --include-live or you say yes.[/]"
        )
    for c in plan.unjudged:
        assert c.liveness is not None
        console.print(
            f"{escape(c.node.name)}: {escape(c.liveness.describe())}; not in this "
            "machine's journal: judged a leftover by the journal alone."
        )
    for c in plan.candidates:
        if c.liveness is not None and c.liveness.lease is not None:
            console.print(f"{escape(c.node.name)}: {escape(c.liveness.describe())}: a leftover.")
    for node in plan.lookalikes:
        console.print(f"Left alone: {escape(node.name)} has no tpulab labels (not ours).")
    for zone, message in plan.list_errors.items():
        console.print(f"[red]Could not list {escape(zone)}: {escape(message)}[/]")
    for provider, message in plan.unasked.items():
        # No journal row needed it (else it is a list error above): said, not fatal.
        console.print(
            f"[yellow]{escape(provider_name(provider))} could not be asked (no journal row "
            f"here needs it); its resources were not searched: {escape(message)}[/]"
        )
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
        forget = forget_command_for(row)
        if forget:
            console.print(f"  (if {escape(row.target)} is gone for good: `{escape(forget)}`)")


def _teardown_verify(
    *,
    verify: bool,
    forget: bool,
    zones: list[str],
    run_id: str | None,
    yes: bool,
    dry_run: bool,
    as_json: bool,
    emulate: bool,
    api_endpoint: str | None,
    project: str | None,
    include_live: bool,
    include_sessions: bool,
    timeout: float,
) -> None:
    from tpulab.app.target import provider_apis
    from tpulab.cleanup.journal import Journal
    from tpulab.cleanup.sweep import find_in_scope, sweep_shielded
    from tpulab.config import teardown_inputs

    inputs = teardown_inputs(
        verify=verify,
        forget=forget,  # both given: teardown_inputs refuses
        project=project,
        zones=zones,
        emulate=emulate,
        api_endpoint=api_endpoint,
        run_id=run_id,
        timeout=timeout,
        adc_project=adc_project,
        include_sessions=include_sessions,
    )
    scope, timeout = inputs.scope, inputs.timeout
    journal = Journal()
    result: SweepResult | None = None
    declined = ""
    with provider_apis(
        scope.project, emulate=scope.emulate, api_endpoint=scope.api_endpoint, notify=reach_notice
    ) as apis:
        plan = find_in_scope(
            apis,
            scope,
            journal=journal,
            include_live=include_live,
            include_sessions=include_sessions,
        )
        if not as_json:
            _print_plan(plan)
        if dry_run:
            declined = "dry run: nothing was deleted"
        elif plan.sessions and not yes and sys.stdin.isatty():
            # Its own question: a session is in use, so "delete the leftovers" must not
            # take it along by surprise.
            names = ", ".join(c.session or c.node.name for c in plan.sessions)
            if typer.confirm(
                f"Also delete {len(plan.sessions)} live session(s) ({names})?", default=False
            ):
                plan.include_sessions()
        if not dry_run and plan.elsewhere and not yes and sys.stdin.isatty():
            # Someone else's live work: asked apart, never taken along by "delete".
            names = ", ".join(c.node.name for c in plan.elsewhere)
            if typer.confirm(
                f"Also delete {len(plan.elsewhere)} node(s) live elsewhere ({names})?",
                default=False,
            ):
                plan.include_elsewhere()
        if declined:
            pass
        elif plan.candidates and not yes:
            if not sys.stdin.isatty():
                declined = "not deleted: stdin is not a terminal and --yes was not given"
            elif not typer.confirm(f"Delete {len(plan.candidates)} node(s)?", default=False):
                declined = "not deleted: declined at the prompt"
        if not declined:
            result = sweep_shielded(
                apis,
                plan,
                journal=journal,
                timeout=timeout,
                notify=print_stderr,
                force_exit_status=EXIT_TEARDOWN,
            )
        unreachable = _unreachable(apis["tpu-api"])
    if unreachable is not None and not as_json:
        _say_unreachable(journal, plan, result, unreachable)
    _teardown_report(plan, result, declined, dry_run, as_json)


def _unreachable(api: "TpuApi") -> str | None:
    from tpulab.cloud.google import GoogleTpuApi

    return api.unreachable if isinstance(api, GoogleTpuApi) else None


def _say_unreachable(
    journal: "Journal", plan: "SweepPlan", result: "SweepResult | None", why: str
) -> None:
    """After a sweep whose endpoint never answered: what that means for the user's nodes
    (the exit status is already EXIT_TEARDOWN's, set by the report above)."""
    deleted = "" if result is None or not result.deleted else " (only those listed above)"
    rows = [row.run_id for row in journal.open_runs() if row.target == plan.target]
    held = (
        f"The journal still holds {len(rows)} run(s) ({', '.join(rows)}) whose node may exist"
        if rows
        else "No journal row here names a node there, but the zones could not be listed"
    )
    where = "" if plan.target == TARGET_GOOGLE else f" --api-endpoint {plan.target}"
    print_stderr(
        f"Nothing was deleted{deleted}: the Cloud TPU API could not be reached ({why}). "
        f"{held}; run `tpulab teardown --verify{where}` again once it answers."
    )


# How long the probe of `--forget` retries a refused connection before believing it: an
# emulator being restarted comes back within that.
_FORGET_PROBE_SECONDS = 3.0


def _teardown_forget(
    *,
    zones: list[str],
    run_id: str | None,
    yes: bool,
    dry_run: bool,
    as_json: bool,
    api_endpoint: str | None,
    project: str | None,
    timeout: float,
    include_sessions: bool = False,
) -> None:
    from tpulab.cleanup.forget import describe, forget, plan_forget
    from tpulab.cleanup.journal import Journal
    from tpulab.config import teardown_inputs
    from tpulab.errors import target_for

    scope = teardown_inputs(
        verify=False,
        forget=True,
        project=project,
        zones=[],
        emulate=False,
        api_endpoint=api_endpoint,
        run_id=run_id,
        timeout=timeout,
        adc_project=adc_project,
        include_sessions=include_sessions,
    ).scope
    if zones:
        raise ConfigError(
            "--zone does not apply to --forget: it closes the endpoint's rows (all, or "
            "--run-id's).",
            hint="Drop --zone; pass --run-id to forget one run only.",
        )
    if as_json:
        raise ConfigError(
            "teardown --forget has no --json output.",
            hint="Run it without --json; `tpulab list --json` shows the rows afterwards.",
        )
    target = target_for(scope.api_endpoint)
    api = tpu_api(
        scope.project,
        api_endpoint=scope.api_endpoint,
        retry_for=_FORGET_PROBE_SECONDS,
        request_timeout=10.0,
    )
    journal = Journal()
    plan = plan_forget(api, journal, target=target, run_id=scope.run_id)
    typer.echo(f"{target} is gone: {plan.evidence}")
    typer.echo(f"Open journal rows for it (project {scope.project}):")
    for line in describe(plan.rows):
        typer.echo(f"  {line}")
    typer.echo(
        "Nothing can confirm these nodes are gone. Forget them only if that endpoint no "
        "longer exists (a stopped `tpulab emulator serve`); if it comes back, "
        "`tpulab teardown --verify` still finds its nodes by their labels."
    )
    if dry_run:
        typer.echo("Dry run: nothing was changed.")
        return
    if not yes:
        if not sys.stdin.isatty():
            raise ConfigError(
                "Not forgotten: stdin is not a terminal and --yes was not given.",
                hint="Re-run with --yes to forget these rows without asking.",
            )
        if not typer.confirm(f"Forget {len(plan.rows)} journal row(s)?", default=False):
            typer.echo("Not forgotten (declined): nothing was changed.")
            return
    closed = forget(journal, plan)
    typer.echo(f"Forgotten (target gone): {', '.join(closed)}.")


def _teardown_report(
    plan: "SweepPlan", result: "SweepResult | None", declined: str, dry_run: bool, as_json: bool
) -> None:
    from tpulab.cleanup.report import teardown_envelope, teardown_error

    error = teardown_error(plan, result, declined)
    if as_json:
        report = error_report(error) if error else None
        document = teardown_envelope(
            plan, result, declined, dry_run=dry_run, error=error, report=report
        )
        print_envelope(document, error)  # a TeardownError exits EXIT_TEARDOWN
        return
    if result is not None:
        for candidate in result.deleted:
            typer.echo(f"Deleted and confirmed gone: {candidate.node.name}")
        if result.closed_rows:
            typer.echo("Closed journal rows: " + ", ".join(result.closed_rows))
        if result.vanished_rows:
            from tpulab.cleanup.journal import VANISHED

            ids = ", ".join(result.vanished_rows)
            typer.echo(f"Their nodes were already gone ({VANISHED}): {ids}")
        if result.ended_sessions:
            ended = ", ".join(result.ended_sessions)
            typer.echo(f"Sessions ended (node gone; key and state removed): {ended}")
        for warning in result.journal_warnings:
            print_stderr(f"journal: {warning}")
    for c in plan.sessions:
        typer.echo(
            f"Kept session {c.session} (node {c.node.name}): `tpulab down {c.session}` or "
            "--include-sessions."
        )
    for c in plan.elsewhere:
        assert c.liveness is not None
        typer.echo(f"Kept {c.node.name}: {c.liveness.describe()}; --include-live deletes it.")
    if error is not None:
        report_error(error)
    scope = f" for run {plan.run_id}" if plan.run_id else ""
    live = ""
    if plan.live:
        live = f"; {len(plan.live)} node(s) of runs still in progress delete themselves"
    kept = ""
    if result is not None and result.kept_sessions:
        # The final list proved it: nothing but the kept sessions' nodes is left.
        kept = f"; only the {len(result.kept_sessions)} kept session node(s) remain"
    elif plan.sessions:
        kept = f"; {len(plan.sessions)} live session node(s) kept"
    if result is not None and result.kept_elsewhere:
        kept += f"; only the {len(result.kept_elsewhere)} node(s) live elsewhere remain"
    elif plan.elsewhere:
        kept += f"; {len(plan.elsewhere)} node(s) live elsewhere kept"
    typer.echo(f"Verified: no tpulab node remains{scope} in {', '.join(plan.zones)}{live}{kept}.")


def teardown_command(
    verify: Annotated[
        bool,
        typer.Option(
            "--verify",
            help="Find tpulab nodes left behind (journal + labels), delete them and confirm "
            "with a list.",
        ),
    ] = False,
    forget: Annotated[
        bool,
        typer.Option(
            "--forget",
            help="Instead of --verify: close the journal rows of an --api-endpoint that no "
            "longer exists (it must refuse the connection), after asking.",
        ),
    ] = False,
    zone: Annotated[
        list[str] | None,
        typer.Option("--zone", help="A zone to search (repeatable); journal zones are added."),
    ] = None,
    run_id: Annotated[
        str | None, typer.Option("--run-id", help="Only this run's node and journal row.")
    ] = None,
    yes: Annotated[
        bool, typer.Option("--yes", "-y", help="Delete (with --forget: forget) without asking.")
    ] = False,
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
        typer.Option(
            "--include-live",
            help="Also delete nodes of runs still in progress here, and nodes live "
            "elsewhere (not in this journal, their watchdog's lease fresh).",
        ),
    ] = False,
    include_sessions: Annotated[
        bool,
        typer.Option(
            "--include-sessions",
            help="Also delete live sessions' nodes (`tpulab up`); without it they are kept "
            "(asked in a terminal).",
        ),
    ] = False,
    timeout: Annotated[
        float, typer.Option("--timeout", help="Seconds to wait for deletes to be confirmed.")
    ] = 600.0,
) -> None:
    """Delete every tpulab node a crashed or killed run left behind, and prove it.

    Exit 0 only when no tpulab node remains in the searched zones; otherwise exit 6
    with the manual delete commands (also for --dry-run when something was found).
    Nodes without tpulab's labels are never touched. A live session's node (`tpulab
    up`) is kept unless --include-sessions (or a yes at its own prompt): kept sessions
    are listed and do not make the exit status non-zero. So is a node live elsewhere (not
    in this journal, its watchdog's lease fresh: another machine's or home's session or
    run), unless --include-live or a yes at its own prompt. With --forget, journal rows of a
    gone endpoint are closed as "forgotten" instead (exit 2 if it still answers).
    """

    def action() -> None:
        if forget and not verify:
            _teardown_forget(
                zones=list(zone or []),
                run_id=run_id,
                yes=yes,
                dry_run=dry_run,
                as_json=as_json,
                api_endpoint=api_endpoint,
                project=project,
                timeout=timeout,
                include_sessions=include_sessions,
            )
            return
        _teardown_verify(
            verify=verify,
            forget=forget,
            zones=list(zone or []),
            run_id=run_id,
            yes=yes,
            dry_run=dry_run,
            as_json=as_json,
            emulate=emulate,
            api_endpoint=api_endpoint,
            project=project,
            include_live=include_live,
            include_sessions=include_sessions,
            timeout=timeout,
        )

    json_or_guarded("teardown", as_json, action)
