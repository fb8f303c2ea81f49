"""The click that typer runs on: its own vendored copy (recent typer) or the click
package (older releases, which pyproject still allows). The CLI names click's types
through here, once."""

try:
    from typer._click import Context, HelpFormatter
    from typer._click.exceptions import UsageError
except ImportError:  # pragma: no cover - depends on the installed typer
    from click import Context, HelpFormatter  # type: ignore[assignment]
    from click.exceptions import UsageError  # type: ignore[assignment]

__all__ = ["Context", "HelpFormatter", "UsageError"]
