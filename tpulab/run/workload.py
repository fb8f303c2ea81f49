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

from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any

from tpulab import paths
from tpulab.errors import ConfigError, ConnectError, InterruptedRun, TpuLabError
from tpulab.remote import bootstrap as boot
from tpulab.remote import workload as wl
from tpulab.run.command import CommandRun, CommandStep, launch, stop_everywhere
from tpulab.run.dropped import again_after_a_drop
from tpulab.run.outcome import WorkloadOutcome
from tpulab.run.progress import Phase
from tpulab.run.signals import StepSkipped, interrupted, is_skip
from tpulab.run.symptoms import unreachable
from tpulab.run.workers import FanOut, Worker

if TYPE_CHECKING:
    from tpulab.config.requirements import RequirementsFile
    from tpulab.config.workload import WorkloadSpec
    from tpulab.remote.manifest import LeftBehind, Manifest
    from tpulab.remote.workspace import UploadResult, UploadSelection
    from tpulab.run.context import RunContext

__all__ = ["WorkloadOutcome", "WorkloadRunner", "extras_for"]


# After a Ctrl-C the fetch is a courtesy before the teardown: bounded, not the full cap.
INTERRUPTED_FETCH_SECONDS = 120.0
_FETCH_STEP = "the fetch"  # as the signal messages name it: "press Ctrl-C again to skip ..."


def _transfer_timeout(size: int) -> float:
    """Generous for a slow uplink (1 MiB/s) plus a fixed allowance for the VM's side."""
    return 120.0 + size / 2**20


class WorkloadRunner:
    """The `-- CMD` phases of one run; `life` (the run's context) gives the session, the
    seams and `phase`. Each phase sets what it produced once; `outcome` puts it together."""

    def __init__(self, life: RunContext, workload: WorkloadSpec) -> None:
        self.life = life
        self.workload = workload
        self.selection: UploadSelection | None = None
        self.launcher = b""
        self.upload_description = ""  # validate
        self.upload: UploadResult | None = None  # sync (worker 0's)
        self.installed: boot.ExtrasResult | None = None  # install (worker 0's)
        self.step = CommandStep(life, workload)  # the command: its progress and result
        self.stopped: str | None = None  # _salvage: why tpulab stopped the command
        self.fetched: Manifest | None = None  # fetch
        self.kept: Manifest | None = None  # _kept: what a fetch cut short kept so far
        self.fetch_problem: str | None = None  # _cut_short

    def outcome(self) -> WorkloadOutcome:
        """What happened to the command, so far, as one frozen record."""
        step, ran = self.step, self.step.result or CommandRun()
        return WorkloadOutcome(
            command=tuple(self.workload.command),
            env_names=self.workload.env_names,
            out=self.workload.out,
            upload=self.upload,
            upload_description=self.upload_description,
            extras=self.installed,
            started=step.started,
            exit_status=ran.exit_status,
            timed_out=ran.timed_out,
            stopped=self.stopped,
            seconds=ran.seconds,
            fetch=self.fetched,
            fetch_problem=self.fetch_problem,
            kept=self.kept,
            output_tail=tuple(step.output_tail),
            worker_exits=ran.worker_exits,
            failed_worker=step.failed_worker,
            reconnects=step.reconnects,
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
        self.upload_description = self.selection.describe()
        return f"upload {self.upload_description}"

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
            if not self.step.started:
                raise
            self._salvage(error)
            raise
        failure = self.outcome().failure(self.workload.timeout)
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
        signal_name = interrupted()
        if signal_name is not None:
            # A first signal let the fetch finish; the run ends as interrupted (which,
            # everything being in, the lifecycle may count as complete).
            raise InterruptedRun(signal_name)

    def _cut_short(self, error: BaseException) -> None:
        """The fetch did not complete: say why, and what it kept."""
        problem = _describe(error)
        if is_skip(error):
            by = getattr(error, "why", None) or "SIGINT"
            problem = f"skipped by {by} during the fetch"
        kept = self.kept
        if kept is not None:
            problem += (
                f"; kept the {kept.count} files ({kept.total_bytes / 2**20:.1f} MiB) that had "
                "fully arrived, each checked against the VM's sha256 (see manifest.json)"
            )
        self.fetch_problem = problem
        if is_skip(error):
            self.life.observer.note(f"artifacts not all fetched: {problem}")

    def _interruption(self, error: BaseException) -> BaseException:
        """What ends the run after a signal cut the fetch short: the run's interrupt."""
        if isinstance(error, StepSkipped):
            return InterruptedRun(interrupted() or error.signal_name)
        return error

    def sync(self) -> str:
        """Stage the launcher (sha256-checked) and upload the workspace as one archive,
        to every worker at once."""
        from tpulab.remote.workspace import upload_workspace

        life = self.life
        selection = self.selection
        assert selection is not None

        def send(worker: Worker) -> UploadResult:
            assert worker.session is not None
            life.stage_file(self.launcher, wl.STAGED_LAUNCHER, "workload launcher", worker.session)
            return upload_workspace(
                worker.session,
                selection,
                wl.WORKSPACE_DIR,
                timeout=_transfer_timeout(selection.total_bytes),
            )

        def up(worker: Worker) -> UploadResult:
            # Both steps may be sent again: a cut upload replaces nothing on the VM (its
            # stream is refused without its trailer); the next sends what the VM lacks.
            return again_after_a_drop(
                self.life,
                worker,
                send,
                "upload",
                "sending it again (the VM kept its previous workspace)",
            )

        done = life.on_workers(up, "sync")
        uploaded = self.upload = done.results[0]
        # What each worker set aside (a slice's workers have a workspace each).
        named = len(done.results) > 1
        replaced = [
            (f"worker {index}: " if named else "") + result.describe_replaced()
            for index, result in enumerate(done.results)
            if result.replaced_count
        ]
        detail = f"{uploaded.describe()} into ~/{wl.WORKSPACE_DIR}"
        return _with_workers("; ".join([detail, *replaced]), done)

    def install(self) -> str:
        """The user's extras into the venv, after jax, on every worker at once; a no-op
        on a ready venv. Worker 0's output is shown."""
        life = self.life
        extras = self.extras

        def add(worker: Worker) -> boot.ExtrasResult:
            assert worker.session is not None
            if extras.staged:
                assert extras.requirements_text is not None
                data = extras.requirements_text.encode("utf-8")
                life.stage_file(data, boot.STAGED_REQUIREMENTS, "requirements file", worker.session)
            first = worker.index == 0
            return boot.install_extras(
                worker.session,
                extras,
                installer=life.installer,
                timeout=life.spec.timeouts.bootstrap,
                on_line=life.on_line if first else None,
                note=life.observer.note if first else _quiet,
                clock=life.clock,
            )

        def again(worker: Worker) -> boot.ExtrasResult:
            # The install waits for one the drop left running (a lock on the VM), then
            # finds its stamp or installs what is still missing.
            return again_after_a_drop(life, worker, add, "install", "installing again")

        done = life.on_workers(again, "install")
        result = self.installed = done.results[0]
        versions = ", ".join(f"{k} {v}" for k, v in sorted(result.versions.items()))
        return _with_workers(f"{extras.describe()}: {result.install}; {versions}", done)

    def command(self) -> str:
        """The command on every worker (tpulab.run.command)."""
        return self.step.run()

    def _launch(self, worker: int = 0) -> tuple[list[str], dict[str, str], float]:
        return launch(self.life, self.workload, worker)

    def fetch(self, timeout: float, *, link_wait: float | None = None) -> str:
        """The run dir, the log and the --fetch patterns into --out, checked file by file;
        a slice's workers' into <out>/worker-N/ each, at once (each worker's own cap). A
        fetch the link dropped under is made again once it is back (`link_wait`: the
        most to wait for it; None: while the VM keeps the run)."""
        from tpulab.remote.workspace import fetch_artifacts

        workload = self.workload
        workers = self.life.workers
        slice_run = len(workers) > 1

        def bring(worker: Worker) -> Manifest:
            # Read-only on the VM: a fetch cut short (its arrived files kept) may be
            # made again whole, each file replacing its kept copy.
            return again_after_a_drop(
                self.life,
                worker,
                fetch_from,
                "fetch",
                "fetching again (what arrived is kept meanwhile)",
                link_wait=link_wait,
            )

        def fetch_from(worker: Worker) -> Manifest:
            assert worker.session is not None
            return fetch_artifacts(
                worker.session,
                workspace=wl.WORKSPACE_DIR,
                patterns=workload.fetch,
                run_dir=wl.RUN_DIR,
                log_path=wl.LOG_PATH,
                out=workload.out / worker_dir(worker.index) if slice_run else workload.out,
                max_bytes=workload.max_fetch,
                status_path=wl.STATUS_PATH,
                timeout=timeout,
                kept=None if slice_run else self._kept,
            )

        done = self.life.on_workers(bring, "fetch")
        manifest = self.fetched = done.results[0] if not slice_run else _merged(done.results)
        missing = f"; nothing matched {', '.join(manifest.missing)}" if manifest.missing else ""
        where = f"{workload.out}" + (f"/worker-0..{len(workers) - 1}" if slice_run else "")
        return (
            f"{manifest.count} files, {manifest.total_bytes / 2**20:.1f} MiB into {where}"
            f"{missing}{manifest.describe_skipped()}{manifest.describe_left()}"
        )

    def _kept(self, manifest: Manifest) -> None:
        self.kept = manifest

    # -- failure paths --------------------------------------------------------------------

    def _fetch_timeout(self) -> float:
        return _transfer_timeout(self.workload.max_fetch)

    def _salvage(self, error: BaseException) -> None:
        """The command was started and the phase did not end normally (Ctrl-C, SIGTERM,
        a dropped connection): stop it on the VM, then fetch what exists, bounded; a
        second signal meanwhile skips both (StepSkipped, or KeyboardInterrupt when no
        signal guard is installed) and the teardown follows."""
        life = self.life
        why = _describe(error)
        self.stopped = why
        gone = unreachable(self.life) if isinstance(error, ConnectError) else None
        if gone is not None:
            # A reconnect would wait out its bound for a VM that is not coming back.
            self._cut_short(error)
            life.observer.note(f"not fetching the artifacts: the node is {gone} (GetNode)")
            return
        with life.skippable(_FETCH_STEP):
            try:
                self._stop()
                # Bounded, as promised after a Ctrl-C: a link that dropped is given one
                # connect's bound to come back, not the lease.
                life.phase(
                    Phase.FETCH,
                    lambda: self.fetch(
                        min(INTERRUPTED_FETCH_SECONDS, self._fetch_timeout()), link_wait=0.0
                    ),
                )
            except BaseException as failed:  # the teardown must follow whatever happens here
                if not isinstance(failed, Exception) and not is_skip(failed):
                    raise
                self._cut_short(failed)
                if not is_skip(failed):
                    life.observer.note(
                        f"could not fetch the artifacts after {why}: {self.fetch_problem}"
                    )

    def _stop(self) -> None:
        stop_everywhere(self.life)


def worker_dir(worker: int) -> str:
    """Where a slice worker's artifacts land under --out."""
    return f"worker-{worker}"


def _merged(manifests: list[Manifest]) -> Manifest:
    """A slice's fetch as one manifest: each worker's entries under worker-N/."""
    from tpulab.remote.manifest import Manifest, ManifestEntry

    entries = tuple(
        ManifestEntry(f"{worker_dir(w)}/{e.path}", e.bytes, e.sha256)
        for w, manifest in enumerate(manifests)
        for e in manifest.entries
    )
    missing = tuple(
        f"{worker_dir(w)}: {m}" for w, manifest in enumerate(manifests) for m in manifest.missing
    )
    skipped = tuple(
        f"{worker_dir(w)}: {s}" for w, manifest in enumerate(manifests) for s in manifest.skipped
    )
    return Manifest(entries, missing, skipped, _merged_left(manifests))


def _merged_left(manifests: list[Manifest]) -> LeftBehind | None:
    """What the workers' commands left, summed; paths as each worker's workspace names
    them (a --fetch pattern applies to every worker alike), each once."""
    from tpulab.remote.manifest import LeftBehind

    lefts = [manifest.left for manifest in manifests if manifest.left is not None]
    if not lefts:
        return None
    first = tuple(dict.fromkeys(path for left in lefts for path in left.first))
    return LeftBehind(
        files=sum(left.files for left in lefts),
        bytes=sum(left.bytes for left in lefts),
        first=first,
        complete=all(left.complete for left in lefts),
    )


def _with_workers(detail: str, done: FanOut[Any]) -> str:
    said = done.describe()
    return f"{detail}; {said}" if said else detail


def _quiet(_message: str) -> None:
    """A non-zero worker's installer notes: worker 0's say the same of the same image."""


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


def _describe(error: BaseException) -> str:
    name = getattr(error, "signal_name", None)
    if name:
        return f"interrupted by {name}"
    if isinstance(error, KeyboardInterrupt):
        return "interrupted by SIGINT"
    if isinstance(error, TpuLabError):
        return error.message
    return str(error) or type(error).__name__
