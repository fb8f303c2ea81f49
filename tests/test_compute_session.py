"""Sessions on the Compute Engine provider (docs/reference/providers.md): `tpulab up`
keeps a TPU7x instance, and `exec`, `ssh`, `list` and `down` reach, renew, list and
delete it through Compute, by the provider its session.json names -- never through the
Cloud TPU API, which is blind to instances.

Real subprocesses against an emulator served from this process (the session outlives
each command), whose instances are real SSH servers; `ssh` goes through the system's
OpenSSH client. Nothing is mocked; every test ends by asking the emulator what is left.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import (
    refused_port,
    require_tool,
    served_emulator,
    tpulab,
    wait_until,
    watchdog_saw_the_last_renewal,
)
from test_exec import _age_session

from tpulab.app.target import compute_api
from tpulab.cleanup.journal import Journal
from tpulab.cloud.api import TpuApi
from tpulab.contract import LEASE_ATTRIBUTE
from tpulab.emulator import Emulator
from tpulab.remote.watchdog import parse_lease

pytestmark = pytest.mark.slow

PROJECT = "compute-session-proj"
ZONE = "us-central1-c"
IMAGE = "projects/p/global/images/tpu-vm-test-image"
EXIT_OK = 0
EXIT_REMOTE = 4
EXIT_INTERRUPTED = 130


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Emulator]:
    with served_emulator(tmp_path / "emulator") as emulator:
        yield emulator


def up_args(
    emulator: Emulator, name: str, *extra: str, accelerator: tuple[str, ...] = ("tpu7x-8",)
) -> list[str]:
    return [
        "up", "--accelerator", *accelerator, "--image", IMAGE, "--api-endpoint", emulator.url,
        "--project", PROJECT, "--zone", ZONE, "--boot-timeout", "30", "--name", name, *extra,
    ]  # fmt: skip


def up(emulator: Emulator, name: str, *extra: str) -> dict[str, object]:
    """`tpulab up` on TPU7x (Compute only); the session's state as written to disk."""
    done = tpulab(*up_args(emulator, name, *extra), timeout=300)
    assert done.returncode == EXIT_OK, done.stderr + done.stdout
    return json.loads(session_file(name).read_text())  # type: ignore[no-any-return]


def session_file(name: str) -> Path:
    return Path(os.environ["TPULAB_HOME"]) / "state" / "sessions" / name / "session.json"


def tpu_api_paths(emulator: Emulator, since: int = 0) -> list[str]:
    """The Cloud TPU API requests among the emulator's, from request `since` on."""
    return [
        f"{entry['method']} {entry['path']}"
        for entry in emulator.requests()[since:]
        if str(entry["path"]).startswith("/v2/")
    ]


def test_up_exec_ssh_list_down_on_tpu7x_go_through_compute(
    served: Emulator, tmp_path: Path
) -> None:
    require_tool(shutil.which("ssh") is not None, "OpenSSH client (ssh)")
    done = tpulab(*up_args(served, "iron", "--ttl", "1h", "--idle", "10m"), timeout=300)
    assert done.returncode == EXIT_OK, done.stderr + done.stdout
    state = json.loads(session_file("iron").read_text())
    node = str(state["node_name"])
    assert f"Session iron is up: instance {node} (tpu7x-8) in {ZONE}" in done.stdout
    assert state["provider"] == "compute"
    assert state["accelerator_type"] == "tpu7x-8"
    assert isinstance(state["receipt_id"], str)
    assert served.instance_names(PROJECT) == [node]
    assert served.node_names(PROJECT) == []
    # The instance's watchdog deletes it through Compute, at this endpoint.
    watchdog = state["watchdog"]
    assert isinstance(watchdog, dict)
    assert watchdog["provider"] == "compute"
    assert watchdog["api_base"] == served.url.rstrip("/") + "/"
    after_up = len(served.requests())

    work = tmp_path / "work"
    work.mkdir()
    (work / "hello.py").write_text("import jax; print('devices', jax.device_count())\n")
    # The plan of the exec is recorded from the exec itself: Compute's calls, for the
    # instance the session names, the ones the exec below then sends.
    plan = tpulab("exec", "iron", "--workdir", str(work), "--dry-run", "--json", "--", "true")
    assert plan.returncode == EXIT_OK, plan.stderr
    planned = [
        f"{step['method']} {step['path']}"
        for step in json.loads(plan.stdout)["steps"]
        if step["kind"] == "api"
    ]
    assert planned, "the exec asks where the instance is before connecting"
    assert all(
        f"/compute/v1/projects/{PROJECT}/zones/{ZONE}/instances/{node}" in p for p in planned
    )
    before_exec = len(served.requests())
    done = tpulab(
        "exec", "iron", "--workdir", str(work), "--out", str(tmp_path / "out"), "--",
        "python", "hello.py", timeout=300,
    )  # fmt: skip
    assert done.returncode == EXIT_OK, done.stderr + done.stdout
    assert "devices 8" in done.stdout  # TPU7x: 8 TensorCores, one JAX device each
    assert _sent(served, before_exec) == planned
    record = json.loads((tmp_path / "out" / "run.json").read_text())
    assert record["session"] == "iron"
    assert record["node_name"] == node

    # The saved address made stale (a restarted VM's new ephemeral IP, a restarted
    # emulator's port): ssh asks Compute where the instance is, saves it, and gets there.
    real_port = state["ssh_port"]
    with refused_port() as stale:
        session_file("iron").write_text(
            json.dumps({**json.loads(session_file("iron").read_text()), "ssh_port": stale})
        )
        shell = tpulab("ssh", "iron", "--", "echo", "on-the-instance", timeout=120)
    assert shell.returncode == EXIT_OK, shell.stderr + shell.stdout
    assert shell.stdout.strip() == "on-the-instance"
    said = " ".join(shell.stderr.split())
    assert f"moved from 127.0.0.1:{stale} to 127.0.0.1:{real_port} (instances.get)" in said
    assert json.loads(session_file("iron").read_text())["ssh_port"] == real_port

    listed = tpulab(
        "list", "--api-endpoint", served.url, "--project", PROJECT, "--zone", ZONE, "--json"
    )
    assert listed.returncode == EXIT_OK, listed.stderr
    envelope = json.loads(listed.stdout)
    assert [(n["name"], n["provider"]) for n in envelope["nodes"]] == [(node, "compute")]
    assert [s["name"] for s in envelope["sessions"]] == ["iron"]
    assert envelope["sessions_gone"] == []

    down = tpulab("down", "iron", timeout=300)
    assert down.returncode == EXIT_OK, down.stderr + down.stdout
    assert f"instance {node} deleted, confirmed by list" in down.stdout
    assert not session_file("iron").exists()
    row = Journal().get(str(state["run_id"]))
    assert row is not None
    assert row.teardown == "confirmed"
    assert row.provider == "compute"
    # exec, ssh, list's reading of the session and down asked the TPU API nothing of it.
    assert not [p for p in tpu_api_paths(served, after_up) if node in p]
    assert served.instance_names(PROJECT) == []
    assert served.node_names(PROJECT) == []


def _sent(emulator: Emulator, since: int) -> list[str]:
    """The API requests the controller sent from request `since` on, in order, as a
    plan's steps name them (the instance's own watchdog's left out)."""
    return [
        f"{entry['method']} {entry['path']}"
        + ("?" + "&".join(f"{k}={v}" for k, v in entry["query"]) if entry["query"] else "")
        for entry in emulator.requests()[since:]
        if "caller" not in entry
    ]


def _where(emulator: Emulator) -> tuple[str, ...]:
    return ("--api-endpoint", emulator.url, "--project", PROJECT, "--zone", ZONE)


def _renewals(api: TpuApi, node: str) -> int:
    """How many renewals of its lease the instance's watchdog has published (-1: none)."""
    lease = parse_lease(api.guest_attributes(ZONE, node, "tpulab/").get(LEASE_ATTRIBUTE))
    return -1 if lease is None else lease.renewals


def test_a_second_homes_sweep_keeps_the_live_instance_until_its_idle_lease_lapses(
    served: Emulator, tmp_path: Path
) -> None:
    state = up(served, "idle", "--ttl", "1h", "--idle", "10m")
    node = str(state["node_name"])
    owner = (Path(os.environ["TPULAB_HOME"]) / "state" / "owner-id").read_text().strip()
    api = compute_api(PROJECT, api_endpoint=served.url, image=None, image_needed=False)
    # The watchdog publishes a renewal when its next look at the lease file sees it.
    wait_until(lambda: _renewals(api, node) >= 1, "the watchdog to publish up's renewal")

    # Another home knows nothing of it: the instance's published lease says it is live.
    other = {"TPULAB_HOME": str(tmp_path / "home-b")}
    swept = tpulab("teardown", "--verify", "--yes", *_where(served), env=other, timeout=300)
    assert swept.returncode == EXIT_OK, swept.stderr + swept.stdout
    assert f"{node}: live elsewhere (owner {owner}, session, renewed " in swept.stdout
    assert f"Deleted and confirmed gone: {node}" not in swept.stdout
    assert served.instance_names(PROJECT) == [node]

    # Nobody renews it: once --idle passes on the VM's clock, the instance's watchdog
    # deletes it through Compute. Aged rather than waited for: the session's times here
    # and the VM's clock move forward by as much, past the lease, well before --ttl.
    by = 600.0 + (time.time() - float(str(state["started_at"]))) + 1
    assert by < float(str(state["deadline_at"])) - time.time(), "the --ttl would pass first"
    _age_session("idle", by, idle_too=True)
    # Only once the watchdog has read up's last renewal: one it reads after the move is
    # dated after it, and the 10-minute lease would lapse ten real minutes later.
    wait_until(lambda: watchdog_saw_the_last_renewal(served, node), "up's last renewal read")
    served.skip_vm_clock(PROJECT, ZONE, node, by, instance=True)
    wait_until(lambda: not served.instance_names(PROJECT), "the idle instance to go", 120)
    deletes = [
        entry
        for entry in served.requests()
        if entry["method"] == "DELETE" and str(entry["path"]).endswith(f"/instances/{node}")
    ]
    assert deletes
    # Sent with the instance's own metadata token: its watchdog, not a controller.
    assert all(str(entry.get("caller", "")).endswith(f"/{node}") for entry in deletes)

    work = tmp_path / "work"
    work.mkdir()
    done = tpulab(
        "exec", "idle", "--workdir", str(work), "--out", str(tmp_path / "out"), "--", "true",
        timeout=300,
    )  # fmt: skip
    assert done.returncode == EXIT_REMOTE, done.stderr + done.stdout
    said = " ".join(done.stderr.split())
    assert f"Session idle's node {node}" in said
    assert "deleted itself: idle for 10 min (--idle)" in said
    assert "Its key and state are removed." in said
    assert not session_file("idle").exists()
    row = Journal().get(str(state["run_id"]))
    assert row is not None
    assert row.teardown == "confirmed"
    assert served.instance_names(PROJECT) == []
    assert served.node_names(PROJECT) == []


def test_ctrl_c_during_a_compute_up_leaves_nothing(served: Emulator) -> None:
    # v6e-4, which both providers serve, kept on Compute by --provider.
    argv = up_args(served, "cut", accelerator=("v6e-4", "--provider", "compute"))
    up_process = subprocess.Popen(
        [sys.executable, "-m", "tpulab", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    said: list[str] = []
    assert up_process.stdout is not None
    reader = threading.Thread(target=lambda: said.extend(up_process.stdout or ()), daemon=True)
    reader.start()
    try:
        # Interrupted while the verifier is staged: the instance exists, billing.
        wait_until(lambda: any("Stage payload" in line for line in said), "the payload staged")
        assert served.instance_names(PROJECT) != []
        up_process.send_signal(signal.SIGINT)
        up_process.wait(timeout=240)
    finally:
        if up_process.poll() is None:
            up_process.kill()
    reader.join(timeout=10)
    output = "".join(said)
    assert up_process.returncode == EXIT_INTERRUPTED, output
    assert "confirmed by list" in output
    # Deleted through Compute by the controller (no instance token: not its watchdog).
    deletes = [e for e in served.requests() if e["method"] == "DELETE"]
    assert deletes
    assert all("/compute/v1/" in str(e["path"]) and "caller" not in e for e in deletes)
    assert not session_file("cut").parent.exists()
    assert served.instance_names(PROJECT) == []
    assert served.node_names(PROJECT) == []
