"""`tpulab run --dry-run`: the real `Lifecycle`, run over recording seams.

There is no description of a run here to drift from it: `build_plan` runs
`tpulab.run.lifecycle.Lifecycle` with the seams of `tpulab.run.recording`, and the plan
is whatever those recorded -- every API request (method, path, body) and every remote
command line and transfer, in order, the teardown of `Lifecycle.run()`'s finally path
included. Building it contacts nothing, writes nothing and imports nothing heavy (no
jax, paramiko or google.*; a test checks `sys.modules`).
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from tpulab import paths
from tpulab.catalog import PRICE_DATE
from tpulab.config import Mode, RunSpec
from tpulab.envelope import Envelope
from tpulab.remote import bootstrap as boot
from tpulab.run.lifecycle import Lifecycle
from tpulab.run.plan_steps import (
    PLACEHOLDER_OWNER,
    PLACEHOLDERS,
    PlanEnds,
    PlanStep,
    worker_ip_placeholder,
)
from tpulab.run.recording import PlanRecorder

__all__ = ["GOOGLE_ENDPOINT", "PlanEnvelope", "PlanStep", "build_plan", "plan_envelope"]

GOOGLE_ENDPOINT = "https://tpu.googleapis.com"
EMBEDDED_ENDPOINT = "<embedded emulator>"


class PlanEnvelope(Envelope):
    """`tpulab run --dry-run --json`: the resolved spec and the ordered steps of its run."""

    command: Literal["run", "exec"] = "run"  # exec: the steps of `tpulab exec --dry-run`
    ok: bool = True
    dry_run: Literal[True] = True
    run_id: str
    mode: Mode
    emulated: bool
    endpoint: str  # the API's base URL; each step's path follows it
    project: str
    project_source: str  # where the value came from: a flag, the environment, gcloud...
    zone: str
    zone_source: str
    # Every configurable value's origin (flag, env, [tool.tpulab], default), the workload's
    # fields included: RunSpec.sources, the one place that records them.
    sources: dict[str, str]
    node_name: str
    accelerator_type: str
    runtime_version: str
    spot: bool
    platform: str
    ssh_user: str
    installer: str
    timeouts_seconds: dict[str, float]
    estimated_cost_per_hour_usd: float | None  # None: no list price is cited (TPU7x)
    price_date: str
    placeholders: dict[str, str]  # marker -> the real value it stands for
    steps: list[PlanStep]


def build_plan(spec: RunSpec, *, installer: boot.Installer = "uv") -> list[PlanStep]:
    """The ordered steps of `spec`'s run, teardown included, recorded from the lifecycle."""
    if spec.owner is None:  # the home's id is read, never made, by a plan
        spec = dataclasses.replace(spec, owner=paths.existing_owner_id() or PLACEHOLDER_OWNER)
    recorder = PlanRecorder(spec)
    life = Lifecycle(
        spec,
        api=recorder.api,
        connect=recorder.connect,
        journal=recorder.journal,
        store=recorder.store,
        observer=recorder,
        installer=installer,
        clock=recorder.clock,
        sleep=recorder.sleep,
        new_key=recorder.new_key,
        new_nonce=recorder.new_nonce,
        judge=recorder.judge,
        write_record=recorder.write_record,
        # The plan shows the first renewal; a thread would add more at random moments.
        renew_in_background=False,
        # A slice's workers one after another: the plan lists each one's steps in order.
        parallel_workers=1,
        preflight=recorder.preflight,
    )
    try:
        life.run()
    except PlanEnds:
        return recorder.steps
    # run() only returns once the evidence came back (the receipt, or a command's
    # artifacts), which a plan never has.
    raise AssertionError("the dry run went past the point where evidence comes back")


def _worker_placeholders(hosts: int) -> dict[str, str]:
    return {
        worker_ip_placeholder(w): f"worker {w}'s address (networkEndpoints[{w}]), known once READY"
        for w in range(hosts if hosts > 1 else 0)
    }


def plan_envelope(
    spec: RunSpec, steps: list[PlanStep], *, installer: boot.Installer = "uv"
) -> PlanEnvelope:
    """The versioned JSON of `tpulab run --dry-run --json`."""
    accel = spec.accelerator
    if spec.mode == "emulate":
        endpoint = EMBEDDED_ENDPOINT
    elif spec.mode == "endpoint" and spec.api_endpoint:
        endpoint = spec.api_endpoint.rstrip("/")
    elif spec.provider == "compute":
        endpoint = "https://compute.googleapis.com"  # each step's path is /compute/v1/...
    else:
        endpoint = GOOGLE_ENDPOINT
    shown = [step.model_dump_json() for step in steps]
    return PlanEnvelope(
        run_id=spec.run_id,
        mode=spec.mode,
        emulated=spec.emulated,
        endpoint=endpoint,
        project=spec.project.value,
        project_source=spec.project.source,
        zone=spec.zone.value,
        zone_source=spec.zone.source,
        sources=spec.sources,
        node_name=spec.node_name,
        accelerator_type=accel.name,
        runtime_version=accel.runtime_version,
        spot=spec.spot,
        platform=spec.platform,
        ssh_user=spec.ssh_user,
        installer=installer,
        timeouts_seconds=dataclasses.asdict(spec.timeouts),
        estimated_cost_per_hour_usd=accel.price_per_hour(spot=spec.spot) if accel.priced else None,
        price_date=PRICE_DATE,
        placeholders={
            marker: meaning
            for marker, meaning in {**PLACEHOLDERS, **_worker_placeholders(accel.hosts)}.items()
            if any(marker in text for text in shown)
        },
        steps=steps,
    )
