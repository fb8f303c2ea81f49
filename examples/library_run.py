"""Drive one run from Python with the library facade, printing each phase as it ends.

    python examples/library_run.py

`tpulab.run_tpu` is `tpulab run`: here against the embedded emulator (`emulate=True`,
the CLI's `--emulate`), so it runs offline; drop `emulate` and pass `zone`/`project` for
a real TPU VM. The observer is the one seam this example uses; the lifecycle under the
facade (`tpulab.run.lifecycle.Lifecycle`) takes every other one -- the API client, the
SSH connect factory, the journal -- as constructor arguments too. Nothing is patched.
"""

from __future__ import annotations

import tpulab


class Printer(tpulab.NullObserver):
    def phase_finished(self, phase: tpulab.Phase, seconds: float, detail: str) -> None:
        print(f"ok    {phase.label:<24} {seconds:6.2f}s  {detail}")

    def phase_failed(self, phase: tpulab.Phase, seconds: float, error: BaseException) -> None:
        print(f"FAIL  {phase.label:<24} {seconds:6.2f}s  {error}")

    def note(self, message: str) -> None:
        print(f"      {message}")


def main() -> None:
    # Raises the run's error (a TeardownError first of all) unless it verified AND the
    # VM's deletion was confirmed by a list.
    outcome = tpulab.run_tpu(accelerator="v5litepod-4", emulate=True, observer=Printer())
    print(f"receipt {outcome.verdict}: sums {outcome.per_device_sums}")
    print(f"teardown {outcome.teardown_status}")
    # Independent proof, as `tpulab teardown --verify` gives it: nothing of tpulab's is
    # left in the emulator's zone.
    report = tpulab.sweep(emulate=True)
    print(f"nodes left: {report.remaining}")


if __name__ == "__main__":
    main()
