"""One run, start to finish: create a TPU VM, prove JAX ran on it, delete it, confirm.

    validate -> create -> wait READY -> host key -> connect -> bootstrap -> stage
             -> execute -> collect -> verify                     (tpulab.run.provision,
             [-> sync -> install -> workload -> fetch: `-- CMD`]   tpulab.run.verifier,
    finally: teardown = delete, wait, list until gone             tpulab.run.workload,
                                                                  tpulab.run.ending)

The two drivers here order those phases over one `RunContext` (tpulab.run.context):
`Lifecycle` is `tpulab run` (always torn down), `KeptRun` is `tpulab up` (a verified node
is handed over to a session; every failure before that is torn down just the same).
The third, `AttachedRun` (`tpulab exec`), lives with the session it attaches to
(tpulab.run.attach).

Invariants kept here (docs/architecture.md §3): nothing is sent before the input is valid and the
journal has the run; every node carries this run's labels and its per-run SSH key; every
exit after create was sent -- success, error, Ctrl-C, SIGTERM -- goes through teardown,
wrapped in `shield` so a second Ctrl-C cannot abort it; the receipt is saved before the
delete is sent; success needs a verified receipt AND a confirmed teardown; a teardown
that cannot be confirmed raises TeardownError, which outranks every other failure.

The seams are the context's arguments: `api` (a TpuApi: Google or an emulator),
`connect` (an SSH connection factory), `journal`, `observer`, `shield`, `clock`,
`sleep`, and `new_key` / `new_nonce` (the run's secrets). `tpulab run --dry-run` is this
class over recording seams (tpulab.run.recording), so the plan cannot drift from the run.
"""

from __future__ import annotations

from tpulab.errors import CloudError, RemoteError
from tpulab.run import provision, verifier
from tpulab.run.context import RunContext
from tpulab.run.ending import end_run
from tpulab.run.outcome import RunOutcome
from tpulab.run.progress import Phase
from tpulab.run.remote_session import Connect, RemoteSession
from tpulab.run.signals import Shield
from tpulab.run.symptoms import explain

__all__ = [
    "Connect",
    "KeptRun",
    "Lifecycle",
    "RemoteSession",
    "RunOutcome",
    "Shield",
    "run_phases",
]


def run_phases(ctx: RunContext) -> None:
    """Every phase of a run, in order; a spot reclaim or a watchdog's delete under a
    phase is raised as what it is, not as the symptom the phase met."""
    try:
        _each_phase(ctx)
    except (RemoteError, CloudError) as error:
        explained = explain(ctx, error)
        if explained is None:
            raise
        raise explained from error


def _each_phase(ctx: RunContext) -> None:
    ctx.phase(Phase.VALIDATE, lambda: verifier.validate(ctx))
    ctx.record_start()
    ctx.phase(Phase.CREATE, lambda: provision.create(ctx))
    ctx.phase(Phase.WAIT_READY, lambda: provision.wait_ready(ctx))
    ctx.phase(Phase.HOST_KEY, lambda: provision.pin_host_key(ctx))
    ctx.phase(Phase.CONNECT, lambda: verifier.open_session(ctx))
    ctx.phase(Phase.BOOTSTRAP, lambda: verifier.bootstrap(ctx))
    ctx.phase(Phase.STAGE, lambda: verifier.stage(ctx))
    ctx.phase(Phase.EXECUTE, lambda: verifier.execute(ctx))
    ctx.phase(Phase.COLLECT, lambda: verifier.collect(ctx))
    ctx.phase(Phase.VERIFY, lambda: verifier.verify(ctx))
    if ctx.workload is not None:
        # Only here, after the receipt verified on this node (docs/architecture.md §3).
        ctx.workload.run()


class Lifecycle(RunContext):
    """`tpulab run`: every phase, then always the teardown."""

    def run(self) -> RunOutcome:
        """Run every phase, then always tear down; return the outcome or raise.

        Raises TeardownError when deletion was not confirmed (whatever else happened),
        otherwise the first failure of the phases (KeyboardInterrupt as InterruptedRun,
        any other BaseException -- e.g. a signal turned into one -- unchanged); returns
        only when the receipt verified and the node is confirmed gone.
        """
        primary: BaseException | None = None
        try:
            run_phases(self)
        except BaseException as error:  # every exit path must reach the teardown
            primary = error
        return end_run(self, primary)


class KeptRun(RunContext):
    """`tpulab up`: a run whose verified node is kept for a session (run/session.py)."""

    def run(self) -> RunOutcome:
        """As `Lifecycle.run`, except that a run whose receipt verified hands its node
        over instead of deleting it (`outcome.kept`)."""
        primary: BaseException | None = None
        try:
            run_phases(self)
        except BaseException as error:  # every exit path must reach the teardown
            primary = error
        if primary is None and self.outcome.verified:
            return self._hand_over()
        return end_run(self, primary)

    def _hand_over(self) -> RunOutcome:
        """Keep the verified node: stop renewing (from now on the watchdog's idle lease
        and hard deadline guard it) and close SSH. The journal row stays open: the node
        is still billing until `tpulab down` confirms it gone."""
        self.kept = True  # first: `up` deletes a node handed over but not recorded
        self.release()
        return self.conclude(error=None, seconds=self.elapsed())
