"""Sessions on a multi-host slice (v5litepod-16: 4 workers) as a user types them: real
`tpulab` subprocesses against an emulator served from this process (a session outlives
each command), one real SSH host per worker. Every slow test ends by asking the
emulator what is left.

A renewal must reach every worker: one whose SSH host is stopped is met and named here;
that worker's watchdog then deleting the node is tests/test_slice_leases.py (each
emulated worker has its own /tmp, so its own lease file).
"""

from __future__ import annotations

import base64
import json
import os
import signal
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import refused_port, served_emulator, tpulab, wait_until

from tpulab.emulator import Emulator
from tpulab.errors import ConfigError

PROJECT = "slice-session-proj"
ZONE = "us-central1-a"
SLICE = "v5litepod-16"
HOSTS = 4
EXIT_OK = 0
EXIT_CONFIG = 2
EXIT_REMOTE = 4
EXIT_WORKLOAD = 9
EXIT_INTERRUPTED = 130


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Emulator]:
    with served_emulator(tmp_path / "emulator") as emulator:
        yield emulator


def _up_argv(emulator: Emulator, name: str) -> list[str]:
    return [
        "up", "--accelerator", SLICE, "--api-endpoint", emulator.url, "--project", PROJECT,
        "--zone", ZONE, "--boot-timeout", "60", "--name", name,
    ]  # fmt: skip


def _session_dir(name: str) -> Path:
    return Path(os.environ["TPULAB_HOME"]) / "state" / "sessions" / name


def _up(emulator: Emulator, name: str) -> dict[str, object]:
    done = tpulab(*_up_argv(emulator, name), timeout=400)
    assert done.returncode == EXIT_OK, done.stderr + done.stdout
    assert f"({SLICE}, {HOSTS} workers)" in done.stdout, done.stdout
    state: dict[str, object] = json.loads((_session_dir(name) / "session.json").read_text())
    return state


def _write_job(work: Path) -> None:
    """A job whose every worker writes who it is (and how many they are) into its run dir;
    worker 2 fails instead when FAIL_ON_2 is set."""
    work.mkdir()
    (work / "job.py").write_text(
        "import os, pathlib, sys, time\n"
        "me, of = os.environ['TPULAB_WORKER_ID'], os.environ['TPULAB_NUM_WORKERS']\n"
        "if os.environ.get('FAIL_ON_2') and me == '2':\n"
        "    print('worker 2 gives up', flush=True)\n"
        "    sys.exit(3)\n"
        "if os.environ.get('FAIL_ON_2'):\n"
        "    time.sleep(240)\n"
        "coordinator = os.environ.get('JAX_COORDINATOR_ADDRESS', '-')\n"
        "said = f'{me} {of} {coordinator}'\n"
        "pathlib.Path(os.environ['TPULAB_RUN_DIR'], 'id.txt').write_text(said)\n"
        "print('worker', me, 'of', of, flush=True)\n"
    )


@pytest.mark.longest
def test_up_exec_ssh_and_down_on_a_slice(served: Emulator, tmp_path: Path) -> None:
    state = _up(served, "slice-1")
    others = state["other_workers"]
    assert isinstance(others, list)
    assert len(others) == HOSTS - 1
    # Every worker is its own machine: its own address and its own pinned host key.
    hosts = {state["ssh_host"], *(w["host"] for w in others)}
    keys = {state["host_key_b64"], *(w["host_key_b64"] for w in others)}
    assert len(hosts) == len(keys) == HOSTS
    node = str(state["node_name"])

    work, out = tmp_path / "work", tmp_path / "out"
    _write_job(work)
    done = tpulab(
        "exec", "slice-1", "--workdir", str(work), "--out", str(out), "--all-output",
        "--", "python", "job.py", timeout=300,
    )  # fmt: skip
    assert done.returncode == EXIT_OK, done.stderr + done.stdout
    for worker in range(HOSTS):
        said = (out / f"worker-{worker}" / "run" / "id.txt").read_text().split()
        # The same environment as `run -- CMD`: its worker, all of them, one coordinator.
        assert said == [str(worker), str(HOSTS), str(state["coordinator"])]
        assert f"w{worker} ┃ worker {worker} of {HOSTS}" in done.stderr + done.stdout
    record = json.loads((out / "run.json").read_text())
    assert len(record["worker_seconds"]["lease"]) == HOSTS  # the lease armed on each
    assert "lease renewal failed" not in done.stderr

    # ssh --worker 3 lands on worker 3 (its home is worker 3's, not worker 0's).
    # One argument: a command line for the remote shell, which expands $HOME there.
    shell = tpulab("ssh", "slice-1", "--worker", "3", "--", "echo $HOME", timeout=60)
    assert shell.returncode == EXIT_OK, shell.stderr
    assert Path(shell.stdout.strip()).resolve() == served.sandbox(PROJECT, ZONE, node, 3).resolve()
    default = tpulab("ssh", "slice-1", "--", "echo $HOME", timeout=60)
    assert Path(default.stdout.strip()).resolve() == served.sandbox(PROJECT, ZONE, node).resolve()
    beyond = tpulab("ssh", "slice-1", "--worker", "4", "--", "true", timeout=60)
    assert beyond.returncode == EXIT_CONFIG, beyond.stderr
    assert "has 4 workers (0-3): there is no worker 4" in beyond.stderr

    # Worker 2 fails: the others are stopped, not waited for, and worker 2 is named.
    failed = tpulab(
        "exec", "slice-1", "--workdir", str(work), "--out", str(tmp_path / "fail"),
        "--env", "FAIL_ON_2=1", "--", "python", "job.py", timeout=300,
    )  # fmt: skip
    assert failed.returncode == EXIT_WORKLOAD, failed.stderr + failed.stdout
    assert "on worker 2 of 4 (the first to fail; the others were stopped)" in failed.stderr
    log = tmp_path / "fail" / "worker-2" / "output.log"
    assert "worker 2 gives up" in log.read_text()
    assert "session   still up" in failed.stdout

    down = tpulab("down", "slice-1", timeout=120)
    assert down.returncode == EXIT_OK, down.stderr
    assert not _session_dir("slice-1").exists()
    assert served.node_names(PROJECT) == []


def test_a_lease_renewal_that_misses_a_worker_names_it(served: Emulator) -> None:
    from tpulab.emulator.state import node_key
    from tpulab.emulator.workers import worker_key

    state = _up(served, "slice-2")
    node = str(state["node_name"])
    backend = served.host_backend
    assert backend is not None
    # Worker 2's VM drops off the network: its watchdog would see no renewal.
    backend.stop(worker_key(node_key(PROJECT, ZONE, node), 2))
    shell = tpulab("ssh", "slice-2", "--", "true", timeout=120)
    assert shell.returncode == EXIT_REMOTE, shell.stderr
    assert "to renew its lease (worker 2: " in shell.stderr, shell.stderr
    # The others still answer; the session is not concluded gone (its node is READY).
    assert _session_dir("slice-2").exists()
    down = tpulab("down", "slice-2", timeout=120)
    assert down.returncode == EXIT_OK, down.stderr
    assert served.node_names(PROJECT) == []


def test_ctrl_c_during_a_slice_up_leaves_nothing(served: Emulator) -> None:
    up = subprocess.Popen(
        [sys.executable, "-m", "tpulab", *_up_argv(served, "slice-3")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    said: list[str] = []
    assert up.stdout is not None
    reader = threading.Thread(target=lambda: said.extend(up.stdout or ()), daemon=True)
    reader.start()
    try:
        # Interrupted while every worker runs the verifier: the node exists, billing.
        wait_until(lambda: any("Stage payload" in line for line in said), "the payload staged")
        up.send_signal(signal.SIGINT)
        up.wait(timeout=240)
    finally:
        if up.poll() is None:
            up.kill()
    reader.join(timeout=10)
    output = "".join(said)
    assert up.returncode == EXIT_INTERRUPTED, output
    assert "Delete VM and confirm" in output
    assert "confirmed by list" in output
    assert not _session_dir("slice-3").exists()
    assert served.node_names(PROJECT) == []


def test_a_slice_session_follows_a_worker_that_moved(served: Emulator, tmp_path: Path) -> None:
    """Worker 2's saved port made stale (as a restarted VM or emulator leaves it): `ssh`
    and `exec` ask the API where every worker is now, save it, and reach worker 2 there
    with the host key `up` pinned."""
    state = _up(served, "slice-4")
    node = str(state["node_name"])
    path = _session_dir("slice-4") / "session.json"

    def worker_2_port() -> int:
        return int(json.loads(path.read_text())["other_workers"][1]["port"])

    def make_stale(port: int) -> None:
        saved = json.loads(path.read_text())
        saved["other_workers"][1]["port"] = port
        path.write_text(json.dumps(saved))

    real = worker_2_port()
    with refused_port() as stale:
        make_stale(stale)
        shell = tpulab("ssh", "slice-4", "--worker", "2", "--", "echo $HOME", timeout=120)
        assert shell.returncode == EXIT_OK, shell.stderr
        home = served.sandbox(PROJECT, ZONE, node, 2).resolve()
        assert Path(shell.stdout.strip()).resolve() == home
        said = " ".join(shell.stderr.split())
        assert f"worker 2 moved from 127.0.0.3:{stale} to 127.0.0.3:{real} (GetNode)" in said
        assert worker_2_port() == real  # saved for the next command

        make_stale(stale)
        work, out = tmp_path / "work", tmp_path / "out"
        _write_job(work)
        ran = tpulab(
            "exec", "slice-4", "--workdir", str(work), "--out", str(out),
            "--", "python", "job.py", timeout=300,
        )  # fmt: skip
        assert ran.returncode == EXIT_OK, ran.stderr + ran.stdout
        assert (out / "worker-2" / "run" / "id.txt").read_text().startswith("2 4 ")
        assert worker_2_port() == real
    down = tpulab("down", "slice-4", timeout=120)
    assert down.returncode == EXIT_OK, down.stderr
    assert served.node_names(PROJECT) == []


# -- session.json: every worker kept, older files still load -----------------------------


def _host_key(n: int) -> str:
    """A well-formed ssh-ed25519 public key blob (every byte `n`), as a guest publishes."""
    kind = b"ssh-ed25519"
    blob = struct.pack(">I", len(kind)) + kind + struct.pack(">I", 32) + bytes([n]) * 32
    return base64.b64encode(blob).decode()


_SINGLE: dict[str, object] = {
    "name": "old", "run_id": "20261201t000000-abcdef", "node_name": "tpulab-old",
    "zone": ZONE, "project": PROJECT, "api_endpoint": None, "accelerator_type": "v5litepod-4",
    "spot": False, "ssh_user": "tpulab", "ssh_host": "10.0.0.2", "ssh_port": 22,
    "host_key_type": "ssh-ed25519", "host_key_b64": _host_key(0), "watchdog": {},
    "started_at": 1.0, "deadline_at": 2.0, "idle_seconds": 1.0, "renewed_at": 1.0,
    "receipt_id": "r-1",
}  # fmt: skip


def _worker(n: int) -> dict[str, object]:
    return {"host": f"10.0.0.{2 + n}", "port": 22, "host_key_type": "ssh-ed25519",
            "host_key_b64": _host_key(n)}  # fmt: skip


def test_a_session_file_from_before_slices_loads_as_one_worker() -> None:
    from tpulab.run.session_state import SessionState

    state = SessionState.from_json(json.dumps(_SINGLE))
    assert state.worker_count == 1
    assert state.coordinator is None
    (only,) = state.worker_targets()
    assert (only.host, only.port, only.host_key.b64) == ("10.0.0.2", 22, _host_key(0))
    with pytest.raises(ConfigError, match="has one worker \\(0\\): there is no worker 1"):
        state.worker_target(1)


def test_a_slice_session_keeps_every_worker_in_order_and_strictly() -> None:
    from tpulab.run.session_state import SessionState

    written = dict(
        _SINGLE,
        accelerator_type=SLICE,
        other_workers=[_worker(1), _worker(2), _worker(3)],
        coordinator="10.1.0.2:8476",
    )
    state = SessionState.from_json(json.dumps(written))
    assert [t.host for t in state.worker_targets()] == [f"10.0.0.{2 + n}" for n in range(HOSTS)]
    assert state.worker_target(3).host_key.b64 == _host_key(3)
    # Renewing (or moving worker 0) keeps the other workers as they are.
    again = SessionState.from_json(state.renewed(5.0).to_json())
    assert again.other_workers == state.other_workers
    assert again.renewed_at == 5.0
    # As strict as the rest of the file: a port written as text is refused, in words.
    broken = dict(written, other_workers=[dict(_worker(1), port="22")])
    with pytest.raises(ValueError, match=r"other_workers\.0\.port"):
        SessionState.from_json(json.dumps(broken))
