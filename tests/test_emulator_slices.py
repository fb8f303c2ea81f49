"""A multi-host slice in the emulator is one node with a real SSH host per worker VM.

Through the real GoogleTpuApi client: a v5litepod-16 (4 hosts) READY node lists four
networkEndpoints on distinct loopback addresses; each worker publishes its own host key,
port and the node's coordinator port as its own guest attributes; a login to each runs
in its own HOME and its metadata server says which worker it is; deleting the node stops
every worker's host and what its sessions left running. Faults: a dead worker refuses
connections while the others serve. getGuestAttributes answers per worker as the real
API does (workerIds; the answer indexed by position). gcloud's own `tpu-vm ssh
--worker=all` reaches every worker with one `-p`.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tpulab import catalog
from tpulab.cloud.polling import wait_for_state
from tpulab.contract import (
    EMULATOR_COORDINATOR_PORT_ATTRIBUTE,
    HOST_KEY_ATTRIBUTE,
)
from tpulab.emulator.faults import FaultPlan
from tpulab.emulator.workers import worker_count
from tpulab.models import NodeState
from tpulab.remote.ssh import Connection, HostKey, RunKey, SshTarget, ssh_port_from

if TYPE_CHECKING:
    from emulator_fixtures import EmulatorStarter

    from tpulab.cloud.google import GoogleTpuApi
    from tpulab.emulator import Emulator
    from tpulab.emulator.hosts import HostBackend

pytest_plugins = ["emulator_fixtures", "ssh_fixtures"]

PROJECT = "test-project"
ZONE = "us-central1-a"
USER = "tpulab"
SLICE = "v5litepod-16"
WORKERS = 4
WAIT = 60.0
# Each worker asks its own metadata server (the address its guest environment gives)
# which worker it is and who its peers are, as JAX's cloud_tpu_cluster.py does.
ASK_METADATA = (
    'python3 -c "import os, urllib.request as u\n'
    "def md(k):\n"
    "    r = u.Request('http://' + os.environ['GCE_METADATA_HOST'] + "
    "'/computeMetadata/v1/instance/attributes/' + k, headers={'Metadata-Flavor': 'Google'})\n"
    "    return u.urlopen(r, timeout=10).read().decode()\n"
    "print(md('agent-worker-number'))\n"
    "print(','.join(e.split(':')[2] for e in md('worker-network-endpoints').split(',')))\n"
    "print([l for l in md('tpu-env').splitlines() if l.startswith('WORKER_ID')][0])\""
)


def slice_request(key: RunKey, **metadata: str) -> Any:
    from emulator_fixtures import node_request

    request = node_request(SLICE, ssh_keys=key.metadata_entry(USER))
    return request.model_copy(update={"metadata": {**request.metadata, **metadata}})


def worker_attributes(api: GoogleTpuApi, name: str, worker: int) -> dict[str, str]:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        attributes = api.guest_attributes(ZONE, name, worker=worker)
        if HOST_KEY_ATTRIBUTE in attributes:
            return attributes
        time.sleep(0.05)
    raise AssertionError(f"worker {worker} of {name} never published its host key")


def targets(
    api: GoogleTpuApi, backend: HostBackend, name: str
) -> tuple[list[SshTarget], list[dict[str, str]]]:
    """Each worker's SSH target, as the run engine builds it: networkEndpoints[w] and
    worker w's own guest attributes."""
    from ssh_fixtures import login_user

    wait_for_state(api, ZONE, name, {NodeState.READY}, timeout=WAIT)
    attributes = [worker_attributes(api, name, w) for w in range(WORKERS)]
    node = api.get_node(ZONE, name)  # the addresses are published with the host keys
    found = []
    for endpoint, attrs in zip(node.workers, attributes, strict=True):
        assert endpoint.external_ip is not None
        key = HostKey("ssh-ed25519", attrs[HOST_KEY_ATTRIBUTE])
        found.append(
            SshTarget(endpoint.external_ip, ssh_port_from(attrs), login_user(backend, USER), key)
        )
    return found, attributes


def refused(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    except ConnectionResetError:
        # The listener is closing with this connection in its backlog: on its way
        # down, not gone yet (CI /tmp/ci122, openssh): ask again.
        return False
    return False


def wait_until(condition: Any, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def gone(path: Path) -> bool:
    return not path.exists()


def pid_gone(pid: int) -> bool:
    """Not running: no such process, or a zombie left for whoever reaps orphans here."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in status


def test_a_slice_is_one_node_with_an_ssh_host_per_worker(
    start_emulator: EmulatorStarter, host_backend: HostBackend, tmp_path: Path
) -> None:
    from emulator_fixtures import api_for

    emulator = start_emulator(tmp_path / "state", host_backend=host_backend)
    api = api_for(emulator)
    key = RunKey()
    began = time.monotonic()
    api.create_node(ZONE, "sl", slice_request(key, **{"startup-script": "echo booted > boot"}))
    workers, attributes = targets(api, host_backend, "sl")
    print(f"{SLICE}: READY with {WORKERS} published hosts in {time.monotonic() - began:.2f}s")

    addresses = [t.host for t in workers]
    assert addresses == [f"127.0.0.{1 + w}" for w in range(WORKERS)]
    # One port for every worker (gcloud's --worker=all takes one -p), its own host key each.
    assert len({t.port for t in workers}) == 1
    assert len({t.host_key.b64 for t in workers}) == WORKERS
    coordinator = {a[EMULATOR_COORDINATOR_PORT_ATTRIBUTE] for a in attributes}
    assert len(coordinator) == 1
    assert int(coordinator.pop()) not in {t.port for t in workers}

    homes, leftovers = [], []
    for worker, target in enumerate(workers):
        with Connection(target, key, connect_timeout=WAIT) as connection:
            home = connection.run("echo $HOME", timeout=30, check=True).stdout.strip()
            said = connection.run(ASK_METADATA, timeout=30, check=True).stdout.splitlines()
            left = connection.run(
                "sleep 300 >/dev/null 2>&1 & echo $!", timeout=30, check=True
            ).stdout.strip()
        homes.append(home)
        leftovers.append(int(left))
        assert Path(home).resolve() == emulator.sandbox(PROJECT, ZONE, "sl", worker).resolve()
        assert said == [str(worker), ",".join(addresses), f"WORKER_ID: '{worker}'"]
        # Every worker ran the node's startup-script itself, in its own HOME.
        wait_until(partial(Path.is_file, Path(home) / "boot"), f"worker {worker} never booted")
    assert len(set(homes)) == WORKERS

    # Delete: every worker's host stops listening; what sessions left running dies.
    api.wait_operation(api.delete_node(ZONE, "sl"), timeout=WAIT)
    for target in workers:
        wait_until(partial(refused, target.host, target.port), f"{target.host} still listens")
    for pid in leftovers:
        wait_until(partial(pid_gone, pid), f"process {pid} outlived its node")
    for home in homes:
        wait_until(partial(gone, Path(home)), f"{home} outlived its node")


def test_a_dead_worker_refuses_connections_and_the_others_serve(
    start_emulator: EmulatorStarter, tmp_path: Path
) -> None:
    from emulator_fixtures import api_for

    from tpulab.emulator.backends import make_host_backend

    backend = make_host_backend("embedded", tmp_path / "hosts", image="preloaded")
    try:
        emulator = start_emulator(tmp_path / "state", host_backend=backend)
        emulator.faults.dead_workers = [2]
        api = api_for(emulator)
        key = RunKey()
        api.create_node(ZONE, "dead", slice_request(key))
        # Its guest agent still publishes the host keys of a VM whose sshd died.
        workers, _ = targets(api, backend, "dead")
        assert refused(workers[2].host, workers[2].port)
        for worker in (0, 1, 3):
            with Connection(workers[worker], key, connect_timeout=WAIT) as connection:
                said = connection.run("echo up", timeout=30, check=True).stdout.strip()
            assert said == "up"
        assert refused(workers[2].host, workers[2].port)  # still, after the others served

        # A restarted emulator boots every worker again: new keys, the same homes.
        emulator.stop()
        restarted = start_emulator(tmp_path / "state", host_backend=backend)
        again, _ = targets(api_for(restarted), backend, "dead")
        assert [t.host for t in again] == [t.host for t in workers]
        assert not {t.host_key.b64 for t in again} & {t.host_key.b64 for t in workers}
        # The new emulator's fault plan is empty: its worker 2 is alive.
        assert not refused(again[2].host, again[2].port)
        with Connection(again[3], key, connect_timeout=WAIT) as connection:
            home = connection.run("echo $HOME", timeout=30, check=True).stdout.strip()
        assert Path(home).resolve() == restarted.sandbox(PROJECT, ZONE, "dead", 3).resolve()
    finally:
        backend.close()


def _guest_attributes(emulator: Emulator, node: str, body: dict[str, Any]) -> Any:
    url = f"{emulator.url}/v2/projects/{PROJECT}/locations/{ZONE}/nodes/{node}:getGuestAttributes"
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())


def test_get_guest_attributes_answers_per_worker_as_the_request_asks(
    start_emulator: EmulatorStarter, tmp_path: Path
) -> None:
    from emulator_fixtures import api_for, node_request

    from tpulab.emulator.backends import make_host_backend

    backend = make_host_backend("embedded", tmp_path / "hosts", image="preloaded")
    try:
        emulator = start_emulator(tmp_path / "state", host_backend=backend)
        api = api_for(emulator)
        api.create_node(ZONE, "ga", slice_request(RunKey()))
        api.create_node(ZONE, "one", node_request("v5litepod-4"))
        targets(api, backend, "ga")
        worker_attributes(api, "one", 0)

        every = _guest_attributes(emulator, "ga", {})["guestAttributes"]
        assert len(every) == WORKERS
        # The v2 GuestAttributes message: queryPath and queryValue, nothing else.
        assert all(set(entry) == {"queryPath", "queryValue"} for entry in every)
        keys = [
            next(i["value"] for i in e["queryValue"]["items"] if i["key"] == "ssh-ed25519")
            for e in every
        ]
        assert len(set(keys)) == WORKERS
        # gcloud's --worker=all sends [""]: every worker, in worker order.
        assert _guest_attributes(emulator, "ga", {"workerIds": [""]})["guestAttributes"] == every
        asked = _guest_attributes(emulator, "ga", {"workerIds": ["3", "1"]})["guestAttributes"]
        assert asked == [every[3], every[1]]
        narrowed = _guest_attributes(
            emulator, "ga", {"queryPath": "hostkeys/", "workerIds": ["2"]}
        )["guestAttributes"]
        assert [
            i["value"] for i in narrowed[0]["queryValue"]["items"] if i["key"] == "ssh-ed25519"
        ] == [keys[2]]
        assert {i["namespace"] for i in narrowed[0]["queryValue"]["items"]} == {"hostkeys"}
        for bad in (["4"], ["-1"], ["x"]):
            with pytest.raises(urllib.error.HTTPError) as refusal:
                _guest_attributes(emulator, "ga", {"workerIds": bad})
            assert refusal.value.code == 400
        # A single host has one worker: one entry, whatever is asked for all.
        assert len(_guest_attributes(emulator, "one", {})["guestAttributes"]) == 1
        single = api.guest_attributes(ZONE, "one")
        assert EMULATOR_COORDINATOR_PORT_ATTRIBUTE not in single
    finally:
        backend.close()


def test_without_ssh_hosts_a_slice_still_lists_a_distinct_endpoint_per_worker(
    tpu_api: GoogleTpuApi,
) -> None:
    from emulator_fixtures import node_request

    tpu_api.wait_operation(tpu_api.create_node(ZONE, "v5s", node_request(SLICE)), timeout=WAIT)
    tpu_api.wait_operation(
        tpu_api.create_node(ZONE, "v5p", node_request("v5p-16", runtime="v2-alpha-tpuv5")),
        timeout=WAIT,
    )
    assert len({w.ip_address for w in tpu_api.get_node(ZONE, "v5s").workers}) == WORKERS
    assert len({w.ip_address for w in tpu_api.get_node(ZONE, "v5p").workers}) == 2


def test_the_emulators_host_rule_agrees_with_the_catalog() -> None:
    # Two tables kept apart on purpose (tests/test_catalog.py): they must agree.
    for accelerator in catalog.CATALOG.values():
        assert worker_count(accelerator.name) == accelerator.hosts, accelerator.name
    assert worker_count("not-a-type") == 1


def test_worker_faults_are_checked_and_travel_as_json() -> None:
    plan = FaultPlan()
    plan.update({"dead_workers": [2, 0], "late_workers": {"1": 2.5}})
    assert plan.dead_workers == [0, 2]
    assert plan.late_workers == {1: 2.5}
    assert json.loads(json.dumps(plan.to_dict()))["late_workers"] == {"1": 2.5}
    assert plan.refuse_for(1) == 2.5
    assert plan.refuse_for(3) == 0.0
    assert plan.refuse_for(2) > 3600 * 24 * 365
    for bad in (
        {"dead_workers": ["2"]},
        {"dead_workers": [-1]},
        {"late_workers": {"x": 1.0}},
        {"late_workers": {"1": -1.0}},
    ):
        with pytest.raises(ValueError):
            plan.update(bad)


@pytest.mark.gcloud
@pytest.mark.slow
def test_gcloud_tpu_vm_ssh_worker_all_reaches_every_worker_with_one_port(
    start_emulator: EmulatorStarter, host_backend: HostBackend, tmp_path: Path
) -> None:
    """`gcloud compute tpus tpu-vm ssh NODE --worker=all --command 'echo $HOME'
    --ssh-flag=-p<port>`, as tests/test_gcloud_ssh.py points gcloud at the emulator."""
    from emulator_fixtures import api_for
    from test_gcloud_ssh import gcloud_ssh

    emulator = start_emulator(tmp_path / "state", host_backend=host_backend)
    api = api_for(emulator)
    api.create_node(ZONE, "gc-all", slice_request(RunKey()))
    workers, _ = targets(api, host_backend, "gc-all")
    home = tmp_path / "home"
    done = gcloud_ssh(
        emulator,
        home,
        "gc-all",
        workers[0].port,
        "--worker=all",
        command="echo $HOME",
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    answered = {line for line in done.stdout.splitlines() if line.startswith("/")}
    expected = {str(emulator.sandbox(PROJECT, ZONE, "gc-all", w)) for w in range(WORKERS)}
    assert {str(Path(a).resolve()) for a in answered} == {str(Path(e).resolve()) for e in expected}
    # gcloud pinned each worker under its own alias, with that worker's published key.
    known = (home / ".ssh" / "google_compute_known_hosts").read_text().splitlines()
    assert sorted(line.split()[2] for line in known) == sorted(t.host_key.b64 for t in workers)
