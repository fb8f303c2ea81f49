"""`tpulab --help` and friends stay light: no jax, paramiko, google.cloud or asyncssh.

Checked in a fresh interpreter, because this test process has imported them already.
"""

from __future__ import annotations

import pytest
from helpers import cli_imports


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["verify", "--help"],
        ["receipts", "--help"],
        ["receipts", "show", "--help"],
        ["--version"],
    ],
)
def test_help_does_not_import_heavy_modules(argv: list[str]) -> None:
    done = cli_imports(*argv)
    assert done.code in (0, None), done.stderr
    assert done.heavy == [], f"`tpulab {' '.join(argv)}` imported {done.heavy}"
    assert "Usage" in done.stdout or "tpulab" in done.stdout


def test_probe_would_notice_a_heavy_import() -> None:
    # The check above must be able to fail: an import of jax shows up in the same probe.
    assert "jax" in cli_imports("--help", preamble="import jax").heavy
