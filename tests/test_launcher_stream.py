"""The workload launcher's streamed output never throttles the command.

remote_payloads/workload_launcher.py run as the VM runs it (a real subprocess), its
stdout a pipe that this test does NOT read: the laptop that cannot keep up, at its most
extreme. The command must still run to its end at full speed (observed on the "VM"
side: the launcher's status file says it ended), its whole output must be in the log,
and the stream must say how many lines it dropped and where they are.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path

from tpulab.remote.workload import parse_launch_report

LAUNCHER = Path(__file__).resolve().parent.parent / "remote_payloads" / "workload_launcher.py"
LINES = 1_000_000  # ~ 60 MB: far past every pipe, SSH window and the launcher's buffer
# Writes LINES numbered lines as fast as it can, then says when it was done.
NOISY = """
import sys, time
out = sys.stdout
for i in range(int(sys.argv[1])):
    out.write(f"line {i:09d} of the command's output, as fast as it can go\\n")
out.flush()
"""


def _launch(tmp_path: Path, *command: str) -> tuple[subprocess.Popen[bytes], dict[str, Path]]:
    layout = {name: tmp_path / "run" / name for name in ("out", "output.log", "pid", "status")}
    process = subprocess.Popen(
        [
            sys.executable, str(LAUNCHER), "--workspace", str(tmp_path),
            "--run-dir", str(layout["out"]), "--log", str(layout["output.log"]),
            "--pid-file", str(layout["pid"]), "--status", str(layout["status"]),
            "--venv", str(tmp_path / "venv"), "--timeout", "300", "--", *command,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    return process, layout


def _ended(status: Path, process: subprocess.Popen[bytes], within: float) -> dict[str, object]:
    """The launcher's final status, once it has written it (the command ended)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            said = json.loads(status.read_text())
        except (OSError, ValueError):
            said = {}
        if "exit_status" in said:
            return said  # type: ignore[no-any-return]
        assert process.poll() is None, "the launcher died"
        time.sleep(0.05)
    raise AssertionError(f"the command did not end within {within:g} s: its output throttled it")


def test_a_reader_that_does_not_read_never_slows_the_command(tmp_path: Path) -> None:
    process, layout = _launch(tmp_path, sys.executable, "-c", NOISY, str(LINES))
    try:
        # Nobody reads the launcher's stdout until the command has ended. The bound is
        # far above the command's own time (~1 s here, unloaded).
        status = _ended(layout["status"], process, within=60)
        assert status["exit_status"] == 0
        stdout, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0
    # The log on the VM has every line, in order.
    log = layout["output.log"].read_bytes().splitlines()
    assert len(log) == LINES
    assert log[-1].startswith(b"line %09d" % (LINES - 1))
    # The stream has fewer, and says how many it dropped, where it dropped them.
    streamed = stdout.splitlines()
    notices = [line for line in streamed if line.startswith(b"tpulab: ")]
    assert notices, streamed[-3:]
    dropped = sum(int(line.split()[1]) for line in notices)
    assert all(line.endswith(b" lines not streamed: see output.log") for line in notices)
    assert len(streamed) - len(notices) + dropped == LINES
    report = parse_launch_report(stderr.decode())
    assert report is not None
    assert report.exit_status == 0
    assert report.unstreamed_lines == dropped


def test_a_reader_that_keeps_up_gets_every_line(tmp_path: Path) -> None:
    process, layout = _launch(tmp_path, sys.executable, "-c", NOISY, "20000")
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 0
    assert stdout == layout["output.log"].read_bytes()
    report = parse_launch_report(stderr.decode())
    assert report is not None
    assert report.unstreamed_lines == 0


# A progress bar: states redrawn with carriage returns, no newline until the end, which
# waits for the test to say so (the file it names appears).
BAR = """
import os, sys, time
for i in range(4):
    sys.stderr.write(f"\\r{i * 25:3d}%|bar")
    sys.stderr.flush()
while not os.path.exists(sys.argv[1]):
    time.sleep(0.01)
sys.stderr.write("\\r100%|bar\\n")
"""


def test_a_progress_bar_reaches_the_stream_while_it_runs(tmp_path: Path) -> None:
    go_on = tmp_path / "go-on"
    process, _layout = _launch(tmp_path, sys.executable, "-c", BAR, str(go_on))
    try:
        assert process.stdout is not None
        seen = b""
        deadline = time.monotonic() + 60
        # The bar's states, while the command cannot end: the stream must carry them.
        while b" 75%|bar" not in seen and time.monotonic() < deadline:
            ready, _, _ = select.select([process.stdout], [], [], 0.5)
            if ready:
                seen += os.read(process.stdout.fileno(), 4096)
        assert seen == b"\r  0%|bar\r 25%|bar\r 50%|bar\r 75%|bar", seen
        go_on.touch()
        rest, _ = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert (seen + rest).startswith(b"\r  0%|bar\r 25%|bar\r 50%|bar\r 75%|bar\r100%|bar")
    assert process.returncode == 0


def test_a_drop_notice_is_on_a_line_of_its_own_even_inside_a_long_line(tmp_path: Path) -> None:
    # One 10 MB line, no newline until its end, and nobody reading until the command
    # ended: the stream drops what its 4 MiB buffer cannot hold, in the middle of that
    # line. The notice must still start a line, or it is lost in the line's tail.
    long_line = "import sys; sys.stdout.write('x' * 10_000_000 + '\\n'); sys.stdout.flush()"
    process, layout = _launch(tmp_path, sys.executable, "-c", long_line)
    try:
        assert _ended(layout["status"], process, within=60)["exit_status"] == 0
        stdout, _ = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    lines = stdout.split(b"\n")
    noticed = [line for line in lines if b"lines not streamed" in line]
    assert noticed, "the stream dropped nothing: the test did not test"
    assert all(line.startswith(b"tpulab: ") for line in noticed), [n[:40] for n in noticed]
    assert layout["output.log"].read_bytes() == b"x" * 10_000_000 + b"\n"
