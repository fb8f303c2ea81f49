"""`tpulab run --dry-run`: every API request and remote command of a run, in order.

The plan is built from the same builders the lifecycle uses (bootstrap commands, the
payload argv and environment, the node request's labels), so what it prints is what a
run would send. Building it contacts nothing and imports nothing heavy: no jax,
paramiko or google.* (a test checks `sys.modules`).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import asdict, dataclass
from typing import Any, Literal

from tpulab.config import RunSpec
from tpulab.remote import bootstrap as boot

__all__ = ["PLAN_VERSION", "PlanStep", "build_plan", "plan_envelope"]

PLAN_VERSION = 1
GOOGLE_BASE = "https://tpu.googleapis.com/v2"
# Stand-ins for values only a real run creates; they satisfy the same validators.
NONCE_PLACEHOLDER = "NONCE-MADE-AT-RUN-TIME"
KEY_PLACEHOLDER = "ssh-ed25519 <per-run public key>"

Kind = Literal["local", "api", "ssh"]


@dataclass(frozen=True)
class PlanStep:
    phase: str
    kind: Kind
    action: str  # "POST .../nodes?nodeId=x" or the remote command line
    why: str


def _base(spec: RunSpec) -> str:
    if spec.mode == "emulate":
        return "<embedded emulator>/v2"
    if spec.mode == "endpoint" and spec.api_endpoint:
        return spec.api_endpoint.rstrip("/") + "/v2"
    return GOOGLE_BASE


def _node_body(spec: RunSpec) -> dict[str, Any]:
    body: dict[str, Any] = {
        "acceleratorType": spec.accelerator.name,
        "runtimeVersion": spec.accelerator.runtime_version,
        "labels": spec.labels,
        "metadata": {"ssh-keys": f"{spec.ssh_user}:{KEY_PLACEHOLDER} {spec.ssh_user}"},
    }
    if spec.spot:
        body["schedulingConfig"] = {"spot": True}
    return body


def build_plan(spec: RunSpec, *, installer: boot.Installer = "uv") -> list[PlanStep]:
    """The ordered steps of `spec`'s run, teardown included."""
    from tpulab.remote.payload import payload_command, payload_env

    t = spec.timeouts
    base = _base(spec)
    location = f"{base}/projects/{spec.project.value}/locations/{spec.zone.value}"
    node = f"{location}/nodes/{spec.node_name}"
    label = f"tpulab-run={spec.run_id}"
    argv = payload_command(
        boot.VENV_PYTHON,
        boot.STAGED_PAYLOAD,
        platform=spec.platform,
        nonce=NONCE_PLACEHOLDER,
        out=boot.RECEIPT_PATH,
        emulated=spec.emulated,
    )
    env = payload_env(spec.platform, spec.accelerator.devices_per_host)
    payload_line = shlex.join(["env", *(f"{k}={v}" for k, v in sorted(env.items())), *argv])
    address = "127.0.0.1:<published port>" if spec.emulated else "<node external IP>:22"
    steps = [
        PlanStep(
            "validate",
            "local",
            "generate an ed25519 key pair and a nonce for this run",
            "the key is injected at create time; the nonce makes old receipts useless",
        ),
        PlanStep(
            "create",
            "local",
            f"journal row: run {spec.run_id} -> {spec.node_name}",
            "committed before create, so `tpulab teardown --verify` can find the node",
        ),
        PlanStep(
            "create",
            "api",
            f"POST {location}/nodes?nodeId={spec.node_name} "
            + json.dumps(_node_body(spec), sort_keys=True),
            "create the TPU VM with tpulab's labels and this run's SSH key",
        ),
        PlanStep(
            "create",
            "api",
            f"GET {location}/operations/<create op> until done",
            f"a zone stockout arrives here (timeout {t.create:g} s)",
        ),
        PlanStep(
            "wait-ready",
            "api",
            f"GET {node} until state READY",
            f"poll every 1 s growing to 10 s (timeout {t.ready:g} s)",
        ),
        PlanStep(
            "host-key",
            "api",
            f'POST {node}:getGuestAttributes {{"queryPath": ""}}',
            "pin the host key hostkeys/ssh-ed25519 before connecting",
        ),
        PlanStep(
            "connect",
            "ssh",
            f"{spec.ssh_user}@{address} (pinned host key, per-run key)",
            f"retried until sshd answers (timeout {t.connect:g} s)",
        ),
        *(
            [
                PlanStep(
                    "bootstrap",
                    "ssh",
                    boot.describe(boot.uv_command()),
                    "find uv, else python3 -m pip install --user uv",
                )
            ]
            if boot.needs_uv(spec.python, installer)
            else []
        ),
        PlanStep(
            "bootstrap",
            "ssh",
            boot.describe(boot.venv_command(installer, spec.python)),
            f"create ~/jax-tpu-lab/.venv with python {spec.python} ({spec.python_source}) "
            "unless it exists with it",
        ),
        PlanStep(
            "bootstrap",
            "ssh",
            boot.describe(boot.probe_command()),
            "resolved versions of python, jax, jaxlib, libtpu, numpy",
        ),
        PlanStep(
            "bootstrap",
            "ssh",
            boot.describe(boot.install_command(spec.platform, installer, spec.jax_version)),
            "only when the probe shows something missing",
        ),
        PlanStep(
            "stage",
            "ssh",
            f"sftp put {boot.STAGED_PAYLOAD}; sha256sum -- {boot.STAGED_PAYLOAD}",
            "upload the verifier and check its sha256",
        ),
        PlanStep(
            "stage",
            "ssh",
            shlex.join(["rm", "-f", boot.RECEIPT_PATH]),
            "no receipt of an earlier run can be collected",
        ),
        PlanStep(
            "execute",
            "ssh",
            payload_line,
            f"the payload, {spec.platform} required, no fallback (timeout {t.payload:g} s)",
        ),
        PlanStep(
            "collect",
            "ssh",
            f"sha256sum -- {boot.RECEIPT_PATH}; sftp get {boot.RECEIPT_PATH}",
            "fetch the receipt (at most 1 MiB), checked by sha256",
        ),
        PlanStep(
            "verify",
            "local",
            f"check the receipt: platform {spec.platform}, "
            f"{spec.accelerator.devices_per_host} devices, nonce; keep it locally",
            "saved under the receipts directory before teardown starts",
        ),
        PlanStep(
            "teardown",
            "api",
            f"DELETE {node}",
            "always, on every exit path; NOT_FOUND counts as deleted",
        ),
        PlanStep("teardown", "api", f"GET {location}/operations/<delete op> until done", ""),
        PlanStep(
            "teardown",
            "api",
            f"GET {location}/nodes (all pages) until no node has {label}",
            f"the proof nothing billable remains (timeout {t.teardown:g} s)",
        ),
    ]
    return steps


def plan_envelope(spec: RunSpec, steps: list[PlanStep]) -> dict[str, Any]:
    """The versioned JSON of `tpulab run --dry-run --json`."""
    accel = spec.accelerator
    return {
        "schema_version": PLAN_VERSION,
        "command": "run",
        "dry_run": True,
        "run_id": spec.run_id,
        "mode": spec.mode,
        "emulated": spec.emulated,
        "project": asdict(spec.project),
        "zone": asdict(spec.zone),
        "node": spec.node_name,
        "accelerator": accel.name,
        "spot": spec.spot,
        "estimated_cost_per_hour_usd": accel.price_per_hour(spot=spec.spot),
        "steps": [asdict(step) for step in steps],
    }
