"""gcloud's own `tpu-vm ssh` is a second real client of the emulator's SSH story.

`gcloud compute tpus tpu-vm ssh NODE --zone Z --command 'echo ok'` (gcloud's
`command_lib/compute/tpus/tpu_vm/ssh.py` `PrepareNodeForSSH`) makes, in order: GetNode,
getGuestAttributes (the ed25519 host key's last 6 characters name the known_hosts alias
`tpu.<id>-<worker>-<suffix>`), Compute `GET projects/p` (commonInstanceMetadata decides
OS Login), UpdateNode `PATCH ?updateMask=metadata` adding its own key (generated with
ssh-keygen into ~/.ssh/google_compute_engine), waits on that operation, then runs the
system `ssh` with that key. The emulator answers all of it; these tests run the real
gcloud and the real ssh client against both SSH backends, each with its own HOME.

With the `project_os_login` fault the project says `enable-oslogin=TRUE`: gcloud then
takes its OS Login path and asks the OS Login API for the user's login profile, which
the emulator does not emulate, so gcloud stops with that call's 404 before it changes
the node. A node whose own metadata says `enable-oslogin: FALSE` (as tpulab's nodes do)
overrides the project for gcloud as for the guest agent: gcloud uses metadata keys.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from helpers import require_tool

from tpulab.contract import HOST_KEY_NAMESPACE, OS_LOGIN_METADATA
from tpulab.models import NodeState
from tpulab.remote.ssh import RunKey, ssh_port_from

if TYPE_CHECKING:
    from emulator_fixtures import EmulatorStarter

    from tpulab.cloud.google import GoogleTpuApi
    from tpulab.emulator import Emulator
    from tpulab.emulator.hosts import HostBackend

pytest_plugins = ["emulator_fixtures", "ssh_fixtures"]

pytestmark = [pytest.mark.gcloud, pytest.mark.slow]

PROJECT = "test-project"
ZONE = "us-central1-a"
ACCOUNT = "tester@example.com"
# What the node's own user (tpulab's, say) put in ssh-keys before gcloud came along.
OWNER = "tpulab"


def gcloud_ssh(
    emulator: Emulator,
    home: Path,
    node: str,
    port: int,
    *extra: str,
    command: str = "echo ok",
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """`gcloud compute tpus tpu-vm ssh` as a user runs it, against the emulator only
    (`extra`: more flags, e.g. `--worker=all`; the one `-p` reaches every worker of an
    emulated slice, as port 22 does online)."""
    require_tool(shutil.which("gcloud") is not None, "gcloud (Google Cloud SDK)")
    require_tool(shutil.which("ssh") is not None, "OpenSSH client (ssh)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLOUDSDK_")}
    env.update(
        HOME=str(home),  # gcloud writes ~/.ssh/google_compute_engine{,.pub} and known_hosts
        CLOUDSDK_CONFIG=str(home / "gcloud-config"),
        CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU=emulator.url + "/",
        CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE=emulator.url + "/compute/v1/",
        # So that gcloud's OS Login call, when it makes one, reaches the emulator too
        # (it would otherwise go to oslogin.googleapis.com).
        CLOUDSDK_API_ENDPOINT_OVERRIDES_OSLOGIN=emulator.url + "/",
        CLOUDSDK_AUTH_DISABLE_CREDENTIALS="true",
        CLOUDSDK_CORE_ACCOUNT=ACCOUNT,
        CLOUDSDK_CORE_PROJECT=PROJECT,
        CLOUDSDK_CORE_DISABLE_PROMPTS="1",
        CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK="true",
        CLOUDSDK_CORE_DISABLE_USAGE_REPORTING="true",
    )
    home.mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        [
            "gcloud",
            "compute",
            "tpus",
            "tpu-vm",
            "ssh",
            node,
            f"--zone={ZONE}",
            *extra,
            f"--command={command}",
            f"--ssh-flag=-p {port}",  # a real VM listens on 22; an emulated one elsewhere
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def ready_node(api: GoogleTpuApi, name: str, metadata: dict[str, str]) -> tuple[str, int]:
    """Create `name` and wait until its SSH host is up: (ed25519 host key, SSH port)."""
    from emulator_fixtures import node_request

    request = node_request()
    request = request.model_copy(update={"metadata": {**request.metadata, **metadata}})
    api.wait_operation(api.create_node(ZONE, name, request), timeout=30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        attributes = api.guest_attributes(ZONE, name)
        ed25519 = attributes.get(f"{HOST_KEY_NAMESPACE}/ssh-ed25519")
        if ed25519:
            return ed25519, ssh_port_from(attributes)
        time.sleep(0.05)
    raise AssertionError(f"{name} never published its host key")


def api_calls(emulator: Emulator) -> list[str]:
    return [f"{r['method']} {r['path']}" for r in emulator.requests()]


def test_gcloud_ssh_runs_a_command_on_an_emulated_node(
    start_emulator: EmulatorStarter, host_backend: HostBackend, tmp_path: Path
) -> None:
    from emulator_fixtures import api_for

    emulator = start_emulator(tmp_path / "state", host_backend=host_backend)
    api = api_for(emulator)
    theirs = RunKey().metadata_entry(OWNER)
    host_key, port = ready_node(api, "gc-ssh", {"ssh-keys": theirs})
    emulator.clear_requests()
    home = tmp_path / "home"

    first = gcloud_ssh(emulator, home, "gc-ssh", port)
    assert first.returncode == 0, first.stderr
    # ssh-keygen's report (gcloud made its key in this HOME), then the command's output.
    assert "Generating public/private rsa key pair." in first.stdout
    assert first.stdout.splitlines()[-1] == "ok"
    node_path = f"/v2/projects/{PROJECT}/locations/{ZONE}/nodes/gc-ssh"
    calls = api_calls(emulator)
    assert calls[:4] == [
        f"GET {node_path}",
        f"POST {node_path}:getGuestAttributes",
        f"GET /compute/v1/projects/{PROJECT}",
        f"PATCH {node_path}",
    ], calls
    patch = next(r for r in emulator.requests() if r["method"] == "PATCH")
    assert ["updateMask", "metadata"] in patch["query"]
    assert any(
        c.startswith(f"GET /v2/projects/{PROJECT}/locations/{ZONE}/operations/") for c in calls
    )

    # gcloud's key (made by its ssh-keygen in this HOME) was added next to the owner's.
    gcloud_key = (home / ".ssh" / "google_compute_engine.pub").read_text().split()[1]
    keys = api.get_node(ZONE, "gc-ssh").metadata["ssh-keys"]
    assert theirs in keys.splitlines()
    assert any(gcloud_key in line for line in keys.splitlines())

    # The system ssh recorded the host key under gcloud's alias, whose suffix gcloud took
    # from the published guest attribute: the key it met is the one the node published.
    known = (home / ".ssh" / "google_compute_known_hosts").read_text()
    match = re.fullmatch(r"tpu\.\d+-0-(\S{6}) ssh-ed25519 (\S+)\n", known)
    assert match is not None, known
    assert match.groups() == (host_key[-6:].lower(), host_key)  # ssh lowercases aliases

    # Again: the key is in the node's metadata now (no UpdateNode), and the alias is
    # known, so gcloud's ssh checks the host key strictly.
    emulator.clear_requests()
    again = gcloud_ssh(emulator, home, "gc-ssh", port)
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines() == ["ok"]
    assert not any(c.startswith("PATCH") for c in api_calls(emulator))
    assert "Permanently added" not in again.stderr


def test_with_project_os_login_gcloud_asks_the_os_login_api_and_stops(
    start_emulator: EmulatorStarter, host_backend: HostBackend, tmp_path: Path
) -> None:
    from emulator_fixtures import api_for

    emulator = start_emulator(tmp_path / "state", host_backend=host_backend)
    emulator.faults.project_os_login = True
    api = api_for(emulator)
    _, port = ready_node(api, "gc-osl", {})
    emulator.clear_requests()

    refused = gcloud_ssh(emulator, tmp_path / "home", "gc-osl", port)
    assert refused.returncode != 0
    calls = api_calls(emulator)
    # The project's enable-oslogin=TRUE sent gcloud to the OS Login API, not UpdateNode.
    assert f"GET /compute/v1/projects/{PROJECT}" in calls
    assert f"GET /v1/users/{ACCOUNT}/loginProfile" in calls
    assert not any(c.startswith("PATCH") for c in calls)
    assert "ok" not in refused.stdout.splitlines()
    assert f"Users instance [{ACCOUNT}] not found" in refused.stderr
    assert "ssh-keys" not in api.get_node(ZONE, "gc-osl").metadata


def test_the_nodes_own_os_login_false_overrides_the_project_for_gcloud_too(
    start_emulator: EmulatorStarter, host_backend: HostBackend, tmp_path: Path
) -> None:
    from emulator_fixtures import api_for

    emulator = start_emulator(tmp_path / "state", host_backend=host_backend)
    emulator.faults.project_os_login = True
    api = api_for(emulator)
    _, port = ready_node(api, "gc-off", {OS_LOGIN_METADATA: "FALSE"})
    emulator.clear_requests()

    done = gcloud_ssh(emulator, tmp_path / "home", "gc-off", port)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "ok"
    calls = api_calls(emulator)
    assert not any(c.startswith("GET /v1/users/") for c in calls)
    assert any(c.startswith("PATCH") for c in calls)
    assert api.get_node(ZONE, "gc-off").state is NodeState.READY


def test_the_emulated_project_says_os_login_as_the_fault_does(emulator: Emulator) -> None:
    """The Compute answer gcloud reads, checked as JSON (field names of Compute v1)."""
    import json
    import urllib.error
    import urllib.request

    def project() -> dict[str, object]:
        with urllib.request.urlopen(f"{emulator.url}/compute/v1/projects/{PROJECT}") as r:
            return json.loads(r.read())  # type: ignore[no-any-return]

    plain = project()
    assert plain["name"] == PROJECT
    assert plain["commonInstanceMetadata"]["items"] == []  # type: ignore[index]
    emulator.faults.project_os_login = True
    items = project()["commonInstanceMetadata"]["items"]  # type: ignore[index]
    assert items == [{"key": "enable-oslogin", "value": "TRUE"}]
    emulator.faults.update({"transient": {"get_compute_project": 1}})
    with pytest.raises(urllib.error.HTTPError) as failed:
        project()
    assert failed.value.code == 503
