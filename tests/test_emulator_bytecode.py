"""Bytecode in the bare image's shared uv cache (tpulab/emulator/bytecode.py).

The premise is uv's: a venv installed from the cache gets the archive's `__pycache__`
hard-linked with its sources, so bytecode compiled once in the cache is valid in every
venv. The last test pins that with a real uv and a wheel built here; if a uv release
stops linking it, that test says so (the emulator would only be slower).
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from uv import find_uv_bin

from tpulab.emulator.bytecode import marker_name, start_warming, unmarked_archives, warm
from tpulab.emulator.hostenv import bare_image_env

TAG = sys.implementation.cache_tag


def _archive(archives: Path, name: str) -> Path:
    package = archives / name / "toypkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("VALUE = 42\n")
    (package / "broken.py").write_text("def (:\n")  # compiles for no Python
    return package


def _pyc(package: Path, module: str) -> Path:
    return package / "__pycache__" / f"{module}.{TAG}.pyc"


def test_warm_compiles_each_unmarked_archive_once(tmp_path: Path) -> None:
    archives, markers = tmp_path / "archive-v0", tmp_path / "bytecode"
    markers.mkdir()
    package = _archive(archives, "a1")
    assert unmarked_archives(archives, markers, TAG) == ["a1"]
    assert warm(archives, markers) == ["a1"]
    assert _pyc(package, "__init__").is_file()
    assert not _pyc(package, "broken").exists()  # left as its import would leave it
    assert (markers / marker_name("a1", TAG)).is_file()
    assert not list((archives / "a1").glob(f"*{TAG}*"))  # no marker inside an archive
    assert unmarked_archives(archives, markers, TAG) == []
    second = _archive(archives, "a2")
    assert warm(archives, markers) == ["a2"]  # only the new one
    assert _pyc(second, "__init__").is_file()


def test_warm_leaves_at_once_while_another_process_warms(tmp_path: Path) -> None:
    archives, markers = tmp_path / "archive-v0", tmp_path / "bytecode"
    markers.mkdir()
    package = _archive(archives, "a1")
    with open(markers / "lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        assert warm(archives, markers) == []
    assert not _pyc(package, "__init__").exists()
    assert unmarked_archives(archives, markers, TAG) == ["a1"]


def test_start_warming_runs_the_script_detached_and_only_when_needed(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    assert start_warming(cache, Path(sys.executable), TAG) is None  # no cache yet
    package = _archive(cache / "uv" / "archive-v0", "a1")
    process = start_warming(cache, Path(sys.executable), TAG)
    assert process is not None
    assert process.wait(timeout=60) == 0
    assert _pyc(package, "__init__").is_file()
    assert start_warming(cache, Path(sys.executable), TAG) is None  # marked now


def _wheel(directory: Path) -> Path:
    """A pure-Python wheel of one module, `toywheel`, built by hand (no build backend)."""
    files = {
        "toywheel/__init__.py": b"VALUE = 7\n",
        "toywheel-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: toywheel\nVersion: 1.0\n",
        "toywheel-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\n"
        b"Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append("toywheel-1.0.dist-info/RECORD,,")
    path = directory / "toywheel-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for name, data in files.items():
            wheel.writestr(name, data)
        wheel.writestr("toywheel-1.0.dist-info/RECORD", "\n".join(record) + "\n")
    return path


def _uv(*args: str, cache: Path) -> None:
    env = {**os.environ, "UV_CACHE_DIR": str(cache), "UV_PYTHON_DOWNLOADS": "never"}
    env.pop("UV_COMPILE_BYTECODE", None)  # the venvs of emulated nodes are not compiled
    subprocess.run([find_uv_bin(), *args], env=env, check=True, capture_output=True)


def test_a_venv_installed_from_a_warmed_cache_gets_its_bytecode(tmp_path: Path) -> None:
    cache, wheel = tmp_path / "cache", _wheel(tmp_path)
    for venv in ("first", "second"):
        _uv("venv", "-q", "-p", sys.executable, str(tmp_path / venv), cache=cache / "uv")
    python = tmp_path / "first" / "bin" / "python"
    _uv("pip", "install", "-q", "--python", str(python), str(wheel), cache=cache / "uv")
    process = start_warming(cache, Path(sys.executable), TAG)
    assert process is not None, "uv did not unpack the wheel into its archive-v0"
    assert process.wait(timeout=60) == 0
    second = tmp_path / "second" / "bin" / "python"
    _uv("pip", "install", "-q", "--python", str(second), str(wheel), cache=cache / "uv")
    site = subprocess.run(
        [str(second), "-c", "import toywheel, sys; print(toywheel.__file__)"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    pyc = _pyc(Path(site).parent, "__init__")
    assert pyc.is_file(), "uv no longer links an archive's __pycache__ into a venv"
    assert pyc.stat().st_nlink > 1  # the cache's own file, not one the import wrote


def test_a_cache_that_cannot_hold_bytecode_still_boots_the_image(tmp_path: Path) -> None:
    # A file where the markers go (or a read-only cache) only costs time: the image
    # is made, and its nodes compile at import as a real VM does.
    cache = tmp_path / "cache"
    _archive(cache / "uv" / "archive-v0", "a1")
    (cache / "bytecode").write_text("not a directory")
    image = bare_image_env(tmp_path / "image", cache_dir=cache)
    assert image.name.startswith("bare")
    assert (cache / "bytecode").read_text() == "not a directory"
