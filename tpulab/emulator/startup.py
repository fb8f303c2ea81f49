"""Run a node's `startup-script` at boot, as a process tree that dies with the node.

The guest agent's google_metadata_script_runner writes the script to a fresh temporary
directory (mode 0755), runs `/bin/bash -c <file>` (so a `#!` line is honoured), logs its
output and removes the directory when the script exits; systemd runs it at every boot
with `KillMode=process`, so what the script daemonises keeps running. `StartupScript`
does the same in the node's sandbox through `guest_init.py`, a per-node init process
(child subreaper) that kills the node's whole tree -- daemonised children included --
when the emulator stops it or dies (its stdin pipe closes even on SIGKILL), so nothing
a node started outlives the node, on this machine as in the cloud.

Files, under the sandbox (the node's HOME): `.tpulab-emulator/startup-script.log`
(output, appended across boots) and `.tpulab-emulator/metadata-scripts*/startup-script`
(only while the script runs).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from tpulab.emulator.processes import NODE_TAG_VAR, kill_tagged, new_node_tag

__all__ = ["GUEST_DIR", "StartupScript", "startup_log"]

log = logging.getLogger(__name__)

GUEST_DIR = ".tpulab-emulator"
_INIT = Path(__file__).with_name("guest_init.py")
_STOP_WAIT = 5.0


def startup_log(sandbox: Path) -> Path:
    return sandbox / GUEST_DIR / "startup-script.log"


class StartupScript:
    """One boot's run of `script` in `sandbox` with environment `env` (plus the tag)."""

    def __init__(self, node_key: str, sandbox: Path, script: str, env: Mapping[str, str]) -> None:
        self.sandbox = sandbox
        self.script = script
        self.tag = new_node_tag(node_key)
        self.env = {**env, NODE_TAG_VAR: self.tag}
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        guest_dir = self.sandbox / GUEST_DIR
        guest_dir.mkdir(parents=True, exist_ok=True)
        script_dir = Path(tempfile.mkdtemp(prefix="metadata-scripts", dir=guest_dir))
        script_file = script_dir / "startup-script"
        script_file.write_text(self.script, encoding="utf-8")
        script_file.chmod(0o755)
        log_file = startup_log(self.sandbox)
        with log_file.open("ab") as errors:
            self._process = subprocess.Popen(
                [
                    sys.executable,
                    "-I",  # the init is the emulator's, not the image's: no PYTHON* vars
                    str(_INIT),
                    str(log_file),
                    str(script_dir),
                    f"{NODE_TAG_VAR}={self.tag}",
                ],
                cwd=self.sandbox,
                env=self.env,
                stdin=subprocess.PIPE,  # never written: its EOF says the node is gone
                stdout=errors,
                stderr=errors,
                start_new_session=True,
            )
        log.info("startup-script of %s running (init pid %d)", self.sandbox, self._process.pid)

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def stop(self) -> None:
        """End the script and everything it started; returns once they are gone."""
        process, self._process = self._process, None
        if process is None:
            return
        assert process.stdin is not None
        with contextlib.suppress(OSError):
            process.stdin.close()
        try:
            process.wait(timeout=_STOP_WAIT)
        except subprocess.TimeoutExpired:
            log.warning("the init of %s did not stop; killing its session", self.sandbox)
            with contextlib.suppress(OSError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=_STOP_WAIT)
        kill_tagged(self.tag)  # a backstop for anything the init could not see
