"""The remote bootstrap over real SSH, on both host backends and on two host images:
the default emulated image (jax baked in) and one that, like Ubuntu without the
python3-venv package, cannot run `python3 -m venv` because ensurepip is missing."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tpulab.emulator.hostenv import ImageEnv, default_image_env
from tpulab.emulator.hosts import HostBackend
from tpulab.remote import bootstrap as boot

if TYPE_CHECKING:
    from ssh_fixtures import SshHost

pytest_plugins = ["ssh_fixtures"]

# What Ubuntu's python3 answers when python3-venv is not installed (its exact words).
_DEBIAN_REFUSAL = (
    "The virtual environment was not created successfully because ensurepip is not\n"
    "available.  On Debian/Ubuntu systems, you need to install the python3-venv\n"
    "package using the following command.\n\n    apt install python3.10-venv\n"
)

BackendFactory = Callable[[ImageEnv], HostBackend]


@pytest.fixture(params=["embedded", pytest.param("openssh", marks=pytest.mark.openssh)])
def make_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BackendFactory]:
    started: list[HostBackend] = []

    def make(image: ImageEnv) -> HostBackend:
        if request.param == "openssh":
            from helpers import require_tool
            from ssh_fixtures import sshd_available

            from tpulab.emulator.openssh import OpenSshHostBackend

            require_tool(sshd_available(), "OpenSSH server")
            backend: HostBackend = OpenSshHostBackend(tmp_path / "hosts", image=image)
        else:
            from tpulab.emulator.sshhost import EmbeddedHostBackend

            backend = EmbeddedHostBackend(tmp_path / "hosts", image=image)
        started.append(backend)
        return backend

    yield make
    for backend in started:
        backend.close()


def host_on(backend: HostBackend, sandbox: Path) -> SshHost:
    from ssh_fixtures import start_host

    return start_host(backend, sandbox)


def test_fresh_host_gets_a_venv_then_bootstrap_is_a_no_op(
    make_backend: BackendFactory, tmp_path: Path
) -> None:
    image = default_image_env()
    # The test extra installs uv beside the interpreter, so the image offers it and the
    # bootstrap must take its preferred path.
    assert shutil.which("uv", path=os.pathsep.join(image.path)), "uv missing from the image"
    host = host_on(make_backend(image), tmp_path / "vm")
    notes: list[str] = []
    with host.connect() as shell:
        first = boot.bootstrap(shell, platform="cpu", timeout=120, note=notes.append)
        second = boot.bootstrap(shell, platform="cpu", timeout=120, note=notes.append)
    assert first.venv_path == "uv venv"
    assert first.install.startswith("skipped")
    assert first.versions["jax"] == importlib.metadata.version("jax")
    assert first.versions["numpy"] == importlib.metadata.version("numpy")
    assert first.versions["libtpu"] is None
    assert second.venv_path == "existing"
    assert second.install.startswith("skipped")
    assert (host.sandbox / boot.VENV_PYTHON).exists()
    assert any("install skipped" in note for note in notes)


def debian_like_image(directory: Path) -> ImageEnv:
    """An image whose python3 refuses `-m venv` (with pip) as Ubuntu does without
    python3-venv, and which has uv on PATH (as the fallback will find it)."""
    bin_dir = directory / "image-bin"
    bin_dir.mkdir(parents=True)
    real = os.path.realpath(sys.executable)
    refusal = _DEBIAN_REFUSAL.replace("\n", "\\n")
    wrapper = bin_dir / "python3"
    wrapper.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = -m ] && [ "$2" = venv ]; then\n'
        '  case " $* " in *" --without-pip "*) ;;\n'
        f"    *) printf '{refusal}'; exit 1 ;;\n"
        "  esac\n"
        "fi\n"
        f'exec {real} "$@"\n'
    )
    wrapper.chmod(0o755)
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    assert uv is not None, "the dev environment ships uv"
    (bin_dir / "uv").symlink_to(os.path.realpath(uv))
    base = default_image_env()
    return ImageEnv(path=(str(bin_dir), "/usr/bin", "/bin"), pythonpath=base.pythonpath)


def test_missing_ensurepip_falls_back_and_says_which_path(
    make_backend: BackendFactory, tmp_path: Path
) -> None:
    host = host_on(make_backend(debian_like_image(tmp_path)), tmp_path / "vm")
    lines: list[tuple[str, str]] = []
    with host.connect() as shell:
        # With pip preferred, `python3 -m venv` is tried first and must fail over.
        result = boot.bootstrap(
            shell,
            platform="cpu",
            installer="pip",
            timeout=120,
            on_line=lambda stream, line: lines.append((stream, line)),
        )
        check = shell.run(
            [boot.VENV_PYTHON, "-c", "import jax; print(jax.__version__)"], timeout=60
        )
    assert result.venv_path == "uv venv (ensurepip missing)"
    assert result.install.startswith("skipped")
    assert any("ensurepip is not" in line for _, line in lines)
    assert check.exit_status == 0
    assert check.stdout.strip() == importlib.metadata.version("jax")


def test_commands_quote_their_arguments() -> None:
    install = boot.install_command("tpu", "uv")
    assert install[:2] == ["sh", "-c"]
    assert install[-2:] == ["jax[tpu]", "numpy"]  # positional parameters, never pasted
    assert boot.install_command("cpu", "pip")[-2:] == ["jax", "numpy"]
    assert boot.venv_command("pip")[-3:] == [boot.LAB_DIR, boot.VENV_DIR, "pip"]
    assert "jax[tpu]" not in boot.install_command("tpu")[2]
