"""The bootstrap's download probe (`tpulab.remote.bootstrap._REACH`), run as the VM runs
it: `sh -c` with `python3` first on PATH being a Python 3.10 (TPU VM images' own), in an
environment that holds only what the test gives it.

Each source is found the way the installer finds it: uv's index from UV_DEFAULT_INDEX,
pip's from PIP_INDEX_URL or pip.conf; a source that answers nothing stops the step with
exit 44 and its URL (credentials left out); downloads that are off probe nothing.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import pytest
from helpers import require_tool

from tpulab.remote import bootstrap as boot


@pytest.fixture
def python310_bin(tmp_path: Path) -> Path:
    """A directory whose `python3` is a Python 3.10 (as on a TPU VM image)."""
    python = os.environ.get("TPULAB_TEST_PY310", "")
    require_tool(bool(python), "a Python 3.10 (TPULAB_TEST_PY310)")
    directory = tmp_path / "image-bin"
    directory.mkdir()
    (directory / "python3").symlink_to(python)
    return directory


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _reach(kind: str, bin_dir: Path, home: Path, **env: str) -> subprocess.CompletedProcess[str]:
    script = boot._REACH_FUNCTION + 'reach "$1" || exit 44\necho "step goes on"\n'
    clean = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(home), **env}
    return subprocess.run(
        ["sh", "-c", script, "sh", kind],
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_an_index_at_a_closed_port_stops_the_step_in_seconds_naming_it(
    python310_bin: Path, tmp_path: Path
) -> None:
    index = f"http://127.0.0.1:{_closed_port()}/simple"
    started = time.monotonic()
    done = _reach("uv", python310_bin, tmp_path, UV_DEFAULT_INDEX=index)
    assert time.monotonic() - started < boot.REACH_TIMEOUT + 5
    assert done.returncode == boot.UNREACHABLE_EXIT, done
    assert done.stdout.startswith(f"{boot.UNREACHABLE_MARKER}uv {index} ConnectionRefusedError")
    assert "step goes on" not in done.stdout


def test_pip_reads_its_index_from_pip_conf_and_a_file_index_must_exist(
    python310_bin: Path, tmp_path: Path
) -> None:
    index = tmp_path / "simple"
    conf = tmp_path / ".config" / "pip" / "pip.conf"
    conf.parent.mkdir(parents=True)
    conf.write_text(f"[global]\nindex-url = {index.as_uri()}\n")
    missing = _reach("pip", python310_bin, tmp_path)
    assert missing.returncode == 44, missing
    assert f"pip {index.as_uri()} no such file or directory" in missing.stdout
    index.mkdir()
    there = _reach("pip", python310_bin, tmp_path)
    assert there.returncode == 0, there
    assert f"TPULAB_REACHED pip {index.as_uri()}" in there.stdout
    assert "step goes on" in there.stdout
    # PIP_INDEX_URL wins over the file, as pip has it.
    other = f"http://127.0.0.1:{_closed_port()}/other"
    assert _reach("pip", python310_bin, tmp_path, PIP_INDEX_URL=other).returncode == 44


def test_credentials_in_an_index_url_are_not_printed(python310_bin: Path, tmp_path: Path) -> None:
    port = _closed_port()
    done = _reach(
        "pip", python310_bin, tmp_path, PIP_INDEX_URL=f"http://me:s3cret@127.0.0.1:{port}/simple"
    )
    assert done.returncode == 44, done
    assert f"http://127.0.0.1:{port}/simple" in done.stdout
    assert "s3cret" not in done.stdout + done.stderr


def test_downloads_that_are_off_probe_nothing(python310_bin: Path, tmp_path: Path) -> None:
    closed = f"http://127.0.0.1:{_closed_port()}"
    off = _reach(
        "python", python310_bin, tmp_path,
        UV_PYTHON_DOWNLOADS="never", UV_PYTHON_INSTALL_MIRROR=closed,
    )  # fmt: skip
    assert off.returncode == 0, off
    assert off.stdout == "step goes on\n"
    on = _reach("python", python310_bin, tmp_path, UV_PYTHON_INSTALL_MIRROR=closed)
    assert on.returncode == 44, on
    assert f"python {closed}" in on.stdout
    offline = _reach("uv", python310_bin, tmp_path, UV_OFFLINE="1", UV_DEFAULT_INDEX=closed)
    assert offline.returncode == 0, offline


def test_a_probe_that_cannot_run_decides_nothing(tmp_path: Path) -> None:
    """No python3 on the image: the step goes on (its own error is the one to read)."""
    empty = tmp_path / "no-python"
    empty.mkdir()
    script = boot._REACH_FUNCTION + 'reach uv || exit 44\necho "step goes on"\n'
    done = subprocess.run(
        ["/bin/sh", "-c", script],
        env={"PATH": str(empty), "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done
    assert "step goes on" in done.stdout
