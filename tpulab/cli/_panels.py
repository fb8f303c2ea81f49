"""Help in panels, drawn as plain text: which panel each option of `run`, `up` and
`exec` is shown in, declared once, and the typer app and command classes that draw them.

`tpulab run --help` lists 40-odd options; grouped by what they are about (where the VM
is, how capacity is found, your command, the VM's Python, timeouts, the watchdog, the
output) they read as a few short lists. The same table serves the three commands, so an
option shared by them sits in the same panel everywhere, and the docs' CLI reference
(tpulab/cli/_reference.py) groups by the same panels. Each panel but Session and Output
is one flag group of tpulab/config/groups.py (tests/test_flag_groups.py holds them
equal); the names are spelled here, not imported, because importing tpulab.config
(pydantic, through tpulab.models) would add a quarter second to every `--help`.

Help is plain text (click's formatter), not typer's rich boxes: `typer.rich_utils` loads
rich's Markdown, Syntax and Traceback to draw any help: ~90 ms of the 0.2 s that
`tpulab --help` took (tests/benchmarks/bench_startup.py measures it against gcloud's).
Every app is a `HelpInPanels`, so every command draws its help here.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import typer
import typer.core

from tpulab.cli._click import Context, HelpFormatter

__all__ = [
    "PANELLED_COMMANDS",
    "PANELS",
    "HelpInPanels",
    "PanelledCommand",
    "panel_of",
    "panel_the_options",
]

PANELS: dict[str, tuple[str, ...]] = {
    "Where": (
        "--accelerator",
        "--zone",
        "--project",
        "--name",
        "--emulate",
        "--api-endpoint",
        "--internal-ip",
        "--network",
        "--subnetwork",
        "--provider",
        "--image",
        "--service-account",
    ),
    "Capacity": (
        "--spot",
        "--recover",
        "--retry-until-up",
        "--retry-for",
        "--queued",
        "--valid-for",
    ),
    "Session": ("--ttl", "--idle"),
    "Your command (after --)": (
        "--workdir",
        "--with",
        "--requirements",
        "--fetch",
        "--exclude",
        "--out",
        "--env",
        "--max-upload",
        "--max-fetch",
        "--allow-secret",
        "--timeout",
        "--quiet",
        "--all-output",
    ),
    "The VM's Python": ("--python", "--jax-version", "--installer"),
    "Timeouts": (
        "--payload-timeout",
        "--teardown-timeout",
        "--boot-timeout",
        "--bootstrap-timeout",
    ),
    "Watchdog": ("--lease", "--boot-grace", "--max-duration", "--no-watchdog"),
    "Output": ("--dry-run", "--json", "--verbose"),
}
PANELLED_COMMANDS = ("run", "up", "exec")
_PANEL_OF = {option: panel for panel, options in PANELS.items() for option in options}


def panel_the_options(group: Any) -> None:
    """Set each option's help panel on the commands with many options (a panel given in
    the option's own declaration wins)."""
    for name in PANELLED_COMMANDS:
        command = getattr(group, "commands", {}).get(name)
        for param in getattr(command, "params", []):
            if getattr(param, "rich_help_panel", None) is not None:
                continue
            for opt in getattr(param, "opts", ()):
                if opt in _PANEL_OF:
                    param.rich_help_panel = _PANEL_OF[opt]
                    break


def panel_of(param: Any) -> str:
    """The panel a parameter is listed in: its own, else Arguments or Options (the CLI
    reference page, tpulab/cli/_reference.py, groups by the same)."""
    panel = getattr(param, "rich_help_panel", None)
    if panel:
        return str(panel)
    return "Arguments" if param.param_type_name == "argument" else "Options"


def _write_panels(command: Any, ctx: Context, formatter: HelpFormatter) -> None:
    """Each panel a section, in the order its first parameter is declared."""
    panels: dict[str, list[tuple[str, str]]] = {}
    for param in command.get_params(ctx):
        record = param.get_help_record(ctx)
        if record is None:
            continue
        if param.param_type_name == "argument":
            # typer names an argument with its Python type ("S <str>"); the name says it.
            name = str(param.metavar or param.name).upper()
            record = (name if param.nargs == 1 else f"{name}...", record[1])
        panels.setdefault(panel_of(param), []).append(record)
    for panel, rows in panels.items():
        with formatter.section(panel):
            formatter.write_dl(rows)


class PanelledCommand(typer.core.TyperCommand):
    def format_options(self, ctx: Context, formatter: HelpFormatter) -> None:
        _write_panels(self, ctx, formatter)


class PanelledGroup(typer.core.TyperGroup):
    def format_options(self, ctx: Context, formatter: HelpFormatter) -> None:
        _write_panels(self, ctx, formatter)
        self.format_commands(ctx, formatter)

    def format_commands(self, ctx: Context, formatter: HelpFormatter) -> None:
        """Each command with its help's first paragraph, wrapped: click's own cuts it at
        the first full stop ("`tpulab run ...") or at the line's end."""
        rows = [
            (name, _summary(command))
            for name, command in self.commands.items()
            if not command.hidden
        ]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def _summary(command: Any) -> str:
    text = command.short_help or inspect.cleandoc(command.help or "")
    return " ".join(text.split("\n\n")[0].split())


class HelpInPanels(typer.Typer):
    """A typer app whose group and commands draw plain help in panels, up to 100 columns
    wide (click's default stops at 80, which cut each command's summary short)."""

    def __init__(self, **settings: Any) -> None:
        settings.setdefault("context_settings", {"max_content_width": 100})
        super().__init__(cls=PanelledGroup, rich_markup_mode=None, **settings)

    def command(
        self, name: str | None = None, *, cls: type[Any] | None = None, **settings: Any
    ) -> Callable[[Any], Any]:
        return super().command(name, cls=cls or PanelledCommand, **settings)
