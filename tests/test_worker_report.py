"""A slice's per-worker timings in the end-of-run summary, `run --json` and run.json."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from tpulab.config import TargetFlags, build_run_spec
from tpulab.run.outcome import RunOutcome
from tpulab.run.progress import Recorder
from tpulab.run.record import run_record
from tpulab.run.report import run_envelope
from tpulab.run.summary import summary_lines
from tpulab.run.workload import WorkloadOutcome


def _outcome(**fields: Any) -> RunOutcome:
    spec = build_run_spec(
        target=TargetFlags(accelerator="v5litepod-4", emulate=True, zones=["us-west1-c"])
    )
    return RunOutcome(spec, **fields)


def _text(lines: list[list[tuple[str, str]]]) -> str:
    return "\n".join("".join(text for text, _ in line) for line in lines)


def test_the_summary_names_the_slowest_worker_of_each_step() -> None:
    outcome = _outcome(
        worker_seconds={"bootstrap": [38.0, 38.5, 41.25, 39.0], "execute": [9.0, 7.5]}
    )
    text = _text(summary_lines(outcome, laptop_jax=lambda: None))
    assert "workers   4; slowest per step:" in text
    assert "bootstrap w2 41.2s (fastest 38.0s)" in text
    assert "execute w0 9.0s (fastest 7.5s)" in text


def test_one_host_has_no_workers_line() -> None:
    assert "workers" not in _text(summary_lines(_outcome(), laptop_jax=lambda: None))


def test_json_and_run_record_carry_every_workers_seconds_and_exits(tmp_path: Path) -> None:
    outcome = _outcome(worker_seconds={"bootstrap": [1.5, 2.25]})
    envelope = run_envelope(outcome, Recorder())
    assert envelope.worker_seconds == {"bootstrap": [1.5, 2.25]}
    workload = WorkloadOutcome(
        command=("python", "job.py"),
        env_names=(),
        out=tmp_path,
        worker_exits=(0, 1),
        failed_worker=1,
    )
    record = run_record(replace(outcome, workload=workload))
    assert record.worker_seconds == {"bootstrap": [1.5, 2.25]}
    assert (record.workload.worker_exits, record.workload.failed_worker) == ([0, 1], 1)
