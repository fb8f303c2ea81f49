"""`tpulab list` vs `gcloud compute tpus tpu-vm list`, against the same emulator, same run.

Both are run as the user runs them (fresh processes, default table output) over the same
zone contents; the median wall time of several alternating runs is compared. Goal:
tpulab at least 1.5x faster in one zone (1 and 120 nodes), and 3x over three zones,
which tpulab lists in parallel and gcloud one process per zone. Each `tpulab list` also
reads the lease of every node this machine's journal does not know (all of them here),
one getGuestAttributes per node, which gcloud does not. Run: `nox -s bench` or
`pytest tests/benchmarks -s`.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from helpers import require_tool

from benchmarks.smoke import SMOKE, rounds
from tpulab.catalog import ZONES as CATALOG_ZONES
from tpulab.cloud.google import GoogleTpuApi
from tpulab.emulator import Emulator, Timing
from tpulab.models import NodeRequest, tpulab_labels

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

PROJECT = "bench-project"
ZONE = "us-central1-a"
# Three zones that host the benchmark's v5litepod, from the catalog's zone table (the
# one the emulator serves), so the benchmark follows the table when it changes.
ZONES = tuple(z.name for z in CATALOG_ZONES.values() if "v5litepod" in z.families)[:3]
ROUNDS = rounds(7)


def tpulab_command() -> list[str]:
    script = Path(sys.executable).with_name("tpulab")
    return [str(script)] if script.exists() else [sys.executable, "-m", "tpulab"]


def timed(command: Sequence[str], env: dict[str, str]) -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    elapsed = time.perf_counter() - started
    assert done.returncode == 0, done.stderr
    return elapsed, done.stdout


def _names(table: str) -> list[str]:
    """Node names from the first column of a table (tpulab adds a summary line)."""
    return sorted(line.split()[0] for line in table.splitlines() if line.startswith("bench-"))


def _populate(url: str, zone: str, count: int) -> None:
    api = GoogleTpuApi(PROJECT, api_endpoint=url)
    for index in range(count):
        request = NodeRequest(
            accelerator_type="v5litepod-4",
            runtime_version="v2-alpha-tpuv5-lite",
            labels=tpulab_labels(f"bench-{index}"),
        )
        api.create_node(zone, f"bench-{zone}-{index:03d}", request)


def gcloud_environment(url: str, config_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLOUDSDK_")}
    env.update(
        CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU=url + "/",
        CLOUDSDK_AUTH_DISABLE_CREDENTIALS="true",
        CLOUDSDK_CORE_PROJECT=PROJECT,
        CLOUDSDK_CONFIG=str(config_dir),
        CLOUDSDK_CORE_DISABLE_PROMPTS="1",
        CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK="true",
    )
    return env


@pytest.mark.gcloud
@pytest.mark.parametrize(
    ("nodes", "zones"),
    [
        pytest.param(1, (ZONE,), id="1-node-1-zone"),
        pytest.param(120, (ZONE,), id="120-nodes-1-zone"),
        pytest.param(1, ZONES, id="1-node-3-zones"),
    ],
)
def test_tpulab_list_vs_gcloud_list(nodes: int, zones: tuple[str, ...], tmp_path: Path) -> None:
    """gcloud's `tpu-vm list` takes one --zone, so covering several zones means one gcloud
    process per zone; `tpulab list` takes them all in one process."""
    require_tool(shutil.which("gcloud") is not None, "gcloud (Google Cloud SDK)")
    timing = Timing(create_seconds=0.0, delete_seconds=0.0)
    with Emulator(tmp_path / "state", timing=timing) as emulator:
        for zone in zones:
            _populate(emulator.url, zone, nodes)
        env = gcloud_environment(emulator.url, tmp_path / "gcloud-config")
        tpulab = [*tpulab_command(), "list", "--all", "--api-endpoint", emulator.url]
        tpulab += ["--project", PROJECT, *(f"--zone={zone}" for zone in zones)]
        gclouds = [["gcloud", "compute", "tpus", "tpu-vm", "list", f"--zone={z}"] for z in zones]

        def run_tpulab() -> tuple[float, list[str]]:
            elapsed, out = timed(tpulab, env)
            return elapsed, _names(out)

        def run_gcloud() -> tuple[float, list[str]]:
            runs = [timed(command, env) for command in gclouds]
            return sum(t for t, _ in runs), sorted(n for _, out in runs for n in _names(out))

        # Both must show the same nodes, every round, or the timing compares different work.
        expected = sorted(f"bench-{z}-{i:03d}" for z in zones for i in range(nodes))

        def checked(run: Callable[[], tuple[float, list[str]]]) -> float:
            elapsed, names = run()
            assert names == expected
            return elapsed

        # One untimed run each for the figures: gcloud writes its config directory on
        # first use. The smoke run times nothing that counts, so it skips them (gcloud's
        # start-up is seconds of CPU a process).
        if not SMOKE:
            checked(run_tpulab)
            checked(run_gcloud)
        tpulab_times: list[float] = []
        gcloud_times: list[float] = []
        for _ in range(ROUNDS):  # alternate so drift on the machine hits both alike
            tpulab_times.append(checked(run_tpulab))
            gcloud_times.append(checked(run_gcloud))

    tpulab_median = statistics.median(tpulab_times)
    gcloud_median = statistics.median(gcloud_times)
    ratio = gcloud_median / tpulab_median
    goal = 3.0 if len(zones) > 1 else 1.5
    print(
        f"\n[bench_list] {nodes} node(s) x {len(zones)} zone(s), median of {ROUNDS}: "
        f"tpulab list {tpulab_median:.3f}s, gcloud tpu-vm list {gcloud_median:.3f}s "
        f"({len(gclouds)} process(es)), ratio {ratio:.2f}x (goal >= {goal:g}x)"
    )
