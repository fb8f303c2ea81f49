"""`tpulab --help` and friends stay light: no jax, paramiko, google.cloud or asyncssh.

Checked in a fresh interpreter, because this test process has imported them already.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

_PROBE = """
import json, sys
from tpulab.cli import app
try:
    app(sys.argv[1:], prog_name="tpulab")
except SystemExit as done:
    code = done.code
else:
    code = 0
heavy = sorted(name for name in sys.modules if name.split(".")[0] in {"jax", "jaxlib",
    "paramiko", "asyncssh", "grpc", "numpy"} or name.startswith("google.cloud"))
print("\\nPROBE " + json.dumps({"code": code, "heavy": heavy}))
"""


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
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, *argv], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    probe = json.loads(done.stdout.rsplit("PROBE ", 1)[1])
    assert probe["code"] in (0, None)
    assert probe["heavy"] == [], f"`tpulab {' '.join(argv)}` imported {probe['heavy']}"
    assert "Usage" in done.stdout or "tpulab" in done.stdout


def test_probe_would_notice_a_heavy_import() -> None:
    # The check above must be able to fail: an import of jax shows up in the same probe.
    probe = _PROBE.replace("from tpulab.cli import app", "from tpulab.cli import app\nimport jax")
    done = subprocess.run(
        [sys.executable, "-c", probe, "--help"], capture_output=True, text=True, timeout=60
    )
    heavy = json.loads(done.stdout.rsplit("PROBE ", 1)[1])["heavy"]
    assert "jax" in heavy
