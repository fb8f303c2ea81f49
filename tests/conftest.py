"""Shared fixtures only (helpers that tests import live in helpers.py). Every test gets
its own TPULAB_HOME so nothing touches the user's."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

# google-auth probes the GCE metadata server (a link-local address) when looking for
# credentials; tests must only ever talk to loopback, and subprocesses inherit this.
os.environ["NO_GCE_CHECK"] = "True"


def _children_start_with_default_signals() -> None:
    """Every child a test starts gets SIGINT, SIGTERM and SIGHUP at their defaults, as a
    foreground command in a terminal has them, whatever this runner inherited.

    A background job of a non-interactive shell (some CI runners) starts with SIGINT
    ignored, `nohup` adds SIGHUP, and an ignored signal stays ignored across exec: a
    `tpulab` child would then rightly keep ignoring the Ctrl-C its test sends. A signal
    *handled* here is reset to its default by exec instead, so an ignored one becomes
    handled by a no-op: this process still ignores it, in effect, its children do not.
    One place for every helper that starts a child (subprocess, xdist's workers too).
    """

    def ignore(signum: int, frame: object) -> None:
        """Ignored, as the runner asked, but by a handler, which exec resets."""

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(signum) is signal.SIG_IGN:
            signal.signal(signum, ignore)


_children_start_with_default_signals()


@pytest.fixture(autouse=True)
def tpulab_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "tpulab-home"
    monkeypatch.setenv("TPULAB_HOME", str(home))
    return home


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test with its tiers (tests/tiers.py): `e2e`, `network`, and `smoke` for
    the end-to-end tests `nox -s quick` keeps."""
    from tiers import SMOKE_TESTS, sources_of, tiers_of_source

    root = Path(str(config.rootpath))
    for item in items:
        if not isinstance(item, pytest.Function):
            continue
        if _node_id(item, root) in SMOKE_TESTS:
            item.add_marker(pytest.mark.smoke)
        explicit = {mark.name for mark in item.iter_markers()}
        found = tiers_of_source(sources_of(_roots(item)))
        for marker in ("slow", "gcloud"):
            if marker in explicit:
                found.setdefault("e2e", f"marked {marker}")
        if "benchmarks" in Path(str(item.path)).parts:
            found.setdefault("e2e", "a benchmark (tests/benchmarks/smoke.py)")
        for tier, reason in found.items():
            if tier not in explicit:
                item.add_marker(getattr(pytest.mark, tier)(reason=reason))


def _node_id(item: pytest.Item, root: Path) -> str:
    path = Path(str(item.path)).resolve()
    relative = path.relative_to(root) if path.is_relative_to(root) else path
    return f"{relative.as_posix()}::{item.name}"


def _roots(item: pytest.Function) -> list[object]:
    """The test function and every fixture function it uses, however indirectly."""
    fixtures = [
        definition.func
        for definitions in item._fixtureinfo.name2fixturedefs.values()
        for definition in definitions
    ]
    return [item.function, *fixtures]
