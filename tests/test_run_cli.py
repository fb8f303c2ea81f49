"""`tpulab run` as a user runs it: a real subprocess, against the embedded emulator
(`--emulate`) and against a separately served one (`--api-endpoint`), on both SSH
backends; plus the dry run, the --json contract and the exit statuses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from helpers import cli_imports

from tpulab import paths
from tpulab.emulator import Emulator, Timing
from tpulab.exits import EXIT_CLOUD, EXIT_CONFIG, EXIT_OK, EXIT_TEARDOWN
from tpulab.run.plan import PlanEnvelope
from tpulab.run.plan_steps import PLACEHOLDER_OWNER
from tpulab.run.report import RunEnvelope

if TYPE_CHECKING:
    from emulator_fixtures import EmulatorStarter

    from tpulab.emulator.hosts import HostBackend

pytest_plugins = ["emulator_fixtures", "ssh_fixtures"]

PROJECT = "cli-project"
ZONE = "us-central1-a"


def tpulab(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "tpulab", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


def envelope(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads(done.stdout)
    except ValueError:
        pytest.fail(f"stdout is not JSON (exit {done.returncode}):\n{done.stdout}\n{done.stderr}")
    return data


def run_document(done: subprocess.CompletedProcess[str]) -> RunEnvelope:
    """The printed `--json` document, parsed by its model: the printed output is the
    contract (its schema is pinned by test_envelopes)."""
    try:
        return RunEnvelope.model_validate_json(done.stdout)
    except ValueError:
        pytest.fail(
            f"stdout is no RunEnvelope (exit {done.returncode}):\n{done.stdout}\n{done.stderr}"
        )


def check_verified_v5litepod_4(result: RunEnvelope) -> None:
    assert result.schema_version == 1
    assert result.command == "run"
    assert result.ok is True
    assert result.error is None
    assert result.dry_run is False
    assert result.accelerator_type == "v5litepod-4"
    assert result.node_name.startswith("tpulab-")
    assert result.emulated is True
    assert result.bootstrap is not None
    assert result.bootstrap.versions["jax"]
    receipt = result.receipt
    assert receipt.verdict == "verified"
    assert receipt.per_device_sums == [140.0, 1100.0, 3084.0, 6092.0]
    assert receipt.observed_total == 10416.0
    assert receipt.expected_total == 10416
    assert receipt.payload_exit_status == 0
    assert receipt.path is not None
    assert Path(receipt.path).is_file()
    teardown = result.teardown
    assert (teardown.status, teardown.confirmed, teardown.delete_attempts) == ("confirmed", True, 1)
    assert teardown.manual_command is None
    phases = [p.phase for p in result.phases]
    assert phases == [
        "validate", "create", "wait-ready", "host-key", "connect", "bootstrap", "stage",
        "execute", "collect", "verify", "teardown",
    ]  # fmt: skip
    assert all(p.ok and p.seconds >= 0 for p in result.phases)
    assert result.api_calls > 5


def embedded_leftovers(state: Path) -> list[str]:
    with Emulator(state, timing=Timing.fast()) as emulator:
        return emulator.node_names()


@pytest.mark.slow
@pytest.mark.parametrize(
    "backend", ["embedded", pytest.param("openssh", marks=pytest.mark.openssh)]
)
def test_run_emulate(fast_embedded_emulator: Path, backend: str) -> None:
    if backend == "openssh":
        from helpers import require_tool
        from ssh_fixtures import sshd_available

        require_tool(sshd_available(), "OpenSSH server")
    done = tpulab(
        "run", "--accelerator", "v5litepod-4", "--emulate", "--json", "--ssh-backend", backend
    )
    assert done.returncode == EXIT_OK, done.stderr
    result = run_document(done)
    check_verified_v5litepod_4(result)
    assert result.mode == "emulate"
    assert embedded_leftovers(fast_embedded_emulator) == []


@pytest.fixture
def served(start_emulator: EmulatorStarter, host_backend: HostBackend, tmp_path: Path) -> Emulator:
    return start_emulator(tmp_path / "served", host_backend=host_backend)


@pytest.mark.slow
def test_run_against_a_served_emulator(served: Emulator) -> None:
    done = tpulab(
        "run", "--accelerator", "v5litepod-4", "--api-endpoint", served.url,
        "--project", PROJECT, "--zone", ZONE, "--json",
    )  # fmt: skip
    assert done.returncode == EXIT_OK, done.stderr
    result = run_document(done)
    check_verified_v5litepod_4(result)
    assert result.mode == "endpoint"
    assert served.node_names() == []


@pytest.fixture
def bare(start_emulator: EmulatorStarter, tmp_path: Path) -> Emulator:
    """A served emulator without SSH hosts: enough for runs that fail before SSH."""
    return start_emulator(tmp_path / "bare")


def test_human_output_names_phases_verdict_and_teardown(fast_embedded_emulator: Path) -> None:
    done = tpulab("run", "--accelerator", "v5litepod-1", "--emulate", "-v")
    assert done.returncode == EXIT_OK, done.stderr
    out = done.stdout
    for text in ("Create TPU VM", "Wait for READY", "Run payload", "Delete VM and confirm"):
        assert text in out
    assert "EMULATED" in out
    assert "VERIFIED" in out
    assert "[140] total 140 (closed form 140)" in out
    assert "deleted, confirmed by list" in out
    assert "TPULAB_RECEIPT" in out  # -v shows the payload's own output
    # A new user's first command prints no library's warnings (asyncssh's DSA names
    # under cryptography >= 48 did, once per run, eight lines of them).
    assert "Warning" not in done.stderr, done.stderr


def test_invalid_accelerator_is_refused_before_any_call(bare: Emulator) -> None:
    done = tpulab("run", "--accelerator", "v5litepod-3", "--api-endpoint", bare.url)
    assert done.returncode == EXIT_CONFIG
    assert "v5litepod-4" in done.stderr
    assert bare.calls["create_node"] == 0
    assert sum(bare.calls.values()) == 0


def test_stockout_exit_status_and_message(bare: Emulator) -> None:
    bare.faults.stockout = True
    done = tpulab(
        "run", "--accelerator", "v5litepod-4", "--api-endpoint", bare.url, "--project", PROJECT
    )
    assert done.returncode == EXIT_CLOUD, done.stderr
    assert "capacity" in done.stderr.lower()
    assert "teardown" in done.stdout
    # Nothing existed to delete (the create failed): the summary must not say "deleted".
    assert "nothing to delete (already gone), confirmed by list" in done.stdout
    assert "deleted, confirmed" not in done.stdout
    assert bare.node_names() == []


def test_unconfirmed_teardown_has_its_own_status_and_the_manual_command(bare: Emulator) -> None:
    # A spot node preempted as soon as it is READY, whose delete then never finishes.
    bare.faults.preempt_after = 0.0
    bare.faults.delete_hangs = True
    done = tpulab(
        "run", "--accelerator", "v5litepod-4", "--api-endpoint", bare.url, "--project", PROJECT,
        "--spot", "--name", "stuck-node", "--teardown-timeout", "1", "--json",
    )  # fmt: skip
    assert done.returncode == EXIT_TEARDOWN, done.stderr
    result = run_document(done)
    assert result.ok is False
    assert result.node_name == "stuck-node"
    assert result.teardown.status == "unconfirmed"
    # DeleteNode was sent (and hung): the report must not say no delete was attempted.
    assert result.teardown.delete_attempts >= 1
    assert bare.calls["delete_node"] >= result.teardown.delete_attempts
    manual = (
        f"CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU={bare.url.rstrip('/')}/ "
        "CLOUDSDK_AUTH_DISABLE_CREDENTIALS=true "
        f"gcloud compute tpus tpu-vm delete stuck-node --project={PROJECT} --zone={ZONE} --quiet"
    )
    assert result.teardown.manual_command == manual
    assert result.error is not None
    assert result.error.type == "TeardownError"
    assert result.error.exit_status == EXIT_TEARDOWN
    assert result.error.hint is not None
    assert manual in result.error.hint
    assert "preempted" in result.error.message  # the first failure is kept too
    assert bare.node_names() == ["stuck-node"]  # left, and said so


def test_dry_run_prints_every_step_and_imports_nothing_heavy(tmp_path: Path) -> None:
    done = cli_imports(
        "run", "--accelerator", "v5litepod-4", "--dry-run", "--project", "my-proj-1",
        "--zone", "us-east5-b", "--spot",
        env={"CLOUDSDK_CONFIG": str(tmp_path / "no-gcloud"), "COLUMNS": "300"},
    )  # fmt: skip
    assert done.code in (0, None), done.stderr
    out = done.stdout
    assert done.heavy == [], done.heavy
    assert "Recorded from the run itself" in out
    assert "API base https://tpu.googleapis.com" in out
    base = "/v2/projects/my-proj-1/locations/us-east5-b"
    order = [
        "journal row for run",
        f"POST {base}/nodes?nodeId=tpulab-",
        f"GET {base}/operations/<CREATE-OPERATION-ID>",
        "every Backoff(initial=1.0, cap=10.0",
        f"GET {base}/nodes/tpulab-",
        ":getGuestAttributes",
        "connect tpulab@<NODE-IP>:22",
        "put @REMOTE-HOME@/jax-tpu-lab/verify_tpu.py",
        "sha256sum < @REMOTE-HOME@/jax-tpu-lab/verify_tpu.py",
        "timeout --signal=KILL 600.000 /bin/sh -c 'export JAX_PLATFORMS=tpu;",
        "--platform tpu --nonce PLACEHOLDER-NONCE",
        "get @REMOTE-HOME@/jax-tpu-lab/receipt.json",
        "judge the receipt",
        f"DELETE {base}/nodes/tpulab-",
        f"GET {base}/operations/<DELETE-OPERATION-ID>",
        f"GET {base}/nodes?$alt=json;enum-encoding=int",
        "Placeholders",
    ]
    positions = [out.find(text) for text in order]
    assert all(p >= 0 for p in positions), list(zip(order, positions, strict=True))
    assert positions == sorted(positions)
    assert '"schedulingConfig": {"spot": true}' in out
    assert '"networkConfig": {"enableExternalIps": true}' in out
    assert "jax[tpu]" in out


def test_run_help_stays_light() -> None:
    done = cli_imports("run", "--help")
    assert "--accelerator" in done.stdout
    assert "--dry-run" in done.stdout
    assert done.heavy == [], done.heavy


def test_dry_run_json_is_a_versioned_plan() -> None:
    done = tpulab("run", "--accelerator", "v6e-1", "--emulate", "--dry-run", "--json")
    assert done.returncode == EXIT_OK, done.stderr
    plan = envelope(done)
    assert plan["schema_version"] == 1
    assert plan["command"] == "run"
    assert plan["ok"] is True
    assert plan["dry_run"] is True
    assert plan["emulated"] is True
    assert plan["accelerator_type"] == "v6e-1"
    assert (plan["project"], plan["project_source"]) == ("tpulab-emulated", "emulator")
    assert plan["node_name"].startswith("tpulab-")
    PlanEnvelope.model_validate_json(done.stdout)  # what printed is the pinned contract
    kinds = [(step["phase"], step["kind"]) for step in plan["steps"]]
    assert kinds[0] == ("validate", "local")
    assert ("verify", "local") in kinds
    assert kinds.index(("verify", "local")) < kinds.index(("teardown", "api"))
    create = next(step for step in plan["steps"] if step["action"] == "CreateNode")
    assert create["method"] == "POST"
    assert create["body"]["labels"] == {
        "managed-by": "tpulab",
        "tpulab-run": plan["run_id"],
        "tpulab-kind": "run",
        # A fresh home has no owner id yet, and a plan makes none: the placeholder.
        "tpulab-owner": PLACEHOLDER_OWNER,
    }
    assert paths.existing_owner_id() is None  # the plan wrote nothing
    assert create["body"]["metadata"]["ssh-keys"] == (
        "tpulab:ssh-ed25519 <PER-RUN-PUBLIC-KEY> tpulab"
    )
    execute = next(step for step in plan["steps"] if step["phase"] == "execute")
    assert execute["env"] == {
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": "--xla_force_host_platform_device_count=1",
    }
    assert execute["command"].startswith("timeout --signal=KILL 600.000 /bin/sh -c ")
    assert "--nonce PLACEHOLDER-NONCE-made-per-run" in execute["command"]
    # The emulator's quick operation schedule, as GoogleTpuApi would poll it.
    operation = next(step for step in plan["steps"] if step["action"] == "GetOperation")
    assert operation["poll"]["schedule"].startswith("Backoff(initial=0.05, cap=0.1")
    # ... and so is the emulator's host key: it is published within milliseconds of READY.
    host_key = next(step for step in plan["steps"] if step["phase"] == "host-key" and step["poll"])
    assert host_key["poll"]["schedule"].startswith("Backoff(initial=0.05, cap=0.1")
    # Every placeholder shown is explained.
    shown = json.dumps(plan["steps"])
    assert "<PER-RUN-PUBLIC-KEY>" in plan["placeholders"]
    assert all(marker in shown for marker in plan["placeholders"])
    assert not paths.emulator_state_dir().exists(), "a dry run must not start the emulator"


def test_missing_project_for_a_real_run_is_a_config_error(tmp_path: Path) -> None:
    env_free = {
        k: v
        for k, v in os.environ.items()
        if k not in {"TPULAB_PROJECT", "CLOUDSDK_CORE_PROJECT", "GOOGLE_CLOUD_PROJECT"}
    }
    done = subprocess.run(
        [sys.executable, "-m", "tpulab", "run", "--accelerator", "v5litepod-4", "--dry-run",
         "--zone", "us-central1-a"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**env_free, "CLOUDSDK_CONFIG": str(tmp_path / "none")},
    )  # fmt: skip
    assert done.returncode == EXIT_CONFIG
    assert "No Google Cloud project" in done.stderr
    assert "--project" in done.stderr


def test_a_run_whose_api_cannot_be_set_up_reports_nothing_created(tmp_path: Path) -> None:
    # Credentials that point at a missing file: the Google client refuses before any
    # request, so the run fails before a Lifecycle exists. Its envelope is still a whole
    # RunEnvelope, saying plainly that nothing was created.
    env = {
        **os.environ,
        "GOOGLE_APPLICATION_CREDENTIALS": str(tmp_path / "missing-adc.json"),
        "CLOUDSDK_CONFIG": str(tmp_path / "no-gcloud"),
    }
    done = subprocess.run(
        [sys.executable, "-m", "tpulab", "run", "--accelerator", "v5litepod-4",
         "--project", "my-proj-1", "--zone", ZONE, "--name", "never-made", "--json"],
        capture_output=True, text=True, timeout=60, check=False, env=env,
    )  # fmt: skip
    assert done.returncode == EXIT_CONFIG, done.stderr
    result = run_document(done)
    assert result.ok is False
    assert result.mode == "google"
    assert result.node_name == "never-made"
    assert (result.teardown.status, result.teardown.confirmed) == ("not-created", False)
    assert result.receipt.verdict is None
    assert result.phases == []
    assert result.api_calls == 0
    assert result.error is not None
    assert result.error.type == "ConfigError"
    assert "missing-adc.json" in result.error.message
