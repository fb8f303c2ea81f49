"""Multi-host slices end to end: a v5litepod-16 (4 workers) through the real run engine
against the emulator's four real SSH hosts, and `tpulab run` as a user types it.

Each test ends by asking the emulator what is left: a slice is one node, so "nothing
left" is one list call, whatever happened on its workers.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from emulator_fixtures import embedded_nodes_left
from helpers import tpulab
from run_rig import Rig

from tpulab.errors import RemoteError
from tpulab.evidence.store import ReceiptStore
from tpulab.exits import EXIT_INTERRUPTED, EXIT_OK, EXIT_WORKLOAD

pytest_plugins = ["emulator_fixtures", "ssh_fixtures", "run_rig"]

SLICE = "v5litepod-16"
HOSTS = 4
PSUM_LAB = Path(__file__).resolve().parent.parent / "examples" / "slice_lab"


def test_a_slice_verifies_every_worker_and_leaves_nothing(rig: Rig) -> None:
    life, recorder, error = rig.run(rig.spec(SLICE))
    assert error is None, error
    outcome = life.outcome
    assert outcome.verified
    assert [w.index for w in life.workers] == [0, 1, 2, 3]
    assert len({(w.target.host, w.target.host_key.b64) for w in life.workers}) == HOSTS
    # One global psum over 16 devices, every device's sum at its global position.
    assert outcome.observed_total == outcome.expected_total == 690880
    assert len(outcome.per_device_sums) == 16
    assert all(len(seconds) == HOSTS for seconds in outcome.worker_seconds.values())
    assert {"bootstrap", "execute", "collect"} <= set(outcome.worker_seconds)
    verify = next(p for p in recorder.phases if p.phase.value == "verify")
    assert verify.detail == "VERIFIED: 4 workers, 16 devices, psum 690880 = closed form"
    # Every worker's receipt is kept; the run's is worker 0's.
    kept = ReceiptStore(rig.tmp / "receipts").list()
    workers = [r.record.provenance.worker for r in kept if r.record is not None]
    assert sorted(w for w in workers if w is not None) == [0, 1, 2, 3]
    assert len(workers) == HOSTS
    assert outcome.receipt is not None
    assert outcome.teardown_status == "confirmed"
    assert rig.leftovers() == []


def test_a_worker_whose_ssh_is_dead_is_named_and_nothing_is_left(embedded_rig: Rig) -> None:
    embedded_rig.emulator.faults.dead_workers = [2]
    life, _recorder, error = embedded_rig.run(embedded_rig.spec(SLICE, connect=3))
    assert isinstance(error, RemoteError), error
    assert error.message.startswith("worker 2: "), error.message
    assert life.outcome.teardown_status == "confirmed"
    assert embedded_rig.leftovers() == []


@pytest.mark.longest
def test_one_jax_program_across_the_slice_comes_back_per_worker(
    preloaded_embedded_emulator: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    done = tpulab(
        "run", "--accelerator", SLICE, "--emulate", "--json", "--all-output",
        "--workdir", str(PSUM_LAB), "--out", str(out), "--", "python", "psum.py",
        timeout=600,
    )  # fmt: skip
    assert done.returncode == EXIT_OK, done.stderr + done.stdout
    result: dict[str, Any] = json.loads(done.stdout)
    assert result["workload"]["worker_exits"] == [0, 0, 0, 0]
    assert result["workload"]["failed_worker"] is None
    assert len(result["worker_seconds"]["workload"]) == HOSTS
    for worker in range(HOSTS):
        said = json.loads((out / f"worker-{worker}" / "run" / f"psum-{worker}.json").read_text())
        # 16 devices hold 1..16: every worker saw the whole slice's total.
        assert (said["worker"], said["workers"], said["devices"]) == (worker, HOSTS, 16)
        assert said["psum"] == said["expected"] == 136.0
        # --all-output: each worker's line streamed with its worker in the gutter.
        assert f"w{worker} ┃ " in done.stderr
        assert f'"worker": {worker}' in done.stderr
    assert embedded_nodes_left() == []


@pytest.mark.longest
def test_the_first_failing_worker_stops_the_others_and_is_named(
    preloaded_embedded_emulator: Path, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "job.py").write_text(
        "import os, sys, time\n"
        "if os.environ['TPULAB_WORKER_ID'] == '2':\n"
        "    print('worker 2 gives up', flush=True)\n"
        "    sys.exit(3)\n"
        "time.sleep(240)\n"
    )
    started = time.monotonic()
    done = tpulab(
        "run", "--accelerator", SLICE, "--emulate", "--json", "--workdir", str(work),
        "--out", str(tmp_path / "out"), "--", "python", "job.py", timeout=600,
    )  # fmt: skip
    took = time.monotonic() - started
    assert done.returncode == EXIT_WORKLOAD, done.stderr + done.stdout
    result: dict[str, Any] = json.loads(done.stdout)
    assert result["workload"]["failed_worker"] == 2
    assert result["workload"]["exit_status"] == 3
    exits = result["workload"]["worker_exits"]
    assert exits[2] == 3
    assert all(status != 0 for status in exits), exits  # none ran its 240 s out
    assert (
        "worker 2 of 4 (the first to fail; the others were stopped)" in (result["error"]["message"])
    )
    assert took < 200, took  # the others were stopped, not waited for
    assert "worker 2 gives up" in (tmp_path / "out" / "worker-2" / "output.log").read_text()
    assert embedded_nodes_left() == []


@pytest.mark.longest
def test_ctrl_c_while_every_worker_runs_leaves_nothing(
    preloaded_embedded_emulator: Path, tmp_path: Path
) -> None:
    marker_dir = tmp_path / "markers"
    marker_dir.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    (work / "wait.py").write_text(
        "import os, pathlib, time\n"
        f"pathlib.Path({str(marker_dir)!r}, os.environ['TPULAB_WORKER_ID']).write_text('1')\n"
        "time.sleep(300)\n"
    )
    run = subprocess.Popen(
        [sys.executable, "-m", "tpulab", "run", "--accelerator", SLICE, "--emulate",
         "--workdir", str(work), "--out", str(tmp_path / "out"), "--", "python", "wait.py"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while len(list(marker_dir.iterdir())) < HOSTS and time.monotonic() < deadline:
            assert run.poll() is None, run.communicate()[0]
            time.sleep(0.1)
        assert sorted(p.name for p in marker_dir.iterdir()) == ["0", "1", "2", "3"]
        run.send_signal(signal.SIGINT)
        said, _ = run.communicate(timeout=240)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == EXIT_INTERRUPTED, said
    assert "your command was stopped on worker 3" in said
    assert "deleted, confirmed by list" in said
    assert embedded_nodes_left() == []


def test_a_slice_is_priced_for_all_its_chips() -> None:
    from tpulab.catalog import lookup

    one_host, whole = lookup("v5litepod-4"), lookup(SLICE)
    assert whole.price_per_hour() == pytest.approx(4 * one_host.price_per_hour())


def test_a_slice_reporting_fewer_workers_than_its_type_fails_at_once(embedded_rig: Rig) -> None:
    """A node whose networkEndpoints are short of its hosts (a slice not fully up, as
    the API can report it) fails before any SSH timeout, and is deleted."""
    from delegating_api import DelegatingTpuApi

    from tpulab.models import NodeInfo

    class ThreeWorkers(DelegatingTpuApi):
        def get_node(self, zone: str, node_id: str) -> NodeInfo:
            node = self.api.get_node(zone, node_id)
            return node.model_copy(update={"workers": node.workers[:3]})

    spec = embedded_rig.spec(SLICE)
    started = time.monotonic()
    life, _recorder, error = embedded_rig.run(spec, api=ThreeWorkers(embedded_rig.api))
    assert isinstance(error, RemoteError), error
    assert "reports 3 network endpoint(s), but a v5litepod-16 has 4 workers" in error.message
    assert time.monotonic() - started < 60
    assert life.outcome.teardown_status == "confirmed"
    assert embedded_rig.leftovers() == []


def test_a_late_workers_ssh_is_waited_for_and_the_slice_verifies(embedded_rig: Rig) -> None:
    """A worker whose sshd comes up seconds after the others (as a VM that boots late):
    its connection retries within the boot timeout, as worker 0's would, and the slice
    verifies with it; the slowest connect is that worker's."""
    embedded_rig.emulator.faults.late_workers = {3: 4.0}
    life, recorder, error = embedded_rig.run(embedded_rig.spec(SLICE))
    assert error is None, error
    assert life.outcome.verified
    connect = life.outcome.worker_seconds["connect"]
    assert max(range(HOSTS), key=connect.__getitem__) == 3, connect
    said = next(p for p in recorder.phases if p.phase.value == "connect").detail or ""
    assert "slowest worker 3" in said, said
    assert embedded_rig.leftovers() == []
