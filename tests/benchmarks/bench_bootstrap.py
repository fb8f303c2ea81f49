"""pip against uv for the bootstrap's CPU jax install: real installs into scratch venvs.

Runs the bootstrap's own remote commands (`bootstrap.venv_command` and
`install_command`) locally in a scratch HOME, once with a cold package cache and then
ROUNDS times warm (a fresh venv each time, the cache kept), for each installer. Prints
the medians and the ratio. It needs PyPI; without it the benchmark is skipped.

Run: `pytest tests/benchmarks/bench_bootstrap.py -s` (or `nox -s bench`).
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tpulab.remote import bootstrap as boot

ROUNDS = 3


def _pypi_reachable() -> bool:
    try:
        with urllib.request.urlopen("https://pypi.org/simple/jax/", timeout=10) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


# Kept from this environment: certificates and proxies (both installers need them).
_PASS = ("SSL_CERT_FILE", "SSL_CERT_DIR", "PIP_CERT", "HTTPS_PROXY", "https_proxy", "NO_PROXY")


def _env(home: Path, cache: Path) -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)  # python3 and uv, as on the emulated image
    return {
        **{name: os.environ[name] for name in _PASS if name in os.environ},
        # Both resolve from PyPI: no machine-wide pip.conf mirrors or local wheel dirs.
        "PIP_CONFIG_FILE": os.devnull,
        "HOME": str(home),
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "PIP_CACHE_DIR": str(cache / "pip"),
        "UV_CACHE_DIR": str(cache / "uv"),
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "LANG": "C.UTF-8",
    }


def _timed(argv: list[str], home: Path, env: dict[str, str]) -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run(
        argv, cwd=home, env=env, capture_output=True, text=True, timeout=900, check=False
    )
    elapsed = time.perf_counter() - started
    assert done.returncode == 0, f"{argv[:3]}...\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    return elapsed, done.stdout


def _one(installer: boot.Installer, home: Path, env: dict[str, str]) -> tuple[float, float, str]:
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    venv_s, made = _timed(boot.venv_command(installer), home, env)
    install_s, _ = _timed(boot.install_command("cpu", installer), home, env)
    _, versions = _timed(boot.probe_command(), home, env)
    assert '"jax": "' in versions, versions
    return venv_s, install_s, made.strip().removeprefix("TPULAB_VENV ")


@pytest.mark.slow
def test_pip_vs_uv_cpu_jax_install(tmp_path: Path) -> None:
    if not _pypi_reachable():
        pytest.skip("PyPI is not reachable: the install benchmark needs it")
    rows: dict[str, dict[str, float | str]] = {}
    for installer in boot.INSTALLERS:
        cache = tmp_path / f"cache-{installer}"
        env = _env(tmp_path / "home", cache)
        _, install_cold, how = _one(installer, tmp_path / "home", env)
        warm = [_one(installer, tmp_path / "home", env) for _ in range(ROUNDS)]
        rows[installer] = {
            "venv": how,
            "venv_s": statistics.median(w[0] for w in warm),
            "cold_s": install_cold,
            "warm_s": statistics.median(w[1] for w in warm),
        }
    where = f"python {sys.version.split()[0]}, {os.cpu_count()} cores"
    print(f"\nCPU jax install into a scratch venv ({where})")
    print(f"{'installer':<10}{'venv made by':<24}{'venv s':>8}{'cold s':>9}{'warm s':>9}")
    for name, row in rows.items():
        print(
            f"{name:<10}{row['venv']!s:<24}{row['venv_s']:>8.2f}{row['cold_s']:>9.2f}"
            f"{row['warm_s']:>9.2f}"
        )
    pip, uv = rows["pip"], rows["uv"]
    warm_ratio = float(pip["warm_s"]) / float(uv["warm_s"])
    cold_ratio = float(pip["cold_s"]) / float(uv["cold_s"])
    print(f"uv is {warm_ratio:.1f}x faster warm, {cold_ratio:.1f}x faster cold (install only)")
    # This figure is why bootstrap defaults to uv; it is printed, not asserted (timings).
    faster = "uv" if float(uv["warm_s"]) < float(pip["warm_s"]) else "pip"
    print(f"faster warm installer in this run: {faster} (the default is uv)")
