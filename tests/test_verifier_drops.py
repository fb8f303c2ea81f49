"""A network that drops under the verifier's steps: each is made again over a new
connection, and the run verifies instead of ending (and deleting the VM it waited for).

The real lifecycle against the emulator over both SSH servers; the drop is a real cut
of the connection's TCP stream (tests/cut_connection.py) at a chosen step. Each test
ends by checking the emulator for leftovers.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from cut_connection import CutConnection, SteppedClock
from helpers import process_running, require_tool, wait_until

from tpulab import paths
from tpulab.errors import ConnectError
from tpulab.remote import bootstrap as boot
from tpulab.remote.keys import RunKey, SshTarget
from tpulab.remote.payload import stop_payload_command, stopped_payloads
from tpulab.remote.ssh import RunResult
from tpulab.run.progress import NullObserver

if TYPE_CHECKING:
    from run_rig import Rig

pytest_plugins = ["emulator_fixtures", "ssh_fixtures", "run_rig"]


class _Notes(NullObserver):
    def __init__(self) -> None:
        self.notes: list[str] = []

    def note(self, message: str) -> None:
        self.notes.append(message)


class _DropsAt(CutConnection):
    """Cut in the middle of a step, as often as `cuts` says: once the bootstrap's venv
    step has printed its first line, or the payload its first; as the payload's upload
    has begun (its folder looked for), or the receipt's download (its sha256 taken on
    the VM). A connection cut between two commands would only be opened again by the
    next: these cut one in flight, which the step sees fail."""

    def __init__(self, target: SshTarget, key: RunKey, cuts: dict[str, int]) -> None:
        super().__init__(target, key)
        self.cuts = dict(cuts)  # step -> cuts still to make in it
        self._in: str | None = None

    def _cut(self, step: str) -> None:
        if self.cuts.get(step, 0) > 0:
            self.cuts[step] -= 1
            self.cut_now()

    def run(self, argv: Sequence[str] | str, **kwargs: Any) -> RunResult:
        shown = kwargs.get("on_line")
        step = None
        if list(argv[:3]) == boot.venv_command()[:3]:  # sh -c <the venv step's script>
            step = "bootstrap"
        elif boot.STAGED_PAYLOAD in argv:
            step = "execute"
        if step is None or shown is None:
            return super().run(argv, **kwargs)

        def on_line(stream: str, line: str) -> None:
            shown(stream, line)
            self._cut(step)

        return super().run(argv, **{**kwargs, "on_line": on_line})

    def put(self, local: Path | bytes, remote: str) -> str:
        self._in = "stage" if remote == boot.STAGED_PAYLOAD else None
        return super().put(local, remote)

    def _makedirs(self, sftp: Any, directory: str) -> None:
        if self._in is not None:
            self._cut(self._in)
        super()._makedirs(sftp, directory)

    def read(self, remote: str, *, max_bytes: int) -> bytes:
        self._in = "collect" if remote == boot.RECEIPT_PATH else None
        return super().read(remote, max_bytes=max_bytes)

    def _remote_sha256(self, path: str) -> str:
        digest = super()._remote_sha256(path)
        if self._in == "collect":
            self._cut("collect")
        return digest


_NAMED = {
    "bootstrap": "bootstrap",
    "stage": "staging",
    "execute": "verifier's run",
    "collect": "receipt's fetch",
}


def test_a_drop_during_each_verifier_step_makes_it_again_and_the_run_verifies(rig: Rig) -> None:
    # One run, cut once in each step (one run per step cost four runs per SSH server):
    # each step's retry is still needed alone, as a step not made again ends the run.
    made: list[_DropsAt] = []

    def connect(target: SshTarget, key: RunKey) -> _DropsAt:
        made.append(_DropsAt(target, key, dict.fromkeys(_NAMED, 1)))
        return made[-1]

    heard = _Notes()
    life, _, error = rig.run(rig.spec(), heard, connect=connect)
    assert error is None, error
    (connection,) = made
    assert connection.cuts == dict.fromkeys(_NAMED, 0)  # each was cut
    assert connection.connects == 1 + len(_NAMED)  # the run's, and one after each drop
    for name in _NAMED.values():
        said = f"the SSH connection dropped during the {name}"
        assert any(n.startswith(said) for n in heard.notes), (name, heard.notes)
    assert life.outcome.verified
    assert life.outcome.teardown_status == "confirmed"
    assert rig.leftovers() == []


def test_a_second_drop_ends_the_run_as_before(rig: Rig) -> None:
    made: list[_DropsAt] = []

    def connect(target: SshTarget, key: RunKey) -> _DropsAt:
        made.append(_DropsAt(target, key, {"collect": 2}))
        return made[-1]

    life, _, error = rig.run(rig.spec(), connect=connect)
    # The link, named as such: not a payload that "wrote no receipt".
    assert isinstance(error, ConnectError), error
    # Not "the VM may have been preempted": GetNode showed it up after each drop.
    assert "receipt.json" in error.message  # what the step was doing when it dropped
    assert error.hint is not None
    assert "GetNode shows the node up: the network" in error.hint, error.hint
    assert made[0].cuts == {"collect": 0}
    assert not life.outcome.verified
    assert life.outcome.teardown_status == "confirmed"
    assert rig.leftovers() == []


class _DownAfterTheCut(_DropsAt):
    """Cut like `_DropsAt`, and then down until the run's own thread has had `tries`
    connects refused, each moving the run's clock `step` seconds on (a reconnect that
    waited out its bound for nothing). The lease renewer's tries meanwhile are refused
    too, but neither counted nor moving the clock: the outage is the run's to measure."""

    def __init__(
        self, target: SshTarget, key: RunKey, cuts: dict[str, int], clock: SteppedClock,
        tries: int, step: float,
    ) -> None:  # fmt: skip
        super().__init__(target, key, cuts)
        self.clock, self.tries, self.step = clock, tries, step
        self.was_cut = False
        self.refused = 0

    def cut_now(self) -> None:
        self.was_cut = True
        super().cut_now()

    def open(self) -> None:
        if self._client is None and self.was_cut and self.refused < self.tries:
            if threading.current_thread() is threading.main_thread():
                self.refused += 1
                self.clock.skipped += self.step
            raise ConnectError("[Errno 113] No route to host (the test's outage)")
        super().open()


def test_a_link_down_longer_than_a_connects_bound_is_waited_for(rig: Rig) -> None:
    """The link drops under the verifier's run and stays down for three refused
    reconnects a minute apart by the run's clock: far past one connect's 20 s, inside
    the 10-minute lease, so the VM still has the run. The step is made again once the
    link is back, and the run verifies (it used to end at the first refused connect)."""
    clock = SteppedClock()
    made: list[_DownAfterTheCut] = []

    def connect(target: SshTarget, key: RunKey) -> _DownAfterTheCut:
        made.append(_DownAfterTheCut(target, key, {"execute": 1}, clock, tries=3, step=60.0))
        return made[-1]

    heard = _Notes()
    life, _, error = rig.run(rig.spec(), heard, connect=connect, clock=clock)
    assert error is None, error
    (connection,) = made
    assert connection.refused == 3
    assert connection.connects == 2  # the run's, and one once the link was back
    still = [n for n in heard.notes if n.startswith("still reconnecting to the VM")]
    assert still, heard.notes
    assert "until its lease may have lapsed and it deletes itself" in still[0]
    # Said when the link is back (three refused minutes by the run's clock).
    back = [n for n in heard.notes if n.startswith("reconnected to the VM after ")]
    assert len(back) == 1, heard.notes
    assert back[0].endswith("s; making the verifier's run again"), back
    assert int(back[0].split(" after ")[1].split(" s")[0]) >= 180, back
    assert life.outcome.verified
    assert life.outcome.teardown_status == "confirmed"
    assert rig.leftovers() == []


class _SharedCuts(_DropsAt):
    """A slice's connections sharing one count of cuts: the first worker to reach the
    step has its connection cut, whichever it is."""

    lock = threading.Lock()

    def __init__(self, target: SshTarget, key: RunKey, cuts: dict[str, int]) -> None:
        super().__init__(target, key, {})
        self.cuts = cuts  # the same dict for every worker's connection

    def _cut(self, step: str) -> None:
        with self.lock:
            super()._cut(step)


def test_a_drop_under_a_slices_verifier_run_runs_it_again_on_every_worker(
    rig: Rig, tmp_path: Path
) -> None:
    # A slice's payloads are one jax.distributed program: the worker whose connection
    # dropped cannot rejoin it, so every worker's payload is stopped and all run again.
    # Each worker's first payload prints a line and then holds on silently (as one
    # waiting for a lost peer does): only the stop ends the first try.
    from run_rig import payload_script

    script = payload_script(
        tmp_path,
        f"""
        import os, pathlib, runpy, sys, time
        worker = sys.argv[sys.argv.index("--process-id") + 1]
        first = pathlib.Path({str(tmp_path)!r}) / f"first-payload-{{worker}}.pid"
        if not first.exists():
            first.write_text(str(os.getpid()))
            print("compiling", flush=True)
            time.sleep(300)
        runpy.run_path({str(paths.payload_path())!r}, run_name="__main__")
        """,
    )
    cuts = {"execute": 1}
    made: list[_SharedCuts] = []

    def connect(target: SshTarget, key: RunKey) -> _SharedCuts:
        made.append(_SharedCuts(target, key, cuts))
        return made[-1]

    heard = _Notes()
    life, _, error = rig.run(rig.spec("v5litepod-16", script=script), heard, connect=connect)
    assert error is None, error
    assert cuts == {"execute": 0}
    hosts = len(life.workers)
    assert hosts == 4
    assert len(made) == hosts
    # Each worker's connection once, and the cut one once more.
    assert sorted(c.connects for c in made) == [1] * (hosts - 1) + [2]
    (cut,) = [c for c in made if c.connects == 2]
    (dropped,) = [w.index for w in life.workers if w.target == cut.target]
    # The note names the worker whose connection dropped.
    said = (
        f"the SSH connection to worker {dropped} dropped during the verifier's run; "
        "a slice's payloads"
    )
    assert sum(n.startswith(said) for n in heard.notes) == 1, heard.notes
    # Every first payload was stopped (emulated workers share one machine, so one
    # worker's stop may name another's: the stop goes by the run's nonce).
    firsts = {int(path.read_text()) for path in tmp_path.glob("first-payload-*.pid")}
    assert len(firsts) == hosts
    stopped = {
        int(pid)
        for note in heard.notes
        if note.startswith("stopped the earlier run on worker ")
        for pid in note.split("(pid ")[1].rstrip(")").split(", ")
    }
    assert stopped == firsts, heard.notes
    assert not any(process_running(pid) for pid in firsts)
    assert life.outcome.verified
    assert all(worker.payload_exit == 0 for worker in life.workers)
    assert life.outcome.teardown_status == "confirmed"
    assert rig.leftovers() == []


def _holds_on_then_verifies(directory: Path, pid_file: Path) -> Path:
    """A payload whose first run prints a line, then stays (writing nothing more, so no
    broken pipe ends it), as a payload compiling on a TPU does; the next run is the real
    verifier (emulated nodes share this file system)."""
    from run_rig import payload_script

    return payload_script(
        directory,
        f"""
        import os, pathlib, runpy, time
        first = pathlib.Path({str(pid_file)!r})
        if not first.exists():
            first.write_text(str(os.getpid()))
            print("compiling", flush=True)
            time.sleep(300)
        runpy.run_path({str(paths.payload_path())!r}, run_name="__main__")
        """,
    )


def test_the_payload_a_drop_left_running_is_stopped_before_the_next(
    rig: Rig, tmp_path: Path
) -> None:
    pid_file = tmp_path / "first-payload.pid"
    script = _holds_on_then_verifies(tmp_path, pid_file)
    made: list[_DropsAt] = []

    def connect(target: SshTarget, key: RunKey) -> _DropsAt:
        made.append(_DropsAt(target, key, {"execute": 1}))
        return made[-1]

    heard = _Notes()
    life, _, error = rig.run(rig.spec(script=script), heard, connect=connect)
    assert error is None, error
    first = int(pid_file.read_text())
    assert f"stopped the earlier run on the VM (pid {first})" in heard.notes, heard.notes
    assert not process_running(first)
    assert life.outcome.verified
    assert life.outcome.teardown_status == "confirmed"
    assert rig.leftovers() == []


@pytest.mark.parametrize("version", ["3", "3.10"], ids=["python3", "python3.10"])
def test_the_payload_stop_kills_only_the_run_with_its_nonce(version: str) -> None:
    """Run as the VM runs it: by the image's python3 (3.10 on TPU VM images)."""
    from helpers import require_python

    python = require_python(version)
    sleep = "import time; time.sleep(120)"

    def start(*args: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, "-c", sleep, *args])

    ours = start("--platform", "cpu", "--nonce", "nonce-of-this-run")
    others = [
        start("--nonce", "nonce-of-another-run"),
        start("nonce-of-this-run"),  # the nonce, not after --nonce
    ]
    try:
        done = subprocess.run(
            [python, *stop_payload_command("nonce-of-this-run", wait_seconds=10)[1:]],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert stopped_payloads(done.stdout) == [ours.pid]
        assert ours.wait(timeout=10) == -9
        time.sleep(0.2)  # a wrong kill would have landed by now: the two are still there
        assert [other.poll() for other in others] == [None, None]
        again = subprocess.run(
            [python, *stop_payload_command("nonce-of-this-run")[1:]],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert stopped_payloads(again.stdout) == []
    finally:
        for process in [ours, *others]:
            process.kill()
            process.wait()


def test_a_venv_step_waits_for_the_one_a_drop_left_running(tmp_path: Path) -> None:
    """The bootstrap's lock (`_ONE_AT_A_TIME`, at the head of the venv, install and
    extras scripts): a second step blocks until the first is done, as dash runs it."""
    require_tool(shutil.which("dash") is not None, "dash")
    log, release = tmp_path / "log", tmp_path / "release"
    lock = boot._ONE_AT_A_TIME
    first = subprocess.Popen(
        ["dash", "-c", lock + f"echo first-in >> {log}\n"
         f"while [ ! -e {release} ]; do sleep 0.05; done\necho first-out >> {log}\n"],
        cwd=tmp_path,
    )  # fmt: skip
    second: subprocess.Popen[bytes] | None = None
    try:
        wait_until(lambda: log.exists() and "first-in" in log.read_text(), "the first in")
        second = subprocess.Popen(["dash", "-c", lock + f"echo second-in >> {log}\n"], cwd=tmp_path)
        # The handshake: the second's flock is waiting (a child of it), so it is at the lock.
        wait_until(lambda: _waiting_flock(second.pid), "the second waiting in flock")
        assert log.read_text().split() == ["first-in"]
        release.touch()
        assert first.wait(timeout=30) == 0
        assert second.wait(timeout=30) == 0
    finally:
        _end_all(first, second)
    assert log.read_text().split() == ["first-in", "first-out", "second-in"]


def test_the_uv_step_waits_for_a_step_a_drop_left_running(tmp_path: Path) -> None:
    """uv's own install (`pip install --user uv`, into ~/.local) takes the bootstrap's
    lock too: the real script, under dash, waits while another step holds it."""
    require_tool(shutil.which("dash") is not None, "dash")
    bin_dir, release = tmp_path / "bin", tmp_path / "release"
    bin_dir.mkdir()
    (bin_dir / "uv").write_text("#!/bin/sh\necho uv 0.0.0\n")
    (bin_dir / "uv").chmod(0o755)
    env = {"HOME": str(tmp_path), "PATH": f"{bin_dir}:/usr/bin:/bin"}
    holding = tmp_path / "holding"
    holder = subprocess.Popen(
        ["dash", "-c", boot._ONE_AT_A_TIME + f"touch {holding}\n"
         f"while [ ! -e {release} ]; do sleep 0.05; done\n"],
        cwd=tmp_path,
    )  # fmt: skip
    uv_step: subprocess.Popen[str] | None = None
    try:
        wait_until(holding.exists, "the holder holding the lock")
        uv_step = subprocess.Popen(
            boot.uv_command(), cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True
        )
        step = uv_step
        wait_until(lambda: _waiting_flock(step.pid) or step.poll() is not None, "the uv step")
        assert uv_step.poll() is None, "the uv step ran while another step held the lock"
        release.touch()
        out, _ = uv_step.communicate(timeout=30)
        assert uv_step.returncode == 0
        assert out.strip() == f"TPULAB_UV found {bin_dir / 'uv'}"
        assert holder.wait(timeout=30) == 0
    finally:
        _end_all(holder, uv_step)


def _end_all(*processes: subprocess.Popen[Any] | None) -> None:
    """Kill whichever of a test's processes still runs (a failed test's)."""
    for process in processes:
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()


def _waiting_flock(parent: int) -> bool:
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            name, _, rest = stat.read_text().partition(") ")
        except OSError:
            continue
        if name.endswith("(flock") and int(rest.split()[1]) == parent:
            return True
    return False
