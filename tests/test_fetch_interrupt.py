"""Signals during "Fetch artifacts": the artifacts of a finished command are never
dropped by one signal, and a fetch cut short keeps every file that fully arrived.

The real lifecycle against the emulator (embedded SSH host), with real signals to this
process through `signals_to_teardown` and `skippable`, as the CLI wires them. The
signals are sent from inside the fetch's own stream, by a real `Connection` whose
`run_streaming` counts the bytes of the `pack` stream as they arrive (injected through
the lifecycle's `connect` seam): each signal lands at a known byte of the fetch, however
fast or loaded the machine is.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import signal
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, cast

import pytest

from tpulab.config import RunSpec
from tpulab.config.workload import WorkloadSpec
from tpulab.errors import InterruptedRun
from tpulab.remote.keys import RunKey, SshTarget
from tpulab.remote.ssh import Connection, RunResult
from tpulab.run.record import read_run_record
from tpulab.run.signals import shield, signals_to_teardown, skippable

if TYPE_CHECKING:
    from run_rig import Rig

pytest_plugins = ["emulator_fixtures", "ssh_fixtures", "run_rig"]
pytestmark = pytest.mark.slow

MiB = 2**20

# Writes files of pseudo-random bytes into the run dir, then prints the sha256 of each,
# computed ON the VM: what the fetched copies must match. Sizes in MiB on the argv.
WRITE = textwrap.dedent(
    """
    import hashlib, os, random, sys
    root = os.environ["TPULAB_RUN_DIR"]
    for spec in sys.argv[1:]:
        name, mib = spec.split("=")
        data = random.Random(name).randbytes(int(mib) * 2**20)
        with open(os.path.join(root, name), "wb") as out:
            out.write(data)
        print("SHA", name, hashlib.sha256(data).hexdigest(), flush=True)
    """
)


class _Signalling:
    """A `pack` stream's writer that sends SIGINT to this process as byte thresholds pass."""

    def __init__(self, sink: BinaryIO, at: Sequence[int], fired: list[int]) -> None:
        self.sink = sink
        self.at = list(at)
        self.fired = fired
        self.size = 0

    def write(self, data: bytes) -> int:
        written = self.sink.write(data)
        self.size += len(data)
        while self.at and self.size >= self.at[0]:
            self.at.pop(0)
            self.fired.append(self.size)
            os.kill(os.getpid(), signal.SIGINT)  # handled right here, in the main thread
        return written


class SignallingConnection(Connection):
    """The real Connection; its artifact fetch sends SIGINT at the given stream bytes."""

    def __init__(self, target: SshTarget, key: RunKey, at: Sequence[int]) -> None:
        super().__init__(target, key, connect_timeout=15)
        self.at = at
        self.fired: list[int] = []  # the stream's size when each signal was sent
        self.streamed = 0  # the fetch stream's size at its end

    def run_streaming(
        self,
        argv: Sequence[str],
        *,
        stdin: BinaryIO | Iterable[bytes] | None,
        stdout: BinaryIO | None,
        timeout: float,
        env: Mapping[str, str] | None = None,
    ) -> RunResult:
        if "pack" not in argv or stdout is None:
            return super().run_streaming(argv, stdin=stdin, stdout=stdout, timeout=timeout, env=env)
        counting = cast(
            BinaryIO, _Signalling(stdout, self.at, self.fired)
        )  # write() is all it uses
        try:
            return super().run_streaming(
                argv, stdin=stdin, stdout=counting, timeout=timeout, env=env
            )
        finally:
            self.streamed = cast(_Signalling, counting).size


def _spec(rig: Rig, tmp_path: Path, files: dict[str, int]) -> RunSpec:
    work = tmp_path / "work"
    work.mkdir()
    (work / "write.py").write_text(WRITE)
    command = ("python", "write.py", *(f"{name}={mib}" for name, mib in files.items()))
    workload = WorkloadSpec(
        command=command,
        workdir=work,
        out=tmp_path / "out",
        env=(),
        with_packages=(),
        requirements=None,
        fetch=(),
        exclude=(),
        allow_secrets=(),
    )
    return dataclasses.replace(rig.spec(), workload=workload)


def _run(
    rig: Rig, spec: RunSpec, at: Sequence[int]
) -> tuple[object, object, SignallingConnection, list[str], BaseException | None]:
    sessions: list[SignallingConnection] = []

    def connect(target: SshTarget, key: RunKey) -> SignallingConnection:
        sessions.append(SignallingConnection(target, key, at))
        return sessions[-1]

    notes: list[str] = []
    life, recorder = rig.lifecycle(spec, connect=connect, shield=shield, skippable=skippable)
    error: BaseException | None = None
    try:
        with signals_to_teardown(notes.append, force_exit_status=6):
            life.run()
    except BaseException as raised:  # the test inspects what came out
        error = raised
    (session,) = sessions
    return life, recorder, session, notes, error


def _on_vm(recorder: object) -> dict[str, str]:
    """name -> sha256, as the command computed them on the VM."""
    lines = [line for _stream, line in recorder.output]  # type: ignore[attr-defined]
    return {p[1]: p[2] for p in (line.split() for line in lines) if p[:1] == ["SHA"]}


def _sha(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(MiB):
            digest.update(chunk)
    return digest.hexdigest()


def test_one_ctrl_c_during_the_fetch_lets_it_finish_every_byte(rig: Rig, tmp_path: Path) -> None:
    files = {"a.bin": 4, "big.bin": 48}
    spec = _spec(rig, tmp_path, files)
    # One SIGINT once 2 MiB of the 52 MiB stream have arrived: mid-fetch, by construction.
    life, recorder, session, notes, error = _run(rig, spec, at=[2 * MiB])
    assert session.fired, "no signal was sent"
    assert session.fired[0] < session.streamed, (session.fired, session.streamed)
    # Everything in (the command had exited 0): a confirmed run, exit 0 as the exit table
    # (docs/reference/exit-status.md) says of a signal after the receipt verified.
    assert error is None, error
    assert any(
        "letting the fetch finish (at most 120 s); press Ctrl-C again to skip the fetch" in n
        for n in notes
    ), notes
    out = tmp_path / "out"
    on_vm = _on_vm(recorder)
    assert set(on_vm) == set(files)
    manifest = json.loads((out / "manifest.json").read_text())
    assert "complete" not in manifest
    listed = {entry["path"]: entry["sha256"] for entry in manifest["files"]}
    for name, digest in on_vm.items():
        assert _sha(out / "run" / name) == digest == listed[f"run/{name}"], name
    outcome = life.outcome  # type: ignore[attr-defined]
    assert outcome.workload.fetch is not None
    assert outcome.teardown_status == "confirmed"
    assert any("interrupted after the receipt verified" in n for n in recorder.notes)  # type: ignore[attr-defined]
    assert read_run_record(out / "run.json").workload.fetched_files == len(files) + 1  # + log
    assert rig.leftovers() == []


def test_a_second_ctrl_c_skips_the_fetch_and_keeps_the_files_that_arrived(
    rig: Rig, tmp_path: Path
) -> None:
    # Archive order: output.log, run/a.bin, run/b.bin, run/c.bin. The second SIGINT lands
    # inside c.bin, after b.bin's sha256 arrived in c.bin's header.
    spec = _spec(rig, tmp_path, {"a.bin": 4, "b.bin": 4, "c.bin": 32})
    life, recorder, session, notes, error = _run(rig, spec, at=[1 * MiB, 12 * MiB])
    assert len(session.fired) == 2, session.fired
    assert isinstance(error, InterruptedRun), error
    assert any("skipping the fetch" in n for n in notes), notes
    out = tmp_path / "out"
    on_vm = _on_vm(recorder)
    for name in ("a.bin", "b.bin"):
        assert _sha(out / "run" / name) == on_vm[name], name
    assert not (out / "run" / "c.bin").exists()  # cut: never left pretending to be whole
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] is False
    assert sorted(e["path"] for e in manifest["files"]) == ["output.log", "run/a.bin", "run/b.bin"]
    outcome = life.outcome  # type: ignore[attr-defined]
    assert outcome.workload.fetch is None
    assert outcome.workload.kept.count == 3
    assert outcome.workload.fetch_problem.startswith("skipped by SIGINT during the fetch; kept")
    record = read_run_record(out / "run.json")
    assert sorted(e.path for e in record.fetch) == ["output.log", "run/a.bin", "run/b.bin"]
    assert outcome.teardown_status == "confirmed"
    assert rig.leftovers() == []
