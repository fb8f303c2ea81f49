"""What the controller itself costs in an emulated `tpulab run`.

Runs the whole lifecycle ROUNDS times against an in-process emulator (its usual polling
schedule, embedded SSH hosts, the packaged payload) and prints medians of:

- controller overhead: wall time minus the emulated create and delete latencies and the
  bootstrap and payload phases (remote work the controller only waits for). Goal < 0.5 s
  (the run engine's issue; this benchmark's first goal was 1 s).
- receipt saved -> first DeleteNode sent. Goal < 0.2 s.
- READY-detection lag: the emulator's READY moment -> the controller's "ready" milestone,
  next to the poll interval in force. Goal: within one poll interval.
- API calls per run.

Run: `pytest tests/benchmarks/bench_run.py -s` (or `nox -s bench`).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import pytest

from benchmarks.smoke import rounds
from tpulab.cloud.google import GoogleTpuApi
from tpulab.cloud.polling import operation_schedule
from tpulab.config import TargetFlags, Timeouts, build_run_spec
from tpulab.emulator import Emulator, Timing
from tpulab.emulator.backends import make_host_backend
from tpulab.evidence.store import ReceiptStore
from tpulab.run.lifecycle import Lifecycle
from tpulab.run.progress import Phase, Recorder

ROUNDS = rounds(5)
CREATE_S = 1.0
DELETE_S = 0.5
# GoogleTpuApi's schedule for a local endpoint (0.05 s growing to its cap).
POLL_CAP_S = operation_schedule(local=True).cap


class Clocked(Recorder):
    """Also notes the wall clock at each milestone, to compare with the emulator's."""

    def __init__(self, emulator: Emulator) -> None:
        super().__init__()
        self.emulator = emulator
        self.wall: dict[str, float] = {}
        self.ready_time: float | None = None

    def milestone(self, name: str, at: float) -> None:
        super().milestone(name, at)
        self.wall.setdefault(name, time.time() - (time.monotonic() - at))
        if name == "ready_seen":
            (node,) = self.emulator.snapshot()["nodes"].values()
            self.ready_time = float(node["ready_time"])


def _one_run(emulator: Emulator, tmp_path: Path) -> dict[str, float]:
    spec = build_run_spec(
        target=TargetFlags(
            accelerator="v5litepod-4",
            api_endpoint=emulator.url,
            project="bench-project",
            zone="us-central1-a",
        ),
        timeouts=Timeouts(teardown=30),
        env={},
    )
    api = GoogleTpuApi(spec.project.value, api_endpoint=emulator.url)
    recorder = Clocked(emulator)
    life = Lifecycle(spec, api=api, observer=recorder, store=ReceiptStore(tmp_path / "receipts"))
    started = time.monotonic()
    life.run()
    wall = time.monotonic() - started
    phase = {p.phase: p.seconds for p in recorder.phases}
    remote = phase[Phase.BOOTSTRAP] + phase[Phase.EXECUTE]
    marks = recorder.milestones
    assert recorder.ready_time is not None
    assert emulator.node_names() == []
    return {
        "wall": wall,
        "overhead": wall - CREATE_S - DELETE_S - remote,
        "bootstrap": phase[Phase.BOOTSTRAP],
        "payload": phase[Phase.EXECUTE],
        "receipt_to_delete": marks["delete_sent"] - marks["receipt_saved"],
        "ready_lag": recorder.wall["ready_seen"] - recorder.ready_time,
        "api_calls": float(api.call_count),
    }


@pytest.mark.slow
def test_controller_overhead_of_an_emulated_run(tmp_path: Path) -> None:
    backend = make_host_backend("embedded", tmp_path / "hosts")
    timing = Timing(create_seconds=CREATE_S, delete_seconds=DELETE_S, tick_seconds=0.02)
    try:
        with Emulator(tmp_path / "emulator", host_backend=backend, timing=timing) as emulator:
            runs = [_one_run(emulator, tmp_path) for _ in range(ROUNDS)]
    finally:
        backend.close()
    median = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
    worst = {key: max(run[key] for run in runs) for key in runs[0]}
    print(f"\nEmulated v5litepod-4 run, {ROUNDS} rounds (median / worst):")
    print(f"  wall time                 {median['wall']:7.3f} s / {worst['wall']:.3f}")
    print(f"  emulated create + delete  {CREATE_S + DELETE_S:7.3f} s")
    print(f"  bootstrap (remote)        {median['bootstrap']:7.3f} s")
    print(f"  payload (remote)          {median['payload']:7.3f} s")
    print(
        f"  controller overhead       {median['overhead']:7.3f} s / {worst['overhead']:.3f}"
        "  (goal < 0.5 s)"
    )
    print(
        f"  receipt saved -> delete   {median['receipt_to_delete'] * 1000:7.1f} ms / "
        f"{worst['receipt_to_delete'] * 1000:.1f}  (goal < 200 ms)"
    )
    print(
        f"  READY-detection lag       {median['ready_lag'] * 1000:7.1f} ms / "
        f"{worst['ready_lag'] * 1000:.1f}  (poll interval <= {POLL_CAP_S * 1000:.0f} ms)"
    )
    print(f"  API calls per run         {median['api_calls']:7.0f}")
    # Goals are reported, not asserted: timings on a shared 2-core machine are figures for
    # the issue note, and a timed assertion would only make the benchmark flaky.
    goals = {
        "receipt -> delete < 200 ms (worst)": worst["receipt_to_delete"] < 0.2,
        "READY noticed within one poll interval (worst)": worst["ready_lag"] < POLL_CAP_S + 0.1,
        "controller overhead < 0.5 s (median)": median["overhead"] < 0.5,
    }
    for goal, met in goals.items():
        print(f"  {'MET   ' if met else 'MISSED'} {goal}")
