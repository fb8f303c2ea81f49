"""`--help` that teaches: flags read as flags, options name their value, and the many
options of `run`, `up` and `exec` sit in panels by what they are about."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tpulab.cli._panels import PANELLED_COMMANDS, PANELS

COMMANDS = [
    ["run"],
    ["teardown"],
    ["list"],
    ["verify"],
    ["receipts", "list"],
    ["receipts", "show"],
    ["emulator", "serve"],
]


def _help(*command: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "tpulab", *command, "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1"},
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_help_names_values_and_shows_flags_bare(command: list[str]) -> None:
    shown = _help(*command)
    options = [line for line in shown.splitlines() if re.match(r"\s+(-\w, )?--\w", line)]
    assert options, shown
    for line in options:
        # typer's own rendering shows the Python type of every option, flags included.
        assert not re.search(r"<(bool|str|float|int|list\[str\])>", line), line
        if "--help" in line:
            assert re.search(r"--help\s+Show this message", line), line


def test_run_help_names_the_zone_value() -> None:
    shown = _help("run")
    assert re.search(r"--zone\s+ZONE\b", shown), shown
    assert re.search(r"--spot\s+Use a spot VM", shown), shown


@pytest.mark.parametrize("command", PANELLED_COMMANDS)
def test_help_lists_each_option_under_its_panel(command: str) -> None:
    """Drawn, not just declared: under each panel's heading come its options (of those
    the command has), up to the next heading."""
    shown = _help(command)
    under: dict[str, str] = {}
    heading = ""
    for line in shown.splitlines():
        if re.fullmatch(r"\S.*:", line):
            heading = line[:-1]
        found = re.match(r"\s+(?:-\w, )?(--[\w-]+)", line)
        if heading and found:
            under[found.group(1)] = heading
    for panel, options in PANELS.items():
        for option in options:
            if option in under:
                assert under[option] == panel, (option, shown)
    assert len(set(under.values())) >= 4, shown  # drawn in panels, not one list
    assert under["--help"] == "Options", shown
