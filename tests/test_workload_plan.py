"""`tpulab run --dry-run ... -- CMD` is the run: the plan lists the upload (files and
bytes), the installs, the command's argv and the fetch, because they go through the same
recording seams -- and it equals what an emulated run of the same spec sends.

The real run is recorded at the wire as in tests/test_plan_is_the_run.py (the emulator's
request log, and a tracing `Connection` through the `connect` seam), with the streamed
transfers traced too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from test_plan_is_the_run import (
    Event,
    PhaseMarks,
    TracingConnection,
    _budgets_within,
    _fold_transfers,
    _normalise,
    _plan_events,
    _wire_by_phase,
)

from tpulab.app.doctor import preflight_for
from tpulab.config import TargetFlags
from tpulab.config.workload import WorkloadSpec
from tpulab.remote.cmdline import remote_command
from tpulab.remote.keys import RunKey, SshTarget
from tpulab.remote.ssh import RunResult
from tpulab.remote.tpu_release import release_command
from tpulab.remote.workload import STAGED_LAUNCHER, WORKSPACE_DIR
from tpulab.run.plan import build_plan
from tpulab.run.plan_steps import (
    PLACEHOLDER_NODE_IP,
    PLACEHOLDER_NONCE,
    PLACEHOLDER_PUBLIC_KEY,
    PLACEHOLDER_REMOTE_HOME,
    PLACEHOLDER_SSH_PORT,
)
from tpulab.run.progress import Phase
from tpulab.run.record import RUN_RECORD_NAME, read_run_record

if TYPE_CHECKING:
    from run_rig import Rig

pytest_plugins = ["emulator_fixtures", "ssh_fixtures", "run_rig"]


class StreamingTracer(TracingConnection):
    def run_streaming(
        self,
        argv: Sequence[str],
        *,
        stdin: BinaryIO | Iterable[bytes] | None,
        stdout: BinaryIO | None,
        timeout: float,
        env: Mapping[str, str] | None = None,
    ) -> RunResult:
        command = remote_command(argv, env=env, timeout=timeout)
        self.events.append((self.phase(), "exec", command))
        return super().run_streaming(argv, stdin=stdin, stdout=stdout, timeout=timeout, env=env)


def _workload(tmp_path: Path, **fields: Any) -> WorkloadSpec:
    work = tmp_path / "work"
    (work / "data").mkdir(parents=True)
    (work / "job.py").write_text(
        "import os\nopen(os.path.join(os.environ['TPULAB_RUN_DIR'], 'r.txt'), 'w').write('1')\n"
    )
    (work / "data" / "table.csv").write_text("a,b\n1,2\n")
    return WorkloadSpec(
        command=("python", "job.py", "--flag", "two words"),
        workdir=work,
        out=tmp_path / "out",
        env=(("MY_SETTING", "x y"),),
        with_packages=fields.pop("with_packages", ()),
        requirements=None,
        fetch=("data/*.csv",),
        exclude=(),
        allow_secrets=(),
        timeout=120.0,
        **fields,
    )


def test_dry_run_of_a_command_sends_what_an_emulated_run_sends(
    embedded_rig: Rig, tmp_path: Path
) -> None:
    rig = embedded_rig
    spec = dataclasses.replace(rig.spec("v5litepod-1"), workload=_workload(tmp_path))
    marks = PhaseMarks(rig.emulator)
    events: list[Event] = []
    sessions: list[StreamingTracer] = []

    def connect(target: SshTarget, key: RunKey) -> StreamingTracer:
        session = StreamingTracer(target, key, events=events, phase=lambda: marks.phase)
        sessions.append(session)
        return session

    # The project's preflight as `tpulab run` asks it (app.doctor.preflight_for).
    preflight = preflight_for(spec, rig.emulator.url)
    life, recorder, error = rig.run(spec, marks, connect=connect, preflight=preflight)
    assert error is None, error
    assert life.outcome.succeeded
    assert (tmp_path / "out" / "run" / "r.txt").read_text() == "1"
    # A fresh VM holds nothing: the sync sent every file, and says so; run.json keeps
    # the whole manifest and what was sent (here the same).
    (sync,) = (p for p in recorder.phases if p.phase is Phase.SYNC)
    assert sync.detail.startswith("2 of 2 files sent (")
    assert sync.detail.endswith(f"); 0 unchanged into ~/{WORKSPACE_DIR}")
    record = read_run_record(tmp_path / "out" / RUN_RECORD_NAME)
    assert [entry.path for entry in record.upload] == ["data/table.csv", "job.py"]
    assert record.upload_sent == record.upload
    assert (record.workload.upload_sent_files, record.workload.upload_unchanged) == (2, 0)
    assert record.workload.upload_removed == 0
    assert record.workload.upload_wire_bytes is not None
    assert record.workload.upload_wire_bytes > record.workload.upload_bytes
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
    real_ssh = _normalise(_fold_transfers(events), replacements)

    steps = build_plan(spec)
    plan_api, plan_ssh = (_normalise(x, {}) for x in _plan_events(steps))
    assert real_api == plan_api
    _budgets_within(real_ssh, plan_ssh, slack=spec.timeouts.bootstrap / 2)
    assert real_ssh == plan_ssh
    phases = {event[0] for event in plan_api + plan_ssh}
    assert {"sync", "workload", "fetch", "teardown"} <= phases

    # What the plan says about them, in words a user reads.
    # The sync asks the VM for its manifest first (one command, through the seam the run
    # uses too, so the equality above covers it), then streams what the VM lacks: on a
    # fresh VM, everything.
    listing, upload = (s for s in steps if s.phase == "sync" and s.detail)
    assert listing.argv is not None
    assert listing.argv[3:] == ["manifest", WORKSPACE_DIR]
    assert upload.argv is not None
    assert upload.argv[3:] == ["unpack", WORKSPACE_DIR]
    assert upload.detail is not None
    assert "streams 2 files" in upload.detail
    assert "job.py" in upload.detail
    assert "data/table.csv" in upload.detail
    workload_steps = [s for s in steps if s.phase == "workload" and s.argv]
    # First the stale-TPU release (a node this run made: nothing of the user's on it),
    # then the command through the staged launcher.
    release, command = workload_steps
    assert release.argv == release_command()
    assert command.argv is not None
    assert command.argv[1].endswith(STAGED_LAUNCHER)
    assert command.argv[command.argv.index("--") + 1 :] == list(spec.workload.command)  # type: ignore[union-attr]
    assert command.env is not None
    assert command.env["MY_SETTING"] == "x y"
    assert command.env["COURSE_EXPECT_PLATFORM"] == "cpu"
    assert any(s.remote_path and s.remote_path.endswith(STAGED_LAUNCHER) for s in steps)
    fetch = next(s for s in steps if s.phase == "fetch")
    assert fetch.argv is not None
    assert "data/*.csv" in fetch.argv
    assert [s.phase for s in steps][-1] != "workload"  # the teardown follows the plan's end


def test_dry_run_lists_the_extra_packages_install(tmp_path: Path, tpulab_home: Path) -> None:
    from tpulab.config import build_run_spec

    base = build_run_spec(
        target=TargetFlags(
            accelerator="v5litepod-4", emulate=True, project="p", zone="us-central1-a"
        ),
        env={},
    )
    workload = _workload(tmp_path, with_packages=("optax>=0.2", "flax"))
    steps = build_plan(dataclasses.replace(base, workload=workload))
    # A plan writes nothing locally: no run.json (it says where, instead), not even an
    # empty --out, and no staging directory beside it.
    assert not workload.out.exists()
    assert [p.name for p in workload.out.parent.iterdir() if p.name.startswith(".tpulab-")] == []
    assert any(s.kind == "local" and "run.json" in s.action for s in steps)
    install = [s for s in steps if s.phase == Phase.INSTALL.value and s.argv]
    assert install, [s.phase for s in steps]
    assert install[0].argv[-2:] == ["optax>=0.2", "flax"]  # type: ignore[index]
    # The probe that records their versions comes next, by distribution name.
    assert install[1].argv[-2:] == ["optax", "flax"]  # type: ignore[index]
