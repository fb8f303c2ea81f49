"""The bootstrap's two ways to a CPU jax venv on a bare image, cold and warm, same run:

- "uv-managed": what tpulab does by default: `python3 -m pip install --user uv`, then
  `uv venv --python <newer local python>` and `uv pip install jax numpy`;
- "venv + pip": the image's own way: `python3 -m venv` and `pip install -U jax numpy`
  (on the image's 3.10, which also resolves an older jax).

Runs the bootstrap's own remote commands (`bootstrap.uv_command`, `venv_command`,
`install_command`) locally in a scratch HOME under the emulator's bare image
environment (`hostenv.bare_image_env`: python3 3.10, no jax, no uv). Cold: empty package
caches; warm: ROUNDS more fresh HOMEs sharing the caches the cold run filled. Prints the
median seconds per step and the resolved python/jax. It needs PyPI; without it the
benchmark is skipped. The smoke run (tests/benchmarks/smoke.py) does one warm round per
strategy on the suite's shared caches (`hostenv.default_cache_dir()`, which the bare-image
tests fill) and no cold one: the same commands, half the installs, no download.

Run: `pytest tests/benchmarks/bench_bootstrap.py -s` (or `nox -s bench`).
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from benchmarks.smoke import SMOKE, rounds
from tpulab.config.python import SYSTEM_PYTHON
from tpulab.emulator.hostenv import (
    bare_image_env,
    default_cache_dir,
    local_pythons,
    session_env,
)
from tpulab.remote import bootstrap as boot

ROUNDS = rounds(2)


def _pypi_reachable() -> bool:
    try:
        with urllib.request.urlopen("https://pypi.org/simple/jax/", timeout=10) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def _timed(argv: list[str], home: Path, env: dict[str, str]) -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run(
        argv, cwd=home, env=env, capture_output=True, text=True, timeout=1800, check=False
    )
    elapsed = time.perf_counter() - started
    assert done.returncode == 0, f"{argv[:3]}...\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    return elapsed, done.stdout


Strategy = tuple[str, boot.Installer, str]  # (label, installer, python request)


def _one(strategy: Strategy, home: Path, env: dict[str, str]) -> dict[str, float | str]:
    _, installer, python = strategy
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    uv_s = 0.0
    if boot.needs_uv(python, installer):
        uv_s, _ = _timed(boot.uv_command(), home, env)
    venv_s, made = _timed(boot.venv_command(installer, python), home, env)
    assert "TPULAB_VENV " in made, made
    install_s, _ = _timed(boot.install_command("cpu", installer), home, env)
    _, probed = _timed(boot.probe_command(), home, env)
    versions = json.loads(probed.split("TPULAB_VERSIONS ", 1)[1])
    return {
        "uv_s": uv_s,
        "venv_s": venv_s,
        "install_s": install_s,
        "total_s": uv_s + venv_s + install_s,
        "python": versions["python"],
        "jax": versions["jax"],
    }


@pytest.mark.slow
@pytest.mark.network  # the bare image's installs, cold then warm, from the package index
# Four installs from the package index: pytest's 300 s default is a timing for them (one
# ran past it at load 8-14), not a bound; this is, under the 1800 s each install allows.
@pytest.mark.timeout(900)
def test_uv_managed_python_vs_venv_and_pip(tmp_path: Path) -> None:
    if not _pypi_reachable():
        pytest.skip("PyPI is not reachable: the install benchmark needs it")
    newer = sorted(local_pythons(), key=lambda v: tuple(map(int, v.split("."))))
    if not newer:
        pytest.skip("no local python newer than the image's to stand in for uv's download")
    strategies: list[Strategy] = [
        ("uv-managed", "uv", newer[-1]),
        ("venv + pip", "pip", SYSTEM_PYTHON),
    ]
    rows: dict[str, dict[str, dict[str, float | str]]] = {}
    for strategy in strategies:
        label = strategy[0]
        # Empty for the figures, so the first round is cold; the smoke run has no cold
        # round and takes the caches every emulated node shares.
        cache = default_cache_dir() if SMOKE else tmp_path / f"cache-{strategy[1]}"
        image = bare_image_env(tmp_path / "image", cache_dir=cache)
        home = tmp_path / "home"
        env = session_env(image, home, "bench")
        rows[label] = {} if SMOKE else {"cold": _one(strategy, home, env)}
        warm = [_one(strategy, home, env) for _ in range(ROUNDS)]
        median = {
            key: statistics.median(float(w[key]) for w in warm)
            for key in ("uv_s", "venv_s", "install_s", "total_s")
        }
        rows[label]["warm"] = {**median, "python": warm[0]["python"], "jax": warm[0]["jax"]}
    print(f"\nCPU jax venv on the bare image ({image.name}); warm = median of {ROUNDS}")
    print(f"{'strategy':<12}{'cache':<6}{'uv s':>7}{'venv s':>8}{'install s':>11}{'total s':>9}"
          f"  python / jax")  # fmt: skip
    for label, both in rows.items():
        for kind, row in both.items():
            print(
                f"{label:<12}{kind:<6}{float(row['uv_s']):>7.2f}{float(row['venv_s']):>8.2f}"
                f"{float(row['install_s']):>11.2f}{float(row['total_s']):>9.2f}"
                f"  {row['python']} / jax {row['jax']}"
            )

    def total(label: str, kind: str) -> float:
        return float(rows[label][kind]["total_s"])

    ratios = [
        f"{total('venv + pip', kind) / total('uv-managed', kind):.1f}x {kind}"
        for kind in rows["uv-managed"]
    ]
    print(
        f"venv + pip / uv-managed: {', '.join(ratios)} "
        "(whole bootstrap; printed, not asserted: timings)"
    )
