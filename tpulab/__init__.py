"""tpulab: run a JAX experiment on a Cloud TPU VM, prove it ran there, leave nothing billing.

The library facade, for driving tpulab from Python with one import::

    import tpulab

    outcome = tpulab.run_tpu(accelerator="v5litepod-4", emulate=True)
    print(outcome.verdict, outcome.teardown_status)     # verified confirmed

    report = tpulab.sweep(emulate=True)                 # teardown --verify --yes
    checked = tpulab.verify_local(devices=4)            # verify --local

- `run_tpu` is `tpulab run` (both are tpulab.app.runs): the same attempts (zone
  failover, --recover, --queued), journal rows, signal handling and always-confirmed
  teardown, and a `-- CMD` after the verifier. It returns the `RunOutcome` and raises the run's
  `TpuLabError` when it did not succeed (`TeardownError`, "may still be billing",
  outranks every other failure); pass `check=False` to get the outcome back instead,
  with the failure in `outcome.error`. (Not `tpulab.run`: that name is the `tpulab.run`
  subpackage, and importing it would replace a function of the same name.)
- `sweep` is `tpulab teardown --verify --yes`; it returns the `TeardownEnvelope` that
  `--json` prints, and raises `TeardownError` unless the scope was proven clean.
- `verify_local` is `tpulab verify --local`: the verifier on this machine's CPU.

Each call is its command's own application code (tpulab.app: the target, the journal,
the signal guard); the facade never imports tpulab.cli. So nothing a library run does
escapes the invariants of a CLI run: nothing is created from bad input, and teardown
always runs and is confirmed by a list. Everything heavy (jax, the Google client,
paramiko, typer, rich) is imported inside these functions, so `import tpulab` stays
cheap; the types in `__all__` load on first use (`tpulab.RunSpec`). For finer control
the building blocks stay public: `tpulab.run.lifecycle.Lifecycle` takes every seam (API
client, SSH connect factory, journal, observer, receipt store) as a constructor argument.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from tpulab.cleanup.report import TeardownEnvelope
    from tpulab.config import RunSpec
    from tpulab.errors import TpuLabError
    from tpulab.evidence.localrun import LocalVerification
    from tpulab.run.outcome import RunOutcome
    from tpulab.run.progress import NullObserver, Phase, RunObserver

__all__ = [
    "NullObserver",
    "Phase",
    "RunObserver",
    "RunOutcome",
    "RunSpec",
    "TeardownEnvelope",
    "TpuLabError",
    "__version__",
    "run_tpu",
    "sweep",
    "verify_local",
]

# Names the facade's signatures use, loaded from their home module on first access.
_LAZY = {
    "NullObserver": "tpulab.run.progress",
    "Phase": "tpulab.run.progress",
    "RunObserver": "tpulab.run.progress",
    "RunOutcome": "tpulab.run.outcome",
    "RunSpec": "tpulab.config",
    "TeardownEnvelope": "tpulab.cleanup.report",
    "TpuLabError": "tpulab.errors",
}


def __getattr__(name: str) -> Any:
    home = _LAZY.get(name)
    if home is None:
        raise AttributeError(f"module 'tpulab' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)


def _say(message: str) -> None:
    print(message, file=sys.stderr)


def run_tpu(
    spec: RunSpec | None = None,
    *,
    accelerator: str | None = None,
    zone: str | None = None,
    zones: Sequence[str] = (),
    project: str | None = None,
    name: str | None = None,
    spot: bool = False,
    recover: int = 0,
    queued: bool = False,
    emulate: bool = False,
    api_endpoint: str | None = None,
    command: Sequence[str] = (),
    fetch: Sequence[str] = (),
    workdir: str | None = None,
    out: str | None = None,
    observer: RunObserver | None = None,
    check: bool = True,
) -> RunOutcome:
    """Create a TPU VM, verify JAX ran on it, delete it and confirm: `tpulab run`.

    Give a validated `spec` (`tpulab.config.build_run_spec`) or the inputs as keywords
    (`accelerator` is then required), validated exactly as the command's flags are:
    `zones` (several: failover in that order, as repeated --zone), `recover` (--recover),
    `queued` (--queued), `command` (`-- CMD`, run on the verified VM, with `fetch`,
    `workdir` and `out` as --fetch, --workdir and --out). `emulate=True` runs against
    the embedded emulator (the CLI's `--emulate`); `api_endpoint` against a served one.
    `observer` receives the phases as they happen. Bad input raises ConfigError before
    anything is created.
    """
    from tpulab.app.runs import RunTpu
    from tpulab.cleanup.journal import RunJournalAdapter
    from tpulab.config import CapacityFlags, TargetFlags, WorkloadFlags, run_inputs
    from tpulab.errors import ConfigError, TpuLabError

    if spec is None:
        if accelerator is None:
            raise ConfigError(
                "tpulab.run_tpu() needs a spec or an accelerator.",
                hint='e.g. tpulab.run_tpu(accelerator="v5litepod-4", emulate=True)',
            )
        # The command's own validation (project file, workload, zones, conflicts).
        spec = run_inputs(
            target=TargetFlags(
                accelerator=accelerator,
                zones=zones,
                zone=zone,
                project=project,
                name=name,
                emulate=emulate,
                api_endpoint=api_endpoint,
            ),
            capacity=CapacityFlags(spot=spot, recover=recover, queued=queued),
            adc_project=_adc_project,
            workload=WorkloadFlags(command=command, fetch=fetch, workdir=workdir, out=out),
        ).spec
    elif any(
        (accelerator, zone, zones, project, name, spot, recover, queued, emulate,
         api_endpoint, command, fetch, workdir, out)
    ):  # fmt: skip
        raise ConfigError(
            "tpulab.run_tpu() takes a spec or keyword inputs, not both.",
            hint="The spec already holds the accelerator, project, zones, name and target.",
        )
    journal = RunJournalAdapter()
    run = RunTpu(spec, alert=_say, observer=observer, journal=journal)
    try:
        return run()
    except TpuLabError:
        if check or run.last is None:
            raise
        return run.last.outcome  # its `error` is the failure (the run records it)
    finally:
        for warning in journal.warnings:  # e.g. a locked journal: the run went on
            _say(f"warning: {warning}")


def _adc_project() -> str | None:
    from tpulab.app.target import adc_project

    return adc_project()


def sweep(
    *,
    zones: Sequence[str] = (),
    project: str | None = None,
    run_id: str | None = None,
    emulate: bool = False,
    api_endpoint: str | None = None,
    include_live: bool = False,
    include_sessions: bool = False,
    dry_run: bool = False,
    timeout: float = 600.0,
    check: bool = True,
) -> TeardownEnvelope:
    """Delete the tpulab nodes dead runs left and prove them gone: `teardown --verify --yes`.

    Finds them by this machine's journal and by tpulab's labels in `zones` (plus the
    journal's zones); never touches a node without tpulab's labels. Returns the report
    `--json` prints; raises TeardownError unless no tpulab node remains in scope (with
    `check=False` the report says so in `ok`, `error` and `manual_commands` instead).
    A live session's node (`tpulab up`) is kept, as `--yes` without `--include-sessions`
    keeps it; `include_sessions=True` deletes it too and removes its key and state.
    A node this journal does not know whose watchdog's lease is fresh (another machine's
    or home's live work) is kept too, in `kept_elsewhere`, unless `include_live=True`.
    """
    from tpulab.app.target import provider_apis
    from tpulab.cleanup.journal import Journal
    from tpulab.cleanup.report import teardown_envelope, teardown_error
    from tpulab.cleanup.sweep import find_in_scope, sweep_shielded
    from tpulab.config import teardown_inputs
    from tpulab.envelope import error_report
    from tpulab.exits import EXIT_TEARDOWN

    inputs = teardown_inputs(
        verify=True,
        project=project,
        zones=list(zones),
        emulate=emulate,
        api_endpoint=api_endpoint,
        run_id=run_id,
        timeout=timeout,
        adc_project=_adc_project,
    )
    scope, timeout = inputs.scope, inputs.timeout
    journal = Journal()
    result = None
    # Both providers: a Compute run's instance is found and deleted through Compute.
    with provider_apis(
        scope.project, emulate=scope.emulate, api_endpoint=scope.api_endpoint
    ) as api:
        plan = find_in_scope(
            api,
            scope,
            journal=journal,
            include_live=include_live,
            include_sessions=include_sessions,
        )
        if not dry_run:
            result = sweep_shielded(
                api,
                plan,
                journal=journal,
                timeout=timeout,
                notify=_say,
                force_exit_status=EXIT_TEARDOWN,
            )
    declined = "dry run: nothing was deleted" if dry_run else ""
    error = teardown_error(plan, result, declined)
    if error is not None and check:
        raise error
    report = None if error is None else error_report(error)
    return teardown_envelope(plan, result, declined, dry_run=dry_run, error=error, report=report)


def verify_local(
    *,
    devices: int = 4,
    accelerator: str | None = None,
    timeout: float = 300.0,
    check: bool = True,
) -> LocalVerification:
    """Run the verifier payload on this machine's CPU and judge its receipt:
    `tpulab verify --local`. `accelerator` emulates that host's device count instead of
    `devices`. The receipt is kept in the store either way; raises VerificationError
    when it did not verify, LocalRunError when the payload gave no receipt
    (`check=False` returns a verdict's error in `.error`)."""
    from tpulab.errors import ConfigError
    from tpulab.evidence.localrun import new_nonce
    from tpulab.evidence.localrun import verify_local as judged_local_run
    from tpulab.evidence.receipt import Expectation, expectation_for

    if not 1 <= devices <= 64:
        raise ConfigError(f"devices={devices} is out of range.", hint="Use 1 to 64.")
    if timeout <= 0:
        raise ConfigError(f"timeout={timeout:g} must be positive.", hint="Try 300.")
    nonce = new_nonce()
    if accelerator is not None:
        expectation = expectation_for(accelerator, emulated=True, nonce=nonce)
    else:
        expectation = Expectation(platform="cpu", local_devices=devices, nonce=nonce)
    checked = judged_local_run(expectation, timeout=timeout)
    if check:
        checked.raise_for_failure()
    return checked
