"""`tpulab costs`: what every journalled run billed, estimated, with totals per day and type.

tpulab.cleanup.costs reads the journal and prices it; this module prints the ledger. It
contacts no API: the figures are the journal's times at catalog list prices.
"""

from typing import TYPE_CHECKING, Annotated

import typer

from tpulab.cli._console import age_text, print_stderr, table_console
from tpulab.cli._exit import json_or_guarded, print_envelope

if TYPE_CHECKING:
    from rich.table import Table

    from tpulab.cleanup.costs import Ledger, LedgerEntry, LedgerTotal, RunCost

__all__ = ["costs_command"]

_STATE_TEXT = {
    "deleted": "deleted (confirmed)",
    "forgotten": "forgotten (its endpoint is gone; never confirmed)",
    "closed": "closed",
    "not-created": "not created",
    "running": "running now",
    "open": "still billing? (run ended without teardown)",
    "unconfirmed": "still billing? (teardown unconfirmed)",
    "up": "up",
}


def _state_text(entry: "LedgerEntry") -> str:
    """The STATE cell: a session's row says so (up, or how it ended)."""
    text = _STATE_TEXT[entry.state]
    if entry.kind != "session":
        return text
    if entry.state == "up":
        return f"session {entry.session} up (`tpulab down {entry.session}` ends it)"
    return f"session, {text}"


def _money(usd: float | None) -> str:
    return "?" if usd is None else f"${usd:.2f}"


def _entry_cells(entry: "LedgerEntry", *, attempt_of: bool = False) -> list[str]:
    row = entry.row
    kind = row.accelerator + (" (spot)" if row.spot else "")
    if row.queued_resource:
        kind += " (queued)"
    if entry.kind == "session":
        kind += " (session)"
    billed = age_text(entry.billed_seconds) + (" so far" if entry.still_billing else "")
    cost = "emulated" if row.emulated else _money(entry.estimated_cost)
    # An attempt under its run's line keeps its own full id: teardown and list use it.
    run_id = f"  #{entry.attempt} {row.run_id}" if attempt_of else row.run_id
    return [
        f"{row.started:%Y-%m-%d %H:%M}",
        run_id,
        kind,
        row.zone,
        row.target,
        billed,
        cost,
        _state_text(entry),
    ]


def _run_rows(run: "RunCost") -> list[list[str]]:
    """A run's line (its attempts summed), then one line per attempt; a run of one
    attempt is just that attempt's line."""
    if run.attempts == 1:
        return [_entry_cells(run.entries[0])]
    first = run.entries[0].row
    kind = first.accelerator + (" (spot)" if first.spot else "")
    still = " so far" if run.still_billing else ""
    cost = "emulated" if first.emulated else _money(run.estimated_cost)
    zones = " > ".join(dict.fromkeys(e.row.zone for e in run.entries))
    state = f"{run.attempts} attempts" + (", still billing?" if run.still_billing else "")
    summary = [
        f"{run.started:%Y-%m-%d %H:%M}",
        run.run_id,
        kind,
        zones,
        first.target,
        age_text(run.billed_seconds) + still,
        cost,
        state,
    ]
    return [summary] + [_entry_cells(e, attempt_of=True) for e in run.entries]


def _totals_table(title: str, totals: "list[LedgerTotal]") -> "Table":
    from rich.table import Table

    table = Table(title=title, title_justify="left", box=None, pad_edge=False)
    for column in (title.split()[-1].upper(), "RUNS", "ATTEMPTS", "BILLED", "EST. COST"):
        table.add_column(column)
    for total in totals:
        cost = _money(total.estimated_cost) + (
            f" (+{total.unpriced} unpriced)" if total.unpriced else ""
        )
        table.add_row(
            total.key,
            str(total.runs),
            str(total.attempts),
            age_text(total.billed_seconds),
            cost,
        )
    return table


def _costs_table(found: "Ledger") -> None:
    from rich.table import Table

    from tpulab.catalog import PRICE_DATE

    console = table_console()
    window = f" since {found.since:%Y-%m-%d %H:%M} UTC" if found.since else ""
    if not found.entries:
        console.print(f"No runs in this machine's journal{window}.")
        return
    table = Table(box=None, pad_edge=False)
    for column in ("STARTED (UTC)", "RUN ID", "TYPE", "ZONE", "TARGET", "BILLED", "EST. COST"):
        table.add_column(column)
    table.add_column("STATE")
    for run in found.runs:
        for cells in _run_rows(run):
            table.add_row(*cells)
    console.print(table)
    if found.billable:
        console.print()
        console.print(_totals_table("Per UTC day", found.by_day))
        console.print()
        console.print(_totals_table("Per accelerator", found.by_accelerator))
        console.print()
    total = found.total
    unpriced = f" ({total.unpriced} of an unknown type not priced)" if total.unpriced else ""
    attempts = f" ({total.attempts} attempts)" if total.attempts != total.runs else ""
    console.print(
        f"Total{window}: {total.runs} billable run(s){attempts}, "
        f"{age_text(total.billed_seconds)} "
        f"billed, ~{_money(total.estimated_cost)}{unpriced} at {PRICE_DATE} list prices "
        "(an estimate from the journal's times, not a bill)."
    )
    emulated = found.emulated_total
    if emulated.runs:
        console.print(
            f"Emulated: {emulated.runs} run(s), {age_text(emulated.billed_seconds)} "
            "on the emulator, $0 (an emulator bills nothing)."
        )
    unaccounted = sum(1 for e in found.billable if e.unaccounted)
    if unaccounted:
        print_stderr(
            f"[yellow]{unaccounted} run(s) may still be billing[/] (never closed, "
            "or teardown unconfirmed); their time runs up to now. `tpulab list` shows "
            "what exists, `tpulab teardown --verify` deletes it."
        )
    up = [e.session for e in found.entries if e.state == "up"]
    if up:
        print_stderr(
            f"{len(up)} session(s) up ({', '.join(n or '?' for n in up)}), billed up to now; "
            "`tpulab down NAME` ends one."
        )


def _costs(*, since: str | None, as_json: bool) -> None:
    from tpulab.cleanup.costs import costs_envelope, ledger
    from tpulab.config import costs_inputs

    inputs = costs_inputs(since=since)
    found = ledger(since=inputs.since, now=inputs.now)
    if as_json:
        print_envelope(costs_envelope(found), None)
        return
    _costs_table(found)


def costs_command(
    since: Annotated[
        str | None,
        typer.Option(
            "--since",
            help="Only runs started at or after this: an ISO date (2026-11-30, midnight "
            "UTC), an ISO date-time (2026-11-30T14:00, UTC unless it has an offset), or a "
            "duration back from now (7d, 12h). Runs that may still be billing are always "
            "shown.",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON envelope.")] = False,
) -> None:
    """What every run in this machine's journal billed, estimated from list prices.

    One line per run; a run that failed over has a line per attempt under it (summed on
    the run's line; --json has both, `runs` and `entries`): accelerator,
    zone, spot, target, billed time and estimated cost, then totals per UTC day, per
    accelerator and overall. Billed time runs from just before CreateNode was sent to
    the confirmed deletion; a run that was never created bills 0; a run never closed,
    or whose teardown was unconfirmed, is billed up to now and flagged "still billing?".
    A session (`tpulab up`) that is up is billed up to now and shown as up; an ended
    one to its confirmed delete (`tpulab down`) or, if its node deleted itself, to its
    deadline or idle expiry.
    Emulated runs are listed at $0 and totalled apart. Nothing is contacted: the
    figures are estimates from the journal and the catalog's dated list prices, not a
    bill (the Cloud Billing console has the bill).

    Example: `tpulab costs --since 7d`.
    """
    json_or_guarded("costs", as_json, lambda: _costs(since=since, as_json=as_json))
