"""tpulab: run a JAX experiment on a Cloud TPU VM, prove it ran there, leave nothing billing.

The library facade, for driving tpulab from Python with one import::

    import tpulab

    outcome = tpulab.run_tpu(accelerator="v5litepod-4", emulate=True)
    print(outcome.verdict, outcome.teardown_status)     # verified confirmed

    report = tpulab.sweep(emulate=True)                 # teardown --verify --yes
    checked = tpulab.verify_local(devices=4)            # verify --local

- `run_tpu` is `tpulab run`: the same Lifecycle, journal row, signal handling and
  always-confirmed teardown. It returns the `RunOutcome` and raises the run's
  `TpuLabError` when it did not succeed (`TeardownError`, "may still be billing",
  outranks every other failure); pass `check=False` to get the outcome back instead,
  with the failure in `outcome.error`. (Not `tpulab.run`: that name is the `tpulab.run`
  subpackage, and importing it would replace a function of the same name.)
- `sweep` is `tpulab teardown --verify --yes`; it returns the `TeardownEnvelope` that
  `--json` prints, and raises `TeardownError` unless the scope was proven clean.
- `verify_local` is `tpulab verify --local`: the verifier on this machine's CPU.

Each call wires the same core pieces as its command in `tpulab.cli` (the target, the
journal, the signal guard), so nothing a library run does escapes the invariants of a
CLI run: nothing is created from bad input, and teardown always runs and is confirmed
by a list. Everything heavy (jax, the Google client, paramiko, typer, rich) is
imported inside these functions, so `import tpulab` stays cheap; the types in
`__all__` load on first use (`tpulab.RunSpec`). For finer control the building blocks
stay public: `tpulab.run.lifecycle.Lifecycle` takes every seam (API client, SSH connect
factory, journal, observer, receipt store) as a constructor argument.
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
    project: str | None = None,
    name: str | None = None,
    spot: bool = False,
    emulate: bool = False,
    api_endpoint: str | None = None,
    observer: RunObserver | None = None,
    check: bool = True,
) -> RunOutcome:
    """Create a TPU VM, verify JAX ran on it, delete it and confirm: `tpulab run`.

    Give a validated `spec` (`tpulab.config.build_run_spec`) or the inputs as keywords
    (`accelerator` is then required). `emulate=True` runs against the embedded emulator
    (the CLI's `--emulate`); `api_endpoint` against a served one. `observer` receives
    the phases as they happen. Bad input raises ConfigError before anything is created.
    """
    from tpulab.cleanup.journal import RunJournalAdapter
    from tpulab.config import build_run_spec
    from tpulab.errors import ConfigError, TpuLabError
    from tpulab.run.lifecycle import Lifecycle
    from tpulab.run.signals import shield, signals_to_teardown

    if spec is None:
        if accelerator is None:
            raise ConfigError(
                "tpulab.run_tpu() needs a spec or an accelerator.",
                hint='e.g. tpulab.run_tpu(accelerator="v5litepod-4", emulate=True)',
            )
        # build_run_spec validates everything, the emulate/api_endpoint conflict included.
        spec = build_run_spec(
            accelerator=accelerator,
            emulate=emulate,
            api_endpoint=api_endpoint,
            project=project,
            zone=zone,
            name=name,
            spot=spot,
            adc_project=_adc_project,
        )
    elif any(
        value not in (None, False)
        for value in (accelerator, zone, project, name, spot, emulate, api_endpoint)
    ):
        raise ConfigError(
            "tpulab.run_tpu() takes a spec or keyword inputs, not both.",
            hint="The spec already holds the accelerator, project, zone, name and target.",
        )
    # The CLI's own wiring of the target (Google, an endpoint, or the embedded emulator)
    # and of the forced-quit status, so a library run is exactly a CLI run.
    from tpulab.cli._exit import EXIT_TEARDOWN
    from tpulab.cli._target import api_context

    journal = RunJournalAdapter()
    life: Lifecycle | None = None
    try:
        with api_context(
            spec.project.value,
            emulate=spec.mode == "emulate",
            api_endpoint=spec.api_endpoint,
            ssh="embedded",
        ) as api:
            life = Lifecycle(spec, api=api, journal=journal, observer=observer, shield=shield)
            with signals_to_teardown(_say, force_exit_status=EXIT_TEARDOWN):
                return life.run()
    except TpuLabError:
        if check or life is None:
            raise
        return life.outcome  # its `error` is the failure (the lifecycle records it)
    finally:
        for warning in journal.warnings:  # e.g. a locked journal: the run went on
            _say(f"warning: {warning}")


def _adc_project() -> str | None:
    from tpulab.cloud.google import adc_project

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
    from tpulab.cleanup.journal import Journal
    from tpulab.cleanup.report import teardown_envelope, teardown_error
    from tpulab.cleanup.sweep import find_in_scope, sweep_shielded
    from tpulab.cli._exit import EXIT_TEARDOWN, error_report
    from tpulab.cli._target import api_context
    from tpulab.config import teardown_inputs

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
    with api_context(scope.project, emulate=scope.emulate, api_endpoint=scope.api_endpoint) as api:
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
