"""`tpulab teardown --forget`: close the journal rows of an API endpoint that is gone.

A run against a served emulator that was later stopped (or any endpoint that no longer
exists) leaves rows "open" or "unconfirmed" that no sweep can ever close: every
`teardown --verify` for that endpoint fails to list and exits 6, and every other one
points at it. Forgetting is the way out, and it is guarded:

- only for an `--api-endpoint` that is not Google's (config refuses the rest: Google's
  API and the embedded emulator never go away, and `--verify` closes their rows);
- only after the endpoint was tried and the connection REFUSED (`UnreachableError`: the
  request was never sent). An endpoint that answers anything, or that accepted the
  connection but did not answer, is refused: `teardown --verify` is what it needs;
- rows are closed as "forgotten", with what was tried in their detail, never deleted.

The caller (the CLI) asks for confirmation between `plan_forget` and `forget`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tpulab.cleanup.journal import Journal, RunRow
from tpulab.cloud.api import TpuApi
from tpulab.errors import (
    CloudError,
    ConfigError,
    JournalError,
    OutcomeUnknownError,
    UnreachableError,
)

__all__ = ["ForgetPlan", "describe", "forget", "plan_forget"]


@dataclass(frozen=True)
class ForgetPlan:
    target: str
    rows: list[RunRow]
    evidence: str  # what the probe saw: why the endpoint counts as gone


def _rows(journal: Journal, target: str, project: str, run_id: str | None) -> list[RunRow]:
    return [
        row
        for row in journal.open_runs()
        if row.target == target
        and row.project == project
        and (run_id is None or row.run_id == run_id)
    ]


def plan_forget(api: TpuApi, journal: Journal, *, target: str, run_id: str | None) -> ForgetPlan:
    """The rows to forget and the evidence that `target` is gone; ConfigError when there
    is nothing to forget or the endpoint may still exist."""
    rows = _rows(journal, target, api.project, run_id)
    if not rows:
        which = f"run {run_id}" if run_id else "any run"
        raise ConfigError(
            f"No open journal row of {which} for {target} in project {api.project}.",
            hint="`tpulab list` and `tpulab teardown --verify` show the rows that are open "
            "and the target and project each belongs to.",
        )
    verify = f"tpulab teardown --verify --api-endpoint {target} --project {api.project}"
    try:
        api.list_nodes(rows[0].zone)
    except UnreachableError as error:
        return ForgetPlan(target, rows, error.message)
    except OutcomeUnknownError as error:
        raise ConfigError(
            f"{target} accepted the connection but did not answer ({error.message}); it "
            "may still exist, so its journal rows are not forgotten.",
            hint=f"Retry when it answers, with `{verify}`.",
        ) from None
    except CloudError as error:
        raise ConfigError(
            f"{target} answers ({error.status}: {error.message}), so it is not gone and its "
            "journal rows are not forgotten.",
            hint=f"Use `{verify}`, which deletes what remains and closes the rows.",
        ) from None
    raise ConfigError(
        f"{target} answers (it listed zone {rows[0].zone}), so it is not gone and its "
        "journal rows are not forgotten.",
        hint=f"Use `{verify}`, which deletes what remains and closes the rows.",
    )


def forget(journal: Journal, plan: ForgetPlan) -> list[str]:
    """Close the plan's rows as "forgotten" (with the evidence); their run ids.

    JournalError if a row could not be written (the ones before it stay closed)."""
    detail = (
        f"forgotten (target gone): {plan.target} refused the connection "
        f"({plan.evidence}); nothing confirmed the node gone (teardown --forget)"
    )
    closed: list[str] = []
    for row in plan.rows:
        try:
            journal.close_run(row.run_id, "forgotten", detail)
        except JournalError as error:
            raise JournalError(
                f"{error.message} Forgotten before it: {', '.join(closed) or 'none'}.",
                hint=error.hint,
            ) from None
        closed.append(row.run_id)
    return closed


def describe(rows: Sequence[RunRow]) -> list[str]:
    """One line per row, for the confirmation the CLI asks."""
    return [
        f"run {row.run_id}: node {row.node_name} in {row.zone} ({row.accelerator}), "
        f"started {row.started:%Y-%m-%d %H:%M} UTC, "
        f"{'teardown unconfirmed' if row.teardown == 'unconfirmed' else 'never closed'}"
        for row in rows
    ]
