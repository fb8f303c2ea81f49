"""The suite's tiers (tests/tiers.py) are decided from what a test runs, so a test
added tomorrow lands in the right one without anyone listing it."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest
from tiers import SMOKE_TESTS, sources_of, tiers_of, tiers_of_source

END_TO_END = [
    'backend = make_host_backend("embedded", tmp / "hosts", image="preloaded")',
    'with served_emulator(tmp / "emulator") as emulator:',
    "life = Lifecycle(spec, observer=recorder)",
    'command = [sys.executable, "-m", "tpulab", "emulator", "serve", "--port", "0"]',
    'done = tpulab("run", "--accelerator", "v5litepod-4",\n    "--api-endpoint", url)',
    'done = tpulab("exec", "pair", "--emulate", "--", "true")',
    "result = run_local_payload(devices=4, platform='cpu', nonce='n', timeout=60)",
    'status, out, _ = invoke("verify", "--local", "--devices", "4")',
    'done = tpulab("--help")',
    "done = tpulab(*args, timeout=60)",
    'probe = cli_imports("--help")',
]

NETWORK = [
    'done = tpulab("run", "--accelerator", "v5litepod-1", "--emulate", "-v")',
    # The host backends' default image is the bare one: its bootstrap installs jax.
    'backend = make_host_backend("embedded", tmp)\nLifecycle(spec).run()',
    "host = EmbeddedHostBackend(tmp, image=image)\nboot.bootstrap(shell, timeout=300)",
]

NEITHER = [
    'code, out, _ = invoke("list", "--emulate", "--json")',
    'status, out, _ = invoke("run", "--accelerator", "v5litepod-4", "--emulate", "--dry-run")',
    "emulator = start_emulator(tmp_path / 'state')  # the API alone, no SSH hosts",
]


@pytest.mark.parametrize("text", END_TO_END)
def test_what_runs_servers_or_whole_runs_is_e2e(text: str) -> None:
    assert "e2e" in tiers_of_source(text)


@pytest.mark.parametrize("text", NETWORK)
def test_what_installs_from_the_package_index_is_network(text: str) -> None:
    found = tiers_of_source(text)
    assert "network" in found
    assert "e2e" in found


def test_run_emulate_on_the_preloaded_image_is_not_network() -> None:
    text = (
        "def test_x(preloaded_embedded_emulator: Path) -> None:\n"
        '    done = tpulab("run", "--accelerator", "v5litepod-16", "--emulate")'
    )
    assert tiers_of_source(text) == {"e2e": "a CLI run against the emulator"}
    bare = text.replace("preloaded_embedded_emulator", "fast_embedded_emulator")
    assert "network" in tiers_of_source(bare)


def test_a_bare_image_node_that_installs_nothing_is_not_network() -> None:
    text = 'backend = make_host_backend("embedded", tmp)\nbackend.start("n", sandbox, keys)'
    assert tiers_of_source(text) == {"e2e": "real SSH hosts"}


@pytest.mark.parametrize("text", NEITHER)
def test_unit_tests_in_process_api_calls_and_dry_runs_are_neither(text: str) -> None:
    assert tiers_of_source(text) == {}


def _starts_hosts() -> object:
    # A stand-in for a fixture module's helper: what a test reaches only by name.
    from tpulab.emulator.backends import make_host_backend

    return make_host_backend("embedded", Path("/nonexistent"), image="preloaded")


def _uses_the_helper() -> object:
    return _starts_hosts()


def test_the_source_followed_reaches_helpers_of_the_tests_directory() -> None:
    assert tiers_of_source(inspect.getsource(_uses_the_helper)) == {}
    assert tiers_of_source(sources_of([_uses_the_helper])) == {"e2e": "real SSH hosts"}
    assert tiers_of([_uses_the_helper]) == {"e2e": "real SSH hosts"}


def _a_bare_node() -> object:
    from tpulab.emulator.backends import make_host_backend

    return make_host_backend("embedded", Path("/nonexistent"))


def _an_install(connection: object) -> object:
    from tpulab.remote import bootstrap as module

    return module.bootstrap(connection, platform="cpu")  # type: ignore[arg-type]


def _both() -> object:
    return _a_bare_node(), _an_install(None)


def test_rules_met_in_different_helpers_add_up_as_in_their_joined_source() -> None:
    """conftest tiers a test from each reached source's rules (tiers_of), not from one
    text of them all: a bare node in one helper and an install in another still need
    the package index, exactly as the joined source says."""
    both = {"e2e": "real SSH hosts", "network": "a bootstrap on a bare-image node"}
    assert tiers_of([_both]) == tiers_of_source(sources_of([_both])) == both
    assert tiers_of([_a_bare_node]) == {"e2e": "real SSH hosts"}
    assert tiers_of([_an_install]) == {}


# Collects FILES as `pytest` would and prints each test's tier markers, one JSON line.
_PROBE = """
import json, sys, pytest
class Tiers:
    def pytest_collection_finish(self, session):
        marks = {i.nodeid: sorted(m.name for m in i.iter_markers()) for i in session.items}
        print("TIERS " + json.dumps(marks))
sys.exit(pytest.main(["--collect-only", "-q", "-p", "no:randomly", *sys.argv[1:]], [Tiers()]))
"""


def _tiers_of(root: Path, *files: str) -> dict[str, set[str]]:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, *files],
        cwd=root, capture_output=True, text=True, timeout=280, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("TIERS "))
    tiers = {"e2e", "network", "smoke"}
    return {test: set(marks) & tiers for test, marks in json.loads(line[6:]).items()}


@pytest.mark.e2e(reason="a pytest collection in a subprocess")
def test_conftest_marks_the_collected_tests(pytestconfig: pytest.Config) -> None:
    run_cli = "tests/test_run_cli.py"
    manual = "tests/test_manual_commands.py"
    files = sorted({test.split("::")[0] for test in SMOKE_TESTS} | {run_cli, manual})
    tiers = _tiers_of(pytestconfig.rootpath, *files)
    assert sorted(test for test, marks in tiers.items() if "smoke" in marks) == sorted(SMOKE_TESTS)
    assert tiers[f"{run_cli}::test_run_emulate[embedded]"] == {"e2e", "network"}
    assert tiers[f"{run_cli}::test_run_against_a_served_emulator[openssh]"] == {"e2e"}
    assert tiers[f"{run_cli}::test_run_help_stays_light"] == {"e2e"}  # a subprocess
    # `tpulab teardown` as printed, pasted into a shell: a CLI subprocess too.
    pasted = f"{manual}::test_an_embedded_emulators_node_is_deleted_by_the_printed_tpulab_command"
    assert tiers[pasted] == {"e2e"}
    assert tiers[f"{manual}::test_google_gets_plain_gcloud_and_the_sweep"] == set()


class _Node:
    """An xdist worker as its scheduler sees it: what it was sent."""

    def __init__(self, name: str) -> None:
        self.gateway = type("Gateway", (), {"id": name})()
        self.sent: list[int] = []
        self.shutting_down = False

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent += indices

    def shutdown(self) -> None:
        self.shutting_down = True


class _Options:
    def __init__(self, workers: int) -> None:
        self.values = {"tx": [f"{workers}*popen"]}

    def getvalue(self, name: str) -> object:
        return self.values[name]


def _first_shares(collection: list[str], workers: int) -> list[list[str]]:
    """The share xdist's own worksteal scheduler hands each worker first."""
    from typing import cast

    from xdist.scheduler.worksteal import WorkStealingScheduling  # type: ignore[import-untyped]

    scheduler = WorkStealingScheduling(cast("pytest.Config", _Options(workers)))
    nodes = [_Node(f"gw{n}") for n in range(workers)]
    for node in nodes:
        scheduler.add_node(node)
    for node in nodes:
        scheduler.add_node_collection(node, collection)
    scheduler.schedule()
    return [[collection[i] for i in node.sent] for node in nodes]


def test_the_benchmarks_start_the_shares_xdist_hands_out() -> None:
    """conftest.py deals the benchmark smoke runs (the longest single tests) one per
    worker share, at its head, where worksteal never takes them away: as collected, all
    seven sat in the first worker's share, run one after the other."""
    from conftest import longest_at_the_heads

    def is_benchmark(name: str) -> bool:
        return name.startswith("tests/benchmarks/")

    collected = [f"tests/benchmarks/bench_{n}.py::test" for n in "abcdefg"]
    collected += [f"tests/test_{n:03}.py::test" for n in range(93)]
    as_collected = _first_shares(collected, 4)
    assert [sum(map(is_benchmark, share)) for share in as_collected] == [7, 0, 0, 0]

    ordered = longest_at_the_heads(collected, 4, is_benchmark)
    assert sorted(ordered) == sorted(collected)  # the order only: nothing dropped or added
    rest = [name for name in collected if not is_benchmark(name)]
    assert [name for name in ordered if not is_benchmark(name)] == rest
    shares = _first_shares(ordered, 4)
    counts = [sum(map(is_benchmark, share)) for share in shares]
    assert sorted(counts) == [1, 2, 2, 2]
    for share, count in zip(shares, counts, strict=True):
        assert all(map(is_benchmark, share[:count])), share[:3]  # first in their share
    assert longest_at_the_heads(collected, 1, is_benchmark) == collected


def test_mostly_benchmarks_are_dealt_without_running_out() -> None:
    """`pytest -n 4 tests/benchmarks`: 15 benchmarks and nothing else to pad the shares
    with. Dealing them stopped the collection (StopIteration, an INTERNALERROR)."""
    from conftest import longest_at_the_heads

    def is_benchmark(name: str) -> bool:
        return name.startswith("tests/benchmarks/")

    for others in (0, 1, 5):
        collected = [f"tests/benchmarks/bench_{n:02}.py::test" for n in range(15)]
        collected += [f"tests/test_{n:03}.py::test" for n in range(others)]
        ordered = longest_at_the_heads(collected, 4, is_benchmark)
        assert sorted(ordered) == sorted(collected), others
