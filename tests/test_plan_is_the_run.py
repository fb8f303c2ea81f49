"""The plan is the run: `--dry-run` shows exactly the requests and commands a run sends.

A real emulated run (the real `GoogleTpuApi` against the emulator, a real SSH host) is
recorded at the wire: the emulator's request log for the API, and a `Connection`
subclass handed in through the `connect` seam for the remote side (it records what the
real connection executes, its own sha256 checks included). A dry run of the same spec
must list the same API requests (method, path with query, body) and the same remote
command lines and transfers, phase by phase. Only values a run makes at random are
normalised, each explicitly: the nonce, the per-run key, operation ids, the node's
address and port, the remote home directory, and the bootstrap's remaining-time budget.
"""

from __future__ import annotations

import itertools
import json
import re
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpulab.app.doctor import preflight_for
from tpulab.cloud import rest
from tpulab.cloud.google import GoogleTpuApi
from tpulab.config import TargetFlags
from tpulab.emulator.sshhost import EmbeddedHostBackend
from tpulab.models import NodeRequest, tpulab_labels
from tpulab.remote.cmdline import remote_command
from tpulab.remote.keys import RunKey, SshTarget
from tpulab.remote.ssh import Connection, RunResult
from tpulab.run.plan import build_plan
from tpulab.run.plan_steps import (
    PLACEHOLDER_CREATE_OPERATION,
    PLACEHOLDER_NODE_IP,
    PLACEHOLDER_NONCE,
    PLACEHOLDER_PUBLIC_KEY,
    PLACEHOLDER_REMOTE_HOME,
    PLACEHOLDER_SSH_PORT,
    PlanStep,
)
from tpulab.run.progress import WORKLOAD_PHASES, NullObserver, Phase

if TYPE_CHECKING:
    from run_rig import Rig

    from tpulab.emulator import Emulator

pytest_plugins = ["emulator_fixtures", "ssh_fixtures", "run_rig"]

Event = tuple[Any, ...]
_OPERATION = re.compile(r"/operations/[^/?]+")
_KILL_AFTER = re.compile(r"^timeout --signal=KILL (\d+\.\d{3}) ")


# -- recording the real run ----------------------------------------------------------


class PhaseMarks(NullObserver):
    """Where each phase starts in the emulator's request log, and the current phase."""

    def __init__(self, emulator: Emulator) -> None:
        self.emulator = emulator
        self.phase = Phase.VALIDATE.value
        self.marks: list[tuple[str, int]] = []

    def phase_started(self, phase: Phase) -> None:
        self.phase = phase.value
        self.marks.append((phase.value, len(self.emulator.requests())))


class TracingConnection(Connection):
    """The real Connection, recording each action as it hands it to the SSH server."""

    def __init__(
        self, target: SshTarget, key: RunKey, *, events: list[Event], phase: Callable[[], str]
    ) -> None:
        super().__init__(target, key, connect_timeout=15)
        self.events = events
        self.phase = phase
        self.opened = False
        self.home = ""  # the login directory, learnt while the session is up

    def open(self) -> None:
        if not self.opened:  # run() and the transfers open lazily through here too
            self.opened = True
            self.events.append((self.phase(), "connect", str(self.target)))
        super().open()

    def run(
        self,
        argv: Sequence[str] | str,
        *,
        env: Mapping[str, str] | None = None,
        timeout: float,
        on_line: Callable[[str, str], None] | None = None,
        check: bool = False,
    ) -> RunResult:
        command = remote_command(argv, env=env, timeout=timeout)
        self.events.append((self.phase(), "exec", command))
        return super().run(argv, env=env, timeout=timeout, on_line=on_line, check=check)

    def put(self, local: Path | bytes, remote: str) -> str:
        self.home = self.home or self.remote_path("~")
        self.events.append((self.phase(), "put", self.remote_path(remote)))
        return super().put(local, remote)

    def read(self, remote: str, *, max_bytes: int) -> bytes:
        self.events.append((self.phase(), "get", self.remote_path(remote)))
        return super().read(remote, max_bytes=max_bytes)


def _fold_transfers(events: list[Event]) -> list[Event]:
    """A transfer and the sha256 check the connection runs for it, as one event. Lease
    renewals after the first are the renewer thread's repeats of it (the plan shows it
    once, like a poll): dropped."""
    folded: list[Event] = []
    renewals = 0
    for event in events:
        if event[1] == "exec" and "/tmp/tpulab-lease-" in event[2]:
            renewals += 1
            if renewals > 1:
                continue
        if folded and folded[-1][1] in {"put", "get"} and len(folded[-1]) == 3:
            phase, action, path = folded.pop()
            assert event[1] == "exec", f"{action} {path} was not followed by its check"
            folded.append((phase, action, path, event[2]))
        else:
            folded.append(event)
    return folded


def _target(entry: Mapping[str, Any]) -> str:
    query = "&".join(f"{k}={v}" for k, v in entry["query"])
    return str(entry["path"]) + (f"?{query}" if query else "")


def _by_the_vm(entry: Mapping[str, Any]) -> bool:
    """A request the node's own watchdog made (with its token), not the controller."""
    return "caller" in entry


def _wire_by_phase(log: list[dict[str, Any]], marks: list[tuple[str, int]]) -> list[Event]:
    """The emulator's log as (phase, method, target, body), consecutive repeats of a
    request within a phase collapsed (that is a poll). The VM's watchdog's own requests
    are not the controller's, so they are not in its plan."""
    bounds = [*marks, ("end", len(log))]
    events: list[Event] = []
    for (phase, start), (_next, end) in itertools.pairwise(bounds):
        for entry in log[start:end]:
            if _by_the_vm(entry):
                continue
            event = (phase, entry["method"], _target(entry), entry["body"])
            if not events or events[-1] != event:
                events.append(event)
    return events


def _plan_events(steps: list[PlanStep]) -> tuple[list[Event], list[Event]]:
    api = [(s.phase, s.method, s.path, s.body) for s in steps if s.kind == "api"]
    ssh: list[Event] = []
    for s in steps:
        if s.kind != "ssh":
            continue
        if s.action == "connect":
            ssh.append((s.phase, "connect", s.target))
        elif s.action == "exec":
            ssh.append((s.phase, "exec", s.command))
        else:
            ssh.append((s.phase, s.action, s.remote_path, s.command))
    return api, ssh


# -- normalising what is random per run ----------------------------------------------


def _normalise(value: Any, replacements: Mapping[str, str]) -> Any:
    if isinstance(value, str):
        for real, marker in replacements.items():
            value = value.replace(real, marker)
        return _OPERATION.sub("/operations/<OP>", value)
    if isinstance(value, dict):
        return {k: _normalise(v, replacements) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_normalise(v, replacements) for v in value)
    return value


def _budgets_within(real: list[Event], plan: list[Event], slack: float) -> None:
    """The bootstrap passes its remaining time as each command's timeout: a real run has
    spent some of it, a plan none. Check the real figure is at most `slack` below the
    plan's, then drop both figures."""
    assert len(real) == len(plan), (real, plan)
    for index, (mine, theirs) in enumerate(zip(real, plan, strict=True)):
        if mine[0] != "bootstrap" or theirs[0] != "bootstrap":
            continue
        got, want = _KILL_AFTER.match(mine[-1]), _KILL_AFTER.match(theirs[-1])
        assert got, mine
        assert want, theirs
        assert 0 <= float(want[1]) - float(got[1]) <= slack, (got[1], want[1])
        real[index] = (*mine[:-1], _KILL_AFTER.sub("timeout --signal=KILL <T> ", mine[-1]))
        plan[index] = (*theirs[:-1], _KILL_AFTER.sub("timeout --signal=KILL <T> ", theirs[-1]))


def _first_renewal_only(commands: list[str]) -> list[str]:
    """The renewer thread's repeats of the first lease renewal dropped (the plan shows it
    once, like a poll)."""
    renewals = 0
    kept: list[str] = []
    for command in commands:
        if "/tmp/tpulab-lease-" in command:
            renewals += 1
            if renewals > 1:
                continue
        kept.append(command)
    return kept


def _budgets_erased(commands: list[str]) -> list[str]:
    """The bootstrap's remaining-time budgets as <T> (their bound is _budgets_within's)."""
    return [_KILL_AFTER.sub("timeout --signal=KILL <T> ", command) for command in commands]


# -- the tests -----------------------------------------------------------------------


def test_dry_run_sends_what_a_real_run_sends(embedded_rig: Rig) -> None:
    # The embedded SSH host only: the connection code is the same against sshd, where one
    # run takes minutes (tests/test_lifecycle.py covers that backend).
    rig = embedded_rig
    spec = rig.spec("v5litepod-1")
    marks = PhaseMarks(rig.emulator)
    events: list[Event] = []
    sessions: list[TracingConnection] = []

    def connect(target: SshTarget, key: RunKey) -> TracingConnection:
        session = TracingConnection(target, key, events=events, phase=lambda: marks.phase)
        sessions.append(session)
        return session

    # The project's preflight as `tpulab run` asks it (app.doctor.preflight_for).
    preflight = preflight_for(spec, rig.emulator.url)
    life, _recorder, error = rig.run(spec, marks, connect=connect, preflight=preflight)
    assert error is None, error
    assert life.outcome.succeeded
    (session,) = sessions
    assert life.target is not None
    assert life.key is not None
    home = session.home
    assert home
    replacements = {
        life.nonce: PLACEHOLDER_NONCE,
        life.key.public_b64: PLACEHOLDER_PUBLIC_KEY,
        f"{life.target.user}@{life.target.host}:{life.target.port}": (
            f"{spec.ssh_user}@{PLACEHOLDER_NODE_IP}:{PLACEHOLDER_SSH_PORT}"
        ),
        home: PLACEHOLDER_REMOTE_HOME,
    }
    real_api = _normalise(_wire_by_phase(rig.emulator.requests(), marks.marks), {})
    real_ssh = _normalise(_fold_transfers(events), replacements)
    real_api = _normalise(real_api, replacements)

    steps = build_plan(spec)
    plan_api, plan_ssh = (_normalise(x, {}) for x in _plan_events(steps))

    assert real_api == plan_api
    _budgets_within(real_ssh, plan_ssh, slack=spec.timeouts.bootstrap / 2)
    assert real_ssh == plan_ssh
    # And byte for byte as the SSH server received them (not as the client meant to send
    # them): every command line of the plan, transfers' checks included, in order.
    assert isinstance(rig.backend, EmbeddedHostBackend)
    received = _first_renewal_only([command for _node, command in rig.backend.received])
    plan_lines = [s.command for s in steps if s.kind == "ssh" and s.command]
    assert _budgets_erased(_normalise(received, replacements)) == _budgets_erased(plan_lines)
    # Sanity: the comparison covered every phase that talks to the VM or the API.
    phases = {event[0] for event in plan_api + plan_ssh}
    # (The `-- CMD` phases are tests/test_workload_plan.py's: this run has no command.)
    workload = {p.value for p in WORKLOAD_PHASES}
    assert phases == {p.value for p in Phase} - {"validate", "verify"} - workload


def test_the_plan_runs_the_lifecycle_and_shows_its_teardown_once(tpulab_home: Path) -> None:
    from tpulab.config import build_run_spec

    spec = build_run_spec(
        target=TargetFlags(accelerator="v6e-1", project="p-123456", zone="us-east5-b"), env={}
    )
    steps = build_plan(spec)
    api = [(s.phase, s.action) for s in steps if s.kind == "api"]
    assert api == [
        ("create", "GetService"),  # the preflight: is the Cloud TPU API enabled?
        ("create", "TestIamPermissions"),  # ... and may this caller run?
        ("create", "CreateNode"),
        ("create", "GetOperation"),
        ("wait-ready", "GetNode"),
        ("host-key", "GetGuestAttributes"),
        ("host-key", "GetNode"),
        ("connect", "GetGuestAttributes"),  # how the VM's watchdog says it is
        ("teardown", "GetNode"),
        ("teardown", "DeleteNode"),
        ("teardown", "GetOperation"),
        ("teardown", "ListNodes"),
    ]
    # The VM's watchdog rides in the CreateNode body; its first renewal follows SSH.
    create = next(s for s in steps if s.action == "CreateNode")
    assert (create.body or {})["metadata"]["startup-script"].startswith("#!/bin/sh\n")
    assert any("/tmp/tpulab-lease-" in (s.command or "") for s in steps if s.phase == "connect")
    verify = [s for s in steps if s.phase == "verify"]
    assert [s.kind for s in verify] == ["local"]
    assert "1 tpu device(s) of v6e-1" in verify[0].action
    # A real TPU image has neither uv nor jax: the plan installs uv, makes the venv with
    # python 3.12, installs jax[tpu], then probes again.
    bootstrap = [s.argv for s in steps if s.phase == "bootstrap"]
    assert len(bootstrap) == 5
    assert (bootstrap[1] or [])[-2:] == ["3.12", "uv"]
    assert "jax[tpu]" in (bootstrap[3] or [])
    # The create operation is polled on the cloud's schedule, with the create timeout.
    operation = steps[[s.action for s in steps].index("GetOperation")]
    assert PLACEHOLDER_CREATE_OPERATION in (operation.path or "")
    assert operation.poll is not None
    assert operation.poll.schedule.startswith("Backoff(initial=1.0, cap=10.0")
    assert operation.poll.timeout_seconds == spec.timeouts.create
    # The host key is looked for on the guest agent's cloud cadence.
    host_key = next(s for s in steps if s.phase == "host-key" and s.poll is not None)
    assert host_key.poll is not None
    assert host_key.poll.schedule.startswith("Backoff(initial=0.5, cap=5.0, factor=2.0")
    # Teardown lists until nothing of the run remains, on teardown.py's own schedule.
    listing = next(s for s in steps if s.action == "ListNodes")
    assert listing.poll is not None
    assert listing.poll.schedule.startswith("Backoff(initial=2.0, cap=10.0, factor=1.5")
    assert listing.poll.timeout_seconds == spec.timeouts.teardown
    # The journal row is written (here: recorded) before CreateNode leaves.
    kinds = [(s.kind, s.action) for s in steps]
    journal = next(i for i, (k, a) in enumerate(kinds) if a.startswith("journal row"))
    assert journal < kinds.index(("api", "CreateNode"))
    # ... and nothing was written: no journal, no receipt, no key file.
    assert not tpulab_home.exists() or not any(tpulab_home.rglob("*"))


def test_wire_builders_match_what_the_client_sends(
    emulator: Emulator, tpu_api: GoogleTpuApi
) -> None:
    """Each `tpulab.cloud.rest` builder against the real client's request on the wire,
    with the options a plain run does not exercise (spot, paging, a query path)."""
    project, zone = tpu_api.project, "us-central1-a"
    request = NodeRequest(
        accelerator_type="v5litepod-4",
        runtime_version="v2-alpha-tpuv5-lite",
        labels=tpulab_labels("run-9"),
        metadata={"ssh-keys": "tpulab:ssh-ed25519 AAAA tpulab"},
        spot=True,
        description="",
    )
    expected: list[rest.WireRequest] = []

    def sent(wire: rest.WireRequest) -> None:
        expected.append(wire)

    sent(rest.create_node(project, zone, "n-1", request))
    operation = tpu_api.create_node(zone, "n-1", request)
    tpu_api.create_node(zone, "n-2", request.model_copy(update={"spot": False}))
    sent(rest.create_node(project, zone, "n-2", request.model_copy(update={"spot": False})))
    tpu_api.wait_operation(operation, timeout=10)
    tpu_api.get_node(zone, "n-1")
    sent(rest.get_node(project, zone, "n-1"))
    tpu_api.guest_attributes(zone, "n-1", "hostkeys/")
    sent(rest.get_guest_attributes(project, zone, "n-1", "hostkeys/"))
    paged = GoogleTpuApi(project, api_endpoint=emulator.url, list_page_size=1)
    assert len(paged.list_nodes(zone)) == 2  # two pages of one node
    sent(rest.list_nodes(project, zone, page_size=1))
    sent(rest.list_nodes(project, zone, page_size=1, page_token="1"))
    tpu_api.delete_node(zone, "n-1")
    sent(rest.delete_node(project, zone, "n-1"))

    log = [
        (e["method"], _target(e), e["body"])
        for e in emulator.requests()
        if "/operations/" not in e["path"]
    ]
    assert log == [(w.method, w.target, w.body) for w in expected]
    (op_get,) = {_target(e) for e in emulator.requests() if "/operations/" in e["path"]}
    assert op_get == rest.get_operation(operation).target
    # Another process reads the same log over HTTP.
    with urllib.request.urlopen(f"{emulator.url}/_emulator/requests", timeout=10) as answer:
        assert json.load(answer)["requests"] == emulator.requests()
