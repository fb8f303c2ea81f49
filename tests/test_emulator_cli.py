"""`tpulab emulator serve` refuses what it cannot serve, once and clearly: a corrupt or
misnamed state, non-finite timings, an empty --host, a missing OpenSSH; and what it
prints is usable (a wildcard bind is advertised on loopback)."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tpulab.emulator import Timing
from tpulab.exits import EXIT_CONFIG

SERVE = [sys.executable, "-m", "tpulab", "emulator", "serve", "--port", "0", "--ssh", "none"]
WIDE = {**os.environ, "COLUMNS": "1000"}  # so messages are not wrapped mid-path


def refused(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """Run `serve` expecting it to stop by itself; one that keeps serving fails here."""
    try:
        return subprocess.run(
            [*SERVE, *args], capture_output=True, text=True, timeout=timeout, check=False, env=WIDE
        )
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"serve {args} kept running instead of refusing: {expired.stderr!r}")


class Served:
    """A `serve` subprocess whose banner has been read."""

    def __init__(self, *args: str) -> None:
        self.process = subprocess.Popen(
            [*SERVE, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=WIDE
        )
        assert self.process.stdout is not None
        self.first_line = self.process.stdout.readline()
        assert "listening on" in self.first_line, self.first_line
        self.url = self.first_line.split()[-1]

    def finish(self, *, timeout: float) -> tuple[int, str, str]:
        try:
            out, err = self.process.communicate(timeout=timeout)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
        return self.process.returncode, out, err


def test_a_corrupt_state_file_is_refused_at_start_naming_the_file(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "state.json").write_text("{not json")
    done = refused("--state", str(state))
    assert done.returncode == EXIT_CONFIG, done.stderr
    assert str(state / "state.json") in done.stderr
    assert "not valid JSON" in done.stderr
    assert "Move" in done.stderr  # what to do about it
    assert "Traceback" not in done.stderr


def test_an_image_json_naming_no_image_is_refused_at_start(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "image.json").write_text('{"kind": "ubuntu-22.04"}')
    done = refused("--state", str(state), "--ssh", "embedded")  # the last --ssh wins
    assert done.returncode == EXIT_CONFIG, done.stderr
    assert f"{state / 'image.json'} does not name an emulated image" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (state / "state.json").exists()  # refused before it served anything


def test_state_corrupted_while_serving_stops_the_server_once(tmp_path: Path) -> None:
    state = tmp_path / "state"
    served = Served("--state", str(state))
    try:
        # Under the emulator's own lock, as its writers do. write_text truncates, then
        # writes: a tick that read in between saw an empty file, took it for a fresh
        # state and wrote one over the damage, then served on (CI, 2026-12-07; 3 of 18
        # runs under load, 0 of 42 with the lock).
        with (state / "state.lock").open("a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            (state / "state.json").write_text("[1, 2")
        started = time.monotonic()
        code, _, err = served.finish(timeout=15)
    except subprocess.TimeoutExpired:
        pytest.fail("the emulator kept serving (and logging) on a corrupt state file")
    assert time.monotonic() - started < 10
    assert code == EXIT_CONFIG, err
    assert str(state / "state.json") in err
    assert "Traceback" not in err
    assert len(err) < 4000  # said once, not 20 times a second


@pytest.mark.parametrize("ssh", ["none", "embedded"])
def test_a_state_path_naming_a_file_is_reported_as_such(tmp_path: Path, ssh: str) -> None:
    # With SSH hosts, their image directory under the state was made first: a traceback.
    a_file = tmp_path / "not-a-dir"
    a_file.write_text("")
    done = refused("--state", str(a_file), "--ssh", ssh)
    assert "Traceback" not in done.stderr
    assert done.returncode == EXIT_CONFIG
    assert f"{a_file} is a file, not a directory" in done.stderr
    assert "Cannot listen" not in done.stderr  # the port was never the problem
    below = refused("--state", str(a_file / "below"), "--ssh", ssh)
    assert "Traceback" not in below.stderr
    assert below.returncode == EXIT_CONFIG
    assert f"Cannot create the emulator state directory {a_file / 'below'}" in below.stderr


def test_a_state_json_that_is_a_directory_is_not_blamed_on_the_port(tmp_path: Path) -> None:
    (tmp_path / "state" / "state.json").mkdir(parents=True)
    done = refused("--state", str(tmp_path / "state"))
    assert done.returncode == EXIT_CONFIG, done.stderr
    assert f"Cannot read the emulator state in {tmp_path / 'state'}" in done.stderr
    assert "Cannot listen" not in done.stderr


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--create-seconds", "nan"),
        ("--create-seconds", "inf"),
        ("--delete-seconds", "inf"),
        ("--delete-seconds", "-1"),
    ],
)
def test_non_finite_or_negative_timings_are_refused(tmp_path: Path, flag: str, value: str) -> None:
    done = refused("--state", str(tmp_path / "state"), flag, value)
    assert done.returncode == EXIT_CONFIG, done.stderr
    assert flag in done.stderr
    assert "finite" in done.stderr


def test_timing_itself_rejects_non_finite_values() -> None:
    for field in (
        "create_seconds",
        "delete_seconds",
        "stockout_seconds",
        "tick_seconds",
        "idle_tick_seconds",
    ):
        for bad in (float("nan"), float("inf")):
            with pytest.raises(ValueError, match=field):
                Timing(**{field: bad})  # type: ignore[arg-type]


def test_an_empty_host_is_refused(tmp_path: Path) -> None:
    done = refused("--state", str(tmp_path / "state"), "--host", "")
    assert done.returncode == EXIT_CONFIG
    assert "--host is empty" in done.stderr
    assert "0.0.0.0" in done.stderr  # how to say "every interface" on purpose


def test_a_wildcard_bind_prints_a_loopback_url_that_works(tmp_path: Path) -> None:
    from tpulab.cloud.google import GoogleTpuApi

    served = Served("--state", str(tmp_path / "state"), "--host", "0.0.0.0")
    try:
        assert served.url.startswith("http://127.0.0.1:"), served.first_line
        port = served.url.rsplit(":", 1)[1]
        assert served.process.stdout is not None
        banner = [served.process.stdout.readline() for _ in range(4)]
        assert any(f"--api-endpoint http://127.0.0.1:{port} " in line for line in banner)
        assert not any("0.0.0.0" in line for line in banner), banner
        assert GoogleTpuApi("p", api_endpoint=served.url).list_nodes("us-central1-a") == []
        served.process.send_signal(signal.SIGTERM)
        code, _, err = served.finish(timeout=20)
    finally:
        if served.process.poll() is None:
            served.process.kill()
    assert code == 0, err
    assert "listening on 0.0.0.0" in err  # the beyond-loopback warning stays


def test_openssh_backend_refuses_at_start_without_sshd_or_sftp_server(tmp_path: Path) -> None:
    from tpulab.emulator.openssh import OpenSshHostBackend, OpenSshMissingError

    with pytest.raises(OpenSshMissingError) as missing:
        OpenSshHostBackend(tmp_path, sshd=str(tmp_path / "no-sshd"))
    assert str(tmp_path / "no-sshd") in str(missing.value)
    assert "apt-get install -y openssh-server" in (missing.value.hint or "")
    # An sshd that exists is not enough: sessions' file transfer needs sftp-server too.
    sshd = tmp_path / "sshd"
    sshd.write_text("#!/bin/sh\n")
    os.chmod(sshd, 0o755)
    with pytest.raises(OpenSshMissingError, match="sftp-server") as missing:
        OpenSshHostBackend(tmp_path, sshd=str(sshd), sftp_server=str(tmp_path / "no-sftp"))
    assert "openssh-server" in (missing.value.hint or "")


def test_an_invalid_faults_file_is_refused_naming_it(tmp_path: Path) -> None:
    """A faults.json that is not a fault plan is refused naming the file, not a crash."""
    state = tmp_path / "state"
    state.mkdir()
    (state / "faults.json").write_text(json.dumps({"stockot": True}))
    done = refused("--state", str(state))
    assert done.returncode == EXIT_CONFIG, done.stderr
    assert str(state / "faults.json") in done.stderr
    assert "Traceback" not in done.stderr
