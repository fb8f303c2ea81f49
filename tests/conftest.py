"""Shared fixtures only (helpers that tests import live in helpers.py). Every test gets
its own TPULAB_HOME so nothing touches the user's."""

from __future__ import annotations

import itertools
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

_T = TypeVar("_T")

# The fixture modules test files name in `pytest_plugins`: rewritten (their asserts say
# what differed) whichever test file imports them first. Registered only by
# `pytest_plugins`, a module a test file had already imported was left plain, with a
# PytestAssertRewriteWarning per worker, depending on the random test order.
pytest.register_assert_rewrite("emulator_fixtures", "ssh_fixtures", "run_rig")

# Keep the assertion-rewritten test modules in __pycache__, as the noxfile compiles
# tpulab's bytecode at install: pytest honours PYTHONDONTWRITEBYTECODE (set on this
# machine kind), and then every xdist worker rewrote and compiled all the test modules
# again at each run, about 4 CPU-s a worker. Only this process: its children keep the
# environment they were given.
sys.dont_write_bytecode = False

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
    from tiers import SMOKE_TESTS, tiers_of

    root = Path(str(config.rootpath))
    for item in items:
        if not isinstance(item, pytest.Function):
            continue
        if _node_id(item, root) in SMOKE_TESTS:
            item.add_marker(pytest.mark.smoke)
        explicit = {mark.name for mark in item.iter_markers()}
        found = tiers_of(_roots(item))
        for marker in ("slow", "gcloud"):
            if marker in explicit:
                found.setdefault("e2e", f"marked {marker}")
        if "benchmarks" in Path(str(item.path)).parts:
            found.setdefault("e2e", "a benchmark (tests/benchmarks/smoke.py)")
        for tier, reason in found.items():
            if tier not in explicit:
                item.add_marker(getattr(pytest.mark, tier)(reason=reason))


class _LongestAtTheHeads:
    """Start each xdist worker's share of the suite with its part of the longest tests:
    the benchmark smoke runs (one took 209 s, another 167 s, CI load) and the tests
    marked `longest` (tens of seconds to a minute each under CI load, or a dozen runs
    at once: the interruption matrix's groups, which ended the suite's run on one
    worker while the others idled, 2026-12-07).

    `--dist worksteal` (noxfile.py) hands each worker a contiguous share of the
    collection and lets an idle one take the *tail* half of a busy one's queue; the
    benchmarks, collected first (tests/benchmarks sorts before test_*.py), all sat at the
    head of the first share, where nobody steals: one worker ran them one after the
    other. A minute-long test left in the tail keeps one worker busy while the others
    have finished. Dealt one per share, at the heads, they start at once and run side
    by side with everything else. Only the order changes; nothing is dropped. After
    deselection (-m, -k), so the shares are the ones xdist cuts.
    """

    def __init__(self, workers: int) -> None:
        self.workers = workers

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        items[:] = longest_at_the_heads(items, self.workers, _starts_first)


def _starts_first(item: pytest.Item) -> bool:
    in_benchmarks = "benchmarks" in Path(str(item.path)).parts
    return in_benchmarks or item.get_closest_marker("longest") is not None


def worksteal_shares(total: int, workers: int) -> list[int]:
    """How many items each worker gets first, as xdist's worksteal cuts them: each idle
    worker in turn takes the remaining items divided by the workers left."""
    shares: list[int] = []
    for left in range(workers, 0, -1):
        shares.append((total - sum(shares)) // left)
    return shares


def longest_at_the_heads(
    items: list[_T], workers: int, starts_first: Callable[[_T], bool]
) -> list[_T]:
    """`items` reordered so those that start first are dealt one per worker share, at
    its head (the rest keeps its order)."""
    longest = [item for item in items if starts_first(item)]
    if workers < 2 or not longest or len(items) < 2 * workers:
        return list(items)
    rest = iter([item for item in items if not starts_first(item)])
    heads: list[list[_T]] = [longest[k::workers] for k in range(workers)]
    ordered: list[_T] = []
    for head, share in zip(heads, worksteal_shares(len(items), workers), strict=True):
        ordered += head
        # islice, not next(): with more of them than the rest can pad (`pytest -n 4
        # tests/benchmarks`), a share runs out of other items before its end.
        ordered += itertools.islice(rest, max(0, share - len(head)))
    ordered += rest
    return ordered


def pytest_configure(config: pytest.Config) -> None:
    workerinput = getattr(config, "workerinput", None)  # set in an xdist worker
    if isinstance(workerinput, dict) and int(workerinput.get("workercount", 1)) > 1:
        plugin = _LongestAtTheHeads(int(workerinput["workercount"]))
        config.pluginmanager.register(plugin, "tpulab-longest-at-the-heads")


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
