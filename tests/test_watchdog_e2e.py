"""The VM's watchdog end to end: real `tpulab run` subprocesses against an emulator
served from this test process (it outlives the controller, as the cloud does), whose
nodes run their startup-script -- the real remote_payloads/watchdog.py -- at boot and
serve it a metadata server. Nothing is patched: the controller is killed, stopped or
left alive, and the emulator's own state and request log say what happened.

Who deleted a node is read from the emulator's request log: the watchdog's DELETE
carries its node's metadata token (the log's `caller` names the node), the controller's
carries none. Phases are held the way tests/test_interruptions.py holds them (its Matrix).
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import tpulab, wait_until
from test_interruptions import PROJECT, ZONE, Matrix, _served

from tpulab.cleanup.journal import VANISHED
from tpulab.emulator.timing import Timing

pytestmark = pytest.mark.slow

EXIT_REMOTE = 4
EXIT_INTERRUPTED = 130
# How late after its lease (or grace, or deadline) a node may still be listed: the
# watchdog's poll (at most 5 s, lease/5 here), its DELETE, the emulator's delete time,
# and a loaded 2-CPU runner.
SLACK = 15.0


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Matrix]:
    with _served(tmp_path, Timing(create_seconds=0.3, delete_seconds=0.3), {}) as m:
        yield m


def _run(
    m: Matrix, node: str, *extra: str, as_json: bool = True, accelerator: str = "v5litepod-4"
) -> subprocess.Popen[str]:
    args = [
        "run", "--accelerator", accelerator, "--api-endpoint", m.gate.url,
        "--project", PROJECT, "--zone", ZONE, "--name", node, *extra,
    ]  # fmt: skip
    return m.start_tpulab(*args, *(["--json"] if as_json else []), log=node)


def _in_phase(m: Matrix, node: str, phase: str, hold: str | None = None) -> Callable[[], bool]:
    def check() -> bool:
        row = m.row(node)
        return row is not None and row.phase == phase and m.held(node, hold or phase)

    return check


def _gone(m: Matrix, node: str) -> Callable[[], bool]:
    return lambda: node not in m.emulator.node_names(PROJECT)


def _deletes(m: Matrix, node: str) -> list[dict[str, Any]]:
    return [
        entry
        for entry in m.emulator.requests()
        if entry["method"] == "DELETE" and entry["path"].endswith(f"/nodes/{node}")
    ]


def _by_watchdog(entry: dict[str, Any], node: str) -> bool:
    """Sent with the node's own metadata token (the emulator logs who by resource name)."""
    return entry.get("caller") == f"projects/{PROJECT}/locations/{ZONE}/nodes/{node}"


def _report(m: Matrix, node: str) -> dict[str, Any]:
    out, err = m.output(node)
    try:
        data: dict[str, Any] = json.loads(out)
    except json.JSONDecodeError:
        raise AssertionError(f"{node}: no JSON report; stderr:\n{err[-3000:]}") from None
    return data


def _stop(process: subprocess.Popen[str], *releases: Callable[[], None]) -> None:
    for release in releases:
        release()
    if process.poll() is None:
        process.kill()
        process.wait()


def _list_json(m: Matrix) -> dict[str, Any]:
    listed = tpulab(
        "list", "--api-endpoint", m.gate.url, "--project", PROJECT, "--zone", ZONE, "--json"
    )
    assert listed.returncode == 0, listed.stderr
    data: dict[str, Any] = json.loads(listed.stdout)
    return data


def test_sigkill_right_after_ready_the_vm_deletes_itself_within_the_grace(
    served: Matrix,
) -> None:
    m, node = served, "tpulab-wd-kill-ready"
    release = m.hold(node, "wait")  # the host key's guest attributes: right after READY
    process = _run(m, node, "--lease", "15s", "--boot-grace", "15s")
    try:
        wait_until(_in_phase(m, node, "host-key", "wait"), "the run to wait for its host key", 120)
        process.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        assert process.wait(timeout=30) == -signal.SIGKILL
        release()
        # Before the first renewal only the boot grace (15 s from the watchdog's start,
        # which was before the kill) stands between the VM and its own DELETE.
        gone = wait_until(_gone(m, node), "the node to delete itself", 15 + SLACK)
    finally:
        _stop(process, release)
    assert gone - killed <= 15 + SLACK
    deletes = _deletes(m, node)
    assert deletes, "something must have deleted it"
    assert all(_by_watchdog(d, node) for d in deletes), deletes  # the dead laptop sent none

    # `tpulab list` proves the node gone and closes the run's row as such (exit 0) ...
    data = _list_json(m)
    (missing,) = [row for row in data["journal_missing"] if row["node_name"] == node]
    assert missing["closed_as"] == VANISHED
    row = m.row(node)
    assert row is not None
    assert row.teardown == "confirmed"
    assert VANISHED in row.detail
    # ... and `teardown --verify` then has nothing left to do.
    sweep = tpulab(
        "teardown", "--verify", "--yes", "--json", "--api-endpoint", m.gate.url,
        "--project", PROJECT, "--zone", ZONE,
    )  # fmt: skip
    assert sweep.returncode == 0, sweep.stderr
    assert json.loads(sweep.stdout)["deleted"] == []


@pytest.mark.parametrize("accelerator", ["v5litepod-4", "v5litepod-16"])
def test_sigkill_during_the_payload_the_vm_deletes_itself_within_one_lease(
    served: Matrix, accelerator: str
) -> None:
    # A slice: every worker runs the watchdog (the startup-script runs on each), and
    # whichever sees the lease lapse deletes the one node.
    m, node = served, f"tpulab-wd-kill-payload-{accelerator.split('-')[1]}"
    release = m.hold(node, "execute")
    process = _run(m, node, "--lease", "15s", accelerator=accelerator)
    try:
        wait_until(_in_phase(m, node, "execute"), "the payload to run", 180)
        process.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        assert process.wait(timeout=30) == -signal.SIGKILL
        gone = wait_until(_gone(m, node), "the node to delete itself", 15 + SLACK)
    finally:
        _stop(process, release)
    # The last renewal was before the kill: one lease (plus a poll) later it fired.
    assert gone - killed <= 15 + SLACK
    deletes = _deletes(m, node)
    assert deletes
    callers = [d.get("caller") for d in deletes]
    assert _by_watchdog(deletes[0], node), callers
    if accelerator == "v5litepod-4":
        assert all(_by_watchdog(d, node) for d in deletes), callers
    else:
        # Another worker's watchdog may fire a moment after the first one's DELETE has
        # completed: its token then names no node (refused, logged as such). The dead
        # laptop (no node token at all) sent nothing either way.
        assert all(caller is not None for caller in callers), callers
    row = m.row(node)
    assert row is not None
    assert (row.teardown, row.phase) == (None, "execute")  # nothing on the laptop closed it

    # `teardown --verify` finds the node gone and closes the row as self-deleted, exit 0.
    sweep = tpulab(
        "teardown", "--verify", "--yes", "--json", "--run-id", row.run_id,
        "--api-endpoint", m.gate.url, "--project", PROJECT,
    )  # fmt: skip
    assert sweep.returncode == 0, sweep.stderr
    report = json.loads(sweep.stdout)
    assert report["deleted"] == []
    assert report["vanished_journal_rows"] == [row.run_id]
    closed = m.row(node)
    assert closed is not None
    assert closed.teardown == "confirmed"
    assert VANISHED in closed.detail


@pytest.mark.longest
def test_a_payload_three_leases_long_completes_and_the_controller_deletes_its_node(
    served: Matrix,
) -> None:
    m, node = served, "tpulab-wd-three-leases"
    release = m.hold(node, "execute")
    process = _run(m, node, "--lease", "10s")
    try:
        wait_until(_in_phase(m, node, "execute"), "the payload to run", 180)
        time.sleep(3 * 10 + 2)  # three leases with the payload running: renewal works
        assert node in m.emulator.node_names(PROJECT), "the watchdog fired on a live run"
        release()
        assert process.wait(timeout=180) == 0, m.output(node)[1][-3000:]
    finally:
        _stop(process, release)
    report = _report(m, node)
    assert report["ok"] is True
    watchdog = report["watchdog"]
    assert watchdog["state"] == "armed"
    assert watchdog["lease_seconds"] == 10
    # One every lease/5 = 2 s after the previous one returned: ~19 in this run at load 8
    # (its 40 s of session), fewer when each SSH round trip is slower. At least half that
    # rate over the 32 s held, whatever the load: they went on all along.
    assert watchdog["lease_renewals"] >= 32 / (2 * 2), watchdog
    assert watchdog["lease_renewal_failures"] == 0
    deletes = _deletes(m, node)
    assert deletes
    assert not any(_by_watchdog(d, node) for d in deletes), deletes  # the controller's only


def test_max_duration_deletes_a_hanging_run_while_its_controller_is_alive(
    served: Matrix,
) -> None:
    m, node = served, "tpulab-wd-deadline"
    release = m.hold(node, "execute")  # the payload hangs (until released, never here)
    process = _run(m, node, "--max-duration", "20s")
    try:
        wait_until(_in_phase(m, node, "execute"), "the payload to run", 180)
        # The guest (and its startup-script) boots at READY, on the emulator's wall clock.
        ready = m.emulator.snapshot()["nodes"][f"{PROJECT}/{ZONE}/{node}"]["ready_time"]
        wait_until(_gone(m, node), "the node to delete itself at its deadline", 120)
        gone = time.time()
        status = process.wait(timeout=120)  # the controller notices by itself
    finally:
        _stop(process, release)
    assert status == EXIT_REMOTE, m.output(node)[1][-3000:]
    deletes = _deletes(m, node)
    assert deletes
    assert _by_watchdog(deletes[0], node), deletes  # the VM, not the live controller
    report = _report(m, node)
    error = report["error"]
    assert error["type"] == "NodeVanishedError"
    assert "hard deadline (--max-duration)" in error["message"]
    assert "--max-duration" in (error.get("hint") or "")
    assert report["teardown"]["confirmed"] is True  # already gone, and the list proves it
    assert "Traceback" not in m.output(node)[1]
    # About 20 s after boot, while the payload still hung.
    assert 20.0 <= gone - ready <= 20.0 + SLACK


def test_no_permission_says_watchdog_not_armed_with_the_fix_and_the_run_still_passes(
    served: Matrix,
) -> None:
    m, node = served, "tpulab-wd-no-permission"
    m.emulator.faults.node_identity_cannot_delete = True
    process = _run(m, node, as_json=False)
    try:
        status = process.wait(timeout=300)
    finally:
        _stop(process)
    out, err = m.output(node)
    assert status == 0, err[-3000:]
    assert "watchdog not armed" in out
    assert "roles/tpu.admin" in out
    assert "tpu.nodes.delete" in out
    assert "receipt   VERIFIED" in out
    assert "deleted, confirmed by list" in out
    assert node not in m.emulator.node_names(PROJECT)


def test_sigstop_past_the_lease_then_sigcont_confirms_the_teardown_and_says_why(
    served: Matrix,
) -> None:
    m, node = served, "tpulab-wd-sigstop"
    release = m.hold(node, "execute")
    process = _run(m, node, "--lease", "10s")
    try:
        wait_until(_in_phase(m, node, "execute"), "the payload to run", 180)
        process.send_signal(signal.SIGSTOP)
        wait_until(_gone(m, node), "the node to delete itself while the laptop sleeps", 10 + SLACK)
        process.send_signal(signal.SIGCONT)
        status = process.wait(timeout=120)
    finally:
        _stop(process, release)
    err = m.output(node)[1]
    assert status == EXIT_REMOTE, err[-3000:]
    assert "Traceback" not in err
    report = _report(m, node)
    assert report["error"]["type"] == "NodeVanishedError"
    assert "no lease renewal reached it" in report["error"]["message"]
    assert report["teardown"]["confirmed"] is True
    assert all(_by_watchdog(d, node) for d in _deletes(m, node)[:1])


def test_a_watchdog_delete_racing_the_controllers_teardown_is_harmless(
    served: Matrix,
) -> None:
    m, node = served, "tpulab-wd-race"
    release = m.hold(node, "execute")
    process = _run(m, node, "--lease", "10s")
    held = m.gate.hold(node, "delete")  # the controller's DeleteNode waits at the gate
    try:
        wait_until(_in_phase(m, node, "execute"), "the payload to run", 180)
        process.send_signal(signal.SIGINT)  # teardown: renewals stop, DeleteNode is held
        held.wait_reached()
        # Meanwhile the lease runs out and the VM deletes itself first.
        wait_until(_gone(m, node), "the watchdog's delete", 10 + SLACK)
        held.release()  # the controller's DeleteNode now meets NOT_FOUND: that is done
        status = process.wait(timeout=120)
    finally:
        m.gate.release_all()
        _stop(process, release)
    assert status == EXIT_INTERRUPTED, m.output(node)[1][-3000:]
    report = _report(m, node)
    assert report["teardown"]["confirmed"] is True
    deletes = _deletes(m, node)
    assert _by_watchdog(deletes[0], node)
    assert any(not _by_watchdog(d, node) for d in deletes[1:])  # the controller's, late
    row = m.row(node)
    assert row is not None
    assert row.teardown == "confirmed"


def _queued_names(m: Matrix) -> list[str]:
    return [key.rsplit("/", 1)[-1] for key in m.emulator.snapshot().get("queued_resources", {})]


def test_sigkill_of_a_queued_run_the_vm_deletes_its_queued_resource_and_itself(
    served: Matrix,
) -> None:
    """A queued node's watchdog deletes the queued resource with force=true (node and
    queued resource go), not only the node, which would leave the queued resource
    SUSPENDED and holding quota."""
    m, node = served, "tpulab-wd-kill-queued"
    release = m.hold(node, "execute")
    process = _run(m, node, "--queued", "--lease", "15s")
    try:
        wait_until(_in_phase(m, node, "execute"), "the payload to run", 180)
        assert node in _queued_names(m)
        process.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        assert process.wait(timeout=30) == -signal.SIGKILL
        gone = wait_until(
            lambda: node not in m.emulator.node_names(PROJECT) and node not in _queued_names(m),
            "the queued resource and its node to be deleted by the VM",
            15 + SLACK,
        )
    finally:
        _stop(process, release)
    assert gone - killed <= 15 + SLACK
    queued_deletes = [
        entry
        for entry in m.emulator.requests()
        if entry["method"] == "DELETE" and entry["path"].endswith(f"/queuedResources/{node}")
    ]
    assert queued_deletes, "the watchdog must delete the queued resource"
    assert all(_by_watchdog(d, node) for d in queued_deletes), queued_deletes
    assert ["force", "true"] in queued_deletes[0]["query"]
    # `tpulab list` shows neither the node nor its queued resource.
    listed = _list_json(m)["nodes"]
    assert [row for row in listed if node in (row["name"], row.get("queued_resource"))] == []
