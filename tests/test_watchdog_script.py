"""remote_payloads/watchdog.py as the VM runs it: the real startup-script under `sh`, the
real daemon, against a small HTTP server in this test that plays the metadata server,
Resource Manager and the Cloud TPU API (the emulator's own version is tested end to end
in tests/test_watchdog_e2e.py). Lease renewals are the controller's real argv, run here.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from helpers import wait_until, written_text

from tpulab.remote.watchdog import (
    PublishedLease,
    WatchdogConfig,
    parse_lease,
    parse_state,
    renew_command,
    startup_script,
)

PROJECT, ZONE, NODE = "wd-proj", "us-central1-a", "tpulab-wd-node"
TOKEN = "ya29.test-token"
SERVICE_ACCOUNT = "runner@wd-proj.iam.gserviceaccount.com"
NODE_PATH = f"/v2/projects/{PROJECT}/locations/{ZONE}/nodes/{NODE}"
# A Compute Engine instance's DELETE, under the root its config names (not the
# environment's TPU API base), so the test tells the two apart.
COMPUTE_ROOT = "compute-root/"
INSTANCE_PATH = f"/{COMPUTE_ROOT}compute/v1/projects/{PROJECT}/zones/{ZONE}/instances/{NODE}"
# How often these tests' watchdogs poll (FastPolling). A real run's poll is a fifth of its
# lease, 1 to 5 s (WatchdogConfig.poll_seconds, pinned below); the payload polls at
# whatever its config says, so a check here waits for the same number of polls in a
# fraction of the time. Leases, graces and deadlines stay what each test says.
POLL = 0.2
# How late after its grace, lease or deadline the watchdog may fire: one poll plus its
# publish and DELETE round trips on a loaded 2-CPU runner. Counted from
# when the daemon provably ran (its "armed" PUT), never from before `sh` started it:
# the start-up of sh and python3 is not lateness of the watchdog (at load 12 it once
# added 4 s to a bound counted from the startup-script's start).
LATE = POLL + 4.0


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: str
    at: float


@dataclass
class FakeCloud:
    """What the server answers; every request it saw, in order."""

    granted: list[str] = field(default_factory=lambda: ["tpu.nodes.delete"])
    iam_status: int = 200
    delete_statuses: list[int] = field(default_factory=list)  # then 200 for good
    node_id: str = NODE
    preempted: str = "FALSE"  # instance/preempted
    # Until this time.monotonic(), the metadata server's identity answers are 503 (its
    # guest attributes still take PUTs, so what the watchdog says can be read).
    identity_down_until: float = 0.0
    # Replaces the token's JSON (e.g. "[]", which the watchdog cannot read).
    token_body: str | None = None
    requests: list[Seen] = field(default_factory=list)
    attributes: dict[str, list[str]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def states(self) -> list[str]:
        with self.lock:
            return list(self.attributes.get("tpulab/watchdog", []))

    def deletes(self) -> list[Seen]:
        with self.lock:
            return [r for r in self.requests if r.method == "DELETE"]

    def reads(self, key: str) -> int:
        """How many times the watchdog GET metadata `key` (e.g. instance/preempted, which
        it reads at every poll until it says TRUE): its polls, counted as they happen."""
        path = "/computeMetadata/v1/" + key
        with self.lock:
            return sum(1 for r in self.requests if r.method == "GET" and r.path == path)

    def leases(self) -> list[PublishedLease]:
        """Every lease the watchdog published (guest attribute tpulab/lease), in order;
        each must parse."""
        values = self.attribute("tpulab/lease")
        parsed = [parse_lease(value) for value in values]
        assert None not in parsed, values
        return [lease for lease in parsed if lease is not None]

    def attribute(self, key: str) -> list[str]:
        """Every value PUT to guest attribute `key` (namespace/key), in order."""
        with self.lock:
            return list(self.attributes.get(key, []))

    def published(self, state: str) -> Seen:
        """The request that published `state` (the first, if several did)."""
        with self.lock:
            return next(r for r in self.requests if r.method == "PUT" and r.body == state)


def _handler(cloud: FakeCloud) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def _answer(self, status: int, body: object) -> None:
            data = (body if isinstance(body, str) else json.dumps(body)).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _handle(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length).decode() if length else ""
            seen = Seen(self.command, self.path, dict(self.headers), body, time.monotonic())
            with cloud.lock:
                cloud.requests.append(seen)
            path = self.path
            if path.startswith("/computeMetadata/v1/"):
                if self.headers.get("Metadata-Flavor") != "Google":
                    return self._answer(403, "Missing Metadata-Flavor:Google header.")
                return self._metadata(path.removeprefix("/computeMetadata/v1/"), body)
            bearer = self.headers.get("Authorization") == f"Bearer {TOKEN}"
            if path == f"/v1/projects/{PROJECT}:testIamPermissions" and self.command == "POST":
                if cloud.iam_status != 200:
                    error = {"code": cloud.iam_status, "message": "API disabled"}
                    return self._answer(cloud.iam_status, {"error": error})
                asked = json.loads(body)["permissions"]
                return self._answer(200, {"permissions": [p for p in asked if p in cloud.granted]})
            if path in (NODE_PATH, INSTANCE_PATH) and self.command == "DELETE":
                if not bearer:
                    return self._answer(401, {"error": {"code": 401, "message": "no token"}})
                status = cloud.delete_statuses.pop(0) if cloud.delete_statuses else 200
                if status == 200:
                    return self._answer(200, {"name": "operations/op-1", "done": False})
                return self._answer(status, {"error": {"code": status, "message": "nope"}})
            return self._answer(404, {"error": {"code": 404, "message": f"no {path}"}})

        def _metadata(self, path: str, body: str) -> None:
            if path.startswith("instance/guest-attributes/") and self.command == "PUT":
                key = path.removeprefix("instance/guest-attributes/")
                with cloud.lock:
                    cloud.attributes.setdefault(key, []).append(body)
                return self._answer(200, "")
            if time.monotonic() < cloud.identity_down_until:
                return self._answer(503, "the metadata server is starting")
            values = {
                "instance/attributes/tpu-env": (
                    f"ACCELERATOR_TYPE: 'v5litepod-4'\nCONSUMER_PROJECT_ID: '{PROJECT}'\n"
                    f"NODE_ID: '{cloud.node_id}'\nWORKER_ID: '0'\nZONE: '{ZONE}'\n"
                ),
                "instance/service-accounts/default/email": SERVICE_ACCOUNT,
                # What a Compute Engine instance has instead of tpu-env.
                "instance/name": cloud.node_id,
                "instance/zone": f"projects/123456/zones/{ZONE}",
                "project/project-id": PROJECT,
                "instance/preempted": cloud.preempted,
                "instance/service-accounts/default/token": cloud.token_body
                or json.dumps({"access_token": TOKEN, "expires_in": 3599, "token_type": "Bearer"}),
            }
            if path in values:
                return self._answer(200, values[path])
            return self._answer(404, "not found")

        do_GET = do_PUT = do_POST = do_DELETE = _handle

    return Handler


@pytest.fixture
def cloud() -> Iterator[tuple[FakeCloud, str]]:
    state = FakeCloud()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state, f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class Armed:
    """One watchdog started through its real startup-script; killed at the end.

    `disk` stands in for the VM's disk (TPULAB_EMULATED_DISK: where it remembers its
    first boot; a fresh directory, removed at stop, unless given) and `clock_skip` for the
    emulator's clock-skip file (TPULAB_EMULATED_CLOCK_SKIP), as the emulator sets them."""

    def __init__(
        self,
        config: WatchdogConfig,
        address: str,
        *,
        disk: Path | None = None,
        clock_skip: Path | None = None,
    ) -> None:
        self.config = config
        # Never the runner's own /var/lib/tpulab (tests may run as root).
        self._own_disk = disk is None
        self.disk = disk or Path(tempfile.mkdtemp(prefix="tpulab-wd-disk-"))
        env = {
            **os.environ,
            "GCE_METADATA_HOST": address,
            "TPULAB_TPU_API_BASE": f"http://{address}/",
            "TPULAB_RESOURCE_MANAGER_BASE": f"http://{address}/",
            "TPULAB_EMULATED_DISK": str(self.disk),
        }
        if clock_skip is not None:
            env["TPULAB_EMULATED_CLOCK_SKIP"] = str(clock_skip)
        self.started = time.monotonic()
        # Pipes, like the guest agent's runner: communicate() returns only once every
        # holder of the write ends closed them, so this proves the daemon let go.
        boot = subprocess.run(
            ["sh", "-c", startup_script(config)], env=env, capture_output=True, timeout=20
        )
        self.boot_seconds = time.monotonic() - self.started
        assert boot.returncode == 0, boot.stderr
        self.pid = int(written_text(Path(config.pid_path), "the watchdog's pid file"))
        self.seq = 0

    def renew(self) -> None:
        self.seq += 1
        subprocess.run(renew_command(self.config, self.seq), check=True, timeout=10)

    def alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        return True

    def power_off(self) -> None:
        """The VM going down: the watchdog killed, /tmp's lease and pid file cleared
        (the log stays, for the next boot to append to)."""
        if self.alive():
            os.kill(self.pid, signal.SIGKILL)
        wait_until(lambda: not self.alive(), "the watchdog to die")
        for path in (self.config.lease_path, self.config.pid_path):
            Path(path).unlink(missing_ok=True)

    def stop(self) -> None:
        if self.alive():
            os.kill(self.pid, signal.SIGKILL)
        for path in (self.config.lease_path, self.config.log_path, self.config.pid_path):
            Path(path).unlink(missing_ok=True)
        if self._own_disk:
            shutil.rmtree(self.disk, ignore_errors=True)

    def log(self) -> str:
        return Path(self.config.log_path).read_text()


@dataclass(frozen=True)
class FastPolling(WatchdogConfig):
    """A run's watchdog config, except that its daemon polls every POLL seconds. The
    config's JSON (startup_script embeds it) carries the poll like any other field."""

    @property
    def poll_seconds(self) -> float:
        return POLL


def _config(tmp: str, **overrides: float) -> WatchdogConfig:
    values: dict[str, float] = {
        "lease_seconds": 2.0,
        "boot_grace_seconds": 2.0,
        "max_duration_seconds": 600.0,
    }
    values.update(overrides)
    return FastPolling(
        run_id=f"20261201t120000-{tmp}",
        node_name=NODE,
        zone=ZONE,
        project=PROJECT,
        lease_seconds=values["lease_seconds"],
        boot_grace_seconds=values["boot_grace_seconds"],
        max_duration_seconds=values["max_duration_seconds"],
    )


@pytest.fixture
def armed() -> Iterator[list[Armed]]:
    started: list[Armed] = []
    yield started
    for one in started:
        one.stop()


def _start(armed: list[Armed], config: WatchdogConfig, address: str) -> Armed:
    one = Armed(config, address)
    armed.append(one)
    return one


def test_boot_grace_lapses_without_a_renewal_and_the_node_deletes_itself(
    cloud: tuple[FakeCloud, str], armed: list[Armed]
) -> None:
    state, address = cloud
    dog = _start(armed, _config("a1b2c3"), address)
    # The boot runner got its pipe back: the watchdog daemonised (a watchdog that did not
    # would hold it until the node is gone; the bound is a guard, not a timing).
    assert dog.boot_seconds < 30
    wait_until(lambda: state.deletes(), "the DELETE")
    delete = state.deletes()[0]
    assert delete.path == NODE_PATH
    assert delete.headers["Authorization"] == f"Bearer {TOKEN}"
    # Not before the boot grace (2 s from the daemon's start, which is after dog.started)
    # ran out, and not much after (the grace began before the daemon said "armed").
    assert delete.at - dog.started >= 2.0
    assert delete.at - state.published("armed").at < 2.0 + LATE
    assert state.states() == ["armed", "firing: lease expired"]
    assert parse_state(state.states()[0]).armed
    # The permission was checked with the token, for the right project and permission.
    iam = [r for r in state.requests if r.path.endswith(":testIamPermissions")]
    assert iam
    assert json.loads(iam[0].body) == {"permissions": ["tpu.nodes.delete"]}
    assert iam[0].headers["Authorization"] == f"Bearer {TOKEN}"
    assert "already gone" not in dog.log()


def test_renewals_hold_it_off_and_it_fires_one_lease_after_the_last(
    cloud: tuple[FakeCloud, str], armed: list[Armed]
) -> None:
    state, address = cloud
    dog = _start(armed, _config("d4e5f6"), address)
    stop_renewing = time.monotonic() + 4.0  # two leases' worth of renewals
    while time.monotonic() < stop_renewing:
        before_last = time.monotonic()
        dog.renew()
        time.sleep(0.4)
    assert state.deletes() == [], "a renewed lease must not fire"
    wait_until(lambda: state.deletes(), "the DELETE after the renewals stopped")
    fired = state.deletes()[0].at
    # One lease from when the daemon saw the last renewal: not before it was written...
    assert fired - before_last >= 2.0, fired - before_last
    # ...and at most LATE after the daemon provably saw it: its last lease publication
    # (it publishes each change of the lease file it sees, and nothing changed after the
    # last write). Counted from the test's write, a loaded runner's daemon that saw the
    # write seconds late read as a watchdog firing late.
    seen_last = _lease_puts(state)[-1].at
    assert before_last <= seen_last < fired, (before_last, seen_last, fired)
    assert fired - seen_last < 2.0 + LATE, fired - seen_last
    assert parse_lease(state.attribute("tpulab/lease")[-1]) is not None
    assert state.states()[-1] == "firing: lease expired"


def _lease_puts(state: FakeCloud) -> list[Seen]:
    """The watchdog's publications of its lease (guest attribute tpulab/lease), in order."""
    with state.lock:
        return [
            r
            for r in state.requests
            if r.method == "PUT" and r.path.endswith("/guest-attributes/tpulab/lease")
        ]


def test_the_hard_deadline_fires_even_while_the_lease_is_renewed(
    cloud: tuple[FakeCloud, str], armed: list[Armed]
) -> None:
    state, address = cloud
    dog = _start(armed, _config("a7b8c9", max_duration_seconds=3.0), address)
    until = time.monotonic() + 60  # a bound: the deadline fires after 3 s
    while not state.deletes() and time.monotonic() < until:
        dog.renew()
        time.sleep(0.3)
    assert state.deletes(), "the deadline never fired"
    fired = state.deletes()[0].at
    assert fired - dog.started >= 3.0
    # Not later than the deadline either, by the watchdog's own clock: each poll that saw
    # a renewal and did not fire published the lease dated by that poll (`renewed_at`),
    # so those polls span less than the 3 s the deadline allows. When the DELETE arrived
    # is no bound: a loaded runner's test server once took 11 s to see it (CI,
    # 2026-12-06), while the polls themselves stayed within the deadline.
    polls = [parse_lease(put.body) for put in _lease_puts(state)]
    dated = [lease.renewed_at for lease in polls if lease is not None]
    assert len(dated) >= 2, "too few renewals seen to date the polls"
    assert dated[-1] - dated[0] < 3.0, dated
    assert state.states()[-1] == "firing: deadline"


def test_transient_delete_failures_are_retried_and_404_means_done(
    cloud: tuple[FakeCloud, str], armed: list[Armed]
) -> None:
    state, address = cloud
    state.delete_statuses = [503, 429, 404]
    dog = _start(armed, _config("c0ffee", boot_grace_seconds=1.0), address)
    wait_until(lambda: len(state.deletes()) >= 3, "three DELETEs")
    wait_until(lambda: "already gone" in dog.log(), "the watchdog to see 404")
    # 404 is done: it says it waits the long while of a delete under way, not a retry's
    # backoff (which would send a fourth DELETE 4 s after the 404).
    wait_until(lambda: "deleting: under way, or done" in dog.log(), "the watchdog to stand by")
    assert len(state.deletes()) == 3, "404 is done: no DELETE after it"


def test_no_permission_is_published_with_the_identity_and_the_role_to_grant(
    cloud: tuple[FakeCloud, str], armed: list[Armed]
) -> None:
    state, address = cloud
    state.granted = []
    _start(armed, _config("ab12cd", boot_grace_seconds=60.0), address)
    wait_until(lambda: state.states(), "a published state")
    parsed = parse_state(state.states()[0])
    assert parsed.kind == "no-permission"
    assert not parsed.armed
    assert SERVICE_ACCOUNT in parsed.detail
    assert "roles/tpu.admin" in parsed.detail
    fix = parsed.fix(SERVICE_ACCOUNT)
    assert fix is not None
    assert SERVICE_ACCOUNT in fix
    assert "tpu.nodes.delete" in fix


def test_a_refused_permission_check_reads_unverified_and_stays_armed(
    cloud: tuple[FakeCloud, str], armed: list[Armed]
) -> None:
    state, address = cloud
    state.iam_status = 403
    _start(armed, _config("ef34ab", boot_grace_seconds=1.0), address)
    wait_until(lambda: state.deletes(), "the DELETE of an unverified watchdog")
    parsed = parse_state(state.states()[0])
    assert parsed.kind == "unverified"
    assert parsed.armed
    assert "403" in parsed.detail


def test_a_vm_that_is_not_the_configured_node_is_never_deleted(
    cloud: tuple[FakeCloud, str], armed: list[Armed]
) -> None:
    state, address = cloud
    state.node_id = "someone-elses-node"
    dog = _start(armed, _config("fe56dc", boot_grace_seconds=1.0), address)
    wait_until(lambda: state.states(), "a published state")
    # Gone first, then checked: a watchdog that has exited can delete nothing more, so
    # "never deleted" is proven, not inferred from a quiet 2.5 s.
    wait_until(lambda: not dog.alive() or state.deletes(), "the watchdog to stand down")
    assert state.deletes() == []
    assert not dog.alive()
    parsed = parse_state(state.states()[0])
    assert parsed.kind == "error"
    assert "someone-elses-node" in parsed.detail


def test_a_queued_node_deletes_its_queued_resource_with_force_then_itself(
    cloud: tuple[FakeCloud, str], armed: list[Armed]
) -> None:
    """Deleting only the node would leave its queued resource SUSPENDED, holding quota."""
    state, address = cloud
    config = dataclasses.replace(_config("9a8b7c"), queued_resource=NODE)
    _start(armed, config, address)
    wait_until(lambda: len(state.deletes()) >= 2, "both DELETEs")
    first, second = state.deletes()[:2]
    assert (
        first.path == f"/v2/projects/{PROJECT}/locations/{ZONE}/queuedResources/{NODE}?force=true"
    )
    assert second.path == NODE_PATH
    assert first.headers["Authorization"] == f"Bearer {TOKEN}"


def test_a_delete_path_naming_another_resource_is_refused(
    cloud: tuple[FakeCloud, str], armed: list[Armed]
) -> None:
    state, address = cloud
    config = dataclasses.replace(_config("6d5e4f", boot_grace_seconds=1.0), queued_resource="x")
    dog = _start(armed, config, address)
    wait_until(lambda: state.states(), "a published state")
    wait_until(lambda: not dog.alive() or state.deletes(), "the watchdog to stand down")
    assert state.deletes() == []
    assert not dog.alive()
    parsed = parse_state(state.states()[0])
    assert parsed.kind == "error"
    assert "queuedResources/x" in parsed.detail


def test_the_lease_is_published_at_start_and_at_every_renewal_for_other_machines(
    cloud: tuple[FakeCloud, str], armed: list[Armed]
) -> None:
    state, address = cloud
    leases = state.leases
    before_start = time.time()
    dog = _start(armed, _config("1ea5e0", lease_seconds=30.0, boot_grace_seconds=45.0), address)
    wait_until(leases, "the lease published at the watchdog's start")
    (first,) = leases()
    # Before any renewal the boot grace is the lease, counted from the watchdog's start.
    assert (first.renewals, first.lease_seconds) == (0, 45.0)
    assert before_start <= first.renewed_at <= time.time()
    assert first.fresh(time.time())
    before_renewal = time.time()
    dog.renew()
    wait_until(lambda: len(leases()) == 2, "the lease published after the renewal")
    second = leases()[1]
    assert (second.renewals, second.lease_seconds) == (1, 30.0)
    # Dated when the watchdog saw the renewal: after it was written, within a poll.
    assert before_renewal <= second.renewed_at <= time.time()
    # Each renewal is published once, with its count (the poll between them re-sends
    # nothing: the third value is this renewal's, not a repeat of the second).
    dog.renew()
    wait_until(lambda: len(leases()) == 3, "the lease published after a second renewal")
    assert leases()[2].renewals == 2
    assert not second.fresh(second.renewed_at + 30.0)
    assert state.deletes() == []


def _watchdog_module(monkeypatch: pytest.MonkeyPatch) -> Any:
    """remote_payloads/watchdog.py imported in this process, for what needs a clock of
    the test's choosing rather than the daemon's."""
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "remote_payloads" / "watchdog.py"
    spec = importlib.util.spec_from_file_location("vm_watchdog", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # its dataclasses look it up
    spec.loader.exec_module(module)
    return module


def test_the_published_lease_length_is_the_configured_one_at_any_clock_reading(
    cloud: tuple[FakeCloud, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lease is published as a length measured on the VM's monotonic clock (its end
    minus now). At 8160.425853 s of uptime (one reading of many) (now + 45) - now is
    45.00000000000091 in floating point: the published length is rounded to the
    millisecond, as its time is, so another machine reads the 45 s it was given (a
    full-suite run met such a reading, 2026-12-07)."""
    state, address = cloud
    module = _watchdog_module(monkeypatch)
    uptime = 8160.425853
    assert (uptime + 45.0) - uptime != 45.0  # the reading still shows the rounding
    config = module.Config.from_json(
        _config("5ec0de", lease_seconds=30.0, boot_grace_seconds=45.0).as_json()
    )
    dog = module.Watchdog(
        config,
        module.Metadata(address),
        api_base=f"http://{address}/",
        resource_manager_base=f"http://{address}/",
        clock=lambda: uptime,
        log=lambda line: None,
    )
    dog.publish_lease()
    (lease,) = state.leases()
    assert (lease.renewals, lease.lease_seconds) == (0, 45.0)


def test_the_emulators_clock_skip_moves_the_watchdogs_clock_forward_never_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The emulator's seam (TPULAB_EMULATED_CLOCK_SKIP, Emulator.skip_vm_clock): a skip
    file adds to the watchdog's monotonic clock; a missing, half-written or smaller value
    never moves it back (a deadline once passed stays passed). Unset: time.monotonic."""
    module = _watchdog_module(monkeypatch)
    assert module.vm_clock(None) is time.monotonic
    skip = tmp_path / "clock-skip"
    clock = module.vm_clock(str(skip))
    assert abs(clock() - time.monotonic()) < 1.0  # no file yet: not skipped
    skip.write_text("100.0\n")
    assert clock() - time.monotonic() >= 99.0
    for unread in ("", "not a number", None):
        if unread is None:
            skip.unlink()
        else:
            skip.write_text(unread)
        assert clock() - time.monotonic() >= 99.0, unread
    skip.write_text("250.5\n")
    assert clock() - time.monotonic() >= 249.0


def test_a_compute_instance_checks_its_own_permission_and_deletes_at_its_configs_root(
    cloud: tuple[FakeCloud, str], armed: list[Armed]
) -> None:
    state, address = cloud
    state.granted = ["compute.instances.delete"]
    config = dataclasses.replace(
        _config("c0m9ut"), provider="compute", api_base=f"http://{address}/{COMPUTE_ROOT}"
    )
    assert json.loads(config.as_json())["delete_paths"] == [INSTANCE_PATH.split(COMPUTE_ROOT)[1]]
    _start(armed, config, address)
    wait_until(lambda: state.deletes(), "the DELETE")
    assert [d.path for d in state.deletes()][:1] == [INSTANCE_PATH]
    assert state.states()[0] == "armed"
    iam = [r for r in state.requests if r.path.endswith(":testIamPermissions")]
    assert json.loads(iam[0].body) == {"permissions": ["compute.instances.delete"]}
    # It learnt its name from instance/name: it never asked for tpu-env.
    assert not [r for r in state.requests if r.path.endswith("/tpu-env")]


def test_a_runs_poll_is_a_fifth_of_its_lease_between_one_and_five_seconds() -> None:
    """What a real run's daemon is told (these tests' FastPolling aside): a poll often
    enough that it fires at most a fifth of a lease late, never more than every second."""

    def real(lease: float) -> WatchdogConfig:
        return WatchdogConfig("20261201t120000-po11ed", NODE, ZONE, PROJECT, lease, 60.0, 600.0)

    polls = {lease: real(lease).poll_seconds for lease in (2.0, 10.0, 20.0, 600.0)}
    assert polls == {2.0: 1.0, 10.0: 2.0, 20.0: 4.0, 600.0: 5.0}
    assert json.loads(real(10.0).as_json())["poll_seconds"] == 2.0
    assert json.loads(_config("f0a5t1").as_json())["poll_seconds"] == POLL


def test_a_tpu_nodes_config_is_what_it_always_was() -> None:
    keys = set(json.loads(_config("t0p0a1").as_json()))
    assert "provider" not in keys
    assert "api_base" not in keys
