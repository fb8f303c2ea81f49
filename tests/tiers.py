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

import ast
import functools
import inspect
import re
import types
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TypeVar

__all__ = ["E2E_PATTERNS", "SMOKE_TESTS", "sources_of", "tiers_of", "tiers_of_source"]

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
# ... unless its `--emulate` nodes boot the preloaded image (emulator_fixtures.py).
_PRELOADED_EMULATE = re.compile(r"\bpreloaded_embedded_emulator\b")

# The two end-to-end tests `nox -s quick` keeps: one emulated run from create to the
# confirmed delete, through the CLI, and one Ctrl-C that tears a run down.
SMOKE_TESTS = (
    "tests/test_run_cli.py::test_run_against_a_served_emulator[embedded]",
    "tests/test_interruptions.py::test_ctrl_c_during_teardown_is_refused_and_a_quick_third_forces_quit",
)


def tiers_of_source(text: str) -> dict[str, str]:
    """{tier: the reason} for source text (see E2E_PATTERNS and the network rules)."""
    return _tiers_of_hits(_hits(text))


def tiers_of(roots: Iterable[object]) -> dict[str, str]:
    """`tiers_of_source(sources_of(roots))`, from each reached source's rules matched
    once: tests share their helpers and fixtures, so each worker would otherwise match
    the same text again in ~1,000 different joins of it."""
    hits: set[str] = set()
    for obj in _reached(roots):
        hits |= _hits(_source(obj))
    return _tiers_of_hits(hits)


_NETWORK_RULES = {
    "run --emulate": _RUN_EMULATE,
    "a preloaded --emulate": _PRELOADED_EMULATE,
    "a bare node": _BARE_NODE,
    "install": _INSTALLS,
}


@functools.cache
def _hits(text: str) -> frozenset[str]:
    """The rules `text` matches: E2E_PATTERNS' reasons and _NETWORK_RULES' names."""
    rules = {**E2E_PATTERNS, **_NETWORK_RULES}
    return frozenset(name for name, pattern in rules.items() if pattern.search(text))


def _tiers_of_hits(hits: Iterable[str]) -> dict[str, str]:
    matched = set(hits)
    found: dict[str, str] = {}
    for reason in E2E_PATTERNS:
        if reason in matched:
            found["e2e"] = reason
            break
    if "run --emulate" in matched and "a preloaded --emulate" not in matched:
        found["network"] = "`tpulab run --emulate` (the bare image)"
    elif "a bare node" in matched and "install" in matched:
        found["network"] = "a bootstrap on a bare-image node"
    return found


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
    found = _indexed_source(obj)
    if found is not None:
        return found
    try:
        return inspect.getsource(obj)  # type: ignore[arg-type]
    except (OSError, TypeError):
        return ""


def _indexed_source(obj: object) -> str | None:
    """`inspect.getsource(obj)` for a function or class of a test file, from the file's
    syntax tree, parsed once: getsource tokenizes each function's file anew (and walks
    a class's whole module), ~2 s of every xdist worker's collection. None: not one."""
    try:
        filename = inspect.getsourcefile(obj)  # type: ignore[arg-type]
    except TypeError:
        return None
    if filename is None or not filename.endswith(".py"):
        return None
    lines, by_first_line, by_qualname = _definitions(filename)
    function = getattr(obj, "__func__", obj)
    code = getattr(function, "__code__", None)
    if code is not None:
        end = by_first_line.get(code.co_firstlineno)
        first = code.co_firstlineno
    else:
        span = by_qualname.get(str(getattr(obj, "__qualname__", "")))
        if span is None:
            return None
        first, end = span
    if end is None:
        return None
    return "".join(lines[first - 1 : end])


_Spans = tuple[list[str], dict[int, int], dict[str, tuple[int, int]]]


@functools.cache
def _definitions(filename: str) -> _Spans:
    """A file's lines; each function's last line by its first (its first decorator's,
    as in `co_firstlineno`); each class's (first, last) line by qualified name."""
    text = Path(filename).read_text(encoding="utf-8")
    by_first_line: dict[int, int] = {}
    by_qualname: dict[str, tuple[int, int]] = {}

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            last = node.end_lineno or node.lineno
            if isinstance(node, ast.ClassDef):
                by_qualname[prefix + node.name] = (first, last)
                visit(node.body, f"{prefix}{node.name}.")
            else:
                by_first_line[first] = last
                visit(node.body, f"{prefix}{node.name}.<locals>.")

    visit(ast.parse(text, filename).body, "")
    return text.splitlines(keepends=True), by_first_line, by_qualname


def sources_of(roots: Iterable[object]) -> str:
    """The source of `roots` and of everything of the tests directory they reach."""
    return "\n".join(_source(obj) for obj in _reached(roots))


def _reached(roots: Iterable[object]) -> Iterator[object]:
    """`roots` and everything of the tests directory they name, each once."""
    seen: set[int] = set()
    stack = [getattr(root, "__wrapped__", root) for root in roots]
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        yield obj
        stack.extend(_referenced(obj))
