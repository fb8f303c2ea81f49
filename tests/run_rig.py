"""A whole emulated cloud for lifecycle tests (a pytest plugin module).

`rig` is parametrized over both SSH host backends (embedded asyncssh and OpenSSH sshd);
`embedded_rig` uses the embedded one only, for the fault matrix. Each gives a started
in-process Emulator (real HTTP server, fast timing) whose READY nodes are real SSH
servers, the real `GoogleTpuApi` REST client pointed at it, and helpers to build a
RunSpec and a Lifecycle with short deadlines. Nothing is mocked.
"""

from __future__ import annotations

import dataclasses
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from emulator_fixtures import PROJECT, ZONE, EmulatorStarter, api_for, fast_poll

from tpulab.cloud.google import GoogleTpuApi
from tpulab.config import CapacityFlags, RunSpec, TargetFlags, Timeouts, build_run_spec
from tpulab.emulator import Emulator
from tpulab.emulator.backends import make_host_backend
from tpulab.emulator.hosts import HostBackend
from tpulab.evidence.store import ReceiptStore
from tpulab.run.lifecycle import KeptRun, Lifecycle
from tpulab.run.progress import FanOut, Recorder, RunObserver

__all__ = [
    "FAST",
    "PAYLOAD_BOUND",
    "Rig",
    "embedded_rig",
    "payload_script",
    "rig",
    "sleeps_in_the_first_zone_then_verifies",
]

# The rig's deadlines are bounds that only a hang reaches, never timings: a test that
# wants one to fire passes its own (`rig.spec(payload=1.5)`). The verifier imports jax
# and runs on the emulated VM; on a loaded 2-core CI runner it ran past a 60 s payload
# deadline (test_spot_states' recovered node, CI). 240 s is four times that, and still
# under the tests' own timeout (pytest-timeout, 300 s in pyproject.toml), so a hung
# verifier ends in the rig's own error (tests/test_run_rig.py holds both).
PAYLOAD_BOUND = 240
FAST = Timeouts(
    create=20, ready=20, host_key=10, connect=15, bootstrap=120, payload=PAYLOAD_BOUND,
    collect=20, teardown=8,
)  # fmt: skip


def payload_script(directory: Path, body: str, name: str = "payload.py") -> Path:
    """A stand-in payload (run on the emulated VM instead of verify_tpu.py)."""
    path = directory / name
    path.write_text(textwrap.dedent(body))
    return path


def sleeps_in_the_first_zone_then_verifies(
    directory: Path, seconds: float, first_zone: str
) -> Path:
    """A payload that sleeps `seconds` on the first attempt's node (so a fault lands while
    it runs) and runs the real verifier, found by path (emulated nodes share this file
    system), on any node in another zone: what a recovered attempt must verify.

    The node asks its metadata server which zone it is in, as a VM's process would. A
    marker file written by the first run was a race: a fault that stopped the VM before
    that payload began left no marker, and the recovered attempt slept instead (a 20 s
    test took 72 s on a loaded machine, 2026-12-06)."""
    from tpulab import paths
    from tpulab.contract import METADATA_FLAVOR, METADATA_FLAVOR_HEADER, METADATA_HOST_ENV

    return payload_script(
        directory,
        f"""
        import os, runpy, time, urllib.request
        asked = urllib.request.Request(
            "http://" + os.environ[{METADATA_HOST_ENV!r}] + "/computeMetadata/v1/instance/zone",
            headers={{{METADATA_FLAVOR_HEADER!r}: {METADATA_FLAVOR!r}}},
        )
        with urllib.request.urlopen(asked, timeout=30) as answer:
            zone = answer.read().decode().rsplit("/", 1)[-1]
        if zone == {first_zone!r}:
            time.sleep({seconds!r})
        runpy.run_path({str(paths.payload_path())!r}, run_name="__main__")
        """,
    )


@dataclass
class Rig:
    emulator: Emulator
    backend: HostBackend
    api: GoogleTpuApi
    tmp: Path

    def spec(
        self,
        accelerator: str = "v5litepod-4",
        *,
        spot: bool = False,
        script: Path | None = None,
        **timeouts: float,
    ) -> RunSpec:
        return build_run_spec(
            target=TargetFlags(
                accelerator=accelerator, api_endpoint=self.emulator.url, project=PROJECT, zone=ZONE
            ),
            capacity=CapacityFlags(spot=spot),
            payload=script,
            timeouts=dataclasses.replace(FAST, **timeouts),
            env={},
        )

    def lifecycle(
        self, spec: RunSpec, *observers: RunObserver, **kwargs: Any
    ) -> tuple[Lifecycle, Recorder]:
        recorder = Recorder()
        return Lifecycle(spec, **self._seams(recorder, observers, kwargs)), recorder

    def kept_run(
        self, spec: RunSpec, *observers: RunObserver, **kwargs: Any
    ) -> tuple[KeptRun, Recorder]:
        """`tpulab up`'s driver over the same seams."""
        recorder = Recorder()
        return KeptRun(spec, **self._seams(recorder, observers, kwargs)), recorder

    def _seams(
        self, recorder: Recorder, observers: tuple[RunObserver, ...], kwargs: dict[str, Any]
    ) -> dict[str, Any]:
        kwargs.setdefault("poll", fast_poll())
        kwargs.setdefault("teardown_poll", 0.05)
        kwargs.setdefault("store", ReceiptStore(self.tmp / "receipts"))
        kwargs.setdefault("api", self.api)  # a test may wrap it (tests/delegating_api.py)
        kwargs["observer"] = FanOut([recorder, *observers]) if observers else recorder
        return kwargs

    def run(
        self, spec: RunSpec, *observers: RunObserver, **kwargs: Any
    ) -> tuple[Lifecycle, Recorder, BaseException | None]:
        life, recorder = self.lifecycle(spec, *observers, **kwargs)
        try:
            life.run()
        except BaseException as error:  # the tests inspect whatever was raised
            return life, recorder, error
        return life, recorder, None

    def leftovers(self) -> list[str]:
        return self.emulator.node_names()


def _rig(emulator: Emulator, backend: HostBackend, tmp: Path) -> Rig:
    return Rig(emulator, backend, api_for(emulator), tmp)


@pytest.fixture
def rig(host_backend: HostBackend, start_emulator: EmulatorStarter, tmp_path: Path) -> Rig:
    emulator = start_emulator(tmp_path / "emulator", host_backend=host_backend)
    return _rig(emulator, host_backend, tmp_path)


@pytest.fixture
def embedded_rig(start_emulator: EmulatorStarter, tmp_path: Path) -> Iterator[Rig]:
    backend = make_host_backend("embedded", tmp_path / "ssh-hosts", image="preloaded")
    emulator: Emulator | None = None
    try:
        emulator = start_emulator(tmp_path / "emulator", host_backend=backend)
        yield _rig(emulator, backend, tmp_path)
    finally:
        # Stop the emulator first: a running one may still start hosts on the backend.
        if emulator is not None:
            emulator.stop()
        backend.close()
