"""An emulated node runs its `startup-script` at boot, in its sandbox, with the node's
environment (metadata server, API bases), and everything it starts -- daemonised
children included -- dies with the node: on delete, on emulator stop, and when the
emulator process itself is SIGKILLed. Real processes throughout; the checks read /proc.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import urllib.request
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from helpers import process_running, wait_until, written_text

from tpulab.contract import (
    METADATA_HOST_ENV,
    RESOURCE_MANAGER_BASE_ENV,
    TPU_API_BASE_ENV,
)
from tpulab.emulator import Emulator
from tpulab.remote.ssh import Connection, RunKey, SshTarget, ssh_port_from, wait_for_host_key

if TYPE_CHECKING:
    from emulator_fixtures import EmulatorStarter

    from tpulab.emulator.hosts import HostBackend

pytest_plugins = ["emulator_fixtures", "ssh_fixtures"]

PROJECT = "test-project"
ZONE = "us-central1-a"
NODES = f"/v2/projects/{PROJECT}/locations/{ZONE}/nodes"
USER = "tpulab"

# Writes what a boot-time service sees, then daemonises three ways and records the pids:
# setsid, a double fork, and `env -i` (which drops every variable, the node's tag too).
_DAEMONS = """
env | sort > "$HOME/env.txt"
pwd > "$HOME/cwd.txt"
echo boot >> "$HOME/boots.txt"
setsid sleep 600 </dev/null >/dev/null 2>&1 &
echo $! > "$HOME/setsid.pid"
( ( sleep 600 </dev/null >/dev/null 2>&1 & echo $! > "$HOME/double.pid" ) & )
env -i setsid sleep 600 </dev/null >/dev/null 2>&1 &
echo $! > "$HOME/envi.pid"
echo "startup done"
"""


def _create(
    emulator: Emulator | str,
    name: str,
    metadata: dict[str, str],
    labels: dict[str, str] | None = None,
) -> None:
    url = emulator if isinstance(emulator, str) else emulator.url
    body = {
        "acceleratorType": "v5litepod-4",
        "runtimeVersion": "v2-alpha-tpuv5-lite",
        "metadata": metadata,
        "labels": labels or {},
    }
    request = urllib.request.Request(
        f"{url}{NODES}?nodeId={name}",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 200


def _pids(sandbox: Path, names: tuple[str, ...] = ("setsid", "double", "envi")) -> list[int]:
    # `echo $! > F` creates F before it writes the pid: wait for the line, not the file.
    pids = [int(written_text(sandbox / f"{name}.pid")) for name in names]
    assert all(process_running(pid) for pid in pids), pids
    return pids


def _env(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def _guest(emulator: Emulator, name: str) -> dict[str, Any]:
    node = emulator.snapshot()["nodes"][f"{PROJECT}/{ZONE}/{name}"]
    return dict(node.get("guest") or {})


def _recorded(emulator: Emulator, name: str, field: str) -> Any:
    """The guest's `field` once the emulator has recorded it: it starts the guest, then
    records it, and by then the startup-script may already have written what a test
    waits for (a loaded run read the state in between: KeyError 'init_pid', 2026-12-07)."""
    wait_until(lambda: field in _guest(emulator, name), f"the guest's {field} recorded")
    return _guest(emulator, name)[field]


@pytest.fixture
def guest_emulator(start_emulator: EmulatorStarter, tmp_path: Path) -> Emulator:
    return start_emulator(tmp_path / "state", guests=True)


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        pytest.param(
            "#!/usr/bin/env python3\n"
            "import os, sys\n"
            "open(os.path.join(os.environ['HOME'], 'booted'), 'w').write("
            "'python ' + os.environ['GCE_METADATA_HOST'] + '\\n')\n"
            "print('hello from python', file=sys.stderr)\n",
            "python ",
            id="shebang-python",
        ),
        pytest.param(
            # No #! line: the runner's `bash -c FILE` runs it with bash.
            'echo "bash${BASH_VERSION:+-yes} $GCE_METADATA_HOST" > "$HOME/booted"\n'
            "echo hello from bash\n",
            "bash-yes ",
            id="no-shebang",
        ),
    ],
)
def test_startup_script_runs_at_boot(guest_emulator: Emulator, script: str, expected: str) -> None:
    _create(guest_emulator, "n1", {"startup-script": script})
    sandbox = guest_emulator.sandbox(PROJECT, ZONE, "n1")
    booted = written_text(sandbox / "booted", "the startup-script's file")
    address = _recorded(guest_emulator, "n1", "metadata")
    assert booted.strip() == f"{expected}{address}"
    log = guest_emulator.startup_log(PROJECT, ZONE, "n1")
    wait_until(lambda: "exit status 0" in log.read_text(), "the exit status in the log")
    assert "hello from" in log.read_text()
    # As google_metadata_script_runner: the script's temporary directory is gone after.
    # The runner logs the exit status first and removes the directory after (a deferred
    # RemoveAll in the agent, the next line in guest_init), so wait for it as well.
    wait_until(
        lambda: not list((sandbox / ".tpulab-emulator").glob("metadata-scripts*")),
        "the script's temporary directory to be removed",
    )


def test_a_node_without_a_startup_script_still_boots_its_metadata_server(
    guest_emulator: Emulator,
) -> None:
    _create(guest_emulator, "n1", {})
    wait_until(lambda: bool(_guest(guest_emulator, "n1").get("metadata")), "the metadata server")
    assert _guest(guest_emulator, "n1")["tag"] is None
    assert not guest_emulator.startup_log(PROJECT, ZONE, "n1").exists()


_SELF_DELETE = textwrap.dedent(
    """\
    #!/usr/bin/env python3
    # What a watchdog does, with the stdlib only: who am I, my token, delete myself.
    import json, os, time, urllib.request

    host = os.environ.get("GCE_METADATA_HOST") or "metadata.google.internal"
    base = os.environ.get("TPULAB_TPU_API_BASE") or "https://tpu.googleapis.com/"

    def metadata(path):
        request = urllib.request.Request(
            f"http://{host}/computeMetadata/v1/{path}", headers={"Metadata-Flavor": "Google"}
        )
        return urllib.request.urlopen(request, timeout=10).read().decode()

    if os.fork() == 0:  # a daemon (double fork + setsid), as a watchdog would be
        os.setsid()
        if os.fork() == 0:
            # Written aside, then renamed: whoever sees the file sees the pid.
            pid_file = os.path.join(os.environ["HOME"], "daemon.pid")
            with open(pid_file + ".tmp", "w") as out:
                out.write(f"{os.getpid()}\\n")
            os.replace(pid_file + ".tmp", pid_file)
            time.sleep(600)
        os._exit(0)
    env = {}
    for line in metadata("instance/attributes/tpu-env").splitlines():
        key, _, value = line.partition(":")
        env[key.strip()] = value.strip().strip("'")
    token = json.loads(metadata("instance/service-accounts/default/token"))["access_token"]
    while not os.path.exists(os.path.join(os.environ["HOME"], "daemon.pid")):
        time.sleep(0.05)
    url = (
        f"{base}v2/projects/{env['CONSUMER_PROJECT_ID']}/locations/{env['ZONE']}"
        f"/nodes/{env['NODE_ID']}"
    )
    request = urllib.request.Request(
        url, method="DELETE", headers={"Authorization": f"Bearer {token}"}
    )
    print("delete answered", urllib.request.urlopen(request, timeout=10).status)
    """
)


def test_the_startup_script_deletes_its_own_node_and_its_daemon_dies(
    guest_emulator: Emulator,
) -> None:
    from emulator_fixtures import api_for

    api = api_for(guest_emulator, project=PROJECT)
    _create(guest_emulator, "selfdel", {"startup-script": _SELF_DELETE})
    _create(guest_emulator, "bystander", {})
    sandbox = guest_emulator.sandbox(PROJECT, ZONE, "selfdel")
    daemon = int(written_text(sandbox / "daemon.pid", "the daemon"))
    wait_until(
        lambda: [n.name for n in api.list_nodes(ZONE)] == ["bystander"], "the node to delete itself"
    )
    wait_until(lambda: not process_running(daemon), "the daemon to die with its node")


def test_a_deleted_nodes_watchdog_files_in_tmp_go_with_it(guest_emulator: Emulator) -> None:
    """Emulated VMs share this machine's /tmp: the files a node's watchdog keeps there
    (named for its run) go when the node does, as they would with a VM's disk; another
    run's, or a name that merely starts like them, stay."""
    from emulator_fixtures import api_for

    run_id = f"20261203t000000-{uuid.uuid4().hex[:6]}"
    other = f"20261203t000000-{uuid.uuid4().hex[:6]}"
    tmp = Path("/tmp")
    ours = [tmp / f"tpulab-lease-{run_id}", tmp / f"tpulab-watchdog-{run_id}.log"]
    kept = [tmp / f"tpulab-lease-{other}", tmp / f"tpulab-lease-{run_id}-not-ours"]
    script = "#!/bin/sh\n" + "".join(f"echo x > {path}\n" for path in [*ours, *kept])
    script += "echo done > $HOME/wrote\n"
    try:
        _create(guest_emulator, "n1", {"startup-script": script}, {"tpulab-run": run_id})
        written_text(guest_emulator.sandbox(PROJECT, ZONE, "n1") / "wrote", "the script")
        assert all(path.exists() for path in [*ours, *kept])
        api = api_for(guest_emulator, project=PROJECT)
        api.wait_operation(api.delete_node(ZONE, "n1"), timeout=20)
        wait_until(lambda: guest_emulator.node_names() == [], "the node to go")
        wait_until(lambda: not any(path.exists() for path in ours), "its /tmp files to go")
        assert all(path.exists() for path in kept)
    finally:
        for path in [*ours, *kept]:
            path.unlink(missing_ok=True)


def test_daemonised_children_die_when_the_controller_deletes_the_node(
    guest_emulator: Emulator,
) -> None:
    from emulator_fixtures import api_for

    api = api_for(guest_emulator, project=PROJECT)
    _create(guest_emulator, "n1", {"startup-script": _DAEMONS})
    sandbox = guest_emulator.sandbox(PROJECT, ZONE, "n1")
    pids = _pids(sandbox)
    init_pid = _recorded(guest_emulator, "n1", "init_pid")
    assert process_running(init_pid)

    # The script's environment: the image's plus the node's own addresses, HOME = cwd.
    env = _env(sandbox / "env.txt")
    assert env[METADATA_HOST_ENV] == _guest(guest_emulator, "n1")["metadata"]
    assert env[TPU_API_BASE_ENV] == guest_emulator.url + "/"
    assert env[RESOURCE_MANAGER_BASE_ENV] == guest_emulator.url + "/"
    assert Path(env["HOME"]).resolve() == sandbox.resolve()
    assert Path((sandbox / "cwd.txt").read_text().strip()).resolve() == sandbox.resolve()

    api.wait_operation(api.delete_node(ZONE, "n1"), timeout=20)
    wait_until(lambda: guest_emulator.node_names() == [], "the node to go")
    wait_until(lambda: not any(map(process_running, pids)), "every process of the node to die")
    wait_until(lambda: not process_running(init_pid), "the node's init to exit after them")


def test_preemption_powers_the_node_off(guest_emulator: Emulator) -> None:
    body = {
        "acceleratorType": "v5litepod-4",
        "runtimeVersion": "v2-alpha-tpuv5-lite",
        "metadata": {"startup-script": _DAEMONS},
        "schedulingConfig": {"spot": True},
    }
    request = urllib.request.Request(
        f"{guest_emulator.url}{NODES}?nodeId=spot",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    urllib.request.urlopen(request, timeout=10).close()
    pids = _pids(guest_emulator.sandbox(PROJECT, ZONE, "spot"))
    guest_emulator.faults.preempt_after = 0.0
    wait_until(
        lambda: not any(map(process_running, pids)), "the processes of the preempted node to die"
    )
    assert guest_emulator.snapshot()["nodes"][f"{PROJECT}/{ZONE}/spot"]["state"] == "PREEMPTED"


def test_emulator_stop_kills_them_and_a_restart_boots_again(
    start_emulator: EmulatorStarter, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    emulator = start_emulator(state, guests=True)
    _create(emulator, "n1", {"startup-script": _DAEMONS})
    sandbox = emulator.sandbox(PROJECT, ZONE, "n1")
    pids = _pids(sandbox)
    emulator.stop()
    assert not any(map(process_running, pids))  # stop() returns after they are gone

    for name in ("setsid", "double", "envi"):
        (sandbox / f"{name}.pid").unlink()
    start_emulator(state, guests=True)  # a restart is a reboot: the script runs again
    again = _pids(sandbox)
    assert set(again).isdisjoint(pids)
    assert (sandbox / "boots.txt").read_text().split() == ["boot", "boot"]


def test_a_killed_emulator_takes_its_nodes_processes_along(
    start_emulator: EmulatorStarter, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    # The real `tpulab emulator serve` (embedded SSH hosts: guests on), as a test of the
    # watchdog would run it so that the cloud outlives a killed controller.
    served = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tpulab",
            "emulator",
            "serve",
            "--port=0",
            f"--state={state}",
            "--ssh=embedded",
            "--create-seconds=0.2",
            "--delete-seconds=0.2",
        ],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert served.stdout is not None
        first = served.stdout.readline()
        assert "listening on http://" in first, first
        url = first.rsplit(" ", 1)[-1].strip()
        _create(url, "n1", {"startup-script": _DAEMONS})
        sandbox = state / "sandboxes" / PROJECT / ZONE / "n1"
        pids = _pids(sandbox)
        os.kill(served.pid, signal.SIGKILL)
        served.wait(timeout=10)
        wait_until(
            lambda: not any(map(process_running, pids)), "the dead emulator's node processes to die"
        )
    finally:
        if served.poll() is None:
            os.kill(served.pid, signal.SIGKILL)
            served.wait(timeout=10)

    # Its successor on the same state finds the node READY and boots it afresh.
    for name in ("setsid", "double", "envi"):
        (sandbox / f"{name}.pid").unlink()
    start_emulator(state, guests=True)
    _pids(sandbox)
    assert (sandbox / "boots.txt").read_text().split() == ["boot", "boot"]


@pytest.mark.parametrize("successor", ["reboots", "deletes"])
def test_a_killed_emulators_ssh_session_processes_die_with_the_node(
    start_emulator: EmulatorStarter, tmp_path: Path, successor: str
) -> None:
    # A SIGKILLed `tpulab run --emulate -- CMD` takes its embedded emulator, and the SSH
    # server its command ran under, along; the command lived on (seen: an hour-long
    # launcher left running on this machine after `teardown --verify` deleted its node).
    # On a VM, a reboot or a delete powers everything off: so must the successor here.
    from tpulab.cloud.google import GoogleTpuApi

    state = tmp_path / "state"
    served = subprocess.Popen(
        [
            sys.executable, "-m", "tpulab", "emulator", "serve", "--port=0",
            f"--state={state}", "--ssh=embedded", "--create-seconds=0.2",
            "--delete-seconds=0.2",
        ],
        stdout=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    orphan = 0
    try:
        assert served.stdout is not None
        first = served.stdout.readline()
        assert "listening on http://" in first, first
        url = first.rsplit(" ", 1)[-1].strip()
        key = RunKey()
        _create(url, "n1", {"ssh-keys": key.metadata_entry(USER)})
        api = GoogleTpuApi(PROJECT, api_endpoint=url)
        attributes: dict[str, str] = {}

        def fetch() -> dict[str, str]:
            attributes.clear()
            attributes.update(api.guest_attributes(ZONE, "n1"))
            return dict(attributes)

        host_key = wait_for_host_key(fetch, timeout=60)
        target = SshTarget("127.0.0.1", ssh_port_from(attributes), USER, host_key)
        with Connection(target, key, connect_timeout=20) as connection:
            started = connection.run("sleep 600 >/dev/null 2>&1 & echo $!", timeout=30, check=True)
        orphan = int(started.stdout.strip())
        os.kill(served.pid, signal.SIGKILL)
        served.wait(timeout=10)
        assert process_running(orphan)  # what the dead emulator's SSH server left behind

        if successor == "reboots":  # the node is READY: a successor with guests boots it
            start_emulator(state, guests=True)
        else:  # one without guests or hosts only deletes it
            emulator = start_emulator(state)
            api = GoogleTpuApi(PROJECT, api_endpoint=emulator.url)
            api.wait_operation(api.delete_node(ZONE, "n1"), timeout=60)
        wait_until(
            lambda: not process_running(orphan), f"the old boot's session process ({successor})"
        )
    finally:
        if served.poll() is None:
            os.kill(served.pid, signal.SIGKILL)
            served.wait(timeout=10)
        if orphan and process_running(orphan):
            os.kill(orphan, signal.SIGKILL)


def test_ssh_sessions_get_the_same_node_environment(
    start_emulator: EmulatorStarter, host_backend: HostBackend, tmp_path: Path
) -> None:
    """Both SSH host backends: sessions see the guest's variables, and what the
    startup-script writes as a guest attribute survives the host-key publication."""
    from emulator_fixtures import api_for
    from ssh_fixtures import login_user

    emulator = start_emulator(tmp_path / "state", host_backend=host_backend)
    api = api_for(emulator, project=PROJECT)
    key = RunKey()
    script = _DAEMONS + (
        'python3 -c \'import os, urllib.request as u; u.urlopen(u.Request("http://" + '
        'os.environ["GCE_METADATA_HOST"] + "/computeMetadata/v1/instance/guest-attributes/'
        'tpulab/boot", data=b"done", method="PUT", headers={"Metadata-Flavor": "Google"}))\'\n'
    )
    _create(emulator, "n1", {"ssh-keys": key.metadata_entry(USER), "startup-script": script})
    sandbox = emulator.sandbox(PROJECT, ZONE, "n1")
    _pids(sandbox)
    attributes: dict[str, str] = {}

    def fetch() -> dict[str, str]:
        attributes.clear()
        attributes.update(api.guest_attributes(ZONE, "n1"))
        return dict(attributes)

    host_key = wait_for_host_key(fetch, timeout=20)
    wait_until(lambda: "tpulab/boot" in fetch(), "the script's guest attribute")
    assert attributes["tpulab/boot"] == "done"
    assert "hostkeys/ssh-ed25519" in attributes
    target = SshTarget(
        "127.0.0.1", ssh_port_from(attributes), login_user(host_backend, USER), host_key
    )
    with Connection(target, key, connect_timeout=20) as connection:
        session = connection.run("env | sort", timeout=20, check=True).stdout
    seen = dict(line.split("=", 1) for line in session.splitlines() if "=" in line)
    boot = _env(sandbox / "env.txt")
    for name in (METADATA_HOST_ENV, TPU_API_BASE_ENV, RESOURCE_MANAGER_BASE_ENV, "PATH"):
        assert seen[name] == boot[name], name
    assert seen[METADATA_HOST_ENV] == _recorded(emulator, "n1", "metadata")
