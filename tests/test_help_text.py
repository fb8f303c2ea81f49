"""`--help` that teaches: flags read as flags, options name their value."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

COMMANDS = [
    ["run"],
    ["teardown"],
    ["list"],
    ["verify"],
    ["receipts", "list"],
    ["receipts", "show"],
    ["emulator", "serve"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_help_names_values_and_shows_flags_bare(command: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tpulab", *command, "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1"},
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    options = [line for line in done.stdout.splitlines() if re.match(r"│\s+(\*\s+)?--", line)]
    assert options, done.stdout
    for line in options:
        # typer's own rendering shows the Python type of every option, flags included.
        assert not re.search(r"<(bool|str|float|int|list\[str\])>", line), line
        if "--help" in line:
            assert re.search(r"--help\s+Show this message", line), line


def test_run_help_names_the_zone_value() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tpulab", "run", "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1"},
        check=False,
        timeout=60,
    )
    assert re.search(r"--zone\s+ZONE\b", done.stdout), done.stdout
    assert re.search(r"--spot\s+Use a spot VM", done.stdout), done.stdout
