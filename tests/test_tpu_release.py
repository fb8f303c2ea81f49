"""tpulab.remote.tpu_release: the holders of the TPU's device files are killed and libtpu's
lock file removed, as MaxText does before each launch; nothing else is touched.

The script runs for real (sh, /proc) with its device globs pointed at files this test
holds open, so no root and no TPU are needed (Linux only: it reads /proc)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tpulab.remote.tpu_release import TpuRelease, parse_release_report, release_command

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/fd").is_dir(), reason="the script reads /proc (Linux)"
)

HOLD = "import sys, time; f = open(sys.argv[1]); print('held', flush=True); time.sleep(600)"


def _holder(path: Path) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(path)], stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "held"  # it has the file open now
    return process


def _release(tmp_path: Path, *globs: str) -> TpuRelease:
    # Its wait for the killed to go is longer than this test waits for it: a script that
    # took a killed child of this test (a zombie until reaped) for alive would time out.
    lockfile = str(tmp_path / "libtpu_lockfile")
    argv = release_command(device_globs=globs, lockfile=lockfile, wait_seconds=600)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True)
    return parse_release_report(done.stdout)


def test_the_holders_are_killed_and_the_lock_file_removed(tmp_path: Path) -> None:
    (tmp_path / "accel0").write_text("")
    (tmp_path / "vfio").mkdir()
    (tmp_path / "vfio" / "0").write_text("")
    (tmp_path / "libtpu_lockfile").write_text("")
    bystander_file = tmp_path / "notes.txt"
    bystander_file.write_text("")
    holders = [_holder(tmp_path / "accel0"), _holder(tmp_path / "vfio" / "0")]
    bystander = _holder(bystander_file)
    try:
        release = _release(tmp_path, f"{tmp_path}/accel*", f"{tmp_path}/vfio/*")
        assert sorted(release.killed) == sorted(h.pid for h in holders)
        assert release.refused == ()
        assert release.removed_lockfile
        assert not (tmp_path / "libtpu_lockfile").exists()
        for holder in holders:  # dead by the time the report is printed (unreaped)
            assert _state(holder.pid) == "Z"
            assert holder.wait(timeout=5) == -9
        assert bystander.poll() is None  # a process holding another file is left alone
        assert "killed pid" in release.describe()
    finally:
        for process in (*holders, bystander):
            process.kill()
            process.wait()


def _state(pid: int) -> str:
    """The process's state letter in /proc (Z: a zombie, dead and not yet reaped)."""
    return Path(f"/proc/{pid}/stat").read_text().rpartition(") ")[2][:1]


def test_a_free_tpu_is_left_as_it_is(tmp_path: Path) -> None:
    (tmp_path / "accel0").write_text("")
    release = _release(tmp_path, f"{tmp_path}/accel*")
    assert release == TpuRelease(killed=(), refused=(), removed_lockfile=False)
    assert not release.anything
    assert release.describe() == "nothing held the TPU"


def test_output_without_the_report_is_an_error() -> None:
    with pytest.raises(ValueError, match="no TPULAB_TPU_RELEASE line"):
        parse_release_report("sh: 1: Syntax error\n")
