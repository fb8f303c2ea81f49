"""`tpulab receipts [list|show]`: the receipts kept on this machine.

Every verify and run keeps one (tpulab.evidence.store); `show` re-checks a receipt
against the expectation it was verified with.
"""

from __future__ import annotations

from typing import Annotated

import typer

from tpulab import errors as E
from tpulab.cli._console import print_json, print_lines
from tpulab.cli._exit import error_json, guarded, json_or_guarded

__all__ = ["receipts_app"]

receipts_app = typer.Typer(
    help="Receipts kept on this machine (every verify and run keeps one).",
    no_args_is_help=False,
)


def _receipts_list(as_json: bool) -> None:
    from tpulab.evidence import report as render
    from tpulab.evidence.store import ReceiptStore

    kept = ReceiptStore().list()
    if as_json:
        summaries = [r.summary() for r in kept]
        print_json(render.envelope("receipts list", ok=True, receipts=summaries))
        return
    print_lines(render.receipts_table(kept))


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
    json_or_guarded("receipts list", as_json, lambda: _receipts_list(as_json))


def _receipts_show(receipt_id: str, as_json: bool) -> None:
    import json

    from tpulab.evidence import report as render
    from tpulab.evidence.receipt import evaluate_receipt, parse_receipt
    from tpulab.evidence.store import ReceiptStore

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
        print_json(
            render.envelope(
                "receipts show",
                ok=True,
                stored=kept.summary(),
                receipt=document,
                recheck=[r.to_dict() for r in results],
                parse_error=error_json(parse_error) if parse_error else None,
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
        print_lines([*header, [("  unreadable: ", "bold red"), (parse_error.message, "red")]])
        return
    body = render.receipt_lines(receipt, expectation)
    if expectation is not None:
        body += [*render.requirement_lines(results), render.verdict_line(results, expectation)]
    print_lines(header + body)


@receipts_app.command("show")
def receipts_show_command(
    receipt_id: Annotated[str, typer.Argument(help="A receipt id, or a unique prefix of one.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON envelope.")] = False,
) -> None:
    """Show one kept receipt, re-checked against the expectation it was verified with."""
    json_or_guarded("receipts show", as_json, lambda: _receipts_show(receipt_id, as_json))
