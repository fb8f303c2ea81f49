"""`tpulab list`: tpulab's TPU nodes and Compute instances with zone, type, state, age,
run id and cost.

tpulab.cleanup.listing reads the nodes and prices them; this module prints them, with the
journal's view of each node next to it.
"""

import dataclasses
from typing import TYPE_CHECKING, Annotated

import typer

from tpulab.cli._console import age_text, cost_text, print_stderr, table_console
from tpulab.cli._exit import json_or_guarded, print_envelope
from tpulab.cli._target import adc_project, reach_notice

if TYPE_CHECKING:
    from tpulab.cleanup.listing import Listing
    from tpulab.cleanup.sessions import SessionFiles

__all__ = ["list_command"]


def _list_table(listing: "Listing", journal_states: dict[tuple[str, str, str], str]) -> None:
    from rich.table import Table

    from tpulab.catalog import PRICE_DATE

    console = table_console()
    where = f"{', '.join(listing.zones)} (project {listing.project})"
    if not listing.nodes:
        extra = f"; {listing.hidden} other node(s): use --all" if listing.hidden else ""
        which = "nodes" if listing.include_all else "tpulab-managed nodes"
        console.print(f"No {which} in {where}{extra}.")
        return
    table = Table(box=None, pad_edge=False)
    for column in ("NAME", "ZONE", "TYPE", "STATE", "AGE", "RUN ID", "EST. COST", "PROVIDER"):
        table.add_column(column)
    if journal_states:
        table.add_column("JOURNAL")
    for item in listing.nodes:
        node = item.node
        row = [
            node.name,
            node.zone,
            node.accelerator_type + (" (spot)" if node.spot else ""),
            node.state.value
            + (f" (queued resource {item.queued_state})" if item.queued_state else ""),
            age_text(item.age_seconds),
            node.run_id or "-",
            cost_text(item.estimated_cost),
            item.provider,
        ]
        if journal_states:
            row.append(journal_states.get((node.project, node.zone, node.name), "-"))
        table.add_row(*row)
    console.print(table)
    hidden = f"; {listing.hidden} non-tpulab node(s) hidden (--all)" if listing.hidden else ""
    unpriced = sum(1 for item in listing.nodes if item.estimated_cost is None)
    # A type without a cited price (TPU7x) is unknown, never counted as $0 in the total.
    besides = f", plus {unpriced} node(s) whose cost is unknown" if unpriced else ""
    console.print(
        f"{len(listing.nodes)} node(s) in {where}{hidden}. Estimated cost so far "
        f"~${listing.estimated_total:.2f}{besides} at {PRICE_DATE} list prices (an estimate, "
        "not a bill)."
    )


def _sessions_table(sessions: "list[SessionFiles]") -> None:
    """The sessions kept by `tpulab up` that are still up: time left to the hard
    deadline and to the idle expiry (from the local state, no API call of their own)."""
    import time

    from rich.table import Table

    from tpulab.catalog import PRICE_DATE
    from tpulab.cleanup.sessions import estimated_cost

    if not sessions:
        return
    now = time.time()
    table = Table(box=None, pad_edge=False)
    columns = ("SESSION", "NODE", "ZONE", "TYPE", "DEADLINE IN", "IDLE EXPIRES IN", "EST. COST")
    for column in columns:
        table.add_column(column)
    for files in sessions:
        state = files.state
        table.add_row(
            state.name,
            state.node_name,
            state.zone,
            state.accelerator_type + (" (spot)" if state.spot else ""),
            age_text(max(0.0, state.deadline_at - now)),
            age_text(max(0.0, state.idle_expires_at - now)),
            cost_text(estimated_cost(state, now=now)),
        )
    console = table_console()
    console.print(table)
    console.print(
        f"{len(sessions)} session(s) up; cost so far from when each was created, at "
        f"{PRICE_DATE} list prices (an estimate, not a bill)."
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
    from rich.markup import escape

    from tpulab.app.target import provider_apis
    from tpulab.cleanup.journal import VANISHED, Journal, close_vanished, journal_view, target_for
    from tpulab.cleanup.listing import list_providers
    from tpulab.cleanup.liveness import with_liveness
    from tpulab.cleanup.providers import provider_name
    from tpulab.cleanup.sessions import reconcile_listed
    from tpulab.cli._session_reach import session_store
    from tpulab.config import list_scope
    from tpulab.paths import owner_id

    scope = list_scope(
        project=project,
        zones=zones,
        emulate=emulate,
        api_endpoint=api_endpoint,
        adc_project=adc_project,
    )
    journal = Journal()
    with session_store() as store:
        readable = store.by_run_id()  # sets nothing aside: reconcile_listed does, below
    with provider_apis(
        scope.project, emulate=scope.emulate, api_endpoint=scope.api_endpoint, notify=reach_notice
    ) as apis:
        listing = list_providers(apis, scope.zones, include_all=include_all)
        nodes = [item.node for item in listing.nodes]
        view = journal_view(
            nodes,
            zones=scope.zones,
            project=scope.project,
            target=target_for(scope.api_endpoint, embedded_emulator=scope.emulate),
            journal=journal,
            # A row of a provider that was not asked is not "missing": nothing looked.
            providers=[name for name in apis if name not in listing.unasked],
            sessions=readable,
        )
        # A node this journal does not know: its lease says whether it is someone's
        # live work (another machine's or home's) or a leftover.
        states = dict(view.states)
        for name, api in apis.items():
            # Each provider reads its own nodes' leases (guest attributes are per API).
            theirs = [item.node for item in listing.nodes if item.provider == name]
            states = with_liveness(api, theirs, states, this_home=owner_id())
        view = dataclasses.replace(view, states=states)
    # Sessions first: a session whose node the listing does not show deleted itself
    # (or was deleted), and its key, state and row go with it, saying why.
    target = target_for(scope.api_endpoint, embedded_emulator=scope.emulate)
    with session_store() as store:  # names each damaged state file it sets aside
        sessions, gone = reconcile_listed(
            store,
            target=target,
            project=scope.project,
            zones=scope.zones,
            listed={(item.node.zone, item.node.name) for item in listing.nodes},
            seen_by="tpulab list",
            # A session behind a provider that was not asked is not concluded gone.
            providers=[name for name in apis if name not in listing.unasked],
            journal=journal,
        )
    for concluded in gone:
        print_stderr(concluded.message)
        for warning in concluded.warnings:
            print_stderr(f"[yellow]journal:[/] {warning}")
    by_session = {concluded.run_id for concluded in gone}
    # The listing proved these runs' nodes gone (their VMs deleted themselves, most
    # likely): the row is closed here rather than left for a sweep with nothing to do.
    others = [row for row in view.vanished if row.run_id not in by_session]
    closed, warnings = close_vanished(journal, others, seen_by="tpulab list")
    closed += [c.run_id for c in gone if c.journal_closed]
    for warning in warnings:
        print_stderr(f"[yellow]journal:[/] {warning}")
    for provider, why in listing.unasked.items():
        # One line, and the nodes are still listed: a project may never have enabled it.
        print_stderr(
            f"[yellow]{escape(provider_name(provider))} could not be asked; its "
            f"resources are not shown:[/] {escape(why)}"
        )
    if as_json:
        from tpulab.cleanup.report import list_envelope

        envelope = list_envelope(listing, view, closed, sessions=sessions, sessions_gone=gone)
        print_envelope(envelope, None)
        return
    _list_table(listing, view.states)
    _sessions_table(sessions)
    for row in view.missing:
        if row.run_id in by_session:
            continue  # said above, with why
        if row.run_id in closed:
            print_stderr(
                f"journal: run {row.run_id} (node {row.node_name} in {row.zone}) closed: "
                f"its node is gone, {VANISHED}."
            )
            continue
        print_stderr(
            f"[yellow]journal:[/] run {row.run_id} (node {row.node_name} in {row.zone}) is "
            "still open but the API does not list its node; `tpulab teardown --verify` "
            "closes it."
        )
    if view.error:
        print_stderr(f"[yellow]journal unreadable:[/] {view.error}")


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
    """List tpulab's TPU nodes and Compute instances with zone, provider, type, state,
    age, run id and estimated cost."""
    json_or_guarded(
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
