"""Terminal output shared by the commands: consoles, report lines, JSON, ages and costs.

rich is imported inside each function so that importing a command module stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from rich.console import Console

__all__ = [
    "age_text",
    "console",
    "cost_text",
    "print_json",
    "print_lines",
    "print_stderr",
    "table_console",
]


def console(*, stderr: bool = False) -> Console:
    """The console for report text: no highlighting, long lines kept whole."""
    from rich.console import Console

    # soft_wrap: piped output keeps one report line per line instead of wrapping at 80.
    return Console(highlight=False, soft_wrap=True, stderr=stderr)


def table_console() -> Console:
    """A console for tables: piped output (scripts, grep) keeps one row per line
    instead of wrapping at 80 columns."""
    from rich.console import Console

    found = console()
    if found.is_terminal:
        return found
    return Console(highlight=False, soft_wrap=True, width=200)


def print_stderr(text: str) -> None:
    """Rich markup on stderr (errors, warnings, notes). Lines are never broken by rich:
    they carry commands to paste (a manual delete), which a hard wrap at 80 columns in
    a log or a pipe would split; a terminal wraps long lines by itself."""
    from rich.console import Console

    Console(stderr=True, highlight=False, soft_wrap=True).print(text)


def print_lines(lines: list[list[tuple[str, str]]]) -> None:
    """Print report lines built by tpulab.evidence.report: each a list of (text, style) parts."""
    from rich.text import Text

    out = console()
    for line in lines:
        out.print(Text.assemble(*line))


def print_json(data: object) -> None:
    import json

    typer.echo(json.dumps(data, indent=2, sort_keys=False, default=str))


def age_text(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{minutes}m{int(seconds % 60):02d}s"
    return f"{minutes // 60}h{minutes % 60:02d}m"


def cost_text(cost: float | None) -> str:
    return "?" if cost is None else f"~${cost:.2f}"
