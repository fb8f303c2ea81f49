"""A lesson session against one-shot runs, same served emulator, same run:

- session: one `tpulab up` (create, boot, bootstrap, verifier; the node kept) plus
  ROUNDS `tpulab exec`s of the course example, then `tpulab down`;
- one-shot: ROUNDS `tpulab run ... -- CMD`s of the same example, each its own create,
  bootstrap, verifier and delete.

Real subprocesses, as a user types them, against `Emulator` served from this process
(its default Timing: 3 s create, 1 s delete) whose nodes are real SSH servers. Prints
each command's wall-clock seconds, the totals and their ratio. Figures, not assertions,
apart from every command succeeding and nothing being left behind.

Run: `pytest tests/benchmarks/bench_sessions.py -s` (or `nox -s bench`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import served_emulator

from benchmarks.smoke import SMOKE, rounds
from tpulab.emulator import Emulator
from tpulab.emulator.timing import Timing

ROUNDS = rounds(5)
PROJECT = "bench-proj"
ZONE = "us-central1-a"
LAB = Path(__file__).resolve().parents[2] / "examples" / "course_lab"
TRAIN = ("python", "train.py", "--run-dir", "$TPULAB_RUN_DIR", "--steps", "5")


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Emulator]:
    # The emulator's default timing (a 3 s create): the create a session saves is counted.
    # The smoke run counts nothing, so its creates and deletes take the tests' timing.
    timing = Timing.fast() if SMOKE else Timing()
    with served_emulator(tmp_path / "emulator", timing=timing) as emulator:
        yield emulator


def _timed(*args: str) -> float:
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "tpulab", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "COLUMNS": "200"},
        check=False,
    )
    elapsed = time.perf_counter() - started
    assert done.returncode == 0, f"tpulab {args[0]}: {done.stderr[-2000:]}{done.stdout[-2000:]}"
    return elapsed


def test_a_session_against_one_shot_runs(served: Emulator, tmp_path: Path) -> None:
    where = ("--api-endpoint", served.url, "--project", PROJECT, "--zone", ZONE)
    work = ("--workdir", str(LAB))

    up = _timed("up", "--accelerator", "v5litepod-4", *where, "--name", "bench", "--ttl", "1h")
    execs = [
        _timed("exec", "bench", *work, "--out", str(tmp_path / f"exec-{n}"), "--", *TRAIN)
        for n in range(ROUNDS)
    ]
    down = _timed("down", "bench")
    one_shot_args = ("run", "--accelerator", "v5litepod-4", *where, *work)
    runs = [
        _timed(*one_shot_args, "--out", str(tmp_path / f"run-{n}"), "--", *TRAIN)
        for n in range(ROUNDS)
    ]
    assert served.node_names(PROJECT) == []

    session = up + sum(execs) + down
    one_shot = sum(runs)
    print(
        f"\nsession: up {up:.1f} s + {ROUNDS} exec {' '.join(f'{t:.1f}' for t in execs)} s "
        f"+ down {down:.1f} s = {session:.1f} s"
        f"\none-shot: {ROUNDS} run {' '.join(f'{t:.1f}' for t in runs)} s = {one_shot:.1f} s"
        f"\nratio one-shot / session: x{one_shot / session:.2f} "
        f"(median exec {sorted(execs)[ROUNDS // 2]:.1f} s vs median run "
        f"{sorted(runs)[ROUNDS // 2]:.1f} s)"
    )
