"""Drive one run from Python against an in-process emulator, printing each phase.

    python examples/library_run.py

The lifecycle's seams are constructor arguments: the TPU API client (here the real
google-cloud-tpu REST client pointed at the emulator), an observer, and optionally an
SSH connect factory, a journal and a signal shield. Nothing is patched.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from tpulab.cloud.google import GoogleTpuApi
from tpulab.config import build_run_spec
from tpulab.emulator import Emulator, Timing
from tpulab.emulator.backends import make_host_backend
from tpulab.evidence.store import ReceiptStore
from tpulab.run.lifecycle import Lifecycle
from tpulab.run.progress import NullObserver, Phase


class Printer(NullObserver):
    def phase_finished(self, phase: Phase, seconds: float, detail: str) -> None:
        print(f"ok    {phase.label:<24} {seconds:6.2f}s  {detail}")

    def phase_failed(self, phase: Phase, seconds: float, error: BaseException) -> None:
        print(f"FAIL  {phase.label:<24} {seconds:6.2f}s  {error}")

    def note(self, message: str) -> None:
        print(f"      {message}")


def main() -> None:
    scratch = Path(tempfile.mkdtemp(prefix="tpulab-example-"))
    backend = make_host_backend("embedded", scratch / "hosts")
    timing = Timing(create_seconds=1.0, delete_seconds=0.5)
    try:
        with Emulator(scratch / "emulator", host_backend=backend, timing=timing) as emulator:
            spec = build_run_spec(
                accelerator="v5litepod-4", mode="endpoint", api_endpoint=emulator.url
            )
            api = GoogleTpuApi(spec.project.value, api_endpoint=emulator.url)
            life = Lifecycle(
                spec, api=api, observer=Printer(), store=ReceiptStore(scratch / "receipts")
            )
            outcome = life.run()
            print(f"receipt {outcome.verdict}: sums {outcome.per_device_sums}")
            print(f"teardown {outcome.teardown_status}; nodes left: {emulator.node_names()}")
    finally:
        backend.close()


if __name__ == "__main__":
    main()
