"""Developer sessions: `nox -s lint typecheck docs tests` is what CI runs (see README)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import nox

nox.options.default_venv_backend = "uv|virtualenv"
nox.options.sessions = ["lint", "typecheck", "docs", "tests"]
nox.options.reuse_existing_virtualenvs = True


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over everything (remote payloads are held to Python 3.10 by target-version),
    then the import-linter contracts of pyproject.toml: the layers of docs/architecture.md §2."""
    session.install("ruff")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.install("-e", ".", "import-linter")
    session.run("lint-imports")


@nox.session
def docs(session: nox.Session) -> None:
    """The docs site (docs/, mkdocs.yml) built with --strict: a broken link, a page
    missing from the nav or a failing hook fails. The CLI reference page is drawn from
    the typer app at build time, so tpulab itself is installed."""
    session.install("-e", ".", "mkdocs-material")
    # Material prints a banner about its successor on every build; it is not a warning
    # about these docs.
    session.env["NO_MKDOCS_2_WARNING"] = "1"
    site = Path(session.create_tmp()) / "site"
    session.run("mkdocs", "build", "--strict", "--site-dir", str(site))


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy --strict over tpulab, the payloads and the tests."""
    session.install("-e", ".[dev]")
    session.run("mypy", "--strict")


# pytest-xdist workers for `nox -s tests`. The tests are independent (each has its own
# TPULAB_HOME and tmp dirs, servers on port 0), so they can share the cores. They wait
# as well as compute (SSH hosts, subprocesses, emulated operations, real leases and
# idle periods), so more workers than cores pay: a worker asleep in a lease test leaves
# its core to another's CPU. The whole suite on this 2-core machine, same tip, one
# after another (2026-12-06; process accounting, `accton`, for the CPU of every
# process): -n 4 669 s (990 CPU-s: the cores 74 % busy), -n 6 578 s (980 CPU-s, 85 %),
# -n 8 603 s (1,064 CPU-s: each worker's collection and the contention cost more than
# the extra overlap). Earlier: -n 2 took 713 s with two OpenSSH sessions hung until
# their timeouts (2026-12-01), and 1,178 s with no hang (2026-12-06), the cores busy
# only 55 % of it. `nox -s tests -- -n 0` runs them in one process (the last -n wins).
TEST_WORKERS = "6"
# How xdist hands out the tests: "worksteal" gives each worker a contiguous share and
# lets an idle one take half of a busy one's queue, so the long end-to-end tests near
# the end of the collection do not pile onto whichever workers "load" had sent them.
# Measured on 11 files (299 tests, the watchdog and workload e2e among them), -n 4,
# 2026-12-01: load 94 s and 97 s, worksteal 86 s and 87 s. A busy worker keeps the head
# of its share, so tests/conftest.py deals the benchmark smoke runs (the longest single
# tests) one per share, at its head: as collected they all sat in the first one.
TEST_DISTRIBUTION = "worksteal"


@nox.session
def tests(session: nox.Session) -> None:
    """The whole suite, end-to-end tests included (they need sshd and gcloud in CI),
    spread over TEST_WORKERS processes."""
    _install_for_tests(session)
    _payload_python_310(session)
    # The 20 slowest tests close every run's log: where the suite's time goes is on
    # record in each CI run, not only when someone measures it.
    session.run(
        "pytest", "-n", TEST_WORKERS, "--dist", TEST_DISTRIBUTION, "--durations=20",
        *session.posargs,
    )  # fmt: skip


# The edit-test loop's tier (tests/tiers.py marks every test from what it runs): no
# real SSH hosts, whole lifecycles, CLI runs or package-index installs, but the two
# `smoke` tests (one emulated run end to end, one Ctrl-C teardown).
QUICK_TIER = "smoke or not (e2e or network)"
# The quick tier waits more than it computes (its 1,246 tests use ~51 CPU-s; the
# watchdog's VM-path and script tests alone are ~50 s of real leases and polls at ~4
# CPU-s), so more workers than cores overlap the waits, as for the full suite. Same
# machine, 2 cores, 2026-12-06: -n 4 60 s, -n 6 53-58 s, -n 8 61 s (each worker's
# collection is ~3 CPU-s: eight cost more than they overlap).
QUICK_WORKERS = "6"


@nox.session
def quick(session: nox.Session) -> None:
    """The fast tier for the edit-test loop; `nox -s tests` stays the whole suite."""
    _install_for_tests(session)
    session.run(
        "pytest", "-n", QUICK_WORKERS, "--dist", TEST_DISTRIBUTION, "-m", QUICK_TIER,
        "--durations=20", *session.posargs,
    )  # fmt: skip


def _install_for_tests(session: nox.Session) -> None:
    # Compile bytecode at install, as pip does: under PYTHONDONTWRITEBYTECODE (set on the
    # CI machines) a uv venv has no .pyc, so each of the suite's hundreds of `tpulab`
    # subprocesses recompiled the Google client, pydantic, rich, paramiko ... from
    # source: a quarter of the tests' CPU on a CPU-bound 2-core runner (2026-12-01: one
    # `tpulab run` process 2.3 -> 1.2 CPU-s; test_run_cli + test_failover_cli at -n 4,
    # 110 -> 85 CPU-s). It costs ~20 s once per fresh venv.
    session.env["UV_COMPILE_BYTECODE"] = "1"
    session.install("-e", ".[test]", *FAST_JAX_IMPORT)
    # The editable tpulab is not in site-packages, so uv leaves it alone: another
    # 0.15 s of each `tpulab` subprocess's ~1.1 s CPU (__pycache__ is gitignored).
    session.run("python", "-m", "compileall", "-q", "tpulab")


# The tests' jax is also what the emulated (preloaded) VMs run the verifier with, once
# per emulated run. ml_dtypes 0.7.0, which jax pulls in, spends 0.5 s initialising its
# extension module at every `import jax` (0.6.0: 4 ms; `python -X importtime -c "import
# ml_dtypes"`, 2026-12-06): the verifier went 1.48 -> 0.80 CPU-s, the largest single
# cost of an emulated run. Only the test environment holds it back; a real VM's
# bootstrap installs what jax asks for, and `nox -s bench` measures that.
FAST_JAX_IMPORT = ("ml_dtypes<0.7",)


def _payload_python_310(session: nox.Session) -> None:
    """TPU VM images run the payload on Python 3.10 with the last jax for it (0.6.x):
    when a python3.10 is on PATH, build that interpreter's venv so a test runs the real
    payload there (in CI the test fails rather than skips without it)."""
    python310 = _find_python_310()
    if python310 is None:
        return
    venv = Path(".nox") / "payload-py310"
    session.run("uv", "venv", "--quiet", "--allow-existing", "-p", python310, str(venv))
    # absolute(), never resolve(): the venv's python is a symlink to the interpreter
    # itself, and installing into that would put jax into the machine's Python 3.10 --
    # the one the emulator's bare image is made of.
    python = str((venv / "bin" / "python").absolute())
    session.run(
        "uv",
        "pip",
        "install",
        "--quiet",
        "--python",
        python,
        "jax[cpu]<0.7",
        "numpy",
        *FAST_JAX_IMPORT,
    )
    session.env["TPULAB_TEST_PY310"] = python


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks: each prints its figures and a ratio against a same-run baseline."""
    # Start-up time is part of what is measured: compile bytecode at install, as pip
    # does, or a uv venv under PYTHONDONTWRITEBYTECODE recompiles every import each run.
    session.env["UV_COMPILE_BYTECODE"] = "1"
    session.install("-e", ".[test]")
    # The editable tpulab is not in site-packages, so uv leaves it alone: another
    # 0.15 s of each `tpulab` subprocess's ~1.1 s CPU (__pycache__ is gitignored).
    session.run("python", "-m", "compileall", "-q", "tpulab")
    session.run("pytest", "tests/benchmarks", "-s", "-p", "no:randomly", *session.posargs)


def _find_python_310() -> str | None:
    # A pyenv shim on PATH may exist without running (version not selected), so look
    # at the real interpreters too and keep the first that answers as 3.10.
    candidates = [shutil.which("python3.10"), "/usr/bin/python3.10", "/usr/local/bin/python3.10"]
    pyenv_root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    candidates += sorted(str(p) for p in pyenv_root.glob("versions/3.10*/bin/python3.10"))
    for candidate in candidates:
        if candidate is None or not Path(candidate).exists():
            continue
        probe = subprocess.run(
            [candidate, "-c", "import sys; print(sys.version_info[:2] == (3, 10))"],
            capture_output=True,
            text=True,
            check=False,
        )
        if probe.returncode == 0 and probe.stdout.strip() == "True":
            return candidate
    return None
