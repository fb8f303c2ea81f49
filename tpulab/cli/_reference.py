"""The CLI reference as Markdown, drawn from the typer app itself.

The docs site (docs/reference/cli.md, through docs/hooks/cli_reference.py) inserts this
text at build time, so no flag is described by hand in two places: the help a user sees
with `--help` and the reference page are the same strings. `missing_help` lists the
commands and options that have none; a test keeps that list empty.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from tpulab.cli._panels import panel_of

__all__ = ["Entry", "cli_reference", "missing_help", "walk"]


@dataclass(frozen=True)
class Entry:
    """One command of the tree: its full path (`tpulab receipts show`) and the command."""

    path: str
    command: Any
    context: Any


def _root() -> tuple[Any, Any]:
    import typer.main

    from tpulab.cli import _name_the_values, app
    from tpulab.cli._panels import panel_the_options

    command = typer.main.get_command(app)
    _name_the_values(command)
    panel_the_options(command)
    return command, command.context_class(command, info_name="tpulab")


def walk() -> Iterator[Entry]:
    """Every command and group under `tpulab`, in the order `--help` lists them."""
    command, context = _root()
    yield from _walk(command, context, "tpulab")


def _walk(command: Any, context: Any, path: str) -> Iterator[Entry]:
    yield Entry(path, command, context)
    list_commands = getattr(command, "list_commands", None)
    if list_commands is None:
        return
    for name in list_commands(context):
        sub = command.get_command(context, name)
        if sub is None or getattr(sub, "hidden", False):
            continue
        sub_context = sub.context_class(sub, info_name=name, parent=context)
        yield from _walk(sub, sub_context, f"{path} {name}")


def _is_help_option(param: Any) -> bool:
    return "--help" in getattr(param, "opts", ())


def missing_help() -> list[str]:
    """`tpulab run --zone`-style names of every command, argument and option without help."""
    missing = []
    for entry in walk():
        if not (entry.command.help or entry.command.short_help):
            missing.append(entry.path)
        for param in entry.command.params:
            if _is_help_option(param) or getattr(param, "hidden", False):
                continue
            if not (getattr(param, "help", None) or "").strip():
                missing.append(f"{entry.path} {_param_name(param)}")
    return missing


def _param_name(param: Any) -> str:
    opts = getattr(param, "opts", None) or [param.name or "?"]
    if param.param_type_name == "argument":
        return str(param.metavar or param.name or "ARG").upper()
    return str(max(opts, key=len))


def cli_reference() -> str:
    """Markdown for every command: what it does, its usage line, and its options grouped
    by the help panels `--help` shows them in."""
    blocks = []
    for entry in walk():
        if entry.path == "tpulab":
            continue
        blocks.append(_command_block(entry))
    return "\n".join(blocks)


def _command_block(entry: Entry) -> str:
    depth = entry.path.count(" ") + 1
    lines = [f"{'#' * depth} `{entry.path}`", ""]
    text = (entry.command.help or entry.command.short_help or "").strip()
    if text:
        lines += [text, ""]
    pieces = entry.command.collect_usage_pieces(entry.context)
    lines += ["```text", f"{entry.path} {' '.join(pieces)}".rstrip(), "```", ""]
    panels: dict[str, list[str]] = {}
    for param in entry.command.params:
        if _is_help_option(param) or getattr(param, "hidden", False):
            continue
        panels.setdefault(panel_of(param), []).append(_param_row(param))
    for panel, rows in panels.items():
        lines += [f"**{panel}**", "", "| option | meaning |", "|---|---|", *rows, ""]
    return "\n".join(lines)


def _param_row(param: Any) -> str:
    if param.param_type_name == "argument":
        name = f"`{_param_name(param)}`"
    else:
        names = [*param.opts, *getattr(param, "secondary_opts", [])]
        metavar = "" if param.is_flag else f" {param.metavar or param.name.upper()}"
        name = ", ".join(f"`{n}{metavar}`" for n in names)
    help_text = (getattr(param, "help", None) or "").replace("\n", " ")
    default = getattr(param, "default", None)
    show = getattr(param, "show_default", None)
    if show and default not in (None, False, (), []) and not callable(default):
        help_text += f" (default: `{default}`)"
    return f"| {name} | {help_text.replace('|', '&#124;')} |"
