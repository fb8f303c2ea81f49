"""`tpulab run` for a validated spec: attempts over the run engine, on the chosen target.

The command (tpulab.cli.run) and the library's `tpulab.run_tpu` are both this: the same
zone failover, spot recovery and queued resources (tpulab.run.attempts), the same journal
row per attempt, the same signal handling (a first Ctrl-C or SIGTERM becomes a teardown,
a third during it quits with EXIT_TEARDOWN), and run.json's `error` written the way the
--json envelope writes it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from tpulab.app.doctor import preflight_for
from tpulab.app.target import Notify, api_context
from tpulab.envelope import error_report
from tpulab.exits import EXIT_TEARDOWN
from tpulab.run.attempts import Attempt, Attempts
from tpulab.run.lifecycle import Lifecycle
from tpulab.run.signals import shield, signals_to_teardown, skippable

if TYPE_CHECKING:
    from tpulab.cloud.api import TpuApi
    from tpulab.cloud.preflight import Check
    from tpulab.config import RunSpec
    from tpulab.config.commands import Installer, SshBackend
    from tpulab.run.outcome import RunOutcome
    from tpulab.run.progress import RunJournal, RunObserver

__all__ = ["RunTpu"]


class RunTpu:
    """One `tpulab run`: call it to run; `last` and `attempts` say what happened, also
    after it raised."""

    def __init__(
        self,
        spec: RunSpec,
        *,
        alert: Callable[[str], None],
        installer: Installer = "uv",
        ssh_backend: SshBackend = "embedded",
        observer: RunObserver | None = None,
        journal: RunJournal | None = None,
        notify: Notify | None = None,
    ) -> None:
        self.spec = spec
        self.alert = alert  # the signal handler's messages ("press Ctrl-C again to ...")
        self.installer: Installer = installer
        self.ssh_backend: SshBackend = ssh_backend
        self.observer = observer
        self.journal = journal
        self.notify = notify
        self.runner: Attempts | None = None

    @property
    def last(self) -> Lifecycle | None:
        """The last attempt's run (None when the target could not even be set up)."""
        return self.runner.last if self.runner is not None else None

    @property
    def attempts(self) -> list[Attempt]:
        return self.runner.attempts if self.runner is not None else []

    def __call__(self) -> RunOutcome:
        """The verified attempt's outcome, or the error that ended the run."""
        spec = self.spec
        with api_context(
            spec.project.value,
            emulate=spec.mode == "emulate",
            api_endpoint=spec.api_endpoint,
            ssh=self.ssh_backend,
            notify=self.notify,
            provider=spec.provider,
            image=spec.image,
        ) as api:
            # Asked once for the whole run, at its first create (every attempt shares it),
            # of the run's provider: the Cloud TPU API's checks, or Compute Engine's.
            preflight = preflight_for(spec, getattr(api, "api_endpoint", None))
            self.runner = Attempts(
                spec,
                new_lifecycle=lambda attempt: self._lifecycle(attempt, api, preflight),
                observer=self.observer,
            )
            with signals_to_teardown(self.alert, force_exit_status=EXIT_TEARDOWN):
                return self.runner.run()

    def _lifecycle(
        self, attempt: RunSpec, api: TpuApi, preflight: Callable[[], list[Check]]
    ) -> Lifecycle:
        # Each attempt (a zone, a recovery) is a whole run with its own teardown.
        return Lifecycle(
            attempt,
            api=api,
            preflight=preflight,
            journal=self.journal,
            observer=self.observer,
            shield=shield,
            skippable=skippable,
            installer=self.installer,
            report_error=error_report,
        )
