"""`tpulab run` on a real terminal (a pty), as a user sees it (issue 10 #11, #12).

- A Ctrl-C during "Delete VM and confirm" is refused with "SIGINT ignored: ..."; that
  message must stand on a line of its own, not glued to the spinner (`0.2s^CSIGINT
  ignored`) nor erased by the spinner's next redraw.
- A signal while the final summary prints neither cuts it short nor turns the run's
  status into death by SIGINT (cli/run.py ignores signals there).

The run is a real subprocess against a served emulator whose deletes take seconds, so
the teardown is on screen long enough to press Ctrl-C into it.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tpulab.emulator import Timing
from tpulab.emulator.backends import make_host_backend
from tpulab.exits import EXIT_OK

if TYPE_CHECKING:
    from collections.abc import Iterator

    from emulator_fixtures import EmulatorStarter
    from pty_screen import PtyRun

    from tpulab.emulator import Emulator

pytest_plugins = ["emulator_fixtures"]

pytestmark = pytest.mark.slow

PROJECT = "pty-project"
TEARDOWN = "Delete VM and confirm"
# Deletes long enough to press Ctrl-C into; the rest fast.
SLOW_DELETE = Timing(create_seconds=0.2, delete_seconds=4.0, update_seconds=0.1, tick_seconds=0.02)


@pytest.fixture
def served(start_emulator: EmulatorStarter, tmp_path: Path) -> Iterator[Emulator]:
    backend = make_host_backend("embedded", tmp_path / "hosts", image="preloaded")
    emulator = start_emulator(tmp_path / "served", host_backend=backend, timing=SLOW_DELETE)
    try:
        yield emulator
    finally:
        emulator.stop()
        backend.close()


def start_run(emulator: Emulator) -> PtyRun:
    from pty_screen import spawn

    return spawn(
        ["run", "--accelerator", "v5litepod-4", "--api-endpoint", emulator.url,
         "--project", PROJECT, "--zone", "us-central1-a"],
    )  # fmt: skip


def test_sigint_ignored_stands_on_its_own_line_above_the_spinner(served: Emulator) -> None:
    run = start_run(served)
    try:
        assert run.read_until(lambda r: r.shows(TEARDOWN), timeout=240), run.screen
        # The teardown's spinner is up (its elapsed time is drawn): press Ctrl-C into it.
        assert run.read_until(lambda r: r.shows(f"{TEARDOWN}    0."), timeout=30), run.screen
        run.press(b"\x03")
        assert run.read_until(lambda r: r.shows("SIGINT ignored"), timeout=30), run.screen
        # Let the spinner redraw a few times over the message's neighbourhood.
        run.read_until(lambda r: False, timeout=1.0)
        status = run.finish(timeout=120)
    finally:
        run.kill()
    screen = run.screen
    messages = [line for line in screen if "SIGINT ignored" in line]
    assert messages, "\n".join(screen)
    # Whole, from the first column: no spinner text and no echoed ^C in front of it.
    assert all(line.startswith("SIGINT ignored: deleting") for line in messages), messages
    assert "tpulab will exit when it is done" in messages[0]
    assert f"✓ {TEARDOWN}" in "\n".join(screen), "\n".join(screen)
    assert status == EXIT_OK, "\n".join(screen)
    assert served.node_names() == []


def _blocked_writing_stdout(pid: int) -> bool:
    """Is the process asleep in a write to a full pipe (Linux: its wait channel)?"""
    try:
        return "pipe_write" in Path(f"/proc/{pid}/wchan").read_text()
    except OSError:
        return False


def test_a_signal_during_the_summary_neither_cuts_it_nor_changes_the_status(
    served: Emulator, tmp_path: Path
) -> None:
    """With --json the envelope is the only thing on stdout, written after teardown. The
    test gives stdout a one-page pipe it has almost filled itself and does not read, so
    the CLI blocks inside that write -- inside the summary -- every time. SIGINT, SIGTERM
    and SIGHUP sent then must change nothing: whole envelope, the run's own status 0."""
    import fcntl
    import json
    import os
    import subprocess
    import sys
    import time

    read_end, write_end = os.pipe()
    capacity = fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 4096)
    filler = capacity - 64  # room for the envelope's first 64 bytes only
    os.write(write_end, b"#" * filler)
    stderr_path = tmp_path / "stderr.txt"
    with stderr_path.open("wb") as stderr:
        child = subprocess.Popen(
            [sys.executable, "-m", "tpulab", "run", "--accelerator", "v5litepod-4",
             "--api-endpoint", served.url, "--project", PROJECT, "--zone", "us-central1-a",
             "--json"],
            stdout=write_end,
            stderr=stderr,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
    os.close(write_end)
    try:
        deadline = time.monotonic() + 240
        while not _blocked_writing_stdout(child.pid):
            assert child.poll() is None, stderr_path.read_text()
            assert time.monotonic() < deadline, stderr_path.read_text()
            time.sleep(0.05)
        # Blocked writing the envelope (nothing else goes to stdout with --json, and
        # --json draws no progress): the run is over, its node already deleted.
        assert served.node_names() == []
        assert served.calls["delete_node"] >= 1
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            child.send_signal(signum)
            time.sleep(0.1)
        assert child.poll() is None  # the signals did not end it
        with os.fdopen(read_end, "rb") as stdout:
            written = stdout.read()
        status = child.wait(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
    assert written[:filler] == b"#" * filler
    envelope = json.loads(written[filler:])  # whole: it parses
    log = stderr_path.read_text()
    assert status == EXIT_OK, log
    assert envelope["ok"] is True
    assert envelope["teardown"]["status"] == "confirmed", envelope["teardown"]
    assert "Traceback" not in log
    assert served.node_names() == []
