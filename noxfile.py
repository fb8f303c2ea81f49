"""Developer sessions: `nox -s lint typecheck tests` is what CI runs (see README)."""

from __future__ import annotations

import nox

nox.options.default_venv_backend = "uv|virtualenv"
nox.options.sessions = ["lint", "typecheck", "tests"]
nox.options.reuse_existing_virtualenvs = True


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over everything; remote payloads are held to Python 3.10 by target-version."""
    session.install("ruff")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy --strict over tpulab, the payloads and the tests."""
    session.install("-e", ".[dev]")
    session.run("mypy", "--strict")


@nox.session
def tests(session: nox.Session) -> None:
    """The whole suite, end-to-end tests included (they need sshd and gcloud in CI)."""
    session.install("-e", ".[test]")
    session.run("pytest", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks: each prints its figures and a ratio against a same-run baseline."""
    # Start-up time is part of what is measured: compile bytecode at install, as pip
    # does, or a uv venv under PYTHONDONTWRITEBYTECODE recompiles every import each run.
    session.env["UV_COMPILE_BYTECODE"] = "1"
    session.install("-e", ".[test]")
    session.run("pytest", "tests/benchmarks", "-s", "-p", "no:randomly", *session.posargs)
