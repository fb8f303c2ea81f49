"""Helpers the test modules share: plain functions and classes, no fixtures.

Fixtures live in conftest.py (and the `*_fixtures.py` plugins); anything a test module
imports by name lives here, once:

- `require_tool`: skip locally, fail in CI, when a system tool is missing;
- `require_python`: a real interpreter of a version ("3.12"), found as the emulated
  image finds its own (system or pyenv, never a shim, whatever HOME is);
- `FakeClock`: time that moves only when the code under test sleeps (or a test says so);
- `tpulab`: the CLI as a user runs it, a real `python -m tpulab` subprocess;
- `invoke`: the same CLI in this process (typer's runner), when no subprocess is needed;
- `create_ready_node`, `killed_run`: what the cloud and the journal hold after a run
  was killed with SIGKILL, for the sweep and `teardown --verify` to find;
- `served_emulator`: the emulator as `tpulab emulator serve` runs it for a session's
  tests (embedded SSH hosts on the preloaded image), closed with its hosts;
- `wait_until`, `written_text`: wait for an event, or for a file another process writes,
  with a bound that is never a timing (see `wait_until`);
- `refused_port`: a loopback port that refuses connections for as long as it is held;
- `cli_imports`: what a `tpulab ...` command imports, run in a fresh interpreter, to
  keep `--help` and `--dry-run` light;
- `advances`: the next value of a marker file a running command keeps rewriting;
- `group_ended`: no live process is left in a process group (the event "it stopped");
- `Blackhole`: a loopback listener that accepts, reads the request, and never answers;
- `workload_spec`: the RunSpec `run --emulate -- python train.py` builds, with workload
  flags, for the config tests.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import pytest

from tpulab.cleanup.journal import Journal, RunRow, target_for
from tpulab.models import NodeRequest, tpulab_labels

if TYPE_CHECKING:  # the Google client is heavy; tests that need it import it themselves
    from tpulab.cloud.google import GoogleTpuApi
    from tpulab.config import RunSpec
    from tpulab.emulator import Emulator
    from tpulab.emulator.timing import Timing

__all__ = [
    "HEAVY_MODULES",
    "IN_CI",
    "Blackhole",
    "CliImports",
    "FakeClock",
    "advances",
    "cli_imports",
    "create_ready_node",
    "group_ended",
    "invoke",
    "killed_run",
    "refused_port",
    "require_python",
    "require_tool",
    "served_emulator",
    "tpulab",
    "wait_until",
    "watchdog_saw_the_last_renewal",
    "workload_spec",
    "written_text",
]

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}

# How long `wait_until` waits by default. A bound, not a timing: CI runs 4 workers on 2
# loaded cores (load 4-12), where a step that takes 0.1 s alone can take seconds.
WAIT_BOUND = 120.0

ACCELERATOR = "v5litepod-4"
RUNTIME = "v2-alpha-tpuv5-lite"
ZONE = "us-central1-a"


def require_tool(available: bool, what: str) -> None:
    """Skip locally when a system tool is missing, but FAIL in CI: CI must run everything."""
    if available:
        return
    if IN_CI:
        pytest.fail(f"{what} is required in CI (CI=true) but is not installed")
    pytest.skip(f"{what} is not installed")


def require_python(version: str) -> str:
    """A real interpreter of `version` ("3" for this machine's python3, or "3.X"):
    required like any tool. Never a pyenv shim (it runs only the version pyenv has
    selected, and fails when HOME is not pyenv's), and found without HOME."""
    from tpulab.emulator.hostenv import find_interpreter

    if version == "3":
        found = next(
            (p for p in ("/usr/bin/python3", "/usr/local/bin/python3") if os.access(p, os.X_OK)),
            None,
        )
    else:
        interpreter = find_interpreter(version)
        found = None if interpreter is None else str(interpreter)
    require_tool(found is not None, f"python{version}")
    assert found is not None
    return found


@dataclass
class FakeClock:
    """Time that only moves when the code under test sleeps, or a test sets `now`.

    Pass the instance itself (or `.clock`) where a `clock()` is wanted and `.sleep` where
    a `sleep(seconds)` is; every sleep is recorded, so a test can assert the schedule.
    """

    now: float = 0.0
    sleeps: list[float] = field(default_factory=list)

    def __call__(self) -> float:
        return self.now

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.sleeps.append(seconds)
        self.now += seconds


def tpulab(
    *args: str,
    timeout: float = 120,
    env: Mapping[str, str] | None = None,
    stdin: int | IO[str] | None = subprocess.DEVNULL,
) -> subprocess.CompletedProcess[str]:
    """Run `python -m tpulab ARGS` as a user would, with a wide terminal and no stdin
    (a test must never wait on a prompt); `env` adds to this process's environment."""
    return subprocess.run(
        [sys.executable, "-m", "tpulab", *args],
        stdin=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
        check=False,
    )


def invoke(*args: str) -> tuple[int, str, str]:
    """Run the CLI in this process: (exit status, stdout, stderr). An exception the CLI
    did not turn into an exit status is re-raised, so a crash never reads as a status."""
    from typer.testing import CliRunner

    from tpulab.cli import app

    result = CliRunner().invoke(app, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def create_ready_node(
    api: GoogleTpuApi, name: str, labels: Mapping[str, str], zone: str = ZONE
) -> None:
    """Create a node through the real client and wait until its operation is done."""
    request = NodeRequest(
        accelerator_type=ACCELERATOR, runtime_version=RUNTIME, labels=dict(labels)
    )
    api.wait_operation(api.create_node(zone, name, request), timeout=30)


def killed_run(
    api: GoogleTpuApi,
    run_id: str,
    *,
    journal: Journal | None = None,
    pid: int | None = None,
    zone: str = ZONE,
    phase: str = "execute",
    target: str | None = None,
    create: bool = True,
) -> str:
    """What a run killed with SIGKILL leaves: an open journal row whose process is gone
    (`pid`: a dead one, or None) and, unless `create=False`, its labelled node.
    Returns the node's name."""
    name = f"tpulab-{run_id}"
    row = RunRow.for_this_process(
        run_id=run_id,
        project=api.project,
        zone=zone,
        node_name=name,
        accelerator=ACCELERATOR,
        target=target or target_for(api.api_endpoint),
        emulated=True,
        phase=phase,
    )
    (journal or Journal()).open_run(RunRow(**{**row.__dict__, "pid": pid, "proc_start": None}))
    if create:
        create_ready_node(api, name, tpulab_labels(run_id), zone)
    return name


def write_tree(root: Path, files: Mapping[str, str | bytes]) -> Path:
    """Files (workspace-relative path -> content) written under `root`; `root`."""
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
    return root


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under `root` (relative path -> bytes): what a transfer left on a disk."""
    return {
        str(path.relative_to(root)): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


@contextlib.contextmanager
def served_emulator(state: Path, timing: Timing | None = None) -> Iterator[Emulator]:
    """An emulator whose nodes are embedded SSH hosts on the preloaded image (the CLI
    reaches it by its URL, as it reaches `tpulab emulator serve`); `timing` defaults to
    0.3 s creates and deletes."""
    from tpulab.emulator import Emulator
    from tpulab.emulator.hostenv import preloaded_image_env
    from tpulab.emulator.sshhost import EmbeddedHostBackend
    from tpulab.emulator.timing import Timing

    backend = EmbeddedHostBackend(state, image=preloaded_image_env())
    try:
        # Quick creates and deletes: the session tests wait on the CLI, not the emulator.
        chosen = timing if timing is not None else Timing(create_seconds=0.3, delete_seconds=0.3)
        with Emulator(state, host_backend=backend, timing=chosen) as emulator:
            yield emulator
    finally:
        backend.close()


def wait_until(
    predicate: Callable[[], object],
    what: str,
    timeout: float = WAIT_BOUND,
    interval: float = 0.05,
) -> float:
    """Poll `predicate` until it is true; the monotonic time it was first seen true.

    Wait for the event the assertion is about, never for a neighbouring one that merely
    usually comes first (a log line written before the state it announces, an exit
    status before a clean-up). `timeout` is a bound for a hang, not a timing: past it
    the test fails naming `what`, and a loaded machine only makes the wait longer.
    """
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s waiting for {what}"
        time.sleep(interval)
    return time.monotonic()


def watchdog_saw_the_last_renewal(emulator: Emulator, name: str, worker: int = 0) -> bool:
    """Whether `worker`'s watchdog on node (or instance) `name` has read the lease renewal
    now on its disk: it published (tpulab/lease) a renewal it dated no earlier than the
    lease file's last write. Only then may a test move that VM's clock. The watchdog dates
    a renewal when it sees it, on its own clock: one it has not seen yet would be dated
    after the move, and its lease would lapse that much later in real time (a 10-minute
    lease: the test's wait for the watchdog ran out)."""
    from tpulab.contract import LEASE_ATTRIBUTE
    from tpulab.emulator.workers import worker_attributes
    from tpulab.remote.watchdog import parse_lease

    records = [r for r in emulator.snapshot()["nodes"].values() if r["name"] == name]
    if len(records) != 1:
        return False
    leases = [
        path
        for path in emulator.machine_tmp(records[0], worker).glob("tpulab-lease-*")
        if "." not in path.name  # not a renewal's temporary file
    ]
    if len(leases) != 1:
        return False
    written = leases[0].stat().st_mtime
    published = parse_lease(worker_attributes(records[0], worker).get(LEASE_ATTRIBUTE))
    return published is not None and published.renewals >= 1 and published.renewed_at >= written


def written_text(path: Path, what: str | None = None, timeout: float = WAIT_BOUND) -> str:
    """The text of `path` once its writer has finished it: present and ending in a
    newline. A file another process is writing exists before its bytes do (`echo $$ >
    F` creates F, then writes), so "it exists" is not "it is written"; every writer
    this waits for ends its text with a newline."""

    def text() -> str:
        try:
            return path.read_text()
        except FileNotFoundError:
            return ""

    wait_until(lambda: text().endswith("\n"), what or f"{path} to be written", timeout)
    return text()


@contextlib.contextmanager
def refused_port() -> Iterator[int]:
    """A loopback port where every connection is refused, while the block runs: bound,
    never listening. A port bound and released at once is free for any other test's
    server (xdist runs four at a time) to take before the test's client connects."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield int(sock.getsockname()[1])


class Blackhole:
    """A real loopback listener that accepts connections, reads the request, and never
    answers: a host on a dead network path, as a client sees it."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.held: list[socket.socket] = []
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.recv(65536)
            self.held.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


def workload_spec(cwd: Path, **workload: object) -> RunSpec:
    """The spec of `tpulab run --emulate [workload flags] -- python train.py` run in `cwd`."""
    from tpulab.config import TargetFlags, TimeoutFlags, run_inputs
    from tpulab.config.workload import WorkloadFlags

    flags = WorkloadFlags(**{"command": ("python", "train.py"), **workload})  # type: ignore[arg-type]
    return run_inputs(
        target=TargetFlags(accelerator="v5litepod-4", emulate=True),
        timeouts=TimeoutFlags(teardown=60.0),
        env={},
        workload=flags,
        cwd=cwd,
    ).spec


def grouped(**flags: Any) -> dict[str, Any]:
    """run_inputs / build_run_spec keywords from flag-named ones, for tests whose tables
    vary flags of several groups: a TargetFlags, CapacityFlags or PythonFlags field goes
    into that group; the rest (env, cwd, workload, timeouts, ...) stays a keyword."""
    import dataclasses

    from tpulab.config import CapacityFlags, PythonFlags, TargetFlags

    groups = {"target": TargetFlags, "capacity": CapacityFlags, "python": PythonFlags}
    for keyword, group in groups.items():
        names = {field.name for field in dataclasses.fields(group)}
        values = {name: flags.pop(name) for name in list(flags) if name in names}
        flags[keyword] = group(**values)
    return flags


def advances(marker: Path, seconds: float = 30) -> str:
    """The next value of `marker`, which a running command keeps rewriting (aside, then
    renamed): proof that the command is alive and still writing."""
    before = marker.read_text()
    deadline = time.monotonic() + seconds
    while (now := marker.read_text()) == before:
        assert time.monotonic() < deadline, f"the command stopped writing at {before!r}"
        time.sleep(0.1)
    return now


def process_running(pid: int) -> bool:
    """Process `pid` runs on this machine: not gone, not a zombie waiting to be reaped."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return False
    return bool(fields) and fields[0] not in ("Z", "X")


def group_ended(pgid: int) -> bool:
    """No live process is left in process group `pgid` on this machine (Linux /proc),
    which is where the emulator's nodes run their commands: the event "it stopped",
    where a marker that did not change for a while only says "it was slow". Zombies
    are dead (nothing they could still write), so they do not count."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:  # gone between the listing and the read
            continue
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            return False
    return True


# What `tpulab --help` and `--dry-run` must never import: they would cost seconds.
HEAVY_MODULES = (
    "jax", "jaxlib", "numpy", "paramiko", "asyncssh", "grpc", "google.cloud", "google.auth",
)  # fmt: skip

_IMPORTS_PROBE = """
import json, sys
{preamble}
from tpulab.cli import app
try:
    app(sys.argv[2:], prog_name="tpulab")
except SystemExit as done:
    code = done.code
else:
    code = 0
heavy = sorted(
    name for name in sys.modules
    if any(name == m or name.startswith(m + ".") for m in json.loads(sys.argv[1]))
)
print("\\nPROBE " + json.dumps({{"code": code, "heavy": heavy}}))
"""


@dataclass(frozen=True)
class CliImports:
    """The exit code `tpulab ARGV` chose, the HEAVY_MODULES it imported, and its output."""

    code: object
    heavy: list[str]
    stdout: str
    stderr: str


def cli_imports(*argv: str, env: Mapping[str, str] | None = None, preamble: str = "") -> CliImports:
    """Run `tpulab ARGV` in a fresh interpreter (this one has imported everything
    already) and report which HEAVY_MODULES it imported; `preamble` runs first (a test
    that the probe notices an import)."""
    done = subprocess.run(
        [
            sys.executable, "-c", _IMPORTS_PROBE.format(preamble=preamble),
            json.dumps(HEAVY_MODULES), *argv,
        ],
        capture_output=True, text=True, timeout=60, check=False,
        env=None if env is None else {**os.environ, **env},
    )  # fmt: skip
    assert "\nPROBE " in done.stdout, done.stderr + done.stdout
    head, _, probe = done.stdout.rpartition("\nPROBE ")
    found = json.loads(probe)
    return CliImports(found["code"], found["heavy"], head, done.stderr)
