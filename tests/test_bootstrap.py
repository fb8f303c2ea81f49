"""The remote bootstrap over real SSH, on both host backends, against the emulator's
images: the bare one (like a real TPU VM image: an old python3, no jax, no uv), the
same without ensurepip (Ubuntu lacking python3-venv), and the named preloaded one.

Installs here are real: uv and jax come from the package index, through the shared
package cache of the bare image (`hostenv.default_cache_dir()`), so only the first run
on a machine downloads them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tpulab.config.python import EMULATED_PYTHON, SYSTEM_PYTHON
from tpulab.emulator.hostenv import ImageEnv, ImageKind, find_image_python
from tpulab.emulator.hosts import HostBackend
from tpulab.remote import bootstrap as boot

if TYPE_CHECKING:
    from ssh_fixtures import SshHost

pytest_plugins = ["ssh_fixtures"]

# A bootstrap that installs jax from the package index into a cold cache takes minutes on
# a slow network. This bound, not pytest-timeout's 300 s (pyproject.toml), is what ends a
# hang, with the bootstrap's own error: the tests that install mark their timeout above it.
INSTALL_BOUND = 900

BackendFactory = Callable[[ImageEnv | ImageKind], HostBackend]


@pytest.fixture(params=["embedded", pytest.param("openssh", marks=pytest.mark.openssh)])
def make_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BackendFactory]:
    started: list[HostBackend] = []

    def make(image: ImageEnv | ImageKind) -> HostBackend:
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


@pytest.fixture
def embedded_bare(tmp_path: Path) -> Iterator[HostBackend]:
    from tpulab.emulator.sshhost import EmbeddedHostBackend

    backend = EmbeddedHostBackend(tmp_path / "hosts")  # the default image: bare
    yield backend
    backend.close()


def host_on(
    backend: HostBackend,
    sandbox: Path,
    *,
    ensurepip_missing: bool = False,
    node_key: str = "node-1",
) -> SshHost:
    from ssh_fixtures import METADATA_USER, SshHost, login_user

    from tpulab.remote.keys import RunKey

    key = RunKey()
    endpoint = backend.start(
        node_key, sandbox, key.metadata_entry(METADATA_USER), ensurepip_missing=ensurepip_missing
    )
    return SshHost(backend, endpoint, sandbox, key, login_user(backend, METADATA_USER))


def _minor(version: str | None) -> tuple[int, int]:
    assert version, "no version reported"
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def test_a_fresh_bare_node_has_the_image_python_and_no_jax_no_uv(
    make_backend: BackendFactory, tmp_path: Path
) -> None:
    host = host_on(make_backend("bare"), tmp_path / "vm")
    _, image_version = find_image_python()
    with host.connect() as shell:
        version = shell.run(
            ["python3", "-c", "import platform; print(platform.python_version())"], timeout=30
        )
        jax = shell.run(["python3", "-c", "import jax"], timeout=30)
        uv = shell.run(["sh", "-c", "command -v uv"], timeout=30)
        path = shell.run(["sh", "-c", 'printf %s "$PATH"'], timeout=30)
        named = shell.run(["sh", "-c", 'printf %s "$TPULAB_EMULATED_IMAGE"'], timeout=30)
    assert version.stdout.strip() == image_version
    from helpers import require_python

    # TPU VM images are Ubuntu 22.04 with 3.10: the suite needs one (README, Development).
    require_python("3.10")
    assert image_version.startswith("3.10.")
    assert jax.exit_status != 0
    assert "No module named 'jax'" in jax.stderr
    assert uv.exit_status != 0, f"uv is on the bare image's PATH: {uv.stdout}"
    assert str(Path(sys.executable).parent) not in path.stdout.split(":")
    assert named.stdout.startswith(f"bare (python3 {image_version}")


def test_bare_bootstrap_installs_jax_on_a_newer_python_then_is_a_no_op(
    make_backend: BackendFactory, tmp_path: Path
) -> None:
    host = host_on(make_backend("bare"), tmp_path / "vm")
    notes: list[str] = []
    with host.connect() as shell:
        first = boot.bootstrap(
            shell, platform="cpu", python=EMULATED_PYTHON, timeout=600, note=notes.append
        )
        second = boot.bootstrap(shell, platform="cpu", python=EMULATED_PYTHON, timeout=120)
        where = shell.run(
            [boot.VENV_PYTHON, "-c", "import jax, sys; print(jax.__file__); print(sys.prefix)"],
            timeout=120,
        )
        # Asking for another python replaces the venv rather than keeping a wrong one...
        system = shell.run(boot.venv_command("uv", SYSTEM_PYTHON), timeout=120)
        again = shell.run(boot.venv_command("uv", SYSTEM_PYTHON), timeout=120)
        system_python = shell.run(
            [boot.VENV_PYTHON, "-c", "import platform; print(platform.python_version())"],
            timeout=60,
        )
    _, image_version = find_image_python()
    # uv was not on the image: the bootstrap installed it user-level with the image's pip.
    assert str(first.uv).startswith("installed "), first.uv
    assert first.uv is not None
    assert first.uv.endswith("(python3 -m pip install --user uv)")
    assert first.venv_path == f"uv venv --python {EMULATED_PYTHON}"
    assert first.install == "uv"  # installed from the index, not found preloaded
    assert _minor(first.versions["python"]) >= (3, 11)
    for package in ("jax", "jaxlib", "numpy"):
        assert first.versions[package], package
    assert first.versions["libtpu"] is None
    assert first.image_python == image_version
    assert str(first.image_kind).startswith("bare")
    assert any(n.startswith("installed with uv: python 3.") for n in notes), notes
    # The second bootstrap on the ready venv changes nothing.
    assert second.venv_path == "existing"
    assert second.install == "skipped (already satisfied)"
    assert second.versions == first.versions
    # jax lives in the node's own venv, not in the controller's site-packages.
    jax_file, prefix = where.stdout.split()
    assert Path(jax_file).is_relative_to(host.sandbox.resolve())
    assert Path(prefix).is_relative_to(host.sandbox.resolve())
    # ...and asking for the same one again keeps it.
    assert "TPULAB_VENV uv venv" in system.stdout, system.stderr
    assert "recreating" in system.stderr
    assert "TPULAB_VENV existing" in again.stdout
    assert system_python.stdout.strip() == image_version


@pytest.mark.longest
@pytest.mark.timeout(INSTALL_BOUND + 240)  # the install's bound and the probes' around it
def test_missing_ensurepip_with_the_system_python_falls_back_and_names_it(
    embedded_bare: HostBackend, tmp_path: Path
) -> None:
    host = host_on(embedded_bare, tmp_path / "vm", ensurepip_missing=True)
    lines: list[tuple[str, str]] = []
    with host.connect() as shell:
        refused = shell.run(["python3", "-m", "venv", "probe-venv"], timeout=60)
        # pip preferred: `python3 -m venv` is tried first and must fail over (no uv here).
        result = boot.bootstrap(
            shell,
            platform="cpu",
            installer="pip",
            python=SYSTEM_PYTHON,
            timeout=INSTALL_BOUND,
            on_line=lambda stream, line: lines.append((stream, line)),
        )
        check = shell.run(
            [boot.VENV_PYTHON, "-c", "import jax; print(jax.__version__)"], timeout=120
        )
    assert refused.exit_status != 0
    assert "ensurepip is not" in refused.stdout + refused.stderr
    assert result.uv is None  # neither the python nor the installer asked for uv
    assert result.venv_path == "venv --without-pip + the image pip (ensurepip missing)"
    assert result.install == "pip"
    assert str(result.image_kind).endswith("without ensurepip")
    assert any("ensurepip is not" in line for _, line in lines)
    _, image_version = find_image_python()
    assert result.versions["python"] == image_version
    assert check.exit_status == 0, check.stderr
    assert check.stdout.strip() == result.versions["jax"]


def _image_without_pip(directory: Path) -> ImageEnv:
    """A bare-like image whose python3 has no pip, so uv cannot be installed."""
    python, _ = find_image_python()
    bin_dir = directory / "no-pip-bin"
    bin_dir.mkdir(parents=True)
    wrapper = bin_dir / "python3"
    wrapper.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = -m ] && [ "$2" = pip ]; then\n'
        '  echo "/usr/bin/python3: No module named pip" >&2; exit 1\n'
        "fi\n"
        f'exec {python} "$@"\n'
    )
    wrapper.chmod(0o755)
    return ImageEnv(path=(str(bin_dir), "/usr/bin", "/bin"), name="no pip")


def test_without_uv_the_venv_falls_back_to_the_image_python_and_says_so(
    embedded_bare: HostBackend, tmp_path: Path
) -> None:
    from tpulab.emulator.sshhost import EmbeddedHostBackend

    backend = EmbeddedHostBackend(tmp_path / "nopip", image=_image_without_pip(tmp_path))
    try:
        host = host_on(backend, tmp_path / "vm")
        with host.connect() as shell:
            uv = shell.run(boot.uv_command(), timeout=60)
            made = shell.run(boot.venv_command("uv", "3.12"), timeout=120)
            again = shell.run(boot.venv_command("uv", "3.12"), timeout=120)
    finally:
        backend.close()
    _, image_version = find_image_python()
    assert "TPULAB_UV none (the image python3 has no pip to install uv with)" in uv.stdout
    assert made.exit_status == 0, made.stderr
    assert "TPULAB_VENV python3 -m venv" in made.stdout
    note = f"TPULAB_NOTE uv unavailable: the image python3 {image_version} instead of python 3.12"
    assert note in made.stdout
    assert "expect an older jax" in made.stderr
    # Still unable to honour 3.12, the fallback venv is kept, not rebuilt on every run.
    assert "TPULAB_VENV existing" in again.stdout


def test_the_preloaded_image_is_named_and_skips_the_install(
    make_backend: BackendFactory, tmp_path: Path
) -> None:
    host = host_on(make_backend("preloaded"), tmp_path / "vm")
    with host.connect() as shell:
        result = boot.bootstrap(shell, platform="cpu", python=SYSTEM_PYTHON, timeout=120)
    import importlib.metadata

    assert str(result.image_kind).startswith("preloaded")
    assert result.install.startswith("skipped")
    assert result.versions["jax"] == importlib.metadata.version("jax")


def test_commands_quote_their_arguments() -> None:
    install = boot.install_command("tpu", "uv")
    assert install[:2] == ["sh", "-c"]
    assert install[-2:] == ["jax[tpu]", "numpy"]  # positional parameters, never pasted
    # An emulated (CPU) node gets the newest CPU jax, as a TPU VM gets the newest jax[tpu].
    assert boot.install_command("cpu", "pip")[-2:] == ["jax", "numpy"]
    assert boot.install_command("cpu", "uv", "0.12.1")[-2:] == ["jax==0.12.1", "numpy"]
    assert boot.install_command("tpu", "uv", "0.6.2")[-2:] == ["jax[tpu]==0.6.2", "numpy"]
    venv = boot.venv_command("pip", ">=3.11")
    assert venv[4:8] == [boot.LAB_DIR, boot.VENV_DIR, ">=3.11", "pip"]
    assert ">=3.11" not in venv[2]
    assert "jax[tpu]" not in boot.install_command("tpu")[2]
    assert boot.needs_uv(SYSTEM_PYTHON, "pip") is False
    assert boot.needs_uv("3.12", "pip") is True


def test_a_malformed_python_request_never_reaches_a_script() -> None:
    from tpulab.errors import ConfigError

    with pytest.raises(ConfigError, match="--python"):
        boot.venv_command("uv", "3.12; rm -rf ~")


@pytest.mark.longest
@pytest.mark.slow
@pytest.mark.timeout(2 * INSTALL_BOUND + 60)  # three installs at once, then a fourth
def test_nodes_installing_at_once_share_one_cold_cache_then_hit_it(tmp_path: Path) -> None:
    """uv's and pip's caches are shared by every node (the bare image points them at one
    directory): several nodes filling an empty one at once must all end with a working
    venv, and a later node must install from it without downloading anything."""
    from concurrent.futures import ThreadPoolExecutor

    from tpulab.emulator.sshhost import EmbeddedHostBackend

    cache = tmp_path / "cache"  # empty: the cold case, where concurrent writers meet
    backend = EmbeddedHostBackend(tmp_path / "hosts", cache_dir=cache)
    try:
        hosts = [
            host_on(backend, tmp_path / f"vm{number}", node_key=f"node-{number}")
            for number in range(4)
        ]

        def install(host: SshHost) -> tuple[boot.BootstrapResult, str]:
            lines: list[str] = []
            with host.connect() as shell:
                result = boot.bootstrap(
                    shell,
                    platform="cpu",
                    python=EMULATED_PYTHON,
                    timeout=INSTALL_BOUND,
                    on_line=lambda _stream, line: lines.append(line),
                )
            return result, "\n".join(lines)

        with ThreadPoolExecutor(max_workers=3) as pool:
            at_once = list(pool.map(install, hosts[:3]))
        later, later_output = install(hosts[3])
    finally:
        backend.close()
    for result, _ in at_once:
        assert result.install == "uv"
        assert result.versions == at_once[0][0].versions
    assert later.versions == at_once[0][0].versions
    assert any((cache / "uv").iterdir())
    assert "Downloading" not in later_output, later_output  # all from the shared cache
