"""The Cloud TPU API emulator for tests (a pytest plugin module).

Use from a test module with `pytest_plugins = ["emulator_fixtures"]`, then ask for:

- `emulator`: a started in-process `Emulator` (no SSH hosts) with `Timing.fast()` on a
  temporary state directory; `emulator.faults` injects faults, `emulator.node_names()`
  checks for leftovers.
- `tpu_api`: the real `GoogleTpuApi` (google-cloud-tpu REST client) pointed at it, for
  project `PROJECT`, with a fast polling schedule.
- `start_emulator(state_dir, **kwargs)`: start more (e.g. to restart on the same state);
  each is stopped at the end of the test.

Helpers: `api_for(emulator, project=PROJECT, **kwargs)`, `node_request(...)`.
Import names from here only under `TYPE_CHECKING` (pytest rewrites plugin asserts).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tpulab.cloud.google import GoogleTpuApi
from tpulab.emulator import Emulator, Timing
from tpulab.models import NodeRequest, tpulab_labels
from tpulab.polling import Backoff

__all__ = [
    "PROJECT",
    "ZONE",
    "EmulatorStarter",
    "api_for",
    "emulator",
    "fast_poll",
    "node_request",
    "start_emulator",
    "tpu_api",
]

PROJECT = "test-project"
ZONE = "us-central1-a"

EmulatorStarter = Callable[..., Emulator]


def fast_poll() -> Backoff:
    return Backoff(initial=0.02, cap=0.1)


def api_for(emulator: Emulator, project: str = PROJECT, **kwargs: Any) -> GoogleTpuApi:
    kwargs.setdefault("poll", fast_poll)
    kwargs.setdefault("retry_backoff", fast_poll)
    return GoogleTpuApi(project, api_endpoint=emulator.url, **kwargs)


def node_request(
    accelerator: str = "v5litepod-4",
    *,
    runtime: str = "v2-alpha-tpuv5-lite",
    run_id: str | None = "run-1",
    spot: bool = False,
    ssh_keys: str = "",
) -> NodeRequest:
    return NodeRequest(
        accelerator_type=accelerator,
        runtime_version=runtime,
        labels=tpulab_labels(run_id) if run_id else {},
        metadata={"ssh-keys": ssh_keys} if ssh_keys else {},
        spot=spot,
    )


@pytest.fixture
def start_emulator() -> Iterator[EmulatorStarter]:
    started: list[Emulator] = []

    def start(state_dir: Path, **kwargs: Any) -> Emulator:
        kwargs.setdefault("timing", Timing.fast())
        emulator = Emulator(state_dir, **kwargs)
        emulator.start()
        started.append(emulator)
        return emulator

    yield start
    for emulator in reversed(started):
        emulator.stop()


@pytest.fixture
def emulator(start_emulator: EmulatorStarter, tmp_path: Path) -> Emulator:
    return start_emulator(tmp_path / "emulator-state")


@pytest.fixture
def tpu_api(emulator: Emulator) -> GoogleTpuApi:
    return api_for(emulator)
