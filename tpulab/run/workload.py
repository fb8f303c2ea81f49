"""The user's experiment (`tpulab run ... -- CMD`): the phases after the verifier.

    validate (+ the upload's selection, before anything is created)
    ... verify (the receipt must verify, or none of this runs: DESIGN §3.9)
    -> sync (launcher + workspace as one archive) -> install (--with / --requirements)
    -> workload (the command, streamed, logged on the VM, bounded by --timeout)
    -> fetch (run dir + log + --fetch patterns into --out)     then the usual teardown

The fetch happens whatever the command did: success, a non-zero exit, a timeout (the
launcher killed its process group on the VM). A first Ctrl-C or SIGTERM while the command
runs stops it on the VM and gives the fetch a bounded time, inside `skippable`, so a
second one skips the fetch and goes straight to the teardown, which keeps every
guarantee it has (it runs in the lifecycle's `finally`, shielded). A first one during
the fetch of a command that had ended lets that fetch finish (at most
INTERRUPTED_FETCH_SECONDS more; `skippable(..., finish_within=)`), and a second one skips
it. A fetch cut short keeps the files that fully arrived (tpulab.remote.workspace).

`WorkloadRunner` runs its phases through the run's context (`RunContext.phase`,
tpulab.run.context), so journal and observer see these phases like any other, and
`--dry-run` records every command and transfer through the same seams.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Protocol

from tpulab import paths
from tpulab.errors import (
    ConfigError,
    InterruptedRun,
    RemoteError,
    TpuLabError,
    WorkloadFailedError,
)
from tpulab.remote import bootstrap as boot
from tpulab.remote import workload as wl
from tpulab.run.progress import COMMAND_STREAM, Phase

if TYPE_CHECKING:
    from tpulab.config.requirements import RequirementsFile
    from tpulab.config.workload import WorkloadSpec
    from tpulab.remote.workspace import Manifest, UploadResult, UploadSelection
    from tpulab.run.context import RunContext

__all__ = ["WorkloadOutcome", "WorkloadRunner", "extras_for"]

# After a Ctrl-C the fetch is a courtesy before the teardown: bounded, not the full cap.
INTERRUPTED_FETCH_SECONDS = 120.0
_STOP_TIMEOUT = wl.STOP_GRACE_SECONDS + wl.LAUNCHER_SETTLE_SECONDS + 20.0
_OUTPUT_TAIL_LINES = 40
_FETCH_STEP = "the fetch"  # as the signal messages name it: "press Ctrl-C again to skip ..."


def _transfer_timeout(size: int) -> float:
    """Generous for a slow uplink (1 MiB/s) plus a fixed allowance for the VM's side."""
    return 120.0 + size / 2**20


@dataclass
class WorkloadOutcome:
    """What happened to the user's command, filled in as the phases go."""

    command: tuple[str, ...]
    env_names: tuple[str, ...]
    out: Path
    upload: UploadResult | None = None  # the workspace on the VM and what was sent
    upload_description: str = ""
    extras: boot.ExtrasResult | None = None
    started: bool = False
    exit_status: int | None = None
    timed_out: bool = False
    stopped: str | None = None  # why tpulab stopped it ("interrupted by SIGINT", ...)
    seconds: float | None = None
    fetch: Manifest | None = None
    fetch_problem: str | None = None  # why nothing (or not everything) came back
    kept: Manifest | None = None  # what a fetch cut short kept (files that fully arrived)
    output_tail: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (
            self.started
            and self.exit_status == 0
            and not self.timed_out
            and self.stopped is None
            and self.fetch is not None
        )


class WorkloadRunner:
    """The `-- CMD` phases of one run; `life` (the run's context) gives the session, the
    seams and `phase`."""

    def __init__(self, life: RunContext, workload: WorkloadSpec) -> None:
        self.life = life
        self.workload = workload
        self.selection: UploadSelection | None = None
        self.launcher = b""
        self.outcome = WorkloadOutcome(
            command=tuple(workload.command), env_names=workload.env_names, out=workload.out
        )

    @property
    def extras(self) -> boot.Extras:
        return extras_for(self.workload)

    # -- validation (inside the lifecycle's VALIDATE phase; nothing is sent) ------------

    def validate(self) -> str:
        """Select the upload (WorkspaceError for over the cap or a secret-looking file),
        check the fetch patterns and that the sync carries what the requirements file
        refers to: all before any create."""
        from tpulab.remote.workspace import check_fetch_patterns, select_workspace

        spec = self.workload
        self.selection = select_workspace(
            spec.workdir,
            max_bytes=spec.max_upload,
            allow_secrets=spec.allow_secrets,
            exclude=spec.exclude,
        )
        check_fetch_patterns(spec.fetch)
        # The launch line's size, measured on the line `command` will send (E2BIG).
        argv, env, ssh_timeout = self._launch()
        wl.checked_launch_line(argv, env=env, timeout=ssh_timeout)
        if spec.requirements is not None:
            _check_uploaded(spec.requirements, self.selection)
        try:
            self.launcher = paths.payload_path(wl.LAUNCHER_NAME).read_bytes()
        except OSError as error:
            raise ConfigError(
                f"Cannot read the workload launcher: {error}",
                hint="Reinstall tpulab (the launcher ships inside it).",
            ) from None
        self.outcome.upload_description = self.selection.describe()
        return f"upload {self.outcome.upload_description}"

    # -- the phases after the verifier ----------------------------------------------------

    def run(self) -> None:
        """Sync, install, run, fetch; raise WorkloadFailedError if the command failed."""
        life = self.life
        life.phase(Phase.SYNC, self.sync)
        if self.extras:
            life.phase(Phase.INSTALL, self.install)
        try:
            life.phase(Phase.WORKLOAD, self.command)
        except BaseException as error:
            if not self.outcome.started:
                raise
            self._salvage(error)
            raise
        failure = self._failure()
        try:
            # The command has ended: a first signal now must not drop what is on its way.
            with life.skippable(_FETCH_STEP, finish_within=INTERRUPTED_FETCH_SECONDS):
                life.phase(Phase.FETCH, lambda: self.fetch(self._fetch_timeout()))
        except TpuLabError as error:
            self._cut_short(error)  # the summary and run.json say why
            if failure is None:
                raise
            # The command's failure is what the user must hear; the fetch's is a note.
            life.observer.note(f"fetching the artifacts failed too: {error.message}")
        except BaseException as error:  # a signal: skipped (2nd) or not deferred (no guard)
            self._cut_short(error)
            raise self._interruption(error) from None
        if failure is not None:
            raise failure
        from tpulab.run.signals import interrupted

        signal_name = interrupted()
        if signal_name is not None:
            # A first signal let the fetch finish; the run ends as interrupted (which,
            # everything being in, the lifecycle may count as complete).
            raise InterruptedRun(signal_name)

    def _cut_short(self, error: BaseException) -> None:
        """The fetch did not complete: say why, and what it kept."""
        outcome = self.outcome
        problem = _describe(error)
        if _is_skip(error):
            by = getattr(error, "why", None) or "SIGINT"
            problem = f"skipped by {by} during the fetch"
        kept = outcome.kept
        if kept is not None:
            problem += (
                f"; kept the {kept.count} files ({kept.total_bytes / 2**20:.1f} MiB) that had "
                "fully arrived, each checked against the VM's sha256 (see manifest.json)"
            )
        outcome.fetch_problem = problem
        if _is_skip(error):
            self.life.observer.note(f"artifacts not all fetched: {problem}")

    def _interruption(self, error: BaseException) -> BaseException:
        """What ends the run after a signal cut the fetch short: the run's interrupt."""
        from tpulab.run.signals import StepSkipped, interrupted

        if isinstance(error, StepSkipped):
            return InterruptedRun(interrupted() or error.signal_name)
        return error

    def sync(self) -> str:
        """Stage the launcher (sha256-checked) and upload the workspace as one archive."""
        from tpulab.remote.workspace import upload_workspace

        session = self.life.session
        assert session is not None
        assert self.selection is not None
        self.life.stage_file(self.launcher, wl.STAGED_LAUNCHER, "workload launcher")
        uploaded = upload_workspace(
            session,
            self.selection,
            wl.WORKSPACE_DIR,
            timeout=_transfer_timeout(self.selection.total_bytes),
        )
        self.outcome.upload = uploaded
        return f"{uploaded.describe()} into ~/{wl.WORKSPACE_DIR}"

    def install(self) -> str:
        """The user's extras into the venv, after jax; a no-op on a ready venv."""
        life = self.life
        session = life.session
        assert session is not None
        extras = self.extras
        if extras.staged:
            assert extras.requirements_text is not None
            data = extras.requirements_text.encode("utf-8")
            life.stage_file(data, boot.STAGED_REQUIREMENTS, "requirements file")
        result = boot.install_extras(
            session,
            extras,
            installer=life.installer,
            timeout=life.spec.timeouts.bootstrap,
            on_line=life.on_line,
            note=life.observer.note,
            clock=life.clock,
        )
        self.outcome.extras = result
        if life.outcome.bootstrap is not None:
            life.outcome.bootstrap.extras = result
        versions = ", ".join(f"{k} {v}" for k, v in sorted(result.versions.items()))
        return f"{extras.describe()}: {result.install}; {versions}"

    def command(self) -> str:
        """Run the command in the synced workspace with the verified platform's env."""
        life = self.life
        session = life.session
        assert session is not None
        workload = self.workload
        argv, env, ssh_timeout = self._launch()
        tail = self.outcome.output_tail

        def on_line(stream: str, line: str) -> None:
            if stream == "stderr" and line.startswith(wl.WORKLOAD_MARKER):
                return  # the launcher's report, parsed below
            tail.append(line)
            del tail[:-_OUTPUT_TAIL_LINES]
            life.observer.remote_output(COMMAND_STREAM if stream == "stdout" else stream, line)

        self.outcome.started = True
        result = session.run(argv, env=env, timeout=ssh_timeout, on_line=on_line)
        report = wl.parse_launch_report(result.stderr)
        if report is None:
            # The launcher itself did not report (it could not start): say what it said.
            self.outcome.exit_status = result.exit_status
            raise RemoteError(
                f"The workload launcher on the VM failed (exit {result.exit_status}) "
                "without reporting on your command.",
                hint="Its output: " + (result.stderr.strip()[-300:] or "(none)"),
            )
        if report.unstreamed_lines:
            life.observer.note(
                f"{report.unstreamed_lines} lines of output were not streamed (this end "
                "fell behind; the command was not slowed): see output.log"
            )
        self.outcome.exit_status = report.exit_status if not report.timed_out else None
        self.outcome.timed_out = report.timed_out
        self.outcome.seconds = report.seconds
        if not report.started:
            self.outcome.exit_status = report.exit_status
            return f"could not start {workload.command[0]!r} (exit {report.exit_status})"
        if report.timed_out:
            return f"killed on the VM after its {workload.timeout:g} s --timeout"
        return f"exit {report.exit_status} after {report.seconds or 0:.1f} s"

    def _launch(self) -> tuple[list[str], dict[str, str], float]:
        """The launcher's argv, the command's environment and the SSH wrapper's limit:
        what `command` sends, and what `validate` measures."""
        spec, workload = self.life.spec, self.workload
        env = wl.workload_env(
            spec.platform, spec.accelerator.devices_per_host, spec.run_id, workload.env
        )
        argv = wl.launch_command(workload.command, timeout=workload.timeout)
        return argv, env, workload.timeout + wl.LAUNCH_SLACK_SECONDS

    def fetch(self, timeout: float) -> str:
        """The run dir, the log and the --fetch patterns into --out, checked file by file."""
        from tpulab.remote.workspace import fetch_artifacts

        session = self.life.session
        assert session is not None
        workload = self.workload
        manifest = fetch_artifacts(
            session,
            workspace=wl.WORKSPACE_DIR,
            patterns=workload.fetch,
            run_dir=wl.RUN_DIR,
            log_path=wl.LOG_PATH,
            out=workload.out,
            max_bytes=workload.max_fetch,
            timeout=timeout,
            kept=self._kept,
        )
        self.outcome.fetch = manifest
        missing = f"; nothing matched {', '.join(manifest.missing)}" if manifest.missing else ""
        return (
            f"{manifest.count} files, {manifest.total_bytes / 2**20:.1f} MiB into "
            f"{workload.out}{missing}"
        )

    def _kept(self, manifest: Manifest) -> None:
        self.outcome.kept = manifest

    # -- failure paths --------------------------------------------------------------------

    def _fetch_timeout(self) -> float:
        return _transfer_timeout(self.workload.max_fetch)

    def _failure(self) -> WorkloadFailedError | None:
        outcome = self.outcome
        tail = "\n".join(outcome.output_tail[-20:])
        if outcome.timed_out:
            return WorkloadFailedError(
                f"Your command ran past its {self.workload.timeout:g} s --timeout and was "
                "killed on the VM (its whole process group). Its artifacts were fetched.",
                exit_status=None,
                timed_out=True,
                output_tail=tail,
                hint="Give it longer with --timeout, or make it checkpoint and resume.",
            )
        if outcome.exit_status not in (0, None):
            return WorkloadFailedError(
                f"Your command exited with status {outcome.exit_status} on the verified VM. "
                f"Its log and run directory were fetched into {self.workload.out}.",
                exit_status=outcome.exit_status,
                output_tail=tail,
                hint="See the command's output above and output.log in the --out directory.",
            )
        return None

    def _salvage(self, error: BaseException) -> None:
        """The command was started and the phase did not end normally (Ctrl-C, SIGTERM,
        a dropped connection): stop it on the VM, then fetch what exists, bounded; a
        second signal meanwhile skips both (StepSkipped, or KeyboardInterrupt when no
        signal guard is installed) and the teardown follows."""
        life = self.life
        why = _describe(error)
        self.outcome.stopped = why
        with life.skippable(_FETCH_STEP):
            try:
                self._stop()
                life.phase(
                    Phase.FETCH,
                    lambda: self.fetch(min(INTERRUPTED_FETCH_SECONDS, self._fetch_timeout())),
                )
            except BaseException as failed:  # the teardown must follow whatever happens here
                if not isinstance(failed, Exception) and not _is_skip(failed):
                    raise
                self._cut_short(failed)
                if not _is_skip(failed):
                    life.observer.note(
                        f"could not fetch the artifacts after {why}: {self.outcome.fetch_problem}"
                    )

    def _stop(self) -> None:
        session = self.life.session
        assert session is not None
        result = session.run(wl.stop_command(), timeout=_STOP_TIMEOUT)
        said = next(
            (line for line in result.stdout.splitlines() if line.startswith("TPULAB_STOP ")),
            "TPULAB_STOP (no answer)",
        )
        self.life.observer.note(
            f"your command was stopped on the VM ({said.removeprefix('TPULAB_STOP ')})"
        )


def extras_for(workload: WorkloadSpec) -> boot.Extras:
    """The venv's extras: a workspace requirements file is read from the synced copy,
    the installer running in the workspace root (its relative references resolve as on
    the laptop); one from outside is staged alone."""
    packages = tuple(workload.with_packages)
    reqs = workload.requirements
    if reqs is None:
        return boot.Extras(packages)
    if reqs.workspace_path is None:
        return boot.Extras(packages, reqs.text)
    return boot.Extras(
        packages,
        reqs.text,
        nested_texts=tuple(text for _path, text in reqs.nested),
        requirements_path=reqs.workspace_path,
        install_dir=wl.WORKSPACE_DIR,
    )


def _check_uploaded(reqs: RequirementsFile, selection: UploadSelection) -> None:
    """A workspace requirements file is read on the VM from the synced copy: it, its
    nested files and the local paths it names must all go up (not be ignored)."""
    if reqs.workspace_path is None:
        return
    files = {path for path, _size in selection.files}
    for item in reqs.uploads:
        # PurePosixPath: `-e .` is the root, whose project file is "pyproject.toml".
        wanted = PurePosixPath(item.path, item.project_file or "").as_posix()
        inside = "" if wanted == "." else wanted + "/"
        carried = wanted in files or any(path.startswith(inside) for path in files)
        if not carried:
            raise ConfigError(
                f"{item.source}: {wanted} is in the workspace but not in its upload "
                "(an ignore rule, [tool.tpulab] exclude or the always-excluded list skips "
                "it), so pip on the VM would not find it.",
                hint="Stop ignoring it (.tpulabignore can re-include with !PATH), or "
                "install that package another way (--with NAME).",
            )


def _is_skip(error: BaseException) -> bool:
    """A second signal (or the bound after the first) skipping the fetch; or, with no
    signal guard installed, the KeyboardInterrupt that does the same."""
    from tpulab.run.signals import StepSkipped

    return isinstance(error, StepSkipped | KeyboardInterrupt)


def _describe(error: BaseException) -> str:
    name = getattr(error, "signal_name", None)
    if name:
        return f"interrupted by {name}"
    if isinstance(error, KeyboardInterrupt):
        return "interrupted by SIGINT"
    if isinstance(error, TpuLabError):
        return error.message
    return str(error) or type(error).__name__


class Skippable(Protocol):
    """`tpulab.run.signals.skippable`: a step a second signal may skip (and, with
    `finish_within`, one a first signal lets finish, bounded)."""

    def __call__(
        self, describe: str, *, finish_within: float | None = None
    ) -> contextlib.AbstractContextManager[object]: ...


# Used by the lifecycle's default seam: no signal guard, nothing to skip with.
def no_skip(
    describe: str, *, finish_within: float | None = None
) -> contextlib.AbstractContextManager[object]:
    del describe, finish_within
    return contextlib.nullcontext()
