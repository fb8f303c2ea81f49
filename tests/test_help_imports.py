"""`tpulab --help` and friends stay light: no jax, paramiko, google.cloud or asyncssh.

Checked in a fresh interpreter, because this test process has imported them already.
"""

from __future__ import annotations

import pytest
from helpers import cli_imports

from tpulab import __version__


@pytest.mark.parametrize(
    ("argv", "first_line"),
    [
        (["--help"], "Usage: tpulab [OPTIONS] COMMAND [ARGS]..."),
        (["verify", "--help"], "Usage: tpulab verify [OPTIONS]"),
        (["receipts", "--help"], "Usage: tpulab receipts [OPTIONS] COMMAND [ARGS]..."),
        (["receipts", "show", "--help"], "Usage: tpulab receipts show [OPTIONS] "),
        (["--version"], f"tpulab {__version__}"),
    ],
)
def test_help_does_not_import_heavy_modules(argv: list[str], first_line: str) -> None:
    done = cli_imports(*argv)
    assert done.code in (0, None), done.stderr
    assert done.heavy == [], f"`tpulab {' '.join(argv)}` imported {done.heavy}"
    # What that command prints first: its own usage line (not another command's), or
    # the version line alone.
    lines = [line.strip() for line in done.stdout.splitlines() if line.strip()]
    assert lines, done.stderr
    if argv == ["--version"]:
        assert lines == [first_line]
    else:
        assert lines[0].startswith(first_line), lines[0]


def test_probe_would_notice_a_heavy_import() -> None:
    # The check above must be able to fail: an import of jax shows up in the same probe.
    assert "jax" in cli_imports("--help", preamble="import jax").heavy
