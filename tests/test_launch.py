"""The suite runs the same however it is launched: started with SIGINT (and SIGHUP)
ignored, as a background job of a non-interactive shell or `nohup` starts it, the
children its tests signal still start with those signals at their defaults
(conftest.py), so a Ctrl-C a test sends reaches them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# What a child sees: True when SIGINT was at its default when it started (Python then
# installs its KeyboardInterrupt handler), False when it inherited SIGINT ignored.
_SIGINT_AT_DEFAULT = (
    "import signal; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"
)

# pytest as `nohup` (or a shell's background job) starts it: SIGINT and SIGHUP ignored.
_IGNORING = (
    "import os, signal, sys\n"
    "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
    "signal.signal(signal.SIGHUP, signal.SIG_IGN)\n"
    "os.execv(sys.executable, [sys.executable, '-m', 'pytest', *sys.argv[1:]])\n"
)


def test_a_child_starts_with_sigint_at_its_default() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _SIGINT_AT_DEFAULT],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert done.stdout.strip() == "True", "the child inherited SIGINT ignored"


@pytest.mark.e2e(reason="a pytest run in a subprocess")
def test_a_suite_started_with_sigint_ignored_starts_children_at_the_default() -> None:
    this = f"{Path(__file__).relative_to(REPO)}::test_a_child_starts_with_sigint_at_its_default"
    done = subprocess.run(
        [sys.executable, "-c", _IGNORING, "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
         "-n", "0", this],
        cwd=REPO, capture_output=True, text=True, timeout=240, check=False,
        env={**os.environ, "PYTEST_ADDOPTS": ""},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "1 passed" in done.stdout
