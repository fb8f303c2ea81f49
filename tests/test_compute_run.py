"""A Compute Engine provider run end to end against the emulator (tpulab.cloud.compute_v1
over the emulator's instances API, emulator/instances.py): `tpulab run --emulate` and
`--api-endpoint` runs verified and deleted, the plan equal to the run, faults through a
run (stockout failover, quota, a VM account that may not delete), and nothing left
billing when the controller is killed or interrupted mid-payload.

Each CLI run is a real `python -m tpulab` subprocess; a served emulator lives in this
test process (it outlives a killed controller, as the cloud does), with embedded SSH
hosts; nothing is patched. Who deleted an instance is read from the emulator's request
log: the VM's watchdog's DELETE carries its token (the log's `caller`), the
controller's none.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from emulator_fixtures import FAST_EMBEDDED_TIMING
from helpers import tpulab, watchdog_saw_the_last_renewal
from run_rig import FAST
from test_plan_is_the_run import (
    PhaseMarks,
    TracingConnection,
    _budgets_within,
    _fold_transfers,
    _normalise,
    _plan_events,
    _wire_by_phase,
)

from tpulab.app.doctor import preflight_for
from tpulab.app.target import compute_api
from tpulab.config import EMULATED_IMAGE, TargetFlags, build_run_spec
from tpulab.emulator.backends import make_host_backend
from tpulab.remote.keys import RunKey, SshTarget
from tpulab.run.plan import build_plan
from tpulab.run.plan_steps import (
    PLACEHOLDER_NODE_IP,
    PLACEHOLDER_NONCE,
    PLACEHOLDER_PUBLIC_KEY,
    PLACEHOLDER_REMOTE_HOME,
    PLACEHOLDER_SSH_PORT,
)

if TYPE_CHECKING:
    from emulator_fixtures import EmulatorStarter
    from run_rig import Rig

    from tpulab.emulator import Emulator
    from tpulab.emulator.hosts import HostBackend

pytest_plugins = ["emulator_fixtures", "ssh_fixtures", "run_rig"]

PROJECT = "compute-project"
ZONE = "us-east5-a"
OTHER_ZONE = "us-east5-b"
IMAGE = "projects/p/global/images/tpu-vm-test-image"
EXIT_INTERRUPTED = 130


def _emulator_instances(state: Path) -> list[str]:
    """The instances the embedded emulator's state still holds (read by a fresh emulator
    on the same directory, as `--emulate` commands share it)."""
    from tpulab.app.embedded import emulated_target

    with emulated_target(state_dir=state) as target:
        return target.emulator.instance_names()


@pytest.mark.parametrize(
    ("args", "devices"),
    [
        (("--accelerator", "tpu7x-8"), 8),  # compute by default: TPU7x is only there
        (("--accelerator", "v6e-4", "--provider", "compute"), 4),
    ],
)
def test_an_emulated_compute_run_verifies_the_catalogs_devices_and_deletes(
    preloaded_embedded_emulator: Path, args: tuple[str, ...], devices: int
) -> None:
    result = tpulab("run", *args, "--emulate", timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    accelerator = args[1]
    assert f"VERIFIED: {devices} cpu device(s) of {accelerator} (EMULATED)" in result.stdout
    priced = "would have cost ~$" if accelerator == "v6e-4" else "has no known cost"
    assert priced in result.stdout
    assert "deleted, confirmed by list" in result.stdout
    # Said as Compute says it: an instance, whose watchdog may delete it.
    assert re.search(rf"^  instance  tpulab-\S+ \({accelerator}\)$", result.stdout, re.M)
    assert "watchdog  armed (its identity may delete its VM)" in result.stdout
    assert _emulator_instances(preloaded_embedded_emulator) == []


def test_an_emulated_compute_plan_names_the_emulators_image() -> None:
    result = tpulab("run", "--accelerator", "tpu7x-8", "--emulate", "--dry-run", "--json")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["sources"]["image"] == "the emulator's"
    # No list price is cited for TPU7x: unknown, never $0.00/h.
    assert plan["estimated_cost_per_hour_usd"] is None
    (insert,) = [s for s in plan["steps"] if s.get("action") == "compute.instances.insert"]
    assert insert["body"]["disks"][0]["initializeParams"]["sourceImage"] == EMULATED_IMAGE
    # Online no image is guessed (the real run refuses: tests/test_compute_provider.py).
    online = tpulab(
        "run", "--accelerator", "tpu7x-8", "--project", "p", "--zone", "us-central1-c",
        "--dry-run", "--json",
    )  # fmt: skip
    assert json.loads(online.stdout)["sources"]["image"] == "default"


def test_nothing_published_yet_is_empty_but_a_missing_instance_is_not_found(
    start_emulator: EmulatorStarter, host_backend: HostBackend, tmp_path: Path
) -> None:
    """Compute answers 404 both for a guest attribute path with nothing under it and for
    a missing instance: the first is "not yet" (the host-key wait goes on), the second
    an error."""
    from emulator_fixtures import node_request

    from tpulab.errors import NotFoundError

    emulator = start_emulator(tmp_path / "state", host_backend=host_backend)
    api = compute_api(PROJECT, api_endpoint=emulator.url, image=IMAGE)
    # No enable-guest-attributes in its metadata: its agent never publishes host keys.
    api.wait_operation(api.create_node(ZONE, "quiet", node_request("v6e-4")), timeout=60)
    _until(lambda: bool(api.guest_attributes(ZONE, "quiet")), "the emulator's port", 60)
    published = api.guest_attributes(ZONE, "quiet")
    assert not [key for key in published if key.startswith("hostkeys/")], published
    assert api.guest_attributes(ZONE, "quiet", "hostkeys/") == {}
    # Asked, and answered 404 (tests/test_emulator_instances.py shows that answer).
    assert any("queryPath=hostkeys/" in _url(e) for e in emulator.requests())
    with pytest.raises(NotFoundError):
        api.guest_attributes(ZONE, "no-such-instance")


def _url(entry: dict[str, Any]) -> str:
    return str(entry["path"]) + "?" + "&".join(f"{k}={v}" for k, v in entry["query"])


# -- the plan is the run --------------------------------------------------------------


def test_a_compute_dry_run_sends_what_a_compute_run_sends(embedded_rig: Rig) -> None:
    rig = embedded_rig
    spec = build_run_spec(
        target=TargetFlags(
            accelerator="v6e-4",
            provider="compute",
            image=IMAGE,
            api_endpoint=rig.emulator.url,
            project=PROJECT,
            zone=ZONE,
        ),
        timeouts=FAST,
        env={},
    )
    api = compute_api(PROJECT, api_endpoint=rig.emulator.url, image=IMAGE)
    marks = PhaseMarks(rig.emulator)
    events: list[Any] = []
    sessions: list[TracingConnection] = []

    def connect(target: SshTarget, key: RunKey) -> TracingConnection:
        session = TracingConnection(target, key, events=events, phase=lambda: marks.phase)
        sessions.append(session)
        return session

    # The project's preflight as `tpulab run` asks it of Compute (app.doctor.preflight_for).
    preflight = preflight_for(spec, rig.emulator.url)
    life, _recorder, error = rig.run(spec, marks, connect=connect, api=api, preflight=preflight)
    assert error is None, error
    assert life.outcome.succeeded
    assert rig.emulator.instance_names() == []
    (session,) = sessions
    assert life.target is not None
    assert life.key is not None
    replacements = {
        life.nonce: PLACEHOLDER_NONCE,
        life.key.public_b64: PLACEHOLDER_PUBLIC_KEY,
        f"{life.target.user}@{life.target.host}:{life.target.port}": (
            f"{spec.ssh_user}@{PLACEHOLDER_NODE_IP}:{PLACEHOLDER_SSH_PORT}"
        ),
        session.home: PLACEHOLDER_REMOTE_HOME,
    }
    real_api = _normalise(_wire_by_phase(rig.emulator.requests(), marks.marks), replacements)
    real_api = _host_key_polls_folded(real_api)
    real_ssh = _normalise(_fold_transfers(events), replacements)
    plan_api, plan_ssh = (_normalise(x, {}) for x in _plan_events(build_plan(spec)))
    assert real_api == plan_api
    # The preflight asked Compute's side of the project, before the create.
    assert real_api[:2] == [
        ("create", "GET", f"/v1/projects/{PROJECT}/services/compute.googleapis.com", None),
        ("create", "POST", f"/v1/projects/{PROJECT}:testIamPermissions", real_api[1][3]),
    ]
    assert "compute.instances.create" in real_api[1][3]["permissions"]
    real_api = real_api[2:]
    # Every other request was Compute's, and the host keys were asked where Compute's agent
    # publishes them (as gcloud's compute ssh asks).
    assert all(str(event[2]).startswith("/compute/v1/") for event in real_api), real_api
    assert any(str(e[2]).endswith("getGuestAttributes?queryPath=hostkeys/") for e in real_api)
    _budgets_within(real_ssh, plan_ssh, slack=spec.timeouts.bootstrap / 2)
    assert real_ssh == plan_ssh


def _host_key_polls_folded(events: list[Any]) -> list[Any]:
    """The host-key wait asks Compute one queryPath at a time (host keys, then the
    emulator's namespace), so its poll repeats a pair, not one request: each request
    of that phase is kept once, as the plan shows a poll."""
    seen: set[Any] = set()
    kept: list[Any] = []
    for event in events:
        if event[0] == "host-key" and event[1] == "GET":
            if event[2] in seen:
                continue
            seen.add(event[2])
        kept.append(event)
    return kept


# -- a served emulator and CLI runs against it -----------------------------------------


@dataclass
class Served:
    emulator: Emulator
    tmp: Path

    def start(self, node: str, *extra: str, accelerator: str = "v6e-4") -> Run:
        args = [
            "run", "--accelerator", accelerator, "--provider", "compute", "--image", IMAGE,
            "--api-endpoint", self.emulator.url, "--project", PROJECT, "--name", node, *extra,
        ]  # fmt: skip
        if "--zone" not in extra:
            args[args.index("--name") : args.index("--name")] = ["--zone", ZONE]
        workspace = self.tmp / f"{node}-workspace"  # what a command's run uploads
        workspace.mkdir()
        out, err = self.tmp / f"{node}.out", self.tmp / f"{node}.err"
        with out.open("w") as stdout, err.open("w") as stderr:
            process = subprocess.Popen(
                [sys.executable, "-m", "tpulab", *args],
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                text=True,
                cwd=workspace,
                env={**os.environ, "COLUMNS": "200"},
            )
        return Run(process, out, err)

    def deletes(self, node: str) -> list[dict[str, Any]]:
        return [
            entry
            for entry in self.emulator.requests()
            if entry["method"] == "DELETE" and entry["path"].endswith(f"/instances/{node}")
        ]


@dataclass
class Run:
    process: subprocess.Popen[str]
    out: Path
    err: Path

    def wait(self, timeout: float = 300) -> tuple[int, str]:
        status = self.process.wait(timeout=timeout)
        return status, self.out.read_text() + self.err.read_text()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def served(start_emulator: EmulatorStarter, tmp_path: Path) -> Iterator[Served]:
    from tpulab.emulator.timing import Timing

    backend = make_host_backend("embedded", tmp_path / "ssh-hosts", image="preloaded")
    emulator: Emulator | None = None
    try:
        timing = Timing(**{**Timing.fast().__dict__, **FAST_EMBEDDED_TIMING})
        emulator = start_emulator(tmp_path / "emulator", host_backend=backend, timing=timing)
        yield Served(emulator, tmp_path)
    finally:
        if emulator is not None:
            emulator.stop()  # first: a running emulator may still start hosts on it
        backend.close()


def _until(check: Callable[[], bool], what: str, timeout: float, run: Run | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        said = "" if run is None else run.out.read_text()[-3000:] + run.err.read_text()[-3000:]
        assert time.monotonic() < deadline, f"timed out waiting for {what}\n{said}"
        assert run is None or run.process.poll() is None, f"the run ended first:\n{said}"
        time.sleep(0.1)


def test_a_compute_run_at_a_served_emulator_verifies_and_deletes(served: Served) -> None:
    run = served.start("tpulab-compute-served")
    status, output = run.wait()
    assert status == 0, output[-4000:]
    assert "VERIFIED: 4 cpu device(s) of v6e-4 (EMULATED)" in output
    assert "deleted, confirmed by list" in output
    assert served.emulator.instance_names(PROJECT) == []
    # The VM's watchdog could delete its own instance: it said so at boot.
    assert "watchdog  armed" in output


def test_a_stockout_in_the_first_zone_fails_over_to_the_second(served: Served) -> None:
    served.emulator.faults.stockout_zones = [ZONE]
    node = "tpulab-compute-failover"
    run = served.start(node, "--zone", ZONE, "--zone", OTHER_ZONE)
    status, output = run.wait()
    assert status == 0, output[-4000:]
    assert "VERIFIED" in output
    inserts = [
        entry["path"]
        for entry in served.emulator.requests()
        if entry["method"] == "POST" and entry["path"].endswith("/instances")
    ]
    assert [path.split("/")[6] for path in inserts] == [ZONE, OTHER_ZONE]
    assert served.emulator.instance_names(PROJECT) == []


def test_quota_ends_the_run_with_computes_quota_message(served: Served) -> None:
    served.emulator.faults.quota = True
    run = served.start("tpulab-compute-quota")
    status, output = run.wait()
    assert status != 0
    assert "Quota 'CT6E_TPUS' exceeded" in output, output[-4000:]
    assert served.emulator.instance_names(PROJECT) == []


def test_a_vm_account_that_may_not_delete_says_watchdog_not_armed(served: Served) -> None:
    served.emulator.faults.node_identity_cannot_delete = True
    run = served.start("tpulab-compute-no-delete")
    status, output = run.wait()
    assert status == 0, output[-4000:]
    assert "watchdog not armed" in output
    assert "compute.instances.delete" in output
    assert "deleted, confirmed by list" in output
    assert served.emulator.instance_names(PROJECT) == []


# -- nothing left billing ---------------------------------------------------------------


def _command_that_waits(tmp: Path) -> tuple[list[str], Path]:
    """The user's command (after the verifier): it says it started (a file: the emulated
    VM shares this file system), then runs long enough for the test to act during it."""
    started = tmp / "command-started"
    return ["--", "sh", "-c", f"touch {started} && sleep 240"], started


def test_sigkill_mid_payload_the_instances_watchdog_deletes_it_once_the_lease_lapses(
    served: Served,
) -> None:
    node = "tpulab-compute-killed"
    command, started = _command_that_waits(served.tmp)
    run = served.start(node, "--lease", "60s", *command)
    try:
        _until(started.exists, "the payload to start", 180, run)
        run.process.send_signal(signal.SIGKILL)
        assert run.process.wait(timeout=30) == -signal.SIGKILL
        assert served.emulator.instance_names(PROJECT) == [node]  # the dead laptop left it
        # The watchdog dates a renewal when it sees it, on its own (moved) clock: moving
        # the clock before it has seen the run's last renewal would date that renewal
        # after the move, and the lease would lapse a real minute later.
        _until(
            lambda: watchdog_saw_the_last_renewal(served.emulator, node),
            "the watchdog to see it",
            60,
        )
        # The lease (60 s) lapses on the VM's clock without a minute of the test's.
        served.emulator.skip_vm_clock(PROJECT, ZONE, node, 120, instance=True)
        _until(lambda: served.emulator.instance_names(PROJECT) == [], "the instance to go", 60)
    finally:
        run.stop()
    deletes = served.deletes(node)
    assert deletes
    # Sent with the instance's own metadata token: the log names it as the caller.
    assert all(str(entry.get("caller", "")).endswith(f"/{node}") for entry in deletes), deletes


def test_sigkill_mid_payload_then_teardown_verify_deletes_the_instance(served: Served) -> None:
    """The laptop dies with the instance billing and its watchdog's lease still fresh:
    `teardown --verify` finds it through the journal row's provider (Compute, where the
    TPU API would answer NOT_FOUND), deletes it through Compute and confirms by listing."""
    node = "tpulab-compute-swept"
    command, started = _command_that_waits(served.tmp)
    run = served.start(node, *command)  # the default lease: the watchdog stays out of it
    try:
        _until(started.exists, "the payload to start", 180, run)
        run.process.send_signal(signal.SIGKILL)
        assert run.process.wait(timeout=30) == -signal.SIGKILL
    finally:
        run.stop()
    assert served.emulator.instance_names(PROJECT) == [node]
    swept = tpulab(
        "teardown", "--verify", "--yes", "--api-endpoint", served.emulator.url,
        "--project", PROJECT, "--zone", ZONE,
    )  # fmt: skip
    assert swept.returncode == 0, swept.stdout + swept.stderr
    assert served.emulator.instance_names(PROJECT) == []
    deletes = served.deletes(node)
    assert deletes, "deleted through Compute's instances API"
    # The laptop's delete, not the VM's (whose lease had not lapsed).
    assert not any(str(entry.get("caller", "")).endswith(f"/{node}") for entry in deletes)
    assert not [
        entry for entry in served.emulator.requests() if entry["path"].endswith(f"/nodes/{node}")
    ], "nothing about it was asked of the TPU API"


def test_ctrl_c_mid_payload_exits_130_and_the_runs_own_teardown_deletes(served: Served) -> None:
    node = "tpulab-compute-interrupted"
    command, started = _command_that_waits(served.tmp)
    run = served.start(node, *command)
    try:
        _until(started.exists, "the payload to start", 180, run)
        run.process.send_signal(signal.SIGINT)
        status, output = run.wait(timeout=120)
    finally:
        run.stop()
    assert status == EXIT_INTERRUPTED, output[-4000:]
    assert served.emulator.instance_names(PROJECT) == []
    deletes = served.deletes(node)
    assert deletes
    assert all("caller" not in entry for entry in deletes), deletes  # the controller's


# -- spot --------------------------------------------------------------------------------


def test_a_spot_instance_reclaimed_mid_run_is_a_preemption_and_recover_recreates_it(
    served: Served,
) -> None:
    # Reclaimed a few seconds after RUNNING (the verifier or the command is under way):
    # Compute shows it TERMINATED (its termination action is STOP), once only.
    served.emulator.faults.update(
        {"preempt_after": 4.0, "preempt_nodes": 1, "preempt_as": "TERMINATED"}
    )
    node = "tpulab-compute-spot"
    run = served.start(node, "--spot", "--recover", "1", "--", "sh", "-c", "sleep 10")
    status, output = run.wait()
    assert status == 0, output[-4000:]
    # Read as a preemption from the instance's own state (run/symptoms.py), not a crash.
    assert "was preempted" in output
    assert "the API says TERMINATED" in output
    inserts = [
        entry["path"]
        for entry in served.emulator.requests()
        if entry["method"] == "POST" and entry["path"].endswith("/instances")
    ]
    assert len(inserts) == 2  # the reclaimed instance, then its recovery
    assert served.emulator.faults.preempt_nodes == 0
    assert served.emulator.instance_names(PROJECT) == []


def test_an_emulated_compute_run_killed_is_listed_and_swept_by_the_emulate_commands(
    preloaded_embedded_emulator: Path, tmp_path: Path
) -> None:
    """`tpulab run --accelerator tpu7x-8 --emulate` SIGKILLed: `list --emulate` shows its
    instance (provider compute, orphaned), `teardown --verify --emulate` deletes it, and
    the embedded emulator's state holds no instance after."""
    from emulator_fixtures import embedded_nodes_left

    command, started = _command_that_waits(tmp_path)
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    out, err = tmp_path / "run.out", tmp_path / "run.err"
    with out.open("w") as stdout, err.open("w") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "tpulab", "run", "--accelerator", "tpu7x-8", "--emulate",
             *command],
            stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, text=True, cwd=workspace,
        )  # fmt: skip
    run = Run(process, out, err)
    try:
        _until(started.exists, "the command to start", 180, run)
        process.send_signal(signal.SIGKILL)
        assert process.wait(timeout=30) == -signal.SIGKILL
    finally:
        run.stop()
    listed = tpulab("list", "--emulate", "--json")
    assert listed.returncode == 0, listed.stderr
    (node,) = json.loads(listed.stdout)["nodes"]
    assert node["provider"] == "compute"
    swept = tpulab("teardown", "--verify", "--emulate", "--yes")
    assert swept.returncode == 0, swept.stdout + swept.stderr
    assert f"Deleted and confirmed gone: {node['name']}" in swept.stdout
    assert embedded_nodes_left() == []
    assert _emulator_instances(preloaded_embedded_emulator) == []
