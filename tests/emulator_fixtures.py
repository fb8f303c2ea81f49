"""The Cloud TPU API emulator for tests (a pytest plugin module).

Use from a test module with `pytest_plugins = ["emulator_fixtures"]`, then ask for:

- `emulator`: a started in-process `Emulator` (no SSH hosts) with `Timing.fast()` on a
  temporary state directory; `emulator.faults` injects faults, `emulator.node_names()`
  checks for leftovers.
- `tpu_api`: the real `GoogleTpuApi` (google-cloud-tpu REST client) pointed at it, for
  project `PROJECT`, with a fast polling schedule.
- `start_emulator(state_dir, **kwargs)`: start more (e.g. to restart on the same state);
  each is stopped at the end of the test.
- `held_emulator`: (emulator, clock) whose clock stands still until the test moves it
  (`clock.now += seconds`): a node stays CREATING or DELETING, an operation in flight,
  for as long as the test looks. On the real clock Timing.fast()'s 0.1-0.2 s can pass
  before a loaded machine's next request, and the state the test asserts is gone.

- `fast_embedded_emulator`: the state directory of `--emulate`'s embedded emulator in
  the test's TPULAB_HOME, with fast timing, for tests that run `tpulab ... --emulate` as
  a subprocess; `embedded_nodes_left()` lists what that emulator still holds.
- `preloaded_embedded_emulator`: the same, its nodes on the preloaded image (the
  controller's jax), for `--emulate` tests whose subject is not the bare image's install.

Helpers: `api_for(emulator, project=PROJECT, **kwargs)`, `node_request(...)`.
Import names from here only under `TYPE_CHECKING` (pytest rewrites plugin asserts).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import FakeClock

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
    "held_emulator",
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


@pytest.fixture
def held_emulator(start_emulator: EmulatorStarter, tmp_path: Path) -> tuple[Emulator, FakeClock]:
    clock = FakeClock(time.time())  # wall-clock based, as the emulator's own clock is
    return start_emulator(tmp_path / "held-emulator-state", clock=clock), clock


# The embedded emulator's timing for CLI tests (`tpulab ... --emulate` reads timing.json
# from its state directory): creates and deletes in a fraction of a second.
FAST_EMBEDDED_TIMING = {
    "create_seconds": 0.2,
    "delete_seconds": 0.1,
    "stockout_seconds": 0.1,
    "tick_seconds": 0.02,
}


@pytest.fixture
def fast_embedded_emulator() -> Path:
    import json

    from tpulab import paths

    state = paths.emulator_state_dir()
    state.mkdir(parents=True, exist_ok=True)
    (state / "timing.json").write_text(json.dumps(FAST_EMBEDDED_TIMING))
    return state


@pytest.fixture
def preloaded_embedded_emulator(fast_embedded_emulator: Path) -> Path:
    """`fast_embedded_emulator` whose nodes boot the preloaded image (image.json, read by
    tpulab.app.embedded.load_image_kind): each node skips the bare image's `pip install
    uv` and venv, ~1.5 CPU-s, four times over on a slice. The bare image's own install
    is the subject of test_bootstrap.py, test_bare_image_e2e.py and test_run_cli.py."""
    import json

    (fast_embedded_emulator / "image.json").write_text(json.dumps({"kind": "preloaded"}))
    return fast_embedded_emulator


def embedded_nodes_left() -> list[str]:
    """The nodes `tpulab list --emulate` still shows (a real subprocess, as typed)."""
    import json

    from helpers import tpulab

    listed = tpulab("list", "--emulate", "--json")
    assert listed.returncode == 0, listed.stderr
    return [node["name"] for node in json.loads(listed.stdout)["nodes"]]
