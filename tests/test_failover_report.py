"""The attempts table in the end-of-run summary and in `run --json`, and the total cost."""

from __future__ import annotations

import pytest

from tpulab.config import CapacityFlags, TargetFlags, build_run_spec
from tpulab.run.attempts import Attempt
from tpulab.run.outcome import RunOutcome
from tpulab.run.progress import Recorder
from tpulab.run.report import run_envelope
from tpulab.run.summary import summary_lines

ATTEMPTS = [
    Attempt(1, "r1", "us-central1-a", True, "stockout", "Could not create: capacity", 0.9,
            "confirmed", 0.001),
    Attempt(2, "r1-a2", "us-south1-a", True, "quota", "Could not create: quota", 0.1,
            "not-created", 0.0),
    Attempt(3, "r1-a3", "us-west1-c", True, "verified", "", 25.0, "confirmed", 0.02),
]  # fmt: skip


def _outcome() -> RunOutcome:
    spec = build_run_spec(
        target=TargetFlags(accelerator="v5litepod-4", emulate=True, zones=["us-west1-c"]),
        capacity=CapacityFlags(spot=True),
        run_id="r1-a3",
    )
    return RunOutcome(spec, billed_seconds=300.0)


def _text(lines: list[list[tuple[str, str]]]) -> str:
    return "\n".join("".join(text for text, _ in line) for line in lines)


def test_the_summary_lists_every_attempt_and_the_total_cost() -> None:
    text = _text(summary_lines(_outcome(), attempts=ATTEMPTS, laptop_jax=lambda: None))
    assert "attempts  3" in text
    assert " 1. us-central1-a      spot      stockout" in text
    assert "nothing created" in text  # the quota attempt: refused, so nothing to delete
    assert "deleted, confirmed" in text
    assert "~$0.0210 over 3 attempts" in text


def test_one_attempt_shows_no_table() -> None:
    text = _text(summary_lines(_outcome(), attempts=ATTEMPTS[2:], laptop_jax=lambda: None))
    assert "attempts" not in text


def test_the_envelope_carries_the_table_and_the_total() -> None:
    document = run_envelope(_outcome(), Recorder(), attempts=ATTEMPTS)
    assert [(a.zone, a.how, a.outcome, a.teardown, a.teardown_confirmed)
            for a in document.attempts] == [
        ("us-central1-a", "spot", "stockout", "confirmed", True),
        ("us-south1-a", "spot", "quota", "not-created", True),
        ("us-west1-c", "spot", "verified", "confirmed", True),
    ]  # fmt: skip
    assert document.estimated_cost_usd == pytest.approx(0.021)
    # Without attempts (a caller that ran one Lifecycle) the cost is that run's own.
    single = run_envelope(_outcome(), Recorder())
    assert single.attempts == []
    assert single.estimated_cost_usd == pytest.approx(_outcome().estimated_cost, abs=1e-4)
