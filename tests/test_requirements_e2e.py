"""A workspace `requirements.txt` with `-r base.txt` and `-e ./pkg` installs on the VM
as `pip install -r requirements.txt` does in the workspace on the laptop.

The real lifecycle on the emulator, both SSH backends: base.txt names a package only a
local index has (tests/test_workload_extras.py builds it), and ./pkg is a tiny project
whose build backend lives in the project itself (PEP 517 `backend-path`, stdlib only), so
the editable install builds for real, offline. The command imports both. Before this, the
file's text was staged alone under ~/jax-tpu-lab and pip ran from HOME, so `-r base.txt`
was looked for beside the staged copy and failed after the VM was created.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from test_workload_extras import MODULE, PACKAGE, VERSION, kind, wheel_rig

from tpulab.config.requirements import read_requirements
from tpulab.remote.workload import WORKSPACE_DIR
from tpulab.run.progress import COMMAND_STREAM, Phase

if TYPE_CHECKING:
    from run_rig import Rig

pytest_plugins = ["emulator_fixtures", "ssh_fixtures", "run_rig"]
pytestmark = pytest.mark.slow
__all__ = ["kind", "wheel_rig"]  # the fixtures this module borrows

LOCAL = "tpulab_local_pkg"

# PEP 517 build_wheel and PEP 660 build_editable in the standard library only: no build
# requirement to fetch, so the project builds on an offline VM as it would on any.
BACKEND = f'''
import base64, hashlib, os, zipfile

NAME, VERSION, MODULE = "tpulab-local-pkg", "0.1.0", "{LOCAL}"
INFO = f"{{MODULE}}-{{VERSION}}.dist-info"
HERE = os.path.dirname(os.path.abspath(__file__))


def _wheel(directory, files):
    files = dict(files)
    files[f"{{INFO}}/METADATA"] = (
        f"Metadata-Version: 2.1\\nName: {{NAME}}\\nVersion: {{VERSION}}\\n"
    )
    files[f"{{INFO}}/WHEEL"] = (
        "Wheel-Version: 1.0\\nGenerator: tests\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n"
    )
    name = f"{{MODULE}}-{{VERSION}}-py3-none-any.whl"
    record = []
    with zipfile.ZipFile(os.path.join(directory, name), "w") as archive:
        for path, text in files.items():
            data = text.encode()
            archive.writestr(path, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            record.append(f"{{path}},sha256={{digest.decode()}},{{len(data)}}")
        record.append(f"{{INFO}}/RECORD,,")
        archive.writestr(f"{{INFO}}/RECORD", "\\n".join(record) + "\\n")
    return name


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    with open(os.path.join(HERE, MODULE, "__init__.py")) as handle:
        return _wheel(wheel_directory, {{f"{{MODULE}}/__init__.py": handle.read()}})


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    return _wheel(wheel_directory, {{f"_{{MODULE}}.pth": HERE + "\\n"}})
'''

PYPROJECT = """
[build-system]
requires = []
build-backend = "tiny_backend"
backend-path = ["."]

[project]
name = "tpulab-local-pkg"
version = "0.1.0"
"""

USE = f"""
import {MODULE}, {LOCAL}
print({MODULE}.MESSAGE)
print("local package from", {LOCAL}.__file__)
"""


def test_nested_file_and_editable_project_resolve_in_the_synced_workspace(
    wheel_rig: Rig, tmp_path: Path
) -> None:
    from test_workload_e2e import with_workload, workspace

    work = workspace(
        tmp_path,
        {
            "requirements.txt": "# as on the laptop\n-r base.txt\n-e ./pkg\n",
            "base.txt": f"{PACKAGE}=={VERSION}\n",
            "pkg/pyproject.toml": PYPROJECT,
            "pkg/tiny_backend.py": BACKEND,
            f"pkg/{LOCAL}/__init__.py": "",
            "use.py": USE,
        },
    )
    out = tmp_path / "out"
    spec = with_workload(wheel_rig.spec(), work, out, "python", "use.py")
    assert spec.workload is not None
    reqs = read_requirements(work / "requirements.txt", workdir=work, cwd=work)
    spec = dataclasses.replace(spec, workload=dataclasses.replace(spec.workload, requirements=reqs))
    life, recorder, error = wheel_rig.run(spec)
    assert error is None, getattr(error, "output_tail", error)
    said = [line for stream, line in recorder.output if stream == COMMAND_STREAM]
    assert f"hello from {PACKAGE} {VERSION}" in said
    # Editable: imported from the synced workspace itself, not from a copy in the venv.
    (where,) = [line for line in said if line.startswith("local package from")]
    assert where.endswith(f"{WORKSPACE_DIR}/pkg/{LOCAL}/__init__.py"), where
    phases = [p.phase for p in recorder.phases]
    assert phases.index(Phase.VERIFY) < phases.index(Phase.SYNC) < phases.index(Phase.INSTALL)
    assert life.outcome.bootstrap is not None
    extras = life.outcome.bootstrap.extras
    assert extras is not None
    assert extras.versions == {PACKAGE: VERSION}  # base.txt's package, probed by name
    assert wheel_rig.leftovers() == []


def test_a_nested_file_edited_installs_again_and_a_failure_names_the_file(
    kind: str, tmp_path: Path
) -> None:
    from ssh_fixtures import start_host
    from test_workload_extras import wheelhouse_backend

    from tpulab.errors import BootstrapError
    from tpulab.remote import bootstrap as boot

    def extras(files: dict[str, str]) -> boot.Extras:
        for name, text in files.items():
            (synced / name).parent.mkdir(parents=True, exist_ok=True)
            (synced / name).write_text(text)
        return boot.Extras(
            (),
            files.get("requirements.txt", (synced / "requirements.txt").read_text()),
            nested_texts=((synced / "base.txt").read_text(),),
            requirements_path="requirements.txt",
            install_dir=WORKSPACE_DIR,
        )

    backend = wheelhouse_backend(kind, tmp_path)
    sandbox = tmp_path / "sandbox"
    synced = sandbox / WORKSPACE_DIR  # what the sync leaves on the VM
    try:
        host = start_host(backend, sandbox)
        with host.connect() as shell:
            boot.bootstrap(shell, platform="cpu", python=boot.SYSTEM_PYTHON, timeout=300)
            wanted = extras({"requirements.txt": "-r base.txt\n", "base.txt": PACKAGE + "\n"})
            first = boot.install_extras(shell, wanted, timeout=300)
            again = boot.install_extras(shell, wanted, timeout=300)
            # Only base.txt changes: the stamp covers it, so the next install runs.
            with pytest.raises(BootstrapError) as missing:
                boot.install_extras(shell, extras({"base.txt": "no-such-package\n"}), timeout=300)
            # A file naming no package by name still says what failed.
            broken = extras(
                {
                    "base.txt": "",
                    "requirements.txt": "-r base.txt\n-e ./broken\n",
                    "broken/pyproject.toml": "[build-system]\nrequires = []\n"
                    'build-backend = "no_such_backend"\n',
                }
            )
            with pytest.raises(BootstrapError) as unbuildable:
                boot.install_extras(shell, broken, timeout=300)
    finally:
        backend.close()
    assert (first.install, first.versions) == ("uv", {PACKAGE: VERSION})
    assert again.install == "skipped (already satisfied)"
    assert missing.value.packages == ("no-such-package",)
    assert "no-such-package could not be installed" in missing.value.message
    assert "the requirements of requirements.txt could not be installed" in (
        unbuildable.value.message
    )
