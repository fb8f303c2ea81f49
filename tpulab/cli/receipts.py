"""`tpulab receipts [list|show]`: the receipts kept on this machine.

Every verify and run keeps one (tpulab.evidence.store). `list` shows each with its kept
verdict after comparing its bytes with the recorded sha256; `show` judges the bytes
again and exits 0 only when they are intact AND verify (else 5). A damaged record is
one damaged entry; an unreadable store is exit 8.
"""

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated

import typer

from tpulab import errors as E
from tpulab.cli._console import print_lines
from tpulab.cli._exit import error_report, guarded, print_envelope
from tpulab.cli._panels import HelpInPanels

if TYPE_CHECKING:
    from tpulab.envelope import Envelope, ErrorReport

__all__ = ["emit_envelope", "receipts_app"]

receipts_app = HelpInPanels(
    help="Receipts kept on this machine (every verify and run keeps one).",
    no_args_is_help=False,
)


def emit_envelope(
    build: "Callable[[], tuple[Envelope, E.TpuLabError | None]]",
    failed: "Callable[[ErrorReport], Envelope]",
) -> None:
    """Print the Envelope `build` returns, or the `failed` one when it raises; exit with
    the failure's status (from the table in cli._exit) when there is one."""
    try:
        document, failure = build()
    except E.TpuLabError as error:
        document, failure = failed(error_report(error)), error
    print_envelope(document, failure)


def _receipts_list(as_json: bool) -> None:
    from tpulab.evidence import report as render
    from tpulab.evidence.store import ReceiptStore

    if as_json:

        def build() -> "tuple[Envelope, E.TpuLabError | None]":
            entries = [render.ReceiptEntry.of(r) for r in ReceiptStore().list()]
            return render.ReceiptsListEnvelope(ok=True, receipts=entries), None

        emit_envelope(build, lambda error: render.ReceiptsListEnvelope(ok=False, error=error))
        return
    guarded(lambda: print_lines(render.receipts_table(ReceiptStore().list())))


@receipts_app.callback(invoke_without_command=True)
def _receipts_root(ctx: typer.Context) -> None:
    """Receipts kept on this machine; without a subcommand, list them."""
    if ctx.invoked_subcommand is None:
        _receipts_list(False)


@receipts_app.command("list")
def receipts_list_command(
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON envelope.")] = False,
) -> None:
    """List kept receipts, newest first (a receipt altered since is listed as TAMPERED)."""
    _receipts_list(as_json)


def _receipts_show(receipt_id: str, as_json: bool) -> None:
    from tpulab.evidence import report as render
    from tpulab.evidence.store import ReceiptStore, recheck

    if as_json:

        def build() -> "tuple[Envelope, E.TpuLabError | None]":
            checked = recheck(ReceiptStore().get(receipt_id))
            document = render.ReceiptsShowEnvelope(
                ok=checked.ok,
                error=error_report(checked.error) if checked.error else None,
                receipt_entry=render.ReceiptEntry.of(checked.entry),
                expectation=checked.record.expectation,
                provenance=checked.record.provenance,
                kept_judgement=checked.record.judgement,
                judgement=checked.judgement,
                receipt=render.receipt_document(checked.raw),
            )
            return document, checked.error

        emit_envelope(build, lambda error: render.ReceiptsShowEnvelope(ok=False, error=error))
        return

    def show() -> None:
        checked = recheck(ReceiptStore().get(receipt_id))
        print_lines(render.recheck_lines(checked))
        if checked.error is not None:
            raise checked.error

    guarded(show)


@receipts_app.command("show")
def receipts_show_command(
    receipt_id: Annotated[str, typer.Argument(help="A receipt id, or a unique prefix of one.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON envelope.")] = False,
) -> None:
    """Show one kept receipt, judged again against the expectation it was kept with."""
    _receipts_show(receipt_id, as_json)
