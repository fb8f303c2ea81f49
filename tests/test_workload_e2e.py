"""`tpulab run ... -- CMD` end to end on the emulator, over both SSH backends.

The real lifecycle against the real emulator (HTTP API + SSH hosts running commands on
this machine): the verifier runs first, then the workspace goes up, the user's command
runs in it, and its artifacts come back -- on success, on failure, at a timeout and after
a Ctrl-C (a real SIGINT to this process, through `signals_to_teardown` as the CLI uses
it). Each test ends by checking the emulator for leftovers (DESIGN §3).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import signal
import textwrap
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from cut_connection import CutConnection, SteppedClock

from tpulab import paths
from tpulab.config import RunSpec
from tpulab.config.workload import WorkloadSpec
from tpulab.errors import (
    ConnectError,
    InterruptedRun,
    TpuLabError,
    VerificationError,
    WorkloadFailedError,
)
from tpulab.exits import EXIT_INTERRUPTED, EXIT_PREEMPTED, EXIT_WORKLOAD, exit_status_for
from tpulab.remote import workload as wl
from tpulab.remote.keys import RunKey, SshTarget
from tpulab.remote.ssh import RunResult
from tpulab.run.progress import COMMAND_STREAM, NullObserver, Phase
from tpulab.run.record import read_run_record
from tpulab.run.signals import shield, signals_to_teardown, skippable
from tpulab.run.summary import summary_lines

if TYPE_CHECKING:
    from run_rig import Rig

    from tpulab.run.remote_session import Connect

pytest_plugins = ["emulator_fixtures", "ssh_fixtures", "run_rig"]
pytestmark = pytest.mark.slow

LAB = Path(__file__).resolve().parent.parent / "examples" / "course_lab"

# Prints "SHA <path relative to the run dir> <sha256>" for every file of the run dir, ON
# the VM, after the training: what the fetched copies must match byte for byte.
HASH_TREE = """
import hashlib, os, sys
root = os.environ["TPULAB_RUN_DIR"]
for folder, _dirs, files in os.walk(root):
    for name in sorted(files):
        path = os.path.join(folder, name)
        digest = hashlib.sha256(open(path, "rb").read()).hexdigest()
        print("SHA", os.path.relpath(path, root), digest, flush=True)
"""


def with_workload(
    spec: RunSpec, workdir: Path, out: Path, *command: str, **fields: object
) -> RunSpec:
    workload = WorkloadSpec(
        command=tuple(command),
        workdir=workdir,
        out=out,
        env=tuple(fields.pop("env", ())),  # type: ignore[arg-type]
        with_packages=(),
        requirements=None,
        fetch=tuple(fields.pop("fetch", ())),  # type: ignore[arg-type]
        exclude=(),
        allow_secrets=(),
        **fields,  # type: ignore[arg-type]
    )
    return dataclasses.replace(spec, workload=workload)


def workspace(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "workspace"
    root.mkdir()
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text))
    return root


def command_lines(recorder: object) -> list[str]:
    return [line for stream, line in recorder.output if stream == COMMAND_STREAM]  # type: ignore[attr-defined]


def test_course_lab_runs_after_the_verifier_and_comes_back_byte_identical(
    rig: Rig, tmp_path: Path
) -> None:
    work = tmp_path / "lab"
    shutil.copytree(LAB, work)
    (work / "hash_tree.py").write_text(HASH_TREE)
    (work / "runs").mkdir()
    (work / "runs" / "ignored.txt").write_text("the lab's .gitignore keeps this home")
    out = tmp_path / "out"
    spec = with_workload(
        rig.spec(),
        work,
        out,
        "sh",
        "-c",
        'python train.py --steps 20 --run-dir "$TPULAB_RUN_DIR" && python hash_tree.py',
        env=[("LAB_NOTE", "from --env")],
        fetch=["train.py"],
    )
    life, recorder, error = rig.run(spec)
    assert error is None, error
    outcome = life.outcome
    assert outcome.judgement is not None
    assert outcome.judgement.verified
    workload = outcome.workload
    assert workload is not None
    assert workload.exit_status == 0
    # The gate: the command's phase starts only after VERIFY finished, and ok.
    order = [p.phase for p in recorder.phases]
    assert order.index(Phase.VERIFY) < order.index(Phase.SYNC) < order.index(Phase.WORKLOAD)
    assert order.index(Phase.WORKLOAD) < order.index(Phase.FETCH) < order.index(Phase.TEARDOWN)
    lines = command_lines(recorder)
    assert any("training on 4 cpu device(s)" in line for line in lines), lines
    on_vm = {
        parts[1]: parts[2] for parts in (line.split() for line in lines) if parts[:1] == ["SHA"]
    }
    assert "checkpoints/step_00020.npz" in on_vm
    assert "metrics.jsonl" in on_vm
    # Every file the VM hashed is back, byte for byte, and the manifest says the same.
    manifest = json.loads((out / "manifest.json").read_text())
    listed = {entry["path"]: entry["sha256"] for entry in manifest["files"]}
    for relative, digest in on_vm.items():
        local = out / "run" / relative
        assert hashlib.sha256(local.read_bytes()).hexdigest() == digest, relative
        assert listed[f"run/{relative}"] == digest
    receipt = json.loads((out / "run" / "device_receipt.json").read_text())
    assert receipt["observed_platform"] == "cpu"
    assert receipt["local_device_count"] == 4
    assert (out / "workspace" / "train.py").read_bytes() == (work / "train.py").read_bytes()
    assert "training on 4 cpu" in (out / "output.log").read_text()
    # The ignored file never went up (the upload manifest lists what did).
    uploaded = {e.path for e in workload.upload.manifest.entries} if workload.upload else set()
    assert "train.py" in uploaded
    assert "runs/ignored.txt" not in uploaded
    record = read_run_record(out / "run.json")
    assert record.ok
    assert record.workload.exit_status == 0
    assert outcome.receipt is not None
    assert record.receipt_id == outcome.receipt.id
    assert record.workload.env_names == ["LAB_NOTE"]
    assert "from --env" not in (out / "run.json").read_text()  # names, never values
    assert {"sync", "workload", "fetch", "teardown"} <= set(record.phase_seconds)
    assert rig.leftovers() == []


def test_failing_command_gets_its_status_and_its_artifacts_back(rig: Rig, tmp_path: Path) -> None:
    work = workspace(
        tmp_path,
        {
            "fail.py": """
            import os, sys
            open(os.path.join(os.environ["TPULAB_RUN_DIR"], "partial.txt"), "w").write("x")
            os.makedirs("results")  # in the workspace, which no --fetch asks for
            open("results/scores.csv", "w").write("step,loss\\n")
            print("platform", os.environ["JAX_PLATFORMS"], os.environ["COURSE_EXPECT_PLATFORM"])
            print("boom: the experiment failed", flush=True)
            sys.exit(3)
            """
        },
    )
    out = tmp_path / "out"
    life, _, error = rig.run(with_workload(rig.spec(), work, out, "python", "fail.py"))
    assert isinstance(error, WorkloadFailedError), error
    assert error.exit_status == 3
    assert not error.timed_out
    assert exit_status_for(error) == EXIT_WORKLOAD
    assert (out / "run" / "partial.txt").read_text() == "x"
    log = (out / "output.log").read_text()
    assert "boom: the experiment failed" in log
    assert "platform cpu cpu" in log
    assert life.outcome.teardown_status == "confirmed"
    record = read_run_record(out / "run.json").workload
    assert record.exit_status == 3
    # What it wrote where nothing fetches it is named, as gone with the VM.
    assert record.fetch_left is not None
    assert (record.fetch_left.files, record.fetch_left.first) == (1, ["results/scores.csv"])
    text = "\n".join(
        "".join(part for part, _ in line)
        for line in summary_lines(life.outcome, laptop_jax=lambda: None)
    )
    assert (
        "  left      1 file (10 B) your command wrote in the workspace was not fetched and "
        "went with the VM: results/scores.csv; --fetch 'results/**' brings them"
    ) in text
    assert rig.leftovers() == []


class _ChildWatch(NullObserver):
    """When the fetch starts (before any teardown), is the command's child still alive?"""

    def __init__(self, pid_file: Path) -> None:
        self.pid_file = pid_file
        self.alive_at_fetch: bool | None = None

    def phase_started(self, phase: Phase) -> None:
        if phase is Phase.FETCH and self.alive_at_fetch is None:
            pid = int(self.pid_file.read_text())
            try:
                os.kill(pid, 0)
                self.alive_at_fetch = Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
            except ProcessLookupError:
                self.alive_at_fetch = False


def test_command_past_its_timeout_is_killed_on_the_vm_and_fetched(rig: Rig, tmp_path: Path) -> None:
    child_pid = tmp_path / "child.pid"
    work = workspace(
        tmp_path,
        {
            "hang.py": f"""
            import os, subprocess, time
            child = subprocess.Popen(["sleep", "300"])
            open({str(child_pid)!r}, "w").write(str(child.pid))
            open(os.path.join(os.environ["TPULAB_RUN_DIR"], "before.txt"), "w").write("up")
            print("hanging", flush=True)
            time.sleep(300)
            """
        },
    )
    out = tmp_path / "out"
    watch = _ChildWatch(child_pid)
    spec = with_workload(rig.spec(), work, out, "python", "hang.py", timeout=3.0)
    started = time.monotonic()
    life, _, error = rig.run(spec, watch)
    assert isinstance(error, WorkloadFailedError), error
    assert error.timed_out
    assert error.exit_status is None
    assert time.monotonic() - started < 120
    assert watch.alive_at_fetch is False  # the whole process group died on the VM
    assert (out / "run" / "before.txt").read_text() == "up"
    assert "hanging" in (out / "output.log").read_text()
    assert life.outcome.teardown_status == "confirmed"
    assert rig.leftovers() == []


class _SignalWhen(NullObserver):
    """Sends SIGINT to this process: once `marker` exists (from a thread), and again as
    the fetch phase starts when `again_at_fetch` (in the main thread, like a user)."""

    def __init__(self, marker: Path, *, again_at_fetch: bool, signum: int = signal.SIGINT) -> None:
        self.again_at_fetch = again_at_fetch
        self.signum = signum
        self.fetches = 0
        self._thread = threading.Thread(target=self._wait, args=(marker,), daemon=True)
        self._thread.start()

    def _wait(self, marker: Path) -> None:
        deadline = time.monotonic() + 120
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), self.signum)

    def phase_started(self, phase: Phase) -> None:
        if phase is Phase.FETCH:
            self.fetches += 1
            if self.again_at_fetch:
                os.kill(os.getpid(), self.signum)


class _Notes(NullObserver):
    def __init__(self, notes: list[str]) -> None:
        self.notes = notes

    def note(self, message: str) -> None:
        self.notes.append(message)


def _interrupted_run(
    rig: Rig,
    tmp_path: Path,
    *,
    again_at_fetch: bool,
    signum: int = signal.SIGINT,
    connect: Connect | None = None,
    notes: list[str] | None = None,
    **lifecycle: Any,
) -> tuple[object, Path, BaseException | None]:
    marker = tmp_path / "command-started"
    work = workspace(
        tmp_path,
        {
            "long.py": f"""
            import os, time
            open(os.path.join(os.environ["TPULAB_RUN_DIR"], "progress.txt"), "w").write("1")
            # Printed before the marker that triggers the signal, so the line exists
            # whenever the signal comes.
            print("running until stopped", flush=True)
            open({str(marker)!r}, "w").write("running")
            time.sleep(300)
            """
        },
    )
    out = tmp_path / "out"
    spec = with_workload(rig.spec(), work, out, "python", "long.py")
    observer = _SignalWhen(marker, again_at_fetch=again_at_fetch, signum=signum)
    error: BaseException | None = None
    heard = _Notes(notes if notes is not None else [])
    life, _ = rig.lifecycle(
        spec, observer, heard, shield=shield, skippable=skippable, connect=connect, **lifecycle
    )
    try:
        with signals_to_teardown(lambda _text: None, force_exit_status=6):
            life.run()
    except BaseException as raised:  # the test inspects what came out
        error = raised
    return life, out, error


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_ctrl_c_during_the_command_fetches_then_deletes(
    rig: Rig, tmp_path: Path, signum: int
) -> None:
    life, out, error = _interrupted_run(rig, tmp_path, again_at_fetch=False, signum=signum)
    assert isinstance(error, InterruptedRun), error
    assert exit_status_for(error) == EXIT_INTERRUPTED
    assert (out / "run" / "progress.txt").read_text() == "1"
    assert "running until stopped" in (out / "output.log").read_text()
    outcome = life.outcome  # type: ignore[attr-defined]
    assert outcome.workload.stopped == f"interrupted by {signal.Signals(signum).name}"
    assert outcome.teardown_status == "confirmed"
    assert read_run_record(out / "run.json").workload.fetched_files
    assert rig.leftovers() == []


class _DropsBeforeTheStop(CutConnection):
    """Cut just before it runs the stop request: a Ctrl-C that left the SSH stream
    unusable, or a network blip at the worst moment."""

    def __init__(self, target: SshTarget, key: RunKey) -> None:
        super().__init__(target, key)
        self.dropped = False

    def run(self, argv: Sequence[str] | str, **kwargs: Any) -> RunResult:
        if not self.dropped and list(argv) == list(wl.stop_command()):
            self.dropped = True
            self.cut_now()
        return super().run(argv, **kwargs)


def test_a_connection_dropped_before_the_stop_is_opened_again_and_the_fetch_follows(
    rig: Rig, tmp_path: Path
) -> None:
    made: list[_DropsBeforeTheStop] = []

    def connect(target: SshTarget, key: RunKey) -> _DropsBeforeTheStop:
        made.append(_DropsBeforeTheStop(target, key))
        return made[-1]

    notes: list[str] = []
    life, out, error = _interrupted_run(
        rig, tmp_path, again_at_fetch=False, connect=connect, notes=notes
    )
    assert isinstance(error, InterruptedRun), error
    (connection,) = made
    assert connection.dropped
    assert connection.connects == 2  # the run's, and one more after the drop
    assert any(n.startswith("your command was stopped on the VM") for n in notes), notes
    assert (out / "run" / "progress.txt").read_text() == "1"
    outcome = life.outcome  # type: ignore[attr-defined]
    assert outcome.workload.fetch_problem is None
    assert outcome.teardown_status == "confirmed"
    assert rig.leftovers() == []


class _DropsDuringTheCommand(CutConnection):
    """Cut while the user's command runs, once this end has received the command's first
    line: the laptop's network dropping under a long training run. The command waits
    for the cut (a file) before it goes on."""

    def __init__(self, target: SshTarget, key: RunKey, cut: Path) -> None:
        super().__init__(target, key)
        self.cut = cut

    def run(self, argv: Sequence[str] | str, **kwargs: Any) -> RunResult:
        shown = kwargs.get("on_line")
        if isinstance(argv, str) or wl.STAGED_LAUNCHER not in argv or shown is None:
            return super().run(argv, **kwargs)

        def on_line(stream: str, line: str) -> None:
            shown(stream, line)
            if line.startswith("step 1") and not self.cut.exists():
                self.cut_now()
                self.cut.write_text("cut")

        return super().run(argv, **{**kwargs, "on_line": on_line})


def test_a_connection_dropped_during_the_command_is_reconnected_and_the_command_runs_on(
    rig: Rig, tmp_path: Path
) -> None:
    cut = tmp_path / "cut"
    work = workspace(
        tmp_path,
        {
            "train.py": f"""
            import os, pathlib, time
            print("step 1, before the drop", flush=True)
            while not pathlib.Path({str(cut)!r}).exists():  # the network drops here
                time.sleep(0.02)
            time.sleep(1)
            print("step 2, while it was down", flush=True)
            time.sleep(2)  # the laptop is back by now
            print("step 3, after the reconnect", flush=True)
            pathlib.Path(os.environ["TPULAB_RUN_DIR"], "done.txt").write_text("yes")
            """
        },
    )
    made: list[_DropsDuringTheCommand] = []

    def connect(target: SshTarget, key: RunKey) -> _DropsDuringTheCommand:
        made.append(_DropsDuringTheCommand(target, key, cut))
        return made[-1]

    notes: list[str] = []
    out = tmp_path / "out"
    spec = with_workload(rig.spec(), work, out, "python", "train.py")
    life, recorder, error = rig.run(spec, _Notes(notes), connect=connect)
    assert error is None, error
    (connection,) = made
    assert cut.exists()
    assert connection.connects == 2  # the run's, and one after the drop
    assert any("dropped while your command ran" in n for n in notes), notes
    assert any(n.startswith("reconnected to the VM; following your command") for n in notes)
    # It ran to its end, unstopped; what it printed after the reconnect was shown, and
    # the log (fetched) has every line.
    shown = command_lines(recorder)
    assert "step 1, before the drop" in shown
    assert "step 3, after the reconnect" in shown
    log = (out / "output.log").read_text()
    assert [line for line in log.splitlines() if line.startswith("step")] == [
        "step 1, before the drop",
        "step 2, while it was down",
        "step 3, after the reconnect",
    ]
    assert (out / "run" / "done.txt").read_text() == "yes"
    outcome = life.outcome
    assert outcome.workload is not None
    assert (outcome.workload.exit_status, outcome.workload.stopped) == (0, None)
    assert outcome.teardown_status == "confirmed"
    # Said after the run too: in its record (for --json and later) and its summary.
    assert read_run_record(out / "run.json").workload.reconnects == 1
    lines = summary_lines(outcome, laptop_jax=lambda: None)
    text = "\n".join("".join(part for part, _ in line) for line in lines)
    assert "  link      the SSH connection dropped once while it ran; it ran on, followed" in text
    assert rig.leftovers() == []


class _DropsDuringTheUpload(CutConnection):
    """Cut once the workspace upload's first chunk is on its way: the laptop's network
    dropping while a large workspace goes up."""

    def __init__(self, target: SshTarget, key: RunKey) -> None:
        super().__init__(target, key)
        self.dropped = False

    def run_streaming(self, argv: Sequence[str], **kwargs: Any) -> RunResult:
        chunks = kwargs.get("stdin")
        if self.dropped or "unpack" not in argv or chunks is None:
            return super().run_streaming(argv, **kwargs)

        def cut_after_the_first(source: Any) -> Any:
            for index, chunk in enumerate(source):
                if index == 1:
                    self.dropped = True
                    self.cut_now()
                yield chunk

        return super().run_streaming(argv, **{**kwargs, "stdin": cut_after_the_first(chunks)})


def test_a_connection_dropped_during_the_upload_sends_it_again(rig: Rig, tmp_path: Path) -> None:
    # Big enough for the archive to go in several chunks, random so it is not a run of
    # one byte that any stream would get right by luck.
    data = os.urandom(300_000)
    work = workspace(
        tmp_path,
        {
            "check.py": """
            import hashlib, pathlib
            print("data", hashlib.sha256(pathlib.Path("data.bin").read_bytes()).hexdigest())
            """
        },
    )
    (work / "data.bin").write_bytes(data)
    made: list[_DropsDuringTheUpload] = []

    def connect(target: SshTarget, key: RunKey) -> _DropsDuringTheUpload:
        made.append(_DropsDuringTheUpload(target, key))
        return made[-1]

    notes: list[str] = []
    spec = with_workload(rig.spec(), work, tmp_path / "out", "python", "check.py")
    life, recorder, error = rig.run(spec, _Notes(notes), connect=connect)
    assert error is None, error
    (connection,) = made
    assert connection.dropped
    assert connection.connects == 2  # the run's, and one for the second upload
    assert any(n.startswith("the SSH connection dropped during the upload") for n in notes)
    assert f"data {hashlib.sha256(data).hexdigest()}" in command_lines(recorder)
    assert life.outcome.teardown_status == "confirmed"
    assert rig.leftovers() == []


class _DropsDuringTheFetch(CutConnection):
    """Cut once the fetch's first chunk has arrived: the laptop's network dropping while
    the results of a long run come home."""

    def __init__(self, target: SshTarget, key: RunKey) -> None:
        super().__init__(target, key)
        self.dropped = False

    def run_streaming(self, argv: Sequence[str], **kwargs: Any) -> RunResult:
        out = kwargs.get("stdout")
        if self.dropped or "pack" not in argv or out is None:
            return super().run_streaming(argv, **kwargs)
        connection, spool = self, out

        class CutAfterTheFirst:
            def write(self, data: bytes) -> int:
                written = spool.write(data)
                if not connection.dropped:
                    connection.dropped = True
                    connection.cut_now()
                return int(written)

        return super().run_streaming(argv, **{**kwargs, "stdout": CutAfterTheFirst()})


def test_a_connection_dropped_during_the_fetch_fetches_again_whole(
    rig: Rig, tmp_path: Path
) -> None:
    work = workspace(
        tmp_path,
        {
            "train.py": """
            import os, pathlib
            run = pathlib.Path(os.environ["TPULAB_RUN_DIR"])
            for i in range(3):
                (run / f"part{i}.bin").write_bytes(os.urandom(200_000))
            print("wrote")
            """
        },
    )
    made: list[_DropsDuringTheFetch] = []

    def connect(target: SshTarget, key: RunKey) -> _DropsDuringTheFetch:
        made.append(_DropsDuringTheFetch(target, key))
        return made[-1]

    notes: list[str] = []
    out = tmp_path / "out"
    spec = with_workload(rig.spec(), work, out, "python", "train.py")
    life, _, error = rig.run(spec, _Notes(notes), connect=connect)
    assert error is None, error
    (connection,) = made
    assert connection.dropped
    assert connection.connects == 2  # the run's, and one for the second fetch
    assert any(n.startswith("the SSH connection dropped during the fetch") for n in notes)
    manifest = json.loads((out / "manifest.json").read_text())
    assert "complete" not in manifest  # the second fetch is whole
    by_path = {entry["path"]: entry["sha256"] for entry in manifest["files"]}
    for i in range(3):
        data = (out / "run" / f"part{i}.bin").read_bytes()
        assert len(data) == 200_000
        assert by_path[f"run/part{i}.bin"] == hashlib.sha256(data).hexdigest()
    assert life.outcome.workload is not None
    assert life.outcome.workload.fetch_problem is None
    assert life.outcome.teardown_status == "confirmed"
    assert rig.leftovers() == []


class _StaysDown(_DropsDuringTheCommand):
    """Cut under the command like `_DropsDuringTheCommand`, and then down: each of the
    first `tries` connects after the cut is refused, and moves the run's clock `step`
    seconds on (a reconnect that waited for nothing)."""

    def __init__(
        self, target: SshTarget, key: RunKey, cut: Path, clock: SteppedClock, tries: int,
        step: float,
    ) -> None:  # fmt: skip
        super().__init__(target, key, cut)
        self.clock, self.tries, self.step = clock, tries, step
        self.refused = 0

    def open(self) -> None:
        if self._client is None and self.cut.exists() and self.refused < self.tries:
            self.refused += 1
            self.clock.skipped += self.step
            raise ConnectError("[Errno 113] No route to host (the test's outage)")
        super().open()


def _outage_run(
    rig: Rig, tmp_path: Path, *, tries: int, step: float
) -> tuple[Any, BaseException | None, list[str], _StaysDown]:
    cut = tmp_path / "cut"
    work = workspace(
        tmp_path,
        {
            "train.py": f"""
            import pathlib, time
            print("step 1, before the drop", flush=True)
            while not pathlib.Path({str(cut)!r}).exists():
                time.sleep(0.02)
            time.sleep(1)
            print("step 2, after the outage", flush=True)
            """
        },
    )
    clock = SteppedClock()
    made: list[_StaysDown] = []

    def connect(target: SshTarget, key: RunKey) -> _StaysDown:
        made.append(_StaysDown(target, key, cut, clock, tries, step))
        return made[-1]

    notes: list[str] = []
    spec = with_workload(rig.spec(), work, tmp_path / "out", "python", "train.py")
    life, _, error = rig.run(spec, _Notes(notes), connect=connect, clock=clock)
    (connection,) = made
    return life, error, notes, connection


def test_a_link_down_longer_than_two_minutes_is_followed_while_the_lease_holds(
    rig: Rig, tmp_path: Path
) -> None:
    """Three refused reconnects a minute apart by the run's clock: longer than the
    follow's bound without a watchdog (120 s), inside the 10-minute lease, so the VM
    still has the command and the run follows it to its end."""
    life, error, notes, connection = _outage_run(rig, tmp_path, tries=3, step=60.0)
    assert error is None, error
    assert connection.refused == 3
    assert connection.connects == 2  # the run's, and one once the link was back
    still = [n for n in notes if n.startswith("still reconnecting to the VM")]
    assert still, notes
    assert "until its lease may have lapsed and it deletes itself" in still[0]
    assert any(n.startswith("reconnected to the VM; following your command") for n in notes)
    log = (tmp_path / "out" / "output.log").read_text()
    assert "step 2, after the outage" in log
    assert (life.outcome.workload.exit_status, life.outcome.workload.stopped) == (0, None)
    assert life.outcome.teardown_status == "confirmed"
    assert rig.leftovers() == []


def test_a_link_down_past_the_lease_is_given_up_and_the_node_deleted(
    rig: Rig, tmp_path: Path
) -> None:
    """Reconnects refused 250 s apart by the run's clock: after the third, the lease
    (600 s) may have lapsed and the VM deleted itself; the follow stops there and the
    run ends as a dropped connection always did, its node deleted by the teardown.
    The link would come back at the 20th try: a follow that did not stop would reach
    it and end the run well."""
    life, error, notes, connection = _outage_run(rig, tmp_path, tries=20, step=250.0)
    assert isinstance(error, ConnectError), error
    assert "dropped while your command ran and was not back after" in error.message
    assert "the VM's lease may have lapsed (it deletes itself)" in error.message
    assert connection.refused < 20, "the follow kept reconnecting past the lease"
    assert any("dropped while your command ran" in n for n in notes), notes
    assert not any(n.startswith("reconnected to the VM") for n in notes), notes
    assert life.outcome.teardown_status == "confirmed"
    assert rig.leftovers() == []


class _ReclaimWhenSaid(_Notes):
    """Reclaims the spot node (the emulator's preemption fault) once the command's first
    line has reached this end: a preemption under the user's command."""

    def __init__(self, notes: list[str], faults: Any) -> None:
        super().__init__(notes)
        self.faults = faults

    def remote_output(self, stream: str, line: str) -> None:
        if line.startswith("training") and not self.faults.preempt_nodes:
            self.faults.preempt_nodes = 1
            self.faults.preempt_after = 0.0


class _FetchCutThenDown(_DropsDuringTheFetch):
    """Cut like `_DropsDuringTheFetch`, and then down: each connect after the cut is
    refused at once and moves the run's clock a minute on. `refused` counts the run's
    own tries (its thread), not the lease renewer's, which may try meanwhile too."""

    def __init__(self, target: SshTarget, key: RunKey, clock: SteppedClock) -> None:
        super().__init__(target, key)
        self.clock = clock
        self.refused = 0

    def open(self) -> None:
        if self._client is None and self.dropped:
            if threading.current_thread() is threading.main_thread():
                self.refused += 1
            self.clock.skipped += 60.0
            raise ConnectError("[Errno 113] No route to host (the test's outage)")
        super().open()


def test_after_a_ctrl_c_a_fetch_the_link_dropped_under_keeps_its_bound(
    rig: Rig, tmp_path: Path
) -> None:
    """The fetch after a Ctrl-C is bounded (the user asked to stop): when the link drops
    under it and stays down, one connect is tried, not the lease's ten minutes of them
    that a fetch after a normal end would wait; the teardown follows."""
    clock = SteppedClock()
    made: list[_FetchCutThenDown] = []

    def connect(target: SshTarget, key: RunKey) -> _FetchCutThenDown:
        made.append(_FetchCutThenDown(target, key, clock))
        return made[-1]

    notes: list[str] = []
    life, _out, error = _interrupted_run(
        rig, tmp_path, again_at_fetch=False, connect=connect, notes=notes, clock=clock
    )
    assert isinstance(error, InterruptedRun), error
    (connection,) = made
    assert connection.dropped
    assert connection.refused == 1
    assert any(n.startswith("could not fetch the artifacts after interrupted") for n in notes)
    outcome = life.outcome  # type: ignore[attr-defined]
    assert outcome.workload.fetch_problem is not None
    assert outcome.teardown_status == "confirmed"
    assert rig.leftovers() == []


def test_a_spot_node_reclaimed_under_the_command_is_not_followed(
    embedded_rig: Rig, tmp_path: Path
) -> None:
    """The connection drops because the node is gone: GetNode says so, and the run
    does not spend the follow's two minutes reconnecting to it."""
    work = workspace(
        tmp_path, {"train.py": "import time\nprint('training', flush=True)\ntime.sleep(120)\n"}
    )
    notes: list[str] = []
    spec = with_workload(embedded_rig.spec(spot=True), work, tmp_path / "out", "python", "train.py")
    observer = _ReclaimWhenSaid(notes, embedded_rig.emulator.faults)
    life, _, error = embedded_rig.run(spec, observer)
    assert isinstance(error, TpuLabError), error
    assert exit_status_for(error) == EXIT_PREEMPTED, error
    assert not any("dropped while your command ran" in note for note in notes), notes
    assert life.outcome.teardown_status == "confirmed"
    assert embedded_rig.leftovers() == []


def test_second_ctrl_c_during_the_fetch_skips_it_not_the_teardown(rig: Rig, tmp_path: Path) -> None:
    life, out, error = _interrupted_run(rig, tmp_path, again_at_fetch=True)
    assert isinstance(error, InterruptedRun), error
    outcome = life.outcome  # type: ignore[attr-defined]
    assert outcome.workload.fetch is None
    assert outcome.workload.fetch_problem.startswith("skipped")
    assert not (out / "run").exists()
    assert outcome.teardown_status == "confirmed"
    assert rig.leftovers() == []


def test_a_receipt_that_does_not_verify_never_starts_the_command(rig: Rig, tmp_path: Path) -> None:
    from run_rig import payload_script

    # The real verifier, but with the device count forced to 1 on a 4-device accelerator:
    # an honest receipt of the wrong machine, which must not verify.
    one_device = payload_script(
        tmp_path,
        f"""
        import os, runpy, sys
        os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
        sys.argv[0] = {str(paths.payload_path())!r}
        runpy.run_path(sys.argv[0], run_name="__main__")
        """,
    )
    marker = tmp_path / "the-command-ran"
    work = workspace(tmp_path, {"touch.py": f"open({str(marker)!r}, 'w').write('ran')\n"})
    spec = with_workload(rig.spec(script=one_device), work, tmp_path / "out", "python", "touch.py")
    life, recorder, error = rig.run(spec)
    assert isinstance(error, VerificationError), error
    assert not marker.exists()  # on this machine's disk, where the "VM" would have written
    assert Phase.SYNC not in [p.phase for p in recorder.phases]
    record = read_run_record(tmp_path / "out" / "run.json")
    assert not record.ok
    assert not record.workload.started
    assert record.verdict is not None
    assert life.outcome.teardown_status == "confirmed"
    assert rig.leftovers() == []


def test_a_refused_fetch_says_why_in_the_summary_and_the_record(rig: Rig, tmp_path: Path) -> None:
    from tpulab.errors import RemoteError

    work = workspace(
        tmp_path,
        {"big.py": "import os\nopen(os.environ['TPULAB_RUN_DIR'] + '/big', 'w').write('x' * 5000)"},
    )
    out = tmp_path / "out"
    spec = with_workload(rig.spec(), work, out, "sh", "-c", "python big.py", max_fetch=1024)
    life, _, error = rig.run(spec)
    assert isinstance(error, RemoteError), error
    assert "over the 1.0 KiB fetch cap" in error.message
    workload = life.outcome.workload
    assert workload is not None
    assert workload.exit_status == 0
    assert workload.fetch_problem == error.message  # once None: "NOT fetched: not fetched"
    text = "\n".join(
        "".join(part for part, _ in line)
        for line in summary_lines(life.outcome, laptop_jax=lambda: None)
    )
    assert f"NOT fetched: {error.message}" in text
    assert "sh -c 'python big.py'" in text  # the command as typed (once: sh -c python big.py)
    assert read_run_record(out / "run.json").workload.fetch_problem == error.message
    assert rig.leftovers() == []
