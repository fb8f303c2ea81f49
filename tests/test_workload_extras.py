"""`--with` / `--requirements`: the user's extra packages in the VM's venv, after jax.

Offline and real: the emulated image is the preloaded one plus a local package index (a
wheel built here, byte by byte, of a package that exists nowhere else, so nothing on
this machine can satisfy the import by accident) served as a PEP 503 index on disk
to uv and pip, exactly as PyPI would serve it. Both SSH backends.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tpulab.emulator.backends import make_host_backend
from tpulab.emulator.hostenv import preloaded_image_env
from tpulab.emulator.hosts import HostBackend
from tpulab.errors import BootstrapError
from tpulab.remote import bootstrap as boot
from tpulab.run.progress import COMMAND_STREAM, Phase
from tpulab.run.record import read_run_record

if TYPE_CHECKING:
    from run_rig import Rig

pytest_plugins = ["emulator_fixtures", "ssh_fixtures", "run_rig"]
pytestmark = pytest.mark.slow

PACKAGE = "tpulab-probe-extra"
MODULE = "tpulab_probe_extra"
VERSION = "1.2.3"


def build_wheel(directory: Path, version: str = VERSION) -> Path:
    """A minimal pure-Python wheel (PEP 427): the module, METADATA, WHEEL, RECORD."""
    directory.mkdir(parents=True, exist_ok=True)
    info = f"{MODULE}-{version}.dist-info"
    files = {
        f"{MODULE}/__init__.py": f"MESSAGE = 'hello from {PACKAGE} {version}'\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {PACKAGE}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    wheel = directory / f"{MODULE}-{version}-py3-none-any.whl"
    record = []
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in files.items():
            data = text.encode()
            archive.writestr(path, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            record.append(f"{path},sha256={digest.decode()},{len(data)}")
        record.append(f"{info}/RECORD,,")
        archive.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return wheel


def simple_index(root: Path) -> Path:
    """A PEP 503 "simple" index on disk holding only our wheel: the package index the
    emulated VM's uv and pip resolve from (so an unknown name is a real "not found")."""
    wheel = build_wheel(root / "wheels")
    project = root / "simple" / PACKAGE
    project.mkdir(parents=True)
    (project / "index.html").write_text(
        f'<html><body><a href="../../wheels/{wheel.name}">{wheel.name}</a></body></html>\n'
    )
    return root / "simple"


def wheelhouse_backend(kind: str, tmp_path: Path) -> HostBackend:
    index = simple_index(tmp_path / "index").as_uri()
    base = preloaded_image_env()
    offline = {"UV_DEFAULT_INDEX": index, "PIP_INDEX_URL": index}
    image = dataclasses.replace(
        base, extra={**base.extra, **offline}, name=f"{base.name} + a local package index"
    )
    return make_host_backend(kind, tmp_path / "ssh-hosts", image=image)  # type: ignore[arg-type]


@pytest.fixture(
    params=[
        pytest.param("embedded", id="embedded"),
        pytest.param("openssh", id="openssh", marks=pytest.mark.openssh),
    ]
)
def kind(request: pytest.FixtureRequest) -> str:
    from helpers import require_tool
    from ssh_fixtures import sshd_available

    if request.param == "openssh":
        require_tool(sshd_available(), "OpenSSH server (sshd and sftp-server)")
    return str(request.param)


@pytest.fixture
def wheel_rig(kind: str, start_emulator, tmp_path: Path) -> Iterator[Rig]:  # type: ignore[no-untyped-def]
    from emulator_fixtures import api_for
    from run_rig import Rig

    backend = wheelhouse_backend(kind, tmp_path)
    emulator = None
    try:
        emulator = start_emulator(tmp_path / "emulator", host_backend=backend)
        yield Rig(emulator, backend, api_for(emulator), tmp_path)
    finally:
        if emulator is not None:
            emulator.stop()
        backend.close()


def test_with_package_is_importable_by_the_command(wheel_rig: Rig, tmp_path: Path) -> None:
    from test_workload_e2e import with_workload, workspace

    work = workspace(tmp_path, {"use.py": f"import {MODULE}\nprint({MODULE}.MESSAGE)\n"})
    out = tmp_path / "out"
    spec = with_workload(wheel_rig.spec(), work, out, "python", "use.py")
    assert spec.workload is not None
    extra = dataclasses.replace(spec.workload, with_packages=(f"{PACKAGE}=={VERSION}",))
    spec = dataclasses.replace(spec, workload=extra)
    life, recorder, error = wheel_rig.run(spec)
    assert error is None, getattr(error, "output_tail", error)
    said = [line for stream, line in recorder.output if stream == COMMAND_STREAM]
    assert f"hello from {PACKAGE} {VERSION}" in said
    phases = [p.phase for p in recorder.phases]
    assert phases.index(Phase.VERIFY) < phases.index(Phase.INSTALL) < phases.index(Phase.WORKLOAD)
    assert life.outcome.bootstrap is not None
    extras = life.outcome.bootstrap.extras
    assert extras is not None
    assert extras.versions == {PACKAGE: VERSION}
    assert not extras.install.startswith("skipped")
    record = read_run_record(out / "run.json")
    assert record.workload.extras == {PACKAGE: VERSION}
    assert wheel_rig.leftovers() == []


def test_extras_install_once_then_a_rerun_installs_nothing(kind: str, tmp_path: Path) -> None:
    from ssh_fixtures import start_host

    backend = wheelhouse_backend(kind, tmp_path)
    try:
        host = start_host(backend, tmp_path / "sandbox")
        with host.connect() as shell:
            boot.bootstrap(shell, platform="cpu", python=boot.SYSTEM_PYTHON, timeout=300)
            wanted = boot.Extras((PACKAGE,))
            first = boot.install_extras(shell, wanted, timeout=300)
            second = boot.install_extras(shell, wanted, timeout=300)
            missing = boot.Extras((PACKAGE, "no-such-package-anywhere"))
            with pytest.raises(BootstrapError) as refused:
                boot.install_extras(shell, missing, timeout=300)
    finally:
        backend.close()
    assert first.install == "uv"
    assert first.versions == {PACKAGE: VERSION}
    assert second.install == "skipped (already satisfied)"
    assert second.versions == {PACKAGE: VERSION}
    assert refused.value.packages == ("no-such-package-anywhere",)
    assert "no-such-package-anywhere" in refused.value.message


def test_a_drop_during_the_install_installs_again(wheel_rig: Rig, tmp_path: Path) -> None:
    """The connection cut once the extras step has printed its first line: the step is
    made again (after the one left running, which holds the venv's lock) and the command
    imports the package."""
    from collections.abc import Sequence
    from typing import Any

    from cut_connection import CutConnection
    from test_workload_e2e import with_workload, workspace

    from tpulab.remote.keys import RunKey, SshTarget
    from tpulab.remote.ssh import RunResult
    from tpulab.run.progress import NullObserver

    class DropsDuringTheInstall(CutConnection):
        cut = False

        def run(self, argv: Sequence[str] | str, **kwargs: Any) -> RunResult:
            shown = kwargs.get("on_line")
            extras = boot.extras_command(boot.Extras(()))
            if self.cut or list(argv[:3]) != extras[:3] or shown is None:
                return super().run(argv, **kwargs)

            def on_line(stream: str, line: str) -> None:
                shown(stream, line)
                if not self.cut:
                    self.cut = True
                    self.cut_now()

            return super().run(argv, **{**kwargs, "on_line": on_line})

    class Notes(NullObserver):
        def __init__(self) -> None:
            self.said: list[str] = []

        def note(self, message: str) -> None:
            self.said.append(message)

    made: list[DropsDuringTheInstall] = []

    def connect(target: SshTarget, key: RunKey) -> DropsDuringTheInstall:
        made.append(DropsDuringTheInstall(target, key))
        return made[-1]

    work = workspace(tmp_path, {"use.py": f"import {MODULE}\nprint({MODULE}.MESSAGE)\n"})
    spec = with_workload(wheel_rig.spec(), work, tmp_path / "out", "python", "use.py")
    assert spec.workload is not None
    extra = dataclasses.replace(spec.workload, with_packages=(f"{PACKAGE}=={VERSION}",))
    notes = Notes()
    life, recorder, error = wheel_rig.run(
        dataclasses.replace(spec, workload=extra), notes, connect=connect
    )
    assert error is None, getattr(error, "output_tail", error)
    (connection,) = made
    assert connection.cut
    assert connection.connects == 2
    assert any(n.startswith("the SSH connection dropped during the install") for n in notes.said)
    said = [line for stream, line in recorder.output if stream == COMMAND_STREAM]
    assert f"hello from {PACKAGE} {VERSION}" in said
    assert life.outcome.teardown_status == "confirmed"
    assert wheel_rig.leftovers() == []
