"""The "emulated target": an in-process Emulator plus a `TpuApi` pointed at it.

`tpulab run|list|teardown --emulate` all use this, on the same state directory
(`paths.emulator_state_dir()`), so a node left by a killed `run --emulate` is still
there for `teardown --verify --emulate`, exactly as it would be in the cloud. The API
client is the real `GoogleTpuApi` over HTTP: `--emulate` exercises the production path.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from tpulab.config import EMULATED_IMAGE, EMULATED_PROJECT, EMULATED_ZONE
from tpulab.emulator.persist import EmulatorStateError, read_settings_file
from tpulab.emulator.server import Emulator
from tpulab.emulator.timing import Timing
from tpulab.errors import ConfigError

if TYPE_CHECKING:
    from tpulab.cloud.api import TpuApi
    from tpulab.cloud.google import GoogleTpuApi
    from tpulab.emulator.hostenv import ImageKind
    from tpulab.emulator.hosts import HostBackend

__all__ = [
    "EMBEDDED_TIMING",
    "EMULATED_IMAGE",
    "EMULATED_PROJECT",
    "EMULATED_ZONE",
    "EmulatedTarget",
    "emulated_api",
    "emulated_target",
    "load_image_kind",
    "load_timing",
]

# Quick enough for a demo, slow enough that CREATING and DELETING are visible.
EMBEDDED_TIMING = Timing(create_seconds=1.0, delete_seconds=0.5, stockout_seconds=0.3)


@dataclass(frozen=True)
class EmulatedTarget:
    emulator: Emulator
    api: GoogleTpuApi
    project: str
    zone: str


def load_timing(state_dir: Path, default: Timing = EMBEDDED_TIMING) -> Timing:
    """`<state_dir>/timing.json` (Timing's field names) over `default`, or `default`.

    This is how a test makes a `--emulate` subprocess fast without a hidden flag. A
    damaged file is refused naming it (EmulatorStateError), before anything starts.
    """
    path = state_dir / "timing.json"
    names = [field.name for field in fields(Timing)]
    seconds = ", ".join(name for name in names if name.endswith("_seconds"))
    hint = (
        f"Fix it (an object of any of {seconds}, in seconds, and page_size, a count), "
        "or delete it for the default timing."
    )
    values = read_settings_file(path, "timing file", hint=hint)
    if values is None:
        return default
    unknown = sorted(set(values) - set(names))
    try:
        if unknown:
            raise ValueError(f"unknown field(s) {unknown}")
        return replace(default, **values)
    except ValueError as error:
        raise EmulatorStateError(
            f"The emulator timing file {path} is not a valid timing ({error}).", hint=hint
        ) from None


def load_image_kind(state_dir: Path) -> ImageKind:
    """`<state_dir>/image.json`'s `{"kind": ...}` if present, else "bare".

    "bare" is what a user's `--emulate` gets: a node like a real TPU VM, whose bootstrap
    installs uv and jax. A test whose subject is not that install writes "preloaded"
    (the controller's own jax, hostenv.preloaded_image_env) to spare each node of a
    `--emulate` subprocess its ~1.5 CPU-s of `pip install uv`, as timing.json spares it
    the emulator's waits.
    """
    from tpulab.emulator.hostenv import IMAGE_KINDS

    path = state_dir / "image.json"
    choices = " or ".join(f'{{"kind": "{known}"}}' for known in IMAGE_KINDS)
    hint = f"Write {choices} there, or delete it for the bare image."
    values = read_settings_file(path, "image file", hint=hint)
    if values is None:
        return "bare"
    kind = values.get("kind")
    for known in IMAGE_KINDS:
        if kind == known:
            return known
    raise ConfigError(f"{path} does not name an emulated image (kind {kind!r}).", hint=hint)


@contextmanager
def emulated_target(
    project: str = EMULATED_PROJECT,
    zone: str = EMULATED_ZONE,
    *,
    ssh: Literal["embedded", "openssh"] | None = None,
    timing: Timing | None = None,
    state_dir: Path | None = None,
) -> Iterator[EmulatedTarget]:
    """Start an Emulator on the shared state directory, yield it with an API client.

    `ssh` picks the SSH host backend for READY nodes ("embedded" for `run`); None gives
    nodes without SSH, enough for `list` and `teardown`.
    """
    from tpulab import paths
    from tpulab.cloud.google import GoogleTpuApi

    directory = state_dir if state_dir is not None else paths.emulator_state_dir()
    emulator = Emulator(directory, timing=timing if timing is not None else load_timing(directory))
    try:
        # Read once before anything is built in it (the SSH hosts' image directory): a
        # TPULAB_HOME that is a file is then this error, not a traceback from the image.
        emulator.check_state()
    except EmulatorStateError as error:
        if state_dir is not None:
            raise
        raise EmulatorStateError(
            error.message,
            hint="The embedded emulator keeps its state under TPULAB_HOME (else your user "
            "state directory): point TPULAB_HOME at a directory you can write to.",
        ) from None
    backend: HostBackend | None = None
    if ssh is not None:
        from tpulab.emulator.backends import make_host_backend

        backend = make_host_backend(ssh, directory, image=load_image_kind(directory))
        emulator.host_backend = backend
    try:
        with emulator:
            api = GoogleTpuApi(project, api_endpoint=emulator.url)
            yield EmulatedTarget(emulator=emulator, api=api, project=project, zone=zone)
    finally:
        if backend is not None:
            backend.close()


@contextmanager
def emulated_api(
    project: str = EMULATED_PROJECT,
    *,
    ssh: Literal["embedded", "openssh"] | None = None,
    timing: Timing | None = None,
    provider: str = "tpu-api",
    image: str | None = None,
) -> Iterator[TpuApi]:
    """Just the API of `emulated_target` (what `teardown --emulate` needs); with
    `provider` "compute", the Compute provider at the same emulator's Compute root,
    creating instances from `image` (None: EMULATED_IMAGE)."""
    with emulated_target(project, ssh=ssh, timing=timing) as target:
        if provider != "compute":
            yield target.api
            return
        from tpulab.app.target import compute_api

        yield compute_api(project, api_endpoint=target.emulator.url, image=image or EMULATED_IMAGE)
