"""A slice's workers driven at once, against one at a time and against one host:

- fan-out: an emulated v5litepod-16 (4 workers) as `tpulab run` runs it, every remote
  step on all workers concurrently (tpulab.run.workers.fan_out); per step, the wall time
  is the slowest worker's;
- one after another: per step, the SUM of the workers' own times in that same run, what
  a loop over `gcloud compute tpus tpu-vm ssh --worker=N` would take at those times (a
  serial run cannot be measured whole: the payload's workers must join each other, so
  its execute step cannot run one worker at a time). On a 2-core machine the fan-out
  also slows each worker (4 emulated VMs share the cores), so the sum is a floor for the
  serial loop, not an estimate of it;
- one host: a v5litepod-4 through the same engine, the baseline a slice's run pays on.

Whole lifecycles through the real run engine against the emulator's real SSH hosts
(embedded backend, the tests' fast timing). Prints per step the fan-out's and the sum's
seconds, the totals, and the ratios sum/fan-out and slice/one host. Figures, not
assertions, apart from every run verifying and nothing being left behind.

Run: `pytest tests/benchmarks/bench_slices.py -s` (or `nox -s bench`).
"""

from __future__ import annotations

import statistics
import time

from run_rig import Rig

from benchmarks.smoke import rounds

pytest_plugins = ["emulator_fixtures", "ssh_fixtures", "run_rig"]

ROUNDS = rounds(3)


def _run(rig: Rig, accelerator: str) -> tuple[float, dict[str, list[float]]]:
    started = time.perf_counter()
    life, _recorder, error = rig.run(rig.spec(accelerator))
    elapsed = time.perf_counter() - started
    assert error is None, error
    assert life.outcome.verified
    assert rig.leftovers() == []
    return elapsed, life.outcome.worker_seconds


def test_fan_out_against_one_worker_after_another_and_one_host(embedded_rig: Rig) -> None:
    slice_runs: list[float] = []
    one_host: list[float] = []
    fanned: dict[str, list[float]] = {}
    summed: dict[str, list[float]] = {}
    for _ in range(ROUNDS):
        seconds, per_worker = _run(embedded_rig, "v5litepod-16")
        slice_runs.append(seconds)
        assert per_worker, "a slice's run keeps every worker's seconds"
        for step, times in per_worker.items():
            assert len(times) == 4, (step, times)
            fanned.setdefault(step, []).append(max(times))
            summed.setdefault(step, []).append(sum(times))
        one_host.append(_run(embedded_rig, "v5litepod-4")[0])
    print()
    print(f"{'step':10} {'fan-out':>8} {'one after another':>18}")
    for step in fanned:
        fan, total = statistics.median(fanned[step]), statistics.median(summed[step])
        print(f"{step:10} {fan:7.2f}s {total:17.2f}s")
    fan_total = sum(statistics.median(v) for v in fanned.values())
    sum_total = sum(statistics.median(v) for v in summed.values())
    whole, single = statistics.median(slice_runs), statistics.median(one_host)
    print(f"steps on every worker: fan-out {fan_total:.2f}s, one after another {sum_total:.2f}s")
    print(f"  ({sum_total / fan_total:.2f}x)")
    print(
        f"whole run: v5litepod-16 {whole:.2f}s, v5litepod-4 {single:.2f}s ({whole / single:.2f}x)"
    )
