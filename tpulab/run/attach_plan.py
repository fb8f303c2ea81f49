"""`tpulab exec --dry-run`: the steps of an exec, recorded from `AttachedRun`
(tpulab.run.attach) over the recording seams of tpulab.run.recording, so the plan cannot
drift from the exec."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpulab.run.attach import AttachedRun, Attachment

if TYPE_CHECKING:
    from tpulab.config import RunSpec
    from tpulab.remote import bootstrap as boot
    from tpulab.run.plan_steps import PlanStep

__all__ = ["build_attached_plan"]


def build_attached_plan(
    spec: RunSpec, attachment: Attachment, *, installer: boot.Installer = "uv"
) -> list[PlanStep]:
    """`tpulab exec --dry-run`: the steps of an exec, recorded from `AttachedRun` over
    the recording seams (no key is read, nothing is contacted or written)."""
    from dataclasses import replace

    from tpulab.cloud import rest
    from tpulab.cloud.compute_v1 import instance_body
    from tpulab.contract import KIND_SESSION, STARTUP_SCRIPT_METADATA
    from tpulab.models import NodeRequest, tpulab_labels
    from tpulab.remote.watchdog import startup_script
    from tpulab.run.plan_steps import PLACEHOLDER_IMAGE, PlanEnds
    from tpulab.run.recording import PlaceholderKey, PlanRecorder

    recorder = PlanRecorder(spec)
    # The session's node exists (READY, its watchdog armed by the startup-script `up`
    # sent): the recording API answers for it as the real one would -- as a Compute
    # instance when the session's provider is Compute (its answer has no TPU node shape).
    request = NodeRequest(
        accelerator_type=spec.accelerator.name,
        runtime_version=spec.accelerator.runtime_version,
        labels=tpulab_labels(attachment.watchdog.run_id, kind=KIND_SESSION),
        metadata={STARTUP_SCRIPT_METADATA: startup_script(attachment.watchdog)},
    )
    recorder.transport.created = (
        instance_body(
            spec.project.value,
            spec.zone.value,
            spec.node_name,
            request,
            machine_type=str(spec.accelerator.machine_type),
            image=spec.image or PLACEHOLDER_IMAGE,
        )
        if spec.provider == "compute"
        else rest.node_body(request)
    )
    life = AttachedRun(
        spec,
        attachment=replace(attachment, key=PlaceholderKey(), wall_clock=lambda: 0.0),
        api=recorder.api,
        connect=recorder.connect,
        observer=recorder,
        store=recorder.store,
        installer=installer,
        clock=recorder.clock,
        sleep=recorder.sleep,
        write_record=recorder.write_record,
        renew_in_background=False,
        parallel_workers=1,  # a slice's workers in order: the plan lists each one's steps
    )
    try:
        life.run()
    except PlanEnds:
        return recorder.steps
    raise AssertionError("the dry run went past the point where evidence comes back")
