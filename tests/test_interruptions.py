"""The interruption matrix (issue 6): real `tpulab run` subprocesses against an emulator
served from this test process, interrupted in every phase.

- SIGINT / SIGTERM (and SIGHUP once) in each phase: the run tears down, exits 130, its
  node is gone by `list`, its journal row is closed "confirmed";
- SIGKILL in each phase: the node stays behind exactly as in the cloud, the journal row
  stays open at that phase, and `tpulab teardown --verify --yes --run-id R` deletes that
  node only, confirms it and closes the row;
- SIGKILL in each phase again, with a short --lease and --boot-grace and NO sweep: the
  VM's own watchdog deletes every node within grace/lease + slack, `tpulab list` closes
  the rows as "deleted by its watchdog or externally" and `teardown --verify` has
  nothing left to delete;
- a node without tpulab's labels (named like ours) survives everything, the runs share
  one zone and run concurrently, each deleting only its own node, and an uninterrupted
  run alongside them succeeds.

Each phase is held open until the test has signalled the run, never for a fixed time,
and each where it lives: creation (the create operation) and host-key publication
(guest attributes) by an HTTP gate in front of the emulator that holds that node's
requests (api_gate.py), SSH by a host that refuses that node's connections, and
bootstrap, staging, execution and collection by the emulated VM image: its `mkdir` and
`sha256sum` tools and its `sitecustomize` (run by the payload's interpreter) wait for a
release file for chosen nodes, after leaving a marker that they are waiting. The test
signals only once the hold is observably in effect (the gate saw the request, the
marker exists) and the journal names the phase; a loaded machine makes it slower, not
flaky. The phase a signal landed in is read back from the run's own --json report (or,
for SIGKILL, from the journal row it left), so a mis-timed signal still fails the test
instead of being counted under the wrong phase.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from api_gate import ApiGate, served_gate
from helpers import tpulab, wait_until

from tpulab.cleanup.journal import Journal, RunRow
from tpulab.cloud.google import GoogleTpuApi
from tpulab.emulator.hostenv import ImageEnv, preloaded_image_env
from tpulab.emulator.hosts import HostEndpoint
from tpulab.emulator.server import Emulator
from tpulab.emulator.sshhost import EmbeddedHostBackend
from tpulab.emulator.timing import Timing
from tpulab.models import NodeRequest
from tpulab.remote.bootstrap import EXTRAS_STAMP

pytestmark = pytest.mark.slow

PROJECT = "matrix-proj"
ZONE = "us-central1-a"
FOREIGN = "tpulab-foreign"  # our naming pattern, but not our labels
EXIT_INTERRUPTED = 130
EXIT_TEARDOWN = 6

# The phase names, and the lifecycle phase each one is held in. "wait" is the
# wait for a usable VM: the emulator's create operation ends at READY, so the waiting
# that can be hit is the host key's publication (guest attributes) after READY.
PHASES = {
    "create": "create",
    "wait": "host-key",
    "connect": "connect",
    "bootstrap": "bootstrap",
    "stage": "stage",
    "execute": "execute",
    "collect": "collect",
}
# The phases of a run with a `-- CMD` (after the verifier), each held by the image too:
# the workspace's unpack and the artifacts' pack (`python3 -c <transfer> unpack|pack`,
# by `sitecustomize`), the extras' install (its `rm` of the extras stamp) and the
# command itself (the matrix's workload script, _WORKLOAD_SCRIPT).
WORKLOAD_PHASES = {"sync": "sync", "install": "install", "workload": "workload", "fetch": "fetch"}
ALL_PHASES = {**PHASES, **WORKLOAD_PHASES}
# Phases held per node by the emulated image (see _install_slow_image).
SLOWED_BY_IMAGE = {"bootstrap", "stage", "execute", "collect", *WORKLOAD_PHASES}
# What the workload script leaves in $TPULAB_RUN_DIR before it waits: it must come back.
ARTIFACT = "matrix-artifact.txt"
# Bounds, not timings: how long a hold lasts if the test never releases it.
HOLD_LIMIT_SECONDS = 300
# The watchdog rows' lease and boot grace, and how soon after a SIGKILL the node must be
# gone: the grace/lease, the watchdog's poll, its DELETE and a loaded 2-CPU runner.
WATCHDOG_ARGS = ("--lease", "10s", "--boot-grace", "10s")
SELF_DELETE_BOUND = 10 + 20

# Started with default signal dispositions whatever the runner inherited: a background
# job in a non-interactive shell starts with SIGINT ignored, which tpulab respects.
LAUNCHER = (
    "import os, signal, sys\n"
    "for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):\n"
    "    signal.signal(s, signal.SIG_DFL)\n"
    "os.execv(sys.executable, [sys.executable, '-m', 'tpulab', *sys.argv[1:]])\n"
)


@dataclass(frozen=True)
class Cell:
    signal: str  # "SIGINT", "SIGTERM", "SIGHUP", "SIGKILL" or "none"
    phase: str  # a key of ALL_PHASES, or "" for the uninterrupted control run
    variant: str = ""  # tells apart two cells of one signal and phase ("-wd": no sweep)

    @property
    def node(self) -> str:
        what = self.phase or "control"
        return f"tpulab-m-{self.signal.lower()}-{what}{self.variant}"


@dataclass
class Outcome:
    cell: Cell
    exit_status: int | None = None
    landed: str = "?"
    node_left_by_kill: bool | None = None
    sweep_exit: int | None = None
    sweep_deleted: list[str] = field(default_factory=list)
    gone_by_list: bool = False
    journal: str = "?"
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)


class RefusingHosts:
    """The image's SSH host backend, except that the nodes in `refused` refuse every
    connection (for `HOLD_LIMIT_SECONDS`): their runs stay in "connect" until signalled."""

    def __init__(self, inner: EmbeddedHostBackend) -> None:
        self.inner = inner
        self.refused: set[str] = set()

    def start(
        self,
        node_key: str,
        sandbox: Path,
        ssh_keys_metadata: str,
        *,
        refuse_for: float = 0.0,
        ensurepip_missing: bool = False,
        env: Mapping[str, str] | None = None,
    ) -> HostEndpoint:
        if node_key.rsplit("/", 1)[-1] in self.refused:
            refuse_for = HOLD_LIMIT_SECONDS
        return self.inner.start(
            node_key,
            sandbox,
            ssh_keys_metadata,
            refuse_for=refuse_for,
            ensurepip_missing=ensurepip_missing,
            env=env,
        )

    def update_keys(self, node_key: str, ssh_keys_metadata: str) -> None:
        self.inner.update_keys(node_key, ssh_keys_metadata)

    def stop(self, node_key: str) -> None:
        self.inner.stop(node_key)

    def close(self) -> None:
        self.inner.close()


class Matrix:
    def __init__(
        self, emulator: Emulator, gate: ApiGate, hosts: RefusingHosts, workdir: Path, slow_dir: Path
    ) -> None:
        self.emulator = emulator
        self.gate = gate  # the endpoint the runs use; the test reads the emulator directly
        self.hosts = hosts
        self.api = GoogleTpuApi(PROJECT, api_endpoint=emulator.url)
        self.journal = Journal()
        self.workdir = workdir
        self.slow_dir = slow_dir

    def hold(self, node: str, phase: str) -> Callable[[], None]:
        """Hold `node`'s run in `phase` (once it gets there) until the returned function
        is called; `held()` says when the hold is in effect."""
        if phase == "create":
            create = self.gate.hold(node, "create-operation")
            return create.release
        if phase == "wait":
            attributes = self.gate.hold(node, "guest-attributes")
            return attributes.release
        if phase == "connect":
            self.hosts.refused.add(node)
            return lambda: None  # the run never gets past "connect"; teardown stops the host
        hold = self.slow_dir / f"{node}.{phase}"
        hold.write_text("hold")
        return partial(Path.touch, hold.with_name(f"{hold.name}.release"))

    def held(self, node: str, phase: str) -> bool:
        """Is the run's request or command for `phase` being held right now?"""
        if phase == "create":
            return any(h.reached.is_set() for h in self.gate.holds(node, "create-operation"))
        if phase == "wait":
            return any(h.reached.is_set() for h in self.gate.holds(node, "guest-attributes"))
        if phase == "connect":
            return True  # refusing from the start: the journal's phase says it is trying
        return (self.slow_dir / f"{node}.{phase}.reached").exists()

    def start_tpulab(self, *args: str, log: str) -> subprocess.Popen[str]:
        out = (self.workdir / f"{log}.out").open("w")
        err = (self.workdir / f"{log}.err").open("w")
        with out, err:
            return subprocess.Popen(
                [sys.executable, "-c", LAUNCHER, *args],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                text=True,
            )

    def output(self, log: str) -> tuple[str, str]:
        return (
            (self.workdir / f"{log}.out").read_text(),
            (self.workdir / f"{log}.err").read_text(),
        )

    def row(self, node: str) -> RunRow | None:
        rows = self.journal.runs_for_node(PROJECT, ZONE, node)
        return rows[0] if rows else None

    def listed(self) -> set[str]:
        return {node.name for node in self.api.list_nodes(ZONE)}

    def wait_for_phase(self, cell: Cell, process: subprocess.Popen[str]) -> RunRow:
        """Until the journal names the phase and its hold is in effect. A bound, not a
        timing: the run cannot leave the phase before the test releases it."""
        want = ALL_PHASES[cell.phase]
        # Up to seven runs of a group start at once, and the last phases come after the
        # verifier's jax: a whole group took 95 s on CI at load 4-6, so 120 s was a
        # timing, not a bound. The test's own timeout (300 s, pyproject) stays above it.
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            if process.poll() is not None:
                # Its own words say why (a deadline of its own, a refused request...).
                said = self.output(cell.node)[1][-3000:]
                raise AssertionError(
                    f"{cell.node} exited {process.returncode} before {want}; it said:\n{said}"
                )
            row = self.row(cell.node)
            if row is not None and row.phase == want and self.held(cell.node, cell.phase):
                # In "create" the held operation implies the node exists; check it anyway,
                # so the signal provably meets a node that the cloud holds.
                assert want != "create" or cell.node in self.emulator.node_names(PROJECT)
                return row
            # Each look opens the journal (SQLite): at 50 a second, the cells of a group
            # waiting at once spent ~1.5 CPU-s of a matrix test on it. The hold keeps the
            # run in its phase, so a slower look only delays the signal, never misses it.
            time.sleep(0.1)
        row = self.row(cell.node)
        raise AssertionError(
            f"{cell.node} never reached phase {want} (journal: "
            f"{row.phase if row else 'no row'}, held: {self.held(cell.node, cell.phase)})"
        )

    def run(self, cell: Cell, *, extra: tuple[str, ...] = (), sweep: bool = True) -> Outcome:
        """Run `cell`; after a SIGKILL, `sweep` runs `teardown --verify`, else the test
        waits (bounded) for the VM's watchdog to delete the node by itself."""
        outcome = Outcome(cell)
        started = time.monotonic()
        release = self.hold(cell.node, cell.phase) if cell.phase else (lambda: None)
        args = [
            "run", "--accelerator", "v5litepod-4", "--api-endpoint", self.gate.url,
            "--project", PROJECT, "--zone", ZONE, "--name", cell.node, "--json", *extra,
        ]  # fmt: skip
        process = self.start_tpulab(*args, log=cell.node)
        try:
            if cell.signal == "none":
                outcome.exit_status = process.wait(timeout=180)
                outcome.landed = "-"
            else:
                self.wait_for_phase(cell, process)
                process.send_signal(getattr(signal, cell.signal))
                # Safe at once: the signal is already pending, so the run raises at its
                # next step, still inside the held phase; teardown may need the request.
                release()
                outcome.exit_status = process.wait(timeout=180)
                if cell.signal == "SIGKILL" and sweep:
                    self.after_kill(outcome)
                elif cell.signal == "SIGKILL":
                    self.after_kill_left_alone(outcome)
                else:
                    self.after_signal(outcome)
        finally:
            release()
            if process.poll() is None:
                process.kill()
                process.wait()
        outcome.gone_by_list = cell.node not in self.listed()
        row = self.row(cell.node)
        outcome.journal = "missing" if row is None else (row.teardown or f"open@{row.phase}")
        outcome.seconds = time.monotonic() - started
        return outcome

    def report(self, cell: Cell) -> dict[str, Any]:
        out, err = self.output(cell.node)
        try:
            data: dict[str, Any] = json.loads(out)
        except json.JSONDecodeError:
            raise AssertionError(f"{cell.node}: no JSON report; stderr:\n{err[-2000:]}") from None
        return data

    def after_signal(self, outcome: Outcome) -> None:
        data = self.report(outcome.cell)
        failed = [p["phase"] for p in data["phases"] if not p["ok"] and p["phase"] != "teardown"]
        outcome.landed = failed[0] if failed else "none"
        if outcome.cell.phase == "fetch":
            # A first signal during the fetch of a command that has ended lets the fetch
            # finish (bounded): the run completes, its artifacts home, exit 0 -- and it
            # must have said so, which proves the signal landed in the fetch.
            _, err = self.output(outcome.cell.node)
            if data.get("error") is not None:
                outcome.problems.append(f"error was {data.get('error')}")
            if "finish (at most" not in err:
                outcome.problems.append("no 'letting the fetch finish' in its output")
        elif (data.get("error") or {}).get("type") != "InterruptedRun":
            outcome.problems.append(f"error was {data.get('error')}")
        if not data["teardown"]["confirmed"]:
            outcome.problems.append("teardown not confirmed by the run")

    def after_kill(self, outcome: Outcome) -> None:
        cell = outcome.cell
        row = self.row(cell.node)
        assert row is not None, f"{cell.node}: no journal row after SIGKILL"
        outcome.landed = row.phase
        outcome.node_left_by_kill = cell.node in self.emulator.node_names(PROJECT)
        log = f"{cell.node}-sweep"
        sweep = self.start_tpulab(
            "teardown", "--verify", "--yes", "--json", "--run-id", row.run_id,
            "--api-endpoint", self.gate.url, "--project", PROJECT, "--timeout", "60",
            log=log,
        )  # fmt: skip
        outcome.sweep_exit = sweep.wait(timeout=120)
        out, err = self.output(log)
        try:
            outcome.sweep_deleted = json.loads(out)["deleted"]
        except (json.JSONDecodeError, KeyError):
            outcome.problems.append(f"sweep printed no JSON; stderr: {err[-500:]}")

    def after_kill_left_alone(self, outcome: Outcome) -> None:
        """No sweep: the node must go by itself (its watchdog) within a bound."""
        cell = outcome.cell
        row = self.row(cell.node)
        assert row is not None, f"{cell.node}: no journal row after SIGKILL"
        outcome.landed = row.phase
        outcome.node_left_by_kill = cell.node in self.emulator.node_names(PROJECT)
        deadline = time.monotonic() + SELF_DELETE_BOUND
        while cell.node in self.emulator.node_names(PROJECT):
            if time.monotonic() > deadline:
                outcome.problems.append(f"still there {SELF_DELETE_BOUND:g}s after SIGKILL")
                return
            time.sleep(0.1)


_SITECUSTOMIZE = f"""\
# The emulated image's site hook: hold the verifier payload and the workspace's and
# artifacts' transfers (`python3 -c <transfer.py> unpack|pack ...`) for chosen nodes.
import os, sys, time
_tag = None
if sys.argv and sys.argv[0].endswith("verify_tpu.py"):
    _tag = "execute"
elif len(sys.argv) > 1 and sys.argv[0] == "-c" and sys.argv[1] in ("unpack", "pack"):
    _tag = "sync" if sys.argv[1] == "unpack" else "fetch"
if _tag is not None:
    hold = os.path.join(os.environ.get("TPULAB_TEST_SLOW_DIR", "/nonexistent"),
                        os.path.basename(os.environ.get("HOME", "")) + "." + _tag)
    if os.path.isfile(hold):
        open(hold + ".reached", "w").close()
        deadline = time.monotonic() + {HOLD_LIMIT_SECONDS}
        while not os.path.exists(hold + ".release") and time.monotonic() < deadline:
            time.sleep(0.05)
"""


def _install_slow_image(root: Path) -> tuple[Path, Path]:
    """Emulated-image tools that hold when `$TPULAB_TEST_SLOW_DIR/<node>.<phase>` exists:
    they create `<...>.reached`, then wait until `<...>.release` exists (bounded).
    bootstrap starts with `mkdir -p`; staging and collection each check a sha256 on the
    VM (the payload, then the receipt); the extras' install starts by removing its stamp;
    the payload's and the transfers' interpreters run `sitecustomize`.
    Returns the directories for PATH and PYTHONPATH."""
    bin_dir, site_dir = root / "bin", root / "site"
    bin_dir.mkdir(parents=True)
    site_dir.mkdir()
    (site_dir / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    for tool in ("mkdir", "sha256sum", "rm"):
        real = shutil.which(tool, path="/usr/bin:/bin")
        assert real is not None, f"{tool} is needed on this machine"
        if tool == "mkdir":
            tag = "tag=bootstrap"
        elif tool == "rm":
            # Only the extras' install removes the extras stamp first; any other `rm`
            # (the bootstrap's) passes straight through.
            tag = f'case "$*" in *{Path(EXTRAS_STAMP).name}*) tag=install ;; *) tag=none ;; esac'
        else:
            # The file to hash arrives as an argument or as stdin (`sha256sum < FILE`).
            tag = (
                'case "$* $(readlink /proc/$$/fd/0 2>/dev/null)" in '
                "*receipt*) tag=collect ;; *) tag=stage ;; esac"
            )
        script = (
            "#!/bin/sh\n"
            f"{tag}\n"
            'hold="$TPULAB_TEST_SLOW_DIR/$(basename "$HOME").$tag"\n'
            'if [ -f "$hold" ]; then\n'
            '  : > "$hold.reached"; n=0\n'
            f'  while [ ! -e "$hold.release" ] && [ $n -lt {HOLD_LIMIT_SECONDS * 20} ]; do\n'
            "    sleep 0.05; n=$((n + 1))\n"
            "  done\n"
            "fi\n"
            f'exec {real} "$@"\n'
        )
        path = bin_dir / tool
        path.write_text(script)
        path.chmod(0o755)
    return bin_dir, site_dir


@contextmanager
def _served(
    tmp_path: Path, timing: Timing, faults: dict[str, Any], *, index: str | None = None
) -> Iterator[Matrix]:
    """`index`: a package index (URL) the image's uv and pip resolve from, for --with."""
    slow_dir = tmp_path / "slow"
    slow_dir.mkdir()
    bin_dir, site_dir = _install_slow_image(tmp_path / "image")
    base = preloaded_image_env()
    offline = {"UV_DEFAULT_INDEX": index, "PIP_INDEX_URL": index} if index else {}
    image = ImageEnv(
        path=(str(bin_dir), *base.path),
        pythonpath=(str(site_dir), *base.pythonpath),
        extra={**base.extra, **offline, "TPULAB_TEST_SLOW_DIR": str(slow_dir)},
    )
    state = tmp_path / "emulator"
    backend = RefusingHosts(EmbeddedHostBackend(state, image=image))
    try:
        with (
            Emulator(state, host_backend=backend, timing=timing) as emulator,
            served_gate(emulator.url) as gate,
        ):
            emulator.faults.update(faults)
            workdir = tmp_path / "logs"
            workdir.mkdir()
            yield Matrix(emulator, gate, backend, workdir, slow_dir)
    finally:
        backend.close()


@pytest.fixture
def matrix(tmp_path: Path) -> Iterator[Matrix]:
    timing = Timing(create_seconds=0.3, delete_seconds=0.3, stockout_seconds=0.1)
    with _served(tmp_path, timing, {}) as m:
        yield m


@pytest.fixture
def with_index(tmp_path: Path) -> Iterator[Matrix]:
    """The matrix's image plus a local package index holding one wheel (for --with)."""
    from test_workload_extras import simple_index

    index = simple_index(tmp_path / "index").as_uri()
    timing = Timing(create_seconds=0.3, delete_seconds=0.3)
    with _served(tmp_path, timing, {}, index=index) as served:
        yield served


@pytest.fixture
def quick(tmp_path: Path) -> Iterator[Matrix]:
    with _served(tmp_path, Timing(create_seconds=0.3, delete_seconds=0.3), {}) as served:
        yield served


def _table(outcomes: list[Outcome]) -> str:
    header = (
        f"{'signal':8} {'phase':10} {'landed in':10} {'exit':>5} {'left':>5} "
        f"{'sweep':>5} {'gone':>5} {'journal':10} {'secs':>5}  problems"
    )
    lines = ["", "Interruption matrix (tpulab run vs. served emulator)", header, "-" * len(header)]
    for o in outcomes:
        left = "-" if o.node_left_by_kill is None else ("yes" if o.node_left_by_kill else "NO")
        sweep = "-" if o.sweep_exit is None else str(o.sweep_exit)
        lines.append(
            f"{o.cell.signal:8} {o.cell.phase or '(none)':10} {o.landed:10} "
            f"{o.exit_status!s:>5} {left:>5} {sweep:>5} {'yes' if o.gone_by_list else 'NO':>5} "
            f"{o.journal:10} {o.seconds:5.1f}  {'; '.join(o.problems)}"
        )
    lines.append(
        "exit: the run's status (130 = interrupted, teardown confirmed; -9 = SIGKILL); "
        "left: node still there after SIGKILL; sweep: `teardown --verify --yes --run-id` "
        "status; gone: absent from `list`."
    )
    return "\n".join(lines)


# The matrix's rows in three groups, each its own test so xdist spreads them (all 23
# runs in one test took 90-220 s, the suite's long tail and close to its timeout; one
# test per phase cost a served emulator and a `tpulab list` each, +20% CPU). Each group
# runs its rows concurrently in one zone, beside a foreign node.
PHASE_GROUPS = {
    "before-ssh": ("create", "wait", "connect"),
    "on-the-vm": ("bootstrap", "stage"),
    "payload": ("execute", "collect"),
}


def _matrix_cells(group: str) -> list[Cell]:
    """A group's rows: SIGINT, SIGTERM and SIGKILL (then `teardown --verify`) in each
    of its phases; SIGHUP lands once, in "execute", and the uninterrupted control run
    rides with the lightest group."""
    cells = [
        Cell(sig, phase)
        for phase in PHASE_GROUPS[group]
        for sig in ("SIGINT", "SIGTERM", "SIGKILL")
    ]
    if "execute" in PHASE_GROUPS[group]:
        cells.append(Cell("SIGHUP", "execute"))
    if group == "before-ssh":
        cells.append(Cell("none", ""))
    return cells


def test_the_groups_cover_every_phase_once() -> None:
    grouped = [phase for phases in PHASE_GROUPS.values() for phase in phases]
    assert sorted(grouped) == sorted(PHASES)


@pytest.mark.longest
@pytest.mark.parametrize("group", list(PHASE_GROUPS))
def test_interruption_matrix(
    group: str, matrix: Matrix, capsys: pytest.CaptureFixture[str]
) -> None:
    request = NodeRequest(accelerator_type="v5litepod-4", runtime_version="v2-alpha-tpuv5-lite")
    operation = matrix.api.create_node(ZONE, FOREIGN, request)
    matrix.api.wait_operation(operation, timeout=30)
    cells = _matrix_cells(group)
    order = list(PHASES)
    with ThreadPoolExecutor(max_workers=len(cells)) as pool:
        outcomes = list(pool.map(matrix.run, cells))
    outcomes.sort(key=lambda o: (o.cell.signal, order.index(o.cell.phase) if o.cell.phase else 9))
    with capsys.disabled():
        print(_table(outcomes).replace("(tpulab run", f"({group}; tpulab run"))

    listed = tpulab(
        "list", "--api-endpoint", matrix.emulator.url, "--project", PROJECT, "--zone", ZONE,
        "--json",
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout)["nodes"] == [], "tpulab nodes remain after the matrix"
    assert matrix.emulator.node_names(PROJECT) == [FOREIGN], "the foreign node must survive"
    assert matrix.journal.open_runs() == [], "every journal row must be closed"

    for o in outcomes:
        cell = o.cell
        where = f"{cell.signal} in {cell.phase or 'no phase'}: {o.problems}"
        assert not o.problems, where
        assert o.gone_by_list, where
        assert o.journal == "confirmed", where
        if cell.signal == "none":
            assert o.exit_status == 0, where
        elif cell.signal == "SIGKILL":
            assert o.exit_status == -signal.SIGKILL, where
            assert o.landed == PHASES[cell.phase], where
            assert o.node_left_by_kill, where  # as the cloud would: nothing cleaned it up
            assert o.sweep_exit == 0, where
            assert o.sweep_deleted == [cell.node], where  # --run-id: that node, no other
        else:
            assert o.exit_status == EXIT_INTERRUPTED, where
            assert o.landed == PHASES[cell.phase], where


def _start(served: Matrix, node: str) -> tuple[subprocess.Popen[str], Callable[[], None]]:
    """A run whose verifier payload is held until the returned release is called."""
    release = served.hold(node, "execute")
    process = served.start_tpulab(
        "run", "--accelerator", "v5litepod-4", "--api-endpoint", served.gate.url,
        "--project", PROJECT, "--zone", ZONE, "--name", node, "--json",
        log=node,
    )  # fmt: skip
    return process, release


def _in_phase(served: Matrix, node: str, phase: str) -> bool:
    row = served.row(node)
    return row is not None and row.phase == phase and served.held(node, phase)


def _says(served: Matrix, node: str, text: str) -> bool:
    return text in served.output(node)[1]


def test_two_concurrent_runs_each_delete_only_their_own_node(quick: Matrix) -> None:
    first, second = "tpulab-pair-first", "tpulab-pair-second"
    started = {node: _start(quick, node) for node in (first, second)}
    runs = {node: process for node, (process, _) in started.items()}
    try:
        for node in runs:
            wait_until(partial(_in_phase, quick, node, "execute"), f"{node} executing")
        runs[first].send_signal(signal.SIGINT)
        assert runs[first].wait(timeout=60) == EXIT_INTERRUPTED
        # The first run's teardown is confirmed; the second run and its node are untouched
        # (its payload is still held, so it cannot have finished on its own meanwhile).
        assert first not in quick.listed()
        assert second in quick.listed()
        assert runs[second].poll() is None
        started[second][1]()
        assert runs[second].wait(timeout=120) == 0, quick.output(second)[1][-2000:]
    finally:
        for process, release in started.values():
            release()
            if process.poll() is None:
                process.kill()
                process.wait()
    second_report = json.loads(quick.output(second)[0])
    assert second_report["ok"] is True
    assert second_report["teardown"]["confirmed"] is True
    assert quick.listed() == set()
    assert [row.teardown for row in quick.journal.all_runs()] == ["confirmed", "confirmed"]


def _press_until_it_quits(process: subprocess.Popen[str], *, timeout: float) -> int:
    """Ctrl-C every 0.25 s until `process` exits; its exit status."""
    deadline = time.monotonic() + timeout
    while process.poll() is None and time.monotonic() < deadline:
        process.send_signal(signal.SIGINT)
        try:
            return process.wait(timeout=0.25)
        except subprocess.TimeoutExpired:
            continue
    return process.wait(timeout=1)


def test_ctrl_c_during_teardown_is_refused_and_a_quick_third_forces_quit(quick: Matrix) -> None:
    served = quick
    patient, impatient = "tpulab-ctrl-c-twice", "tpulab-ctrl-c-thrice"
    started = {node: _start(served, node) for node in (patient, impatient)}
    runs = {node: process for node, (process, _) in started.items()}
    # Each teardown's DeleteNode is held at the gate: teardown lasts until released.
    deletes = {node: served.gate.hold(node, "delete") for node in runs}

    try:
        for node, process in runs.items():
            wait_until(partial(_in_phase, served, node, "execute"), f"{node} executing")
            process.send_signal(signal.SIGINT)
        for node, process in runs.items():
            deletes[node].wait_reached()
            process.send_signal(signal.SIGINT)
            wait_until(partial(_says, served, node, "SIGINT ignored"), f"{node} refusing")
        # The third, inside the 2 s window. Pressed again every 0.25 s until the run quits,
        # as an impatient user does: on a loaded machine the test can see the refusal more
        # than 2 s after it was made, and a single third press would then be a fresh
        # (refused) second one, and the run would wait for the held delete.
        assert _press_until_it_quits(runs[impatient], timeout=30) == EXIT_TEARDOWN
        # The forced run's DeleteNode was still held when it quit: its node is still there.
        # Asked now: releasing every hold below lets the gate forward that held request.
        assert impatient in served.emulator.node_names(PROJECT)
        deletes[patient].release()
        assert runs[patient].wait(timeout=60) == EXIT_INTERRUPTED
    finally:
        served.gate.release_all()
        for process, release in started.values():
            release()
            if process.poll() is None:
                process.kill()
                process.wait()

    refused = served.output(patient)[1]
    assert f"SIGINT ignored: deleting node {patient} in {ZONE}" in refused
    report = json.loads(served.output(patient)[0])
    assert report["teardown"]["confirmed"] is True
    assert patient not in served.listed()

    forced = served.output(impatient)[1]
    assert f"Forced quit while deleting node {impatient} in {ZONE}" in forced
    assert f"gcloud compute tpus tpu-vm delete {impatient} --project={PROJECT}" in forced
    row = served.row(impatient)
    assert row is not None
    assert (row.teardown, row.phase) == (None, "teardown")  # left open for the sweep
    sweep = tpulab(
        "teardown", "--verify", "--yes", "--api-endpoint", served.gate.url,
        "--project", PROJECT, "--zone", ZONE,
    )  # fmt: skip
    assert sweep.returncode == 0, sweep.stderr
    assert served.listed() == set()
    assert served.journal.open_runs() == []


@pytest.mark.longest
@pytest.mark.parametrize("group", list(PHASE_GROUPS))
def test_sigkill_in_every_phase_leaves_nothing_even_without_teardown_verify(
    group: str, matrix: Matrix, capsys: pytest.CaptureFixture[str]
) -> None:
    from tpulab.cleanup.journal import VANISHED

    cells = [Cell("SIGKILL", phase) for phase in PHASE_GROUPS[group]]
    order = list(PHASES)
    with ThreadPoolExecutor(max_workers=len(cells)) as pool:
        outcomes = list(pool.map(partial(matrix.run, extra=WATCHDOG_ARGS, sweep=False), cells))
    outcomes.sort(key=lambda o: order.index(o.cell.phase))
    with capsys.disabled():
        print(_table(outcomes).replace("(tpulab run vs. served emulator)", f"(no sweep, {group})"))
    for o in outcomes:
        where = f"SIGKILL in {o.cell.phase}: {o.problems}"
        assert not o.problems, where
        assert o.exit_status == -signal.SIGKILL, where
        assert o.landed == PHASES[o.cell.phase], where
        assert o.gone_by_list, where  # gone by itself: no sweep ran
        assert o.sweep_exit is None, where
    assert matrix.emulator.node_names(PROJECT) == []

    # `tpulab list` proves them gone and closes each row whose node had been created ...
    listed = tpulab(
        "list", "--api-endpoint", matrix.gate.url, "--project", PROJECT, "--zone", ZONE,
        "--json",
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    closed = {r["node_name"]: r["closed_as"] for r in json.loads(listed.stdout)["journal_missing"]}
    for o in outcomes:
        # A run killed in "create" may have a create whose reply never came: only the
        # sweep (which waits for that) may close it.
        want = None if o.cell.phase == "create" else VANISHED
        assert closed.get(o.cell.node) == want, (o.cell.phase, closed)
    # ... and `teardown --verify` finds nothing to delete and closes what is left.
    sweep = tpulab(
        "teardown", "--verify", "--yes", "--json", "--api-endpoint", matrix.gate.url,
        "--project", PROJECT, "--zone", ZONE,
    )  # fmt: skip
    assert sweep.returncode == 0, sweep.stderr
    assert json.loads(sweep.stdout)["deleted"] == []
    assert matrix.journal.open_runs() == []


_WORKLOAD_SCRIPT = f"""\
# The matrix's `-- CMD`: leave an artifact in the run dir, then (for nodes held in
# "workload") say so and wait for the test's release, bounded.
import os, pathlib, time
run_dir = pathlib.Path(os.environ["TPULAB_RUN_DIR"])
run_dir.mkdir(parents=True, exist_ok=True)
(run_dir / "{ARTIFACT}").write_text("written by " + os.environ["TPULAB_RUN_ID"])
print("artifact written", flush=True)
hold = pathlib.Path(os.environ["TPULAB_TEST_SLOW_DIR"],
                    os.path.basename(os.environ["HOME"]) + ".workload")
if hold.is_file():
    pathlib.Path(str(hold) + ".reached").touch()
    deadline = time.monotonic() + {HOLD_LIMIT_SECONDS}
    while not pathlib.Path(str(hold) + ".release").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
"""


def _workload_workspace(served: Matrix) -> Path:
    """The small workspace every row uploads: the matrix's workload script only."""
    work = served.workdir / "workspace"
    work.mkdir()
    (work / "matrix_work.py").write_text(_WORKLOAD_SCRIPT)
    return work


def _workload_args(
    served: Matrix, cell: Cell, work: Path, *, with_package: bool
) -> tuple[str, ...]:
    """The workspace, a per-cell --out, the extra package when the row needs an
    install, and the command (last: everything after `--` is the user's)."""
    from test_workload_extras import PACKAGE, VERSION

    extras = ("--with", f"{PACKAGE}=={VERSION}") if with_package else ()
    out = served.workdir / f"out-{cell.node}"
    return ("--workdir", str(work), "--out", str(out), *extras, "--", "python", "matrix_work.py")


def _fetched_artifact(served: Matrix, cell: Cell) -> str | None:
    found = sorted((served.workdir / f"out-{cell.node}").rglob(ARTIFACT))
    return found[0].read_text() if found else None


@pytest.mark.longest
@pytest.mark.parametrize("phase", list(WORKLOAD_PHASES))
def test_interrupted_in_a_workload_phase_leaves_nothing(
    phase: str, with_index: Matrix, capsys: pytest.CaptureFixture[str]
) -> None:
    """One row per `-- CMD` phase (each its own test, so xdist spreads them): SIGINT and
    SIGTERM exit 130 with the teardown confirmed (and, stopped in "workload", the
    command's artifact fetched) -- except in "fetch", where the first signal lets the
    fetch of the ended command finish: exit 0, the artifact home, teardown confirmed;
    SIGKILL leaves the node to `teardown --verify`; SIGKILL
    with a short lease and no sweep leaves it to the VM's watchdog. Every INSTALL row
    installs a real `--with` package from the local index (the phase exists only then)."""
    served = with_index
    cells = [Cell(sig, phase) for sig in ("SIGINT", "SIGTERM", "SIGKILL")]
    cells.append(Cell("SIGKILL", phase, variant="-wd"))
    work = _workload_workspace(served)

    def run(cell: Cell) -> Outcome:
        args = _workload_args(served, cell, work, with_package=phase == "install")
        if cell.variant == "-wd":
            return served.run(cell, extra=(*WATCHDOG_ARGS, *args), sweep=False)
        return served.run(cell, extra=args)

    with ThreadPoolExecutor(max_workers=len(cells)) as pool:
        outcomes = list(pool.map(run, cells))
    with capsys.disabled():
        print(_table(outcomes).replace("(tpulab run", f"(`-- CMD` in {phase}; tpulab run"))

    for o in outcomes:
        cell = o.cell
        where = f"{cell.signal}{cell.variant} in {phase}: {o.problems}"
        assert not o.problems, where
        assert o.gone_by_list, where
        finished_anyway = phase == "fetch" and cell.signal != "SIGKILL"
        assert o.landed == ("none" if finished_anyway else WORKLOAD_PHASES[phase]), where
        if cell.signal == "SIGKILL":
            assert o.exit_status == -signal.SIGKILL, where
            assert o.node_left_by_kill, where
            if cell.variant == "-wd":
                assert o.sweep_exit is None, where  # gone by its watchdog alone
            else:
                assert o.sweep_exit == 0, where
                assert o.sweep_deleted == [cell.node], where
                assert o.journal == "confirmed", where
        else:
            assert o.exit_status == (0 if finished_anyway else EXIT_INTERRUPTED), where
            assert o.journal == "confirmed", where
            if phase in ("workload", "fetch"):
                # Stopped on the VM, then fetched before the teardown.
                row = served.row(cell.node)
                assert row is not None, where
                assert _fetched_artifact(served, cell) == f"written by {row.run_id}", where
    assert served.emulator.node_names(PROJECT) == []

    # The watchdog's row: `tpulab list` proves the node gone and closes it as such.
    from tpulab.cleanup.journal import VANISHED

    listed = tpulab(
        "list", "--api-endpoint", served.gate.url, "--project", PROJECT, "--zone", ZONE,
        "--json",
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    closed = {r["node_name"]: r["closed_as"] for r in json.loads(listed.stdout)["journal_missing"]}
    assert closed == {Cell("SIGKILL", phase, variant="-wd").node: VANISHED}, closed
    assert served.journal.open_runs() == []
