"""The run lifecycle end to end against the emulator, its SSH hosts and the real clients.

Every test ends by checking what the emulator still holds: a run must leave nothing.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from delegating_api import DelegatingTpuApi

from tpulab.errors import (
    AlreadyExistsError,
    CommandFailedError,
    DeadlineError,
    InterruptedRun,
    InvalidArgumentError,
    PreemptedError,
    QuotaError,
    RemoteTimeoutError,
    StockoutError,
    TeardownError,
    TpuBusyError,
    UnknownAcceleratorError,
    VerificationError,
)
from tpulab.evidence.localrun import run_local_payload
from tpulab.evidence.receipt import expectation_for, parse_receipt, verify_receipt
from tpulab.models import NodeRequest
from tpulab.paths import owner_id
from tpulab.run.progress import WORKLOAD_PHASES, NullObserver, Phase

if TYPE_CHECKING:
    from run_rig import Rig

    from tpulab.cloud.google import GoogleTpuApi


pytest_plugins = ["emulator_fixtures", "ssh_fixtures", "run_rig"]


class Snoop(NullObserver):
    """Looks at the emulated cloud while the run is in a given phase."""

    def __init__(self, rig: Rig, phase: Phase) -> None:
        self.rig = rig
        self.phase = phase
        self.nodes: dict[str, object] = {}

    def phase_started(self, phase: Phase) -> None:
        if phase is self.phase:
            self.nodes = dict(self.rig.emulator.snapshot()["nodes"])


def test_run_verifies_a_v5litepod_4_and_leaves_nothing(rig: Rig) -> None:
    spec = rig.spec("v5litepod-4")
    snoop = Snoop(rig, Phase.CONNECT)
    life, recorder, error = rig.run(spec, snoop)
    assert error is None, error
    outcome = life.outcome
    assert outcome.succeeded
    assert outcome.verdict == "verified"
    assert outcome.per_device_sums == [140.0, 1100.0, 3084.0, 6092.0]
    assert outcome.observed_total == 10416.0
    assert outcome.teardown_status == "confirmed"
    assert rig.leftovers() == []
    # While it ran, the node carried our labels and only this run's key.
    (node,) = snoop.nodes.values()
    assert isinstance(node, dict)
    assert node["labels"] == {
        "managed-by": "tpulab",
        "tpulab-run": spec.run_id,
        "tpulab-kind": "run",
        "tpulab-owner": owner_id(),
    }
    (key_line,) = node["metadata"]["ssh-keys"].splitlines()
    assert key_line.startswith("tpulab:ssh-ed25519 ")
    # The kept receipt verifies on its own, and was kept before the delete was sent.
    assert outcome.receipt is not None
    receipt = parse_receipt(outcome.receipt.path.read_bytes())
    verify_receipt(receipt, expectation_for("v5litepod-4", emulated=True, nonce=life.nonce))
    assert outcome.milestones["receipt_saved"] < outcome.milestones["delete_sent"]
    # A run without `-- CMD`: every phase but the command's.
    assert [p.phase for p in recorder.phases] == [p for p in Phase if p not in WORKLOAD_PHASES]
    assert all(p.ok for p in recorder.phases)
    assert outcome.api_calls > 0


def test_second_bootstrap_on_the_same_host_is_a_no_op(embedded_rig: Rig) -> None:
    # The emulated image already has jax: the install is skipped, and says so.
    life, recorder, error = embedded_rig.run(embedded_rig.spec("v5litepod-1"))
    assert error is None, error
    assert life.outcome.bootstrap is not None
    assert life.outcome.bootstrap.install.startswith("skipped")
    assert life.outcome.bootstrap.versions["jax"]
    assert any("install skipped" in note for note in recorder.notes)


def test_stockout_is_reported_and_nothing_remains(embedded_rig: Rig) -> None:
    embedded_rig.emulator.faults.stockout = True
    life, _, error = embedded_rig.run(embedded_rig.spec())
    assert isinstance(error, StockoutError)
    assert "capacity" in (error.api_message + error.message).lower()
    assert life.outcome.teardown_status == "confirmed"
    assert embedded_rig.leftovers() == []


def test_quota_refusal_creates_nothing(embedded_rig: Rig) -> None:
    embedded_rig.emulator.faults.quota = True
    life, _, error = embedded_rig.run(embedded_rig.spec())
    assert isinstance(error, QuotaError)
    assert "quota" in (error.api_message + error.message).lower()
    assert life.outcome.teardown_status == "not-created"
    assert embedded_rig.emulator.calls["delete_node"] == 0
    assert embedded_rig.leftovers() == []


def test_invalid_accelerator_never_reaches_the_api(embedded_rig: Rig) -> None:
    with pytest.raises(UnknownAcceleratorError) as caught:
        embedded_rig.spec("v5litepod-3")
    assert "v5litepod-4" in caught.value.message
    assert embedded_rig.emulator.calls["create_node"] == 0
    # And if the API itself refuses the type (a zone without it), nothing is left either.
    embedded_rig.emulator.faults.invalid_type = True
    life, _, error = embedded_rig.run(embedded_rig.spec())
    assert isinstance(error, InvalidArgumentError)
    assert life.outcome.teardown_status == "not-created"
    assert embedded_rig.leftovers() == []


def test_a_taken_name_is_refused_and_the_other_node_survives(embedded_rig: Rig) -> None:
    import dataclasses

    from emulator_fixtures import node_request

    api = embedded_rig.api
    api.wait_operation(
        api.create_node("us-central1-a", "someone-elses", node_request(run_id=None)), timeout=10
    )
    spec = dataclasses.replace(embedded_rig.spec(), node_name="someone-elses")
    life, _, error = embedded_rig.run(spec)
    assert isinstance(error, AlreadyExistsError)
    assert life.outcome.teardown_status == "not-created"
    assert embedded_rig.emulator.calls["delete_node"] == 0
    assert embedded_rig.leftovers() == ["someone-elses"]


class BlockLabDir(NullObserver):
    """Makes ~/jax-tpu-lab a plain file on the VM, so the venv cannot be created."""

    def __init__(self, rig: Rig) -> None:
        self.rig = rig

    def phase_started(self, phase: Phase) -> None:
        if phase is Phase.BOOTSTRAP:
            (node,) = self.rig.emulator.snapshot()["nodes"].values()
            sandbox = self.rig.emulator.sandbox(node["project"], node["zone"], node["name"])
            (sandbox / "jax-tpu-lab").write_text("not a directory")


def test_bootstrap_failure_names_the_step(embedded_rig: Rig) -> None:
    life, _, error = embedded_rig.run(embedded_rig.spec(), BlockLabDir(embedded_rig))
    assert isinstance(error, CommandFailedError)
    assert "Could not create the remote venv" in error.message
    assert life.outcome.teardown_status == "confirmed"
    assert embedded_rig.leftovers() == []


def test_payload_crash_without_receipt(embedded_rig: Rig, tmp_path: Path) -> None:
    from run_rig import payload_script

    crash = payload_script(
        tmp_path,
        """
        import sys
        print("starting", flush=True)
        raise SystemExit("RuntimeError: the payload blew up")
        """,
    )
    life, _, error = embedded_rig.run(embedded_rig.spec(script=crash))
    assert isinstance(error, CommandFailedError)
    assert "wrote no receipt" in error.message
    assert error.exit_status == 1
    assert "blew up" in error.output_tail
    assert life.outcome.verdict is None
    assert life.outcome.teardown_status == "confirmed"
    assert embedded_rig.leftovers() == []


def test_stale_tpu_process_is_named(embedded_rig: Rig, tmp_path: Path) -> None:
    from run_rig import payload_script

    busy = payload_script(
        tmp_path,
        """
        import sys
        sys.stderr.write(
            "RuntimeError: Unable to initialize backend 'tpu': ABORTED: The TPU is already "
            "in use by process with pid 4242. Not attempting to load libtpu.so in this process.\\n"
        )
        sys.exit(1)
        """,
    )
    life, _, error = embedded_rig.run(embedded_rig.spec(script=busy))
    assert isinstance(error, TpuBusyError)
    assert "pid 4242" in error.message
    assert error.hint is not None
    assert "/dev/vfio" in error.hint
    assert life.outcome.teardown_status == "confirmed"
    assert embedded_rig.leftovers() == []


def test_payload_hang_is_killed_at_the_timeout(embedded_rig: Rig, tmp_path: Path) -> None:
    from run_rig import payload_script

    hang = payload_script(
        tmp_path,
        """
        import pathlib, time
        time.sleep(30)
        pathlib.Path("hang-survived").write_text("the timeout did not kill me")
        """,
    )
    life, recorder, error = embedded_rig.run(embedded_rig.spec(script=hang, payload=1.5))
    assert isinstance(error, RemoteTimeoutError)
    execute = next(p for p in recorder.phases if p.phase is Phase.EXECUTE)
    assert not execute.ok
    assert execute.seconds < 10
    assert life.outcome.teardown_status == "confirmed"
    assert embedded_rig.leftovers() == []


def _stale_receipt_writer(tmp_path: Path, old_nonce: str, *, then: str) -> Path:
    """A stand-in payload that writes a genuine receipt of an earlier run (another nonce)
    where the controller expects this run's, then runs `then` (its exit)."""
    from run_rig import payload_script

    stale = run_local_payload(devices=4, nonce=old_nonce, emulated=True, timeout=120)
    return payload_script(
        tmp_path,
        f"""
        import argparse, pathlib, sys
        parser = argparse.ArgumentParser()
        parser.add_argument("--out")
        args, _ = parser.parse_known_args()
        pathlib.Path(args.out).write_bytes({stale.raw!r})
        {then}
        """,
    )


def test_stale_receipt_planted_by_a_failing_payload_is_rejected_by_nonce(
    embedded_rig: Rig, tmp_path: Path
) -> None:
    # A genuine receipt, from an earlier run with another nonce.
    planter = _stale_receipt_writer(
        tmp_path, "an-earlier-run-0001", then='sys.exit("failed after leaving an old receipt")'
    )
    life, _, error = embedded_rig.run(embedded_rig.spec(script=planter))
    assert isinstance(error, CommandFailedError)
    assert "stale" in error.message
    assert "nonce" in error.message
    outcome = life.outcome
    assert outcome.verdict == "rejected"
    assert any(failure.startswith("nonce") for failure in outcome.failures), outcome.failures
    assert outcome.receipt is not None  # kept, as evidence, marked rejected
    assert json.loads(outcome.receipt.record_path.read_text())["judgement"]["verdict"] == "rejected"
    assert outcome.teardown_status == "confirmed"
    assert embedded_rig.leftovers() == []


def test_stale_receipt_from_a_successful_exit_fails_verification(
    embedded_rig: Rig, tmp_path: Path
) -> None:
    replay = _stale_receipt_writer(tmp_path, "an-earlier-run-0002", then="sys.exit(0)")
    life, _, error = embedded_rig.run(embedded_rig.spec(script=replay))
    assert isinstance(error, VerificationError)
    assert [f.requirement for f in error.failures] == ["nonce"]
    assert not life.outcome.succeeded
    assert embedded_rig.leftovers() == []


def test_spot_preemption_mid_run_is_reported_as_preemption(
    embedded_rig: Rig, tmp_path: Path
) -> None:
    from run_rig import payload_script

    slow = payload_script(tmp_path, "import time\ntime.sleep(20)\n")
    faults = embedded_rig.emulator.faults

    class PreemptWhenThePayloadStarts(NullObserver):
        # Preempt at the start of "execute", not after a fixed time: how long the
        # bootstrap takes depends on the machine and on whether uv is installed.
        def phase_started(self, phase: Phase) -> None:
            if phase is Phase.EXECUTE:
                faults.preempt_after = 0.0

    life, _, error = embedded_rig.run(
        embedded_rig.spec(spot=True, script=slow), PreemptWhenThePayloadStarts()
    )
    assert isinstance(error, PreemptedError), error
    assert "preempted" in error.message
    assert "run payload" in error.message
    assert life.outcome.teardown_status == "confirmed"
    assert embedded_rig.leftovers() == []


@pytest.mark.parametrize("fault", ["operation_fails", "sync_503"])
def test_delete_failing_three_times_is_still_confirmed(
    embedded_rig: Rig, tmp_path: Path, fault: str
) -> None:
    from run_rig import payload_script

    quick = payload_script(tmp_path, "raise SystemExit(0)\n")
    if fault == "operation_fails":
        embedded_rig.emulator.faults.delete_failures = 3
    else:
        embedded_rig.emulator.faults.transient = {"delete_node": 3}
    life, recorder, error = embedded_rig.run(embedded_rig.spec(script=quick))
    # The stand-in payload writes no receipt: the run fails, the teardown must not.
    assert isinstance(error, CommandFailedError)
    assert life.outcome.teardown_status == "confirmed"
    assert life.outcome.teardown is not None
    assert life.outcome.teardown.delete_attempts == 4
    assert len(life.outcome.teardown.problems) == 3
    assert embedded_rig.leftovers() == []
    assert any("retrying" in n or "failed" in n for n in recorder.notes)


@pytest.mark.parametrize("fault", ["always_fails", "hangs"])
def test_delete_never_succeeding_raises_teardown_error_with_manual_command(
    embedded_rig: Rig, tmp_path: Path, fault: str
) -> None:
    from run_rig import payload_script

    from tpulab.run.teardown import delete_and_confirm

    quick = payload_script(tmp_path, "raise SystemExit(0)\n")
    faults = embedded_rig.emulator.faults
    if fault == "hangs":
        faults.delete_hangs = True
    else:
        faults.delete_failures = 10**6
    spec = embedded_rig.spec(script=quick, teardown=1.5)
    life, _, error = embedded_rig.run(spec)
    assert isinstance(error, TeardownError)
    assert "NOT confirmed" in error.message
    assert "wrote no receipt" in error.message  # the earlier failure is not lost
    expected = (
        f"gcloud compute tpus tpu-vm delete {spec.node_name} "
        f"--project={spec.project.value} --zone={spec.zone.value} --quiet"
    )
    assert error.hint is not None
    assert expected in error.hint
    assert [leak.name for leak in error.leaked] == [spec.node_name]
    assert life.outcome.teardown_status == "unconfirmed"
    assert embedded_rig.leftovers() == [spec.node_name]
    if fault == "hangs":
        return  # the emulated operation stays hung; the node is left, as in the cloud
    # Once the cloud behaves again, the shared teardown finishes the job.
    faults.delete_failures = 0
    report = delete_and_confirm(
        embedded_rig.api, spec.zone.value, spec.node_name, run_id=spec.run_id, timeout=10, poll=0.05
    )
    assert report.confirmed
    assert embedded_rig.leftovers() == []


class CtrlC(NullObserver):
    def __init__(self, phase: Phase) -> None:
        self.phase = phase

    def phase_started(self, phase: Phase) -> None:
        if phase is self.phase:
            raise KeyboardInterrupt


def test_ctrl_c_during_a_phase_still_tears_down(embedded_rig: Rig) -> None:
    spec = embedded_rig.spec()
    # An observer raising KeyboardInterrupt is Ctrl-C arriving as the phase starts.
    from tpulab.run.lifecycle import Lifecycle

    life = Lifecycle(
        spec,
        api=embedded_rig.api,
        observer=CtrlC(Phase.BOOTSTRAP),
        teardown_poll=0.05,
    )
    with pytest.raises(InterruptedRun):
        life.run()
    assert life.outcome.teardown_status == "confirmed"
    assert embedded_rig.leftovers() == []


class CreateOperationSaysAlreadyExists(DelegatingTpuApi):
    """A TpuApi whose create is accepted but whose operation then fails ALREADY_EXISTS
    (a race for the name); everything else is the real client against the emulator."""

    def create_node(self, zone: str, node_id: str, request: NodeRequest) -> str:
        return f"projects/{self.project}/locations/{zone}/operations/raced-{node_id}"

    def wait_operation(self, operation_name: str, *, timeout: float) -> None:
        raise AlreadyExistsError("node exists", status="ALREADY_EXISTS")


def test_a_create_that_loses_the_name_race_never_deletes_the_winners_node(
    embedded_rig: Rig,
) -> None:
    from tpulab.run.lifecycle import Lifecycle

    spec = embedded_rig.spec()
    theirs = NodeRequest(accelerator_type="v5litepod-4", runtime_version="v2-alpha-tpuv5-lite")
    operation = embedded_rig.api.create_node(spec.zone.value, spec.node_name, theirs)
    embedded_rig.api.wait_operation(operation, timeout=30)
    life = Lifecycle(
        spec, api=CreateOperationSaysAlreadyExists(embedded_rig.api), teardown_poll=0.05
    )
    with pytest.raises(AlreadyExistsError):
        life.run()
    assert life.outcome.teardown_status == "confirmed"  # nothing with our label exists
    assert embedded_rig.leftovers() == [spec.node_name]  # and their node is untouched


def test_a_signal_while_recording_an_unconfirmed_teardown_keeps_the_teardown_error(
    embedded_rig: Rig, tmp_path: Path
) -> None:
    import os
    import signal

    from run_rig import payload_script

    from tpulab.run.lifecycle import Lifecycle
    from tpulab.run.signals import shield, signals_to_teardown

    class SignalWhileFinishing:
        def run_started(self, spec: object) -> None:
            pass

        def phase_changed(self, run_id: str, phase: str) -> None:
            pass

        def run_finished(self, run_id: str, teardown: str, detail: str) -> None:
            os.kill(os.getpid(), signal.SIGINT)  # the user's first Ctrl-C lands now

    embedded_rig.emulator.faults.delete_hangs = True
    quick = payload_script(tmp_path, "raise SystemExit(0)\n")
    spec = embedded_rig.spec(script=quick, teardown=1.0)
    life = Lifecycle(
        spec,
        api=embedded_rig.api,
        journal=SignalWhileFinishing(),
        shield=shield,
        teardown_poll=0.05,
    )
    messages: list[str] = []
    with pytest.raises(TeardownError), signals_to_teardown(messages.append, force_exit_status=6):
        life.run()
    assert life.outcome.teardown_status == "unconfirmed"
    assert any(spec.node_name in m or "recording" in m for m in messages), messages


class CreateReplyLost(DelegatingTpuApi):
    """CreateNode's reply is lost (a 504) while the API goes on to create the node a
    moment later: the run cannot know whether a node exists."""

    def __init__(self, api: GoogleTpuApi) -> None:
        super().__init__(api)
        self.later: threading.Timer | None = None

    def create_node(self, zone: str, node_id: str, request: NodeRequest) -> str:
        self.later = threading.Timer(0.3, self.api.create_node, (zone, node_id, request))
        self.later.start()
        raise DeadlineError("create_node: 504 Gateway Timeout", status="DEADLINE_EXCEEDED")


def test_a_create_whose_reply_was_lost_is_still_found_and_deleted(embedded_rig: Rig) -> None:
    from tpulab.run.lifecycle import Lifecycle

    spec = embedded_rig.spec(teardown=8.0)
    api = CreateReplyLost(embedded_rig.api)
    life = Lifecycle(spec, api=api, teardown_poll=0.05)
    with pytest.raises(DeadlineError):
        life.run()
    assert api.later is not None
    api.later.join()
    # The node materialised after the first empty list: the teardown must have waited
    # for it, deleted it and only then confirmed.
    assert life.outcome.teardown_status == "confirmed"
    assert life.outcome.teardown is not None
    assert life.outcome.teardown.delete_attempts >= 1
    assert embedded_rig.leftovers() == []
