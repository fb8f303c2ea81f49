"""`tpulab notebook`: Jupyter on a session's VM, commands and reports.

JupyterLab goes into the session's venv through the extras mechanism of `exec --with`
(`notebook_extras`, installed by `bootstrap.install_extras`: a stamp makes a second
notebook install nothing new). `remote_payloads/notebook.py` starts it in the synced
workspace (`workload.WORKSPACE_DIR`, where `tpulab exec` puts your files) bound to the
VM's loopback, and stops it; the laptop reaches it only through an SSH forward.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from tpulab import paths
from tpulab.errors import RemoteError
from tpulab.remote.bootstrap import LAB_DIR, VENV_DIR, VENV_PYTHON, Extras
from tpulab.remote.workload import WORKSPACE_DIR

__all__ = [
    "JUPYTER_PACKAGE",
    "NotebookServer",
    "notebook_extras",
    "parse_started",
    "parse_stopped",
    "start_command",
    "stop_command",
]

JUPYTER_PACKAGE = "jupyterlab"
STATE_FILE = f"{LAB_DIR}/notebook.json"
_STARTED = "TPULAB_NOTEBOOK "
_STOPPED = "TPULAB_NOTEBOOK_STOPPED "


def notebook_extras() -> Extras:
    """`--with jupyterlab`, as `exec` would install it."""
    return Extras(packages=(JUPYTER_PACKAGE,))


def _source() -> str:
    return paths.payload_path("notebook.py").read_text(encoding="utf-8")


def start_command() -> list[str]:
    """Start Jupyter (the token goes on stdin); prints `TPULAB_NOTEBOOK {...}`."""
    return [VENV_PYTHON, "-c", _source(), "start", VENV_DIR, WORKSPACE_DIR, STATE_FILE]


def stop_command() -> list[str]:
    """Stop it, confirmed gone; prints `TPULAB_NOTEBOOK_STOPPED {...}`."""
    return [VENV_PYTHON, "-c", _source(), "stop", STATE_FILE]


@dataclass(frozen=True)
class NotebookServer:
    pid: int
    port: int  # on the VM's loopback


def _report(stdout: str, marker: str, what: str) -> dict[str, object]:
    for line in reversed(stdout.splitlines()):
        if line.startswith(marker):
            try:
                found = json.loads(line[len(marker) :])
            except ValueError:
                break
            if isinstance(found, dict):
                return found
    raise RemoteError(f"The VM did not report {what} (no {marker.strip()} line).")


def parse_started(stdout: str) -> NotebookServer:
    found = _report(stdout, _STARTED, "the started notebook")
    return NotebookServer(pid=int(str(found["pid"])), port=int(str(found["port"])))


def parse_stopped(stdout: str) -> tuple[int, str]:
    """(pid, how): how it went -- "TERM", "KILL", or "none" (nothing was running)."""
    found = _report(stdout, _STOPPED, "the notebook stopped")
    return int(str(found["pid"])), str(found["how"])
