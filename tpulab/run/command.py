"""The user's command on every worker (the WORKLOAD phase of `tpulab run ... -- CMD`).

One argv through the staged launcher on each worker at once; worker 0's output streams
(every worker's with --all-output), each worker's is in its output.log. Fail-fast: the
first worker whose command fails, times out or cannot start stops the others, as
MaxText's multihost_runner and xpk's `backoffLimit: 0` do: a slice's program is one
program. Before the command, on a node this run made, a stale holder of the TPU is
killed (tpulab.remote.tpu_release). tpulab.run.workload runs the phases around it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from tpulab.errors import ConnectError, RemoteError
from tpulab.remote import workload as wl
from tpulab.run.dropped import reconnect
from tpulab.run.progress import COMMAND_STREAM, worker_command_stream
from tpulab.run.symptoms import unreachable
from tpulab.run.workers import Worker, fan_out, place

if TYPE_CHECKING:
    from tpulab.config.workload import WorkloadSpec
    from tpulab.remote.bootstrap import CommandResult
    from tpulab.run.context import RunContext

__all__ = ["CommandRun", "CommandStep", "launch", "stop_everywhere"]

_STOP_TIMEOUT = wl.STOP_GRACE_SECONDS + wl.LAUNCHER_SETTLE_SECONDS + 20.0
OUTPUT_TAIL_LINES = 40


def launch(
    life: RunContext, workload: WorkloadSpec, worker: int = 0
) -> tuple[list[str], dict[str, str], float]:
    """The launcher's argv, the command's environment and the SSH wrapper's limit: what
    the step sends (to each worker), and what validation measures."""
    spec = life.spec
    env = wl.workload_env(
        spec.platform,
        spec.accelerator.devices_per_host,
        spec.run_id,
        workload.env,
        worker=worker,
        workers=spec.accelerator.hosts,
        coordinator=life.coordinator,
    )
    argv = wl.launch_command(workload.command, timeout=workload.timeout)
    return argv, env, workload.timeout + wl.LAUNCH_SLACK_SECONDS


@dataclass(frozen=True)
class CommandRun:
    """How the command ended, once its launcher (worker 0's, or the first failing
    worker's) reported -- or, with `exit_status` alone, could not."""

    exit_status: int | None = None
    timed_out: bool = False
    seconds: float | None = None
    # A slice: each worker's exit status (None: timed out, stopped or never reported).
    worker_exits: tuple[int | None, ...] = ()


class CommandStep:
    """Runs the command. Its progress is readable however the phase ends: `started`,
    the output's `output_tail`, a slice's first `failed_worker`; its `result` once the
    command ended."""

    def __init__(self, life: RunContext, workload: WorkloadSpec) -> None:
        self.life = life
        self.workload = workload
        self.started = False
        self.output_tail: list[str] = []
        self.failed_worker: int | None = None
        self.result: CommandRun | None = None
        # Connections opened again to follow the command, by worker (each worker's
        # follow runs in its own thread and counts only its own).
        self._reconnects: dict[int, int] = {}

    def run(self) -> str:
        """The phase's detail; RemoteError when a launcher could not report."""
        life = self.life
        workers = life.workers
        self.started = True
        if len(workers) == 1:
            report = self._run_on(workers[0], self.output_tail)
            self.result = _ended(report)
            return self._said(report)
        tails: list[list[str]] = [[] for _ in workers]
        reports: list[wl.LaunchReport | None] = [None] * len(workers)

        def run(worker: Worker) -> wl.LaunchReport:
            report = reports[worker.index] = self._run_on(worker, tails[worker.index])
            if report.timed_out or not report.started or report.exit_status != 0:
                raise _WorkerCommandFailed(worker.index)
            return report

        try:
            done = life.on_workers(run, "workload")
        except _WorkerCommandFailed as failed:
            first = failed.worker
            self.failed_worker = first
            self.output_tail[:] = tails[first]
            stop_everywhere(life, others_than=first)
            failing = reports[first]
            assert failing is not None
            # After the stop: the others' reports (their stopped commands) are in by now.
            self.result = _ended(failing, tuple(_exit_of(r) for r in reports))
            return f"worker {first} of {len(workers)}: {self._said(failing)}; the others stopped"
        self.output_tail[:] = tails[0]
        slowest = max(r.seconds or 0.0 for r in done.results)
        self.result = _ended(done.results[0], tuple(_exit_of(r) for r in done.results), slowest)
        said = done.describe()
        detail = self._said(done.results[0])
        return f"{detail}; {said}" if said else detail

    def _run_on(self, worker: Worker, tail: list[str]) -> wl.LaunchReport:
        """The command on one worker through the launcher; its report (RemoteError when
        the launcher could not even report). Worker 0's lines go to the terminal."""
        life = self.life
        session = worker.session
        assert session is not None
        argv, env, ssh_timeout = launch(life, self.workload, worker.index)
        spec = life.spec.workload
        every_worker = spec is not None and spec.all_output and len(life.workers) > 1
        shown = worker.index == 0 or every_worker
        # --all-output: which worker said it, as SkyPilot's `(worker1, rank=1)` prefix does.
        command = worker_command_stream(worker.index) if every_worker else COMMAND_STREAM
        if life.frees_stale_tpu:
            self._free_tpu(worker)

        def on_line(stream: str, line: str) -> None:
            if stream == "stderr" and line.startswith(wl.WORKLOAD_MARKER):
                return  # the launcher's report, parsed below
            tail.append(line)
            del tail[:-OUTPUT_TAIL_LINES]
            if shown:
                life.observer.remote_output(command if stream == "stdout" else stream, line)

        launched = time.monotonic()
        try:
            result = session.run(argv, env=env, timeout=ssh_timeout, on_line=on_line)
        except ConnectError as dropped:
            limit = ssh_timeout - (time.monotonic() - launched)
            result = self._follow(worker, dropped, on_line, limit)
        report = wl.parse_launch_report(result.stderr)
        if report is None:
            # The launcher itself did not report (it could not start): say what it said.
            self.result = replace(self.result or CommandRun(), exit_status=result.exit_status)
            raise RemoteError(
                f"The workload launcher on the VM failed (exit {result.exit_status}) "
                "without reporting on your command.",
                hint="Its output: " + (result.stderr.strip()[-300:] or "(none)"),
            )
        if report.unstreamed_lines and shown:
            life.observer.note(
                f"{report.unstreamed_lines} lines of output were not streamed (this end "
                "fell behind; the command was not slowed): see output.log"
            )
        return report

    @property
    def reconnects(self) -> int:
        """How often a dropped connection was opened again to follow the command."""
        return sum(self._reconnects.values())

    def _follow(
        self,
        worker: Worker,
        dropped: ConnectError,
        on_line: Callable[[str, str], None],
        limit: float,
    ) -> CommandResult:
        """The connection dropped while the command ran, which runs on, on the VM:
        reconnect and follow it to its end (the launcher's --follow: the log's new bytes,
        then its result). `dropped` is raised again when the launch never began; a
        ConnectError when no connection comes back while the VM keeps the command
        (tpulab.run.dropped.reconnect)."""
        life = self.life
        session = worker.session
        assert session is not None
        where = place(worker, len(life.workers))
        if unreachable(life):
            raise dropped  # preempted or deleted: no reconnect can follow it
        life.observer.note(
            f"the SSH connection to {where} dropped while your command ran; it runs on "
            "there: reconnecting to follow it"
        )
        up_at = life.clock()
        followed_from = time.monotonic()  # the command's limit runs on real time
        heard: list[str] = []

        def follow_line(stream: str, line: str) -> None:
            heard.append(line)
            on_line(stream, line)

        while True:
            reconnect(life, worker, up_at=up_at, lost="while your command ran")
            self._reconnects[worker.index] = self._reconnects.get(worker.index, 0) + 1
            life.observer.note(
                f"reconnected to {where}; following your command (what it wrote while "
                "the connection was down is in its output.log)"
            )
            try:
                result = session.run(
                    wl.follow_command(life.spec.run_id),
                    timeout=max(limit - (time.monotonic() - followed_from), 60.0),
                    on_line=follow_line,
                )
            except ConnectError:
                if heard:  # the link was up while the follow streamed: count from now
                    up_at = life.clock()
                    heard[:] = []
                continue
            failure = wl.follow_failure(result.stderr)
            if failure == "not-started":
                raise dropped  # nothing of this launch runs: the phase ends as before
            if failure is not None:
                raise RemoteError(
                    f"The connection to {where} dropped while your command ran, and its "
                    f"launcher then ended without a result ({failure}).",
                    hint="Its output.log is fetched with the artifacts; the VM may have "
                    "run out of memory (dmesg on a session: `tpulab ssh S -- dmesg`).",
                )
            return result

    def _free_tpu(self, worker: Worker) -> None:
        """Kill what still holds the TPU and remove libtpu's lock file, as MaxText does
        before each launch (tpulab.remote.tpu_release), and say so when it did anything."""
        from tpulab.remote.tpu_release import parse_release_report, release_command

        assert worker.session is not None
        result = worker.session.run(release_command(), timeout=60)
        try:
            release = parse_release_report(result.stdout)
        except ValueError:
            self.life.observer.note(
                f"could not check for a stale TPU holder on worker {worker.index} "
                f"(exit {result.exit_status}); starting the command anyway"
            )
            return
        if release.anything:
            where = place(worker, len(self.life.workers))
            self.life.observer.note(
                f"freed the TPU on {where} before your command: {release.describe()}"
            )

    def _said(self, report: wl.LaunchReport) -> str:
        if not report.started:
            return f"could not start {self.workload.command[0]!r} (exit {report.exit_status})"
        if report.timed_out:
            return f"killed on the VM after its {self.workload.timeout:g} s --timeout"
        return f"exit {report.exit_status} after {report.seconds or 0:.1f} s"


def stop_everywhere(life: RunContext, others_than: int | None = None) -> None:
    """Stop the command on every worker (but `others_than`, whose command has ended), at
    once; each says what it stopped."""
    targets = [w for w in life.workers if w.index != others_than]

    def stop(worker: Worker) -> str:
        assert worker.session is not None
        result = worker.session.run(wl.stop_command(), timeout=_STOP_TIMEOUT)
        said = next(
            (line for line in result.stdout.splitlines() if line.startswith("TPULAB_STOP ")),
            "TPULAB_STOP (no answer)",
        )
        return said.removeprefix("TPULAB_STOP ")

    said = fan_out(targets, stop, what="stop", max_parallel=life.parallel_workers).results
    if len(life.workers) == 1:
        life.observer.note(f"your command was stopped on the VM ({said[0]})")
        return
    for worker, answer in zip(targets, said, strict=True):
        life.observer.note(f"your command was stopped on worker {worker.index} ({answer})")


class _WorkerCommandFailed(Exception):
    """A slice worker's command failed: ends the fan-out at once (fail-fast)."""

    def __init__(self, worker: int) -> None:
        super().__init__(f"worker {worker}'s command failed")
        self.worker = worker


def _ended(
    report: wl.LaunchReport,
    worker_exits: tuple[int | None, ...] = (),
    seconds: float | None = None,
) -> CommandRun:
    """The command's end as `report` says it: no exit status after a timeout (the
    launcher killed it), but the launcher's own for a command that could not start."""
    killed = report.timed_out and report.started
    return CommandRun(
        exit_status=None if killed else report.exit_status,
        timed_out=report.timed_out,
        seconds=report.seconds if seconds is None else seconds,
        worker_exits=worker_exits,
    )


def _exit_of(report: wl.LaunchReport | None) -> int | None:
    if report is None or report.timed_out:
        return None
    return report.exit_status
