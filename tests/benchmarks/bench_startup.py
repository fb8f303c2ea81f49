"""How fast the CLI starts: help against gcloud's, and a dry run's wall time.

- `tpulab --help` and `tpulab run --help` against `gcloud compute tpus tpu-vm --help`,
  each a fresh process as the user runs it, alternating in one run so that drift on the
  machine hits all three alike; the ratio of medians is printed. Goal: tpulab at least
  7x faster.
- `tpulab run --accelerator v5litepod-4 --zone us-central1-a --project my-project
  --dry-run` (README's invocation): its median wall time. Goal: under 0.3 s.

What the help may import is pinned by tests/test_startup.py; this measures what it
costs. Run: `nox -s bench` or `pytest tests/benchmarks/bench_startup.py -s`.
"""

from __future__ import annotations

import os
import shutil
import statistics
from pathlib import Path

import pytest
from helpers import require_tool

from benchmarks.bench_list import timed, tpulab_command
from benchmarks.smoke import SMOKE, rounds

ROUNDS = rounds(9)
DRY_RUN = ["run", "--accelerator", "v5litepod-4", "--zone", "us-central1-a"]
DRY_RUN += ["--project", "my-project", "--dry-run"]


def _environment(tmp_path: Path) -> dict[str, str]:
    """A fresh tpulab home and gcloud config: no state of this machine's is read."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLOUDSDK_")}
    env.update(
        TPULAB_HOME=str(tmp_path / "home"),
        CLOUDSDK_CONFIG=str(tmp_path / "gcloud-config"),
        CLOUDSDK_CORE_DISABLE_PROMPTS="1",
        CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK="true",
        COLUMNS="100",
    )
    return env


@pytest.mark.gcloud
def test_help_vs_gcloud_help(tmp_path: Path) -> None:
    require_tool(shutil.which("gcloud") is not None, "gcloud (Google Cloud SDK)")
    env = _environment(tmp_path)
    commands = {
        "tpulab --help": [*tpulab_command(), "--help"],
        "tpulab run --help": [*tpulab_command(), "run", "--help"],
        "gcloud compute tpus tpu-vm --help": ["gcloud", "compute", "tpus", "tpu-vm", "--help"],
    }

    def drawn(name: str) -> float:
        """Seconds to draw `name`'s help; each must draw it (not an error), every time,
        or the timing compares different work."""
        elapsed, out = timed(commands[name], env)
        assert out.strip(), name
        return elapsed

    # One untimed run each for the figures: gcloud writes its config directory on first
    # use. The smoke run's one round counts nothing, so it has none.
    if not SMOKE:
        for name in commands:
            drawn(name)
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(ROUNDS):
        for name in commands:
            times[name].append(drawn(name))
    medians = {name: statistics.median(found) for name, found in times.items()}
    gcloud = medians["gcloud compute tpus tpu-vm --help"]
    for name in ("tpulab --help", "tpulab run --help"):
        print(
            f"\n[bench_startup] median of {ROUNDS}: {name} {medians[name]:.3f}s, gcloud "
            f"compute tpus tpu-vm --help {gcloud:.3f}s, ratio {gcloud / medians[name]:.2f}x "
            "(goal >= 7x)"
        )


def test_dry_run_wall_time(tmp_path: Path) -> None:
    env = _environment(tmp_path)
    command = [*tpulab_command(), *DRY_RUN]

    def planned() -> float:
        elapsed, out = timed(command, env)
        assert "CreateNode" in out  # it printed the plan, each time
        return elapsed

    if not SMOKE:
        planned()  # untimed: the first run warms the page cache for the figures
    median = statistics.median(planned() for _ in range(ROUNDS))
    print(
        f"\n[bench_startup] median of {ROUNDS}: tpulab {' '.join(DRY_RUN)} {median:.3f}s "
        "(goal < 0.3 s)"
    )
