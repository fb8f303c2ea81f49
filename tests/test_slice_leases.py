"""Each worker of a slice reads its own lease, as each real worker VM has its own /tmp.

On Cloud TPU every worker VM of a multi-host slice runs the node's startup-script, so
every worker runs a watchdog, and each reads the lease file in its OWN /tmp: a renewal
that misses one worker lets that worker delete the whole node. The emulated workers
share this machine; the emulator gives each its own directory for /tmp
(`TPULAB_EMULATED_TMP`, `Emulator.vm_tmp`), so a renewal that misses a worker is seen
here as it would be online: that worker's watchdog fires.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import served_emulator, tpulab, wait_until, watchdog_saw_the_last_renewal

from tpulab.contract import EMULATED_TMP_ENV
from tpulab.emulator import Emulator
from tpulab.emulator.timing import Timing
from tpulab.remote.watchdog import WatchdogConfig, renew_command

PROJECT = "slice-lease-proj"
ZONE = "us-central1-a"
SLICE = "v5litepod-16"
HOSTS = 4
EXIT_OK = 0
EXIT_REMOTE = 4
IDLE_SECONDS = 600.0  # the session's lease (--idle); its watchdogs poll every 5 s
# DELETING lasts longer than two of the watchdogs' polls, so every watchdog whose lease
# lapsed has fired before the node (and its guests) is gone.
DELETE_SECONDS = 12.0


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Emulator]:
    timing = Timing(create_seconds=0.3, delete_seconds=DELETE_SECONDS)
    with served_emulator(tmp_path / "emulator", timing) as emulator:
        yield emulator


def _session_dir(name: str) -> Path:
    return Path(os.environ["TPULAB_HOME"]) / "state" / "sessions" / name


def _up(emulator: Emulator, name: str) -> dict[str, object]:
    done = tpulab(
        "up", "--accelerator", SLICE, "--api-endpoint", emulator.url, "--project", PROJECT,
        "--zone", ZONE, "--boot-timeout", "60", "--name", name,
        "--idle", f"{IDLE_SECONDS:g}s", "--ttl", "2h", timeout=400,
    )  # fmt: skip
    assert done.returncode == EXIT_OK, done.stderr + done.stdout
    state: dict[str, object] = json.loads((_session_dir(name) / "session.json").read_text())
    return state


def _lease(emulator: Emulator, state: dict[str, object], worker: int) -> Path:
    node = str(state["node_name"])
    return emulator.vm_tmp(PROJECT, ZONE, node, worker) / f"tpulab-lease-{state['run_id']}"


def _watchdog_log(emulator: Emulator, state: dict[str, object], worker: int) -> Path:
    node = str(state["node_name"])
    name = f"tpulab-watchdog-{state['run_id']}.log"
    return emulator.vm_tmp(PROJECT, ZONE, node, worker) / name


def _watchdog_deletes(emulator: Emulator, node: str) -> list[dict[str, object]]:
    """The DELETEs of the node sent with its own token: its watchdogs'."""
    return [
        r
        for r in emulator.requests()
        if r["method"] == "DELETE" and "caller" in r and str(r["path"]).endswith(f"/nodes/{node}")
    ]


def test_the_renew_script_writes_into_the_workers_own_tmp(tmp_path: Path) -> None:
    """The renew argv under the VM's sh: into $TPULAB_EMULATED_TMP when set, one file per
    worker; into /tmp itself, at the config's own path, when not (a real VM)."""
    shell = shutil.which("dash") or "sh"
    config = WatchdogConfig(
        run_id=f"20261205t000000-{uuid.uuid4().hex[:6]}",
        node_name="tpulab-lease-script",
        zone=ZONE,
        project=PROJECT,
        lease_seconds=60.0,
        boot_grace_seconds=60.0,
        max_duration_seconds=600.0,
    )
    online = Path(config.lease_path)
    clean = {"PATH": os.environ["PATH"]}
    try:
        for worker in range(2):
            argv = renew_command(config, seq=10 + worker)
            env = {**clean, EMULATED_TMP_ENV: str(tmp_path / f"w{worker}")}
            (tmp_path / f"w{worker}").mkdir()
            subprocess.run([shell, *argv[1:]], env=env, check=True, timeout=30)
        for worker in range(2):
            written = (tmp_path / f"w{worker}" / online.name).read_text()
            assert json.loads(written)["seq"] == 10 + worker
        assert not online.exists()  # no worker's renewal landed in the shared /tmp
        subprocess.run([shell, *renew_command(config, seq=3)[1:]], env=clean, check=True)
        assert json.loads(online.read_text())["seq"] == 3
    finally:
        online.unlink(missing_ok=True)


def test_each_worker_of_a_slice_has_its_own_lease_file(served: Emulator) -> None:
    state = _up(served, "lease-1")
    run_id = str(state["run_id"])
    # `up` renewed the lease on every worker; each watchdog reads it in its own /tmp.
    leases = [_lease(served, state, worker) for worker in range(HOSTS)]
    assert all(lease.is_file() for lease in leases), leases
    assert len({lease.parent for lease in leases}) == HOSTS
    assert all(json.loads(lease.read_text())["lease_seconds"] == IDLE_SECONDS for lease in leases)
    # ... and each worker's watchdog keeps its log there, started for this node.
    for worker in range(HOSTS):
        log = _watchdog_log(served, state, worker).read_text()
        assert f"started for node {state['node_name']}" in log, (worker, log)
    # Nothing of this run went to the machine's shared /tmp.
    assert not Path(f"/tmp/tpulab-lease-{run_id}").exists()
    assert not Path(f"/tmp/tpulab-watchdog-{run_id}.log").exists()
    down = tpulab("down", "lease-1", timeout=120)
    assert down.returncode == EXIT_OK, down.stderr
    assert served.node_names(PROJECT) == []
    # The emulator powers a deleted node's workers off and clears their disks just after
    # the node leaves the listing (as a real VM's disk goes some time after its delete).
    worker_tmp = served.vm_tmp(PROJECT, ZONE, str(state["node_name"]), 2)
    wait_until(lambda: not worker_tmp.exists(), "worker 2's /tmp to be cleared")


def test_a_worker_the_renewals_miss_deletes_the_node_when_its_lease_lapses(
    served: Emulator,
) -> None:
    """Worker 2 drops off the network: `ssh` renews workers 0, 1 and 3 but not it. Once
    its lease lapses (the VMs' clocks moved forward), worker 2's watchdog deletes the
    node with the node's own token; the renewed workers' watchdogs do not fire. With one
    lease file for all four (a shared /tmp) worker 2 would read the others' renewal and
    never fire, and the same bug online would delete a real slice mid-run."""
    from tpulab.emulator.state import node_key
    from tpulab.emulator.workers import worker_key

    state = _up(served, "lease-2")
    node = str(state["node_name"])
    backend = served.host_backend
    assert backend is not None
    backend.stop(worker_key(node_key(PROJECT, ZONE, node), 2))
    # Worker 2's watchdog dates `up`'s renewal when it reads it, on its own clock: moved
    # before that, the renewal would be dated after the move and the lease would lapse
    # ten real minutes later (seen once the emulator stopped answering 40 ms late).
    wait_until(
        lambda: watchdog_saw_the_last_renewal(served, node, worker=2),
        "worker 2's watchdog to read up's renewal",
    )

    # Half a lease passes on the VMs; then a command renews every worker it can reach.
    served.skip_vm_clock(PROJECT, ZONE, node, IDLE_SECONDS / 2)
    renewed_before = [_lease(served, state, w).read_text() for w in range(HOSTS)]
    shell = tpulab("ssh", "lease-2", "--", "true", timeout=120)
    assert shell.returncode == EXIT_REMOTE, shell.stderr
    assert "to renew its lease (worker 2: " in shell.stderr, shell.stderr
    renewed_after = [_lease(served, state, w).read_text() for w in range(HOSTS)]
    changed = [w for w in range(HOSTS) if renewed_after[w] != renewed_before[w]]
    assert changed == [0, 1, 3]
    assert _watchdog_deletes(served, node) == []

    # The rest of worker 2's lease passes, and a little more: its watchdog fires; the
    # others were renewed half a lease ago and keep still.
    served.skip_vm_clock(PROJECT, ZONE, node, IDLE_SECONDS / 2 + 30)
    wait_until(lambda: _watchdog_deletes(served, node), "worker 2's watchdog to DELETE the node")
    # The emulator records the DELETE before its answer reaches the watchdog, which logs
    # "accepted" only then: the log is waited for, not read at once (a loaded run read it
    # between the two, 2026-12-06).
    accepted = f"DELETE v2/projects/{PROJECT}/locations/{ZONE}/nodes/{node} accepted"
    log = _watchdog_log(served, state, 2)
    wait_until(lambda: accepted in log.read_text(), "worker 2's watchdog to log its DELETE")
    fired = log.read_text()
    assert "firing: lease expired" in fired, fired
    for worker in (0, 1, 3):
        assert "firing" not in _watchdog_log(served, state, worker).read_text(), worker

    wait_until(lambda: served.node_names(PROJECT) == [], "the node to be gone", timeout=60)
    # Deleting lasted past two polls of every watchdog: only worker 2's fired.
    assert len(_watchdog_deletes(served, node)) == 1
    down = tpulab("down", "lease-2", timeout=120)
    assert down.returncode == EXIT_OK, down.stderr + down.stdout
    assert served.node_names(PROJECT) == []
