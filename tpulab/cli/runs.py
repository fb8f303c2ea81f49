"""`tpulab runs [list|show ID]`: the records of `tpulab run ... -- CMD` and `tpulab exec`.

The journal points to each one's `<out>/run.json` (tpulab.run.record);
`list` reads them back newest first (a record that was moved or deleted is listed as
such, not an error), `show` prints one, `--json` the record itself.

A record is written when its run starts ("running") and replaced at its end. One that
still says "running" is told apart by the process that writes it, which the journal's
pointer names (pid, host, start time, as a run's row does): alive, the run is still
going; gone, the run was killed (SIGKILL, power loss) and is listed as "interrupted",
with its out dir. The pointer, not the file, carries the writer: an exec has no journal
row to ask, and an out dir copied to another machine must not look alive there.
"""

import shlex
from typing import TYPE_CHECKING, Annotated, Any

import typer

from tpulab import errors as E
from tpulab.cli._console import print_lines
from tpulab.cli._exit import guarded
from tpulab.cli._panels import HelpInPanels

if TYPE_CHECKING:
    from pathlib import Path

    from tpulab.cleanup.journal import RecordPointer
    from tpulab.cli._runs_envelope import RunsListEnvelope
    from tpulab.run.record import RunRecord

__all__ = ["RunsListEnvelope", "runs_app"]

runs_app = HelpInPanels(
    help="Records of your experiments (`tpulab run ... -- CMD`, `tpulab exec`): <out>/run.json.",
    no_args_is_help=False,
)


def __getattr__(name: str) -> Any:
    # The envelope's home imports pydantic: loaded when asked for, not by `--help`.
    if name == "RunsListEnvelope":
        from tpulab.cli._runs_envelope import RunsListEnvelope

        return RunsListEnvelope
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _read(path: "Path", run_id: str) -> "RunRecord":
    """Run `run_id`'s record at `path`; ConfigError when it cannot be read, or when a
    later run given the same --out wrote its own record there."""
    from pydantic import ValidationError

    from tpulab.run.record import read_run_record

    try:
        record = read_run_record(path)
    except OSError as error:
        raise E.ConfigError(
            f"The run record {path} cannot be read: {error.strerror or error}.",
            hint="It lives in the run's --out directory; it may have been moved or deleted.",
        ) from None
    except ValidationError as error:
        raise E.ConfigError(
            f"The run record {path} is not a tpulab run.json ({error.error_count()} errors).",
            hint="It was edited or written by another tool; the artifacts beside it are intact.",
        ) from None
    if record.run_id != run_id:
        raise E.ConfigError(
            f"The run record {path} is run {record.run_id}'s now: a later run was given "
            "the same --out once this run's was emptied or deleted.",
            hint=f"See `tpulab runs show {record.run_id}`; give each run its own --out "
            "(the default, ./tpulab-runs/<run id>/, is).",
        )
    return record


def _collect(limit: int) -> "tuple[list[RunRecord], dict[str, str], list[str]]":
    from tpulab.cleanup.journal import Journal

    records: list[RunRecord] = []
    unreadable: dict[str, str] = {}
    interrupted: list[str] = []
    for pointer in Journal().run_records(limit):
        try:
            record = _read(pointer.path, pointer.run_id)
        except E.ConfigError as error:
            unreadable[pointer.run_id] = error.message
            continue
        records.append(record)
        if _interrupted(record, pointer):
            interrupted.append(record.run_id)
    return records, unreadable, interrupted


def _interrupted(record: "RunRecord", pointer: "RecordPointer") -> bool:
    """A start record whose writer is gone: the end never came to replace it."""
    return record.state == "running" and not pointer.writer_alive


def _status(record: "RunRecord", *, interrupted: bool) -> tuple[str, str]:
    workload = record.workload
    if interrupted:
        return "interrupted", "bold red"
    if record.state == "running":
        return "running", "cyan"
    if not workload.started:
        return "not started", "yellow"
    if workload.timed_out:
        return "timed out", "red"
    if workload.stopped:
        return "stopped", "yellow"
    if workload.exit_status == 0:
        return "exit 0", "green"
    return f"exit {workload.exit_status}", "red"


@runs_app.command("list")
def runs_list(
    as_json: Annotated[
        bool, typer.Option("--json", help="Print a versioned JSON envelope.")
    ] = False,
    limit: Annotated[int, typer.Option("--limit", help="At most this many, newest first.")] = 50,
) -> None:
    """The runs with a command, newest first: status, accelerator, artifacts, where."""

    def action() -> None:
        records, unreadable, interrupted = _collect(limit)
        if as_json:
            from tpulab.cli._runs_envelope import RunsListEnvelope

            envelope = RunsListEnvelope(
                ok=True, runs=records, unreadable=unreadable, interrupted=interrupted
            )
            typer.echo(envelope.to_json())
            return
        if not records and not unreadable:
            print_lines([[("No runs with a command yet (tpulab run ... -- CMD).", "dim")]])
            return
        lines = []
        for record in records:
            status, style = _status(record, interrupted=record.run_id in interrupted)
            fetched = record.workload.fetched_files
            # A record that never finished has no artifacts to count: say where they go.
            where = (
                f"  out {record.workload.out}"
                if record.state == "running"
                else f"  {fetched if fetched is not None else 'no'} files back"
            )
            lines.append(
                [
                    (f"{record.run_id}  ", "bold cyan"),
                    (f"{record.started:%Y-%m-%d %H:%M}  ", "dim"),
                    (f"{record.accelerator_type}{' EMULATED' if record.emulated else ''}  ", ""),
                    (f"{status:<11} ", style),
                    (shlex.join(record.workload.command)[:60], ""),
                    (where, "dim"),
                    (f"  exec on session {record.session}" if record.session else "", "dim"),
                ]
            )
        for run_id, why in unreadable.items():
            lines.append([(f"{run_id}  ", "bold cyan"), (why, "yellow")])
        print_lines(lines)

    guarded(action)


@runs_app.command("show")
def runs_show(
    run_id: Annotated[str, typer.Argument(help="The run id (see `tpulab runs list`).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the run.json record.")] = False,
) -> None:
    """One run's record: the gate (receipt), the command and its status, the artifacts."""

    def action() -> None:
        from tpulab.cleanup.journal import Journal

        pointer = Journal().run_record_of(run_id)
        if pointer is None:
            raise E.ConfigError(
                f"No run {run_id!r} with a command is in this machine's journal.",
                hint="See `tpulab runs list` for the ids.",
            )
        record = _read(pointer.path, run_id)
        if as_json:
            typer.echo(record.to_json())
            return
        interrupted = _interrupted(record, pointer)
        status, style = _status(record, interrupted=interrupted)
        workload = record.workload
        lines = [
            [
                ("Run ", "bold"),
                (record.run_id, "bold cyan"),
                (" EMULATED" if record.emulated else "", "bold magenta"),
            ],
            [
                ("  node      ", "dim"),
                (f"{record.node_name} ({record.accelerator_type}), zone {record.zone}", ""),
            ],
            [
                ("  receipt   ", "dim"),
                (f"{record.verdict or 'none'} {record.receipt_id or ''}", ""),
            ],
            [
                ("  command   ", "dim"),
                (shlex.join(workload.command), ""),
                ("  ", ""),
                (status, style),
            ],
            [("  env names ", "dim"), (", ".join(workload.env_names) or "(none)", "")],
            [
                ("  uploaded  ", "dim"),
                (f"{workload.upload_files} files, {workload.upload_bytes} bytes", ""),
            ],
            [
                ("  fetched   ", "dim"),
                (f"{workload.fetched_files or 0} files, {workload.fetched_bytes or 0} bytes", ""),
                (f" in {workload.out}", "dim"),
            ],
            [
                ("  phases    ", "dim"),
                (", ".join(f"{k} {v:.1f}s" for k, v in record.phase_seconds.items()), ""),
            ],
            [
                ("  teardown  ", "dim"),
                # A start record's "not-created" is only what it knew when it began.
                (record.teardown if record.state == "finished" else "not recorded", ""),
            ],
            [
                ("  cost      ", "dim"),
                (f"~${record.estimated_cost_usd:.4f}", ""),
                (f" (list prices {record.price_date}); {record.api_calls} API calls", "dim"),
            ],
        ]
        if record.failure:
            lines.append([("  failure   ", "dim"), (record.failure, "red")])
        if record.state == "running":
            lines.append(_unfinished_line(record, pointer, interrupted=interrupted))
        print_lines(lines)

    guarded(action)


def _unfinished_line(
    record: "RunRecord", pointer: "RecordPointer", *, interrupted: bool
) -> list[tuple[str, str]]:
    """What a record that never finished means, and what to do about it."""
    writer = f"process {pointer.pid} on {pointer.host}" if pointer.pid else "its process"
    if not interrupted:
        return [("  state     ", "dim"), (f"still running ({writer})", "cyan")]
    if record.session is not None:
        left = (
            f"its command may still run on session {record.session}'s node: a new exec "
            f"says so (busy); `tpulab ssh {record.session}` to look"
        )
    else:
        left = (
            "its VM, if it got one, deletes itself (its watchdog); `tpulab teardown "
            "--verify` deletes it now and confirms"
        )
    return [
        ("  state     ", "dim"),
        (
            f"interrupted: {writer} ended before the run finished (SIGKILL, power loss), so "
            f"nothing after its start was recorded; {left}. What it fetched, if anything, "
            f"is in {record.workload.out}",
            "red",
        ),
    ]


@runs_app.callback(invoke_without_command=True)
def _runs_root(ctx: typer.Context) -> None:
    if ctx.invoked_subcommand is None:
        runs_list(as_json=False, limit=50)
