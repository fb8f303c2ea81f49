"""Which help panel each option of `run`, `up` and `exec` is shown in, declared once.

`tpulab run --help` lists 40-odd options; grouped by what they are about (where the VM
is, how capacity is found, your command, the VM's Python, timeouts, the watchdog, the
output) they read as a few short lists. The same table serves the three commands, so an
option shared by them sits in the same panel everywhere, and the docs' CLI reference
(tpulab/cli/_reference.py) groups by the same panels. Each panel but Session and Output
is one flag group of tpulab/config/groups.py (tests/test_flag_groups.py holds them
equal); the names are spelled here, not imported, because importing tpulab.config
(pydantic, through tpulab.models) would add a quarter second to every `--help`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PANELLED_COMMANDS", "PANELS", "panel_the_options"]

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
