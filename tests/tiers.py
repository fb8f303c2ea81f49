"""The suite's tiers, decided from what a test runs (conftest.py marks each test with them).

- `e2e`: the test brings up real SSH hosts (either host backend, `served_emulator`, the
  `rig` fixtures), drives a whole `Lifecycle`, runs `tpulab emulator serve`, a `tpulab`
  CLI run/exec/session against the local emulator, the payload under jax in a
  subprocess, or any `tpulab` (or, marked `gcloud`, gcloud) subprocess: each costs a
  second or more of CPU. A quarter of the tests, and nearly all of the suite's CPU.
- `network`: the test's emulated node bootstraps on the bare image, which installs uv and
  jax from the package index (uv's and pip's caches in `hostenv.default_cache_dir()`
  spare the download after the first run, but a fresh machine needs the index).

The decision reads source text, not a hand-kept list of test names, so a test added
tomorrow is tiered by what it does: the test function, every fixture it uses (however
indirectly), and every function or class of the tests directory those call, followed
name by name through their globals. A test (or module) may also say it outright with
`@pytest.mark.e2e` / `@pytest.mark.network`; `slow` (the older marker) and `gcloud`
count as e2e, and so does every benchmark (tests/benchmarks/smoke.py).

`nox -s quick` runs `-m "not e2e and not network"` plus SMOKE_TESTS; `nox -s tests` runs
everything.
"""

from __future__ import annotations

import functools
import inspect
import re
import types
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TypeVar

__all__ = ["E2E_PATTERNS", "SMOKE_TESTS", "sources_of", "tiers_of_source"]

TESTS_DIR = Path(__file__).resolve().parent

# What makes a test end to end: each pattern names a thing that starts real servers or
# whole runs (seconds of CPU each on a loaded 2-core runner).
_BARE_OR_NOT = r"\b(make_host_backend|EmbeddedHostBackend|OpenSshHostBackend)\("
_CLI_RUN = r"[\"'](run|exec|session)[\"'][^)]*[\"']--(emulate|api-endpoint)[\"'](?![^)]*--dry-run)"
E2E_PATTERNS: dict[str, re.Pattern[str]] = {
    "real SSH hosts": re.compile(_BARE_OR_NOT + r"|\bserved_emulator\("),
    "a whole lifecycle in-process": re.compile(r"\bLifecycle\("),
    "`tpulab emulator serve`": re.compile(r"[\"']emulator[\"'],\s*[\"']serve[\"']"),
    "a CLI run against the emulator": re.compile(_CLI_RUN),
    "the payload under jax in a subprocess": re.compile(
        r"\b(run_local_payload|real_run|payload_command)\(|[\"']verify[\"'],\s*[\"']--local[\"']"
    ),
    # ~1 s of CPU each (the CLI's imports), and tests make them by the dozen.
    "a `tpulab` subprocess": re.compile(
        r"\btpulab\(\s*[\"'*]|[\"']-m[\"'],\s*[\"']tpulab[\"']|\bcli_imports\("
    ),
}

# What makes a test need the package index: the bootstrap's install on a node of the
# bare image (the host backends' default) -- a backend made without `preloaded` in a
# test that also runs a lifecycle, a bootstrap or a CLI run -- or a CLI `run --emulate`,
# whose own emulator uses that image.
_BARE_NODE = re.compile(_BARE_OR_NOT + r"(?![^()]*preloaded)")
_INSTALLS = re.compile(r"\bLifecycle\(|\bbootstrap\(|" + _CLI_RUN)
_RUN_EMULATE = re.compile(r"[\"']run[\"'][^)]*[\"']--emulate[\"'](?![^)]*--dry-run)")

# The two end-to-end tests `nox -s quick` keeps: one emulated run from create to the
# confirmed delete, through the CLI, and one Ctrl-C that tears a run down.
SMOKE_TESTS = (
    "tests/test_run_cli.py::test_run_against_a_served_emulator[embedded]",
    "tests/test_interruptions.py::test_ctrl_c_during_teardown_is_refused_and_a_quick_third_forces_quit",
)


def tiers_of_source(text: str) -> dict[str, str]:
    """{tier: the reason} for source text (see E2E_PATTERNS and the network rules)."""
    return dict(_tiers_of_source(text))


# Parametrized tests and tests sharing their fixtures reach the same sources: each
# xdist worker tiers ~1,800 items, so the same text is matched again and again.
@functools.cache
def _tiers_of_source(text: str) -> tuple[tuple[str, str], ...]:
    found: dict[str, str] = {}
    for reason, pattern in E2E_PATTERNS.items():
        if pattern.search(text):
            found["e2e"] = reason
            break
    if _RUN_EMULATE.search(text):
        found["network"] = "`tpulab run --emulate` (the bare image)"
    elif _BARE_NODE.search(text) and _INSTALLS.search(text):
        found["network"] = "a bootstrap on a bare-image node"
    return tuple(found.items())


def _in_tests(obj: object) -> bool:
    return _cached_by_identity(_in_tests_cache, obj, _is_in_tests)


def _is_in_tests(obj: object) -> bool:
    try:
        source = inspect.getsourcefile(obj)  # type: ignore[arg-type]
    except TypeError:
        return False
    return source is not None and Path(source).resolve().is_relative_to(TESTS_DIR)


def _code_names(code: types.CodeType) -> Iterator[str]:
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_names(const)


def _referenced(obj: object) -> tuple[object, ...]:
    """What `_references` yields for `obj`, worked out once per object: every test
    reaches the same helpers and fixtures, and each name costs a source-file lookup."""
    return _cached_by_identity(_referenced_cache, obj, lambda o: tuple(_references(o)))


_T = TypeVar("_T")
# id(obj) -> (obj, value): the object is held so its id cannot be reused by another.
_in_tests_cache: dict[int, tuple[object, bool]] = {}
_referenced_cache: dict[int, tuple[object, tuple[object, ...]]] = {}


def _cached_by_identity(
    cache: dict[int, tuple[object, _T]], obj: object, compute: Callable[[object], _T]
) -> _T:
    """compute(obj), remembered by identity (not every object reached is hashable)."""
    hit = cache.get(id(obj))
    if hit is not None and hit[0] is obj:
        return hit[1]
    value = compute(obj)
    cache[id(obj)] = (obj, value)
    return value


def _references(obj: object) -> Iterator[object]:
    """Functions and classes of the tests directory that `obj` names in its body, and
    the constant command lines it names (`SERVE = [sys.executable, "-m", ...]`)."""
    members: Iterable[object] = vars(obj).values() if isinstance(obj, type) else [obj]
    for member in members:
        function = getattr(member, "__func__", member)
        code = getattr(function, "__code__", None)
        namespace = getattr(function, "__globals__", None)
        if code is None or namespace is None:
            continue
        for name in _code_names(code):
            target = namespace.get(name)
            if callable(target) and _in_tests(target):
                yield target
            elif isinstance(target, (list, tuple)) and all(isinstance(t, str) for t in target):
                yield _Constant(repr(target))


class _Constant(str):
    """A constant's text, read as source (its repr)."""


@functools.cache
def _source(obj: object) -> str:
    if isinstance(obj, _Constant):
        return str(obj)
    try:
        return inspect.getsource(obj)  # type: ignore[arg-type]
    except (OSError, TypeError):
        return ""


def sources_of(roots: Iterable[object]) -> str:
    """The source of `roots` and of everything of the tests directory they reach."""
    seen: set[int] = set()
    stack = [getattr(root, "__wrapped__", root) for root in roots]
    texts: list[str] = []
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        texts.append(_source(obj))
        stack.extend(_referenced(obj))
    return "\n".join(texts)
