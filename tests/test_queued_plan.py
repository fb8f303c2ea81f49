"""`--dry-run --queued` shows exactly what a queued run sends (the same comparison as
tests/test_plan_is_the_run.py, over the queued-resource calls), and the wire builders of
the queued-resource calls match what google-cloud-tpu's client puts on the wire."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from test_plan_is_the_run import (
    Event,
    PhaseMarks,
    TracingConnection,
    _normalise,
    _plan_events,
    _target,
    _wire_by_phase,
)

from tpulab.app.doctor import preflight_for
from tpulab.cloud import rest
from tpulab.cloud.api import QueuedResourceRequest
from tpulab.cloud.google import GoogleTpuApi
from tpulab.models import NodeRequest, tpulab_labels
from tpulab.remote.keys import RunKey, SshTarget
from tpulab.run.plan import build_plan
from tpulab.run.plan_steps import PLACEHOLDER_PUBLIC_KEY, PLACEHOLDER_QR_OPERATION

if TYPE_CHECKING:
    from run_rig import Rig

    from tpulab.emulator import Emulator

pytest_plugins = ["emulator_fixtures", "ssh_fixtures", "run_rig"]


def test_dry_run_queued_sends_what_a_queued_run_sends(embedded_rig: Rig) -> None:
    rig = embedded_rig
    spec = dataclasses.replace(rig.spec("v5litepod-1"), queued=True, valid_for=600)
    marks = PhaseMarks(rig.emulator)
    events: list[Event] = []

    def connect(target: SshTarget, key: RunKey) -> TracingConnection:
        return TracingConnection(target, key, events=events, phase=lambda: marks.phase)

    # The project's preflight as `tpulab run` asks it (app.doctor.preflight_for).
    preflight = preflight_for(spec, rig.emulator.url)
    life, _recorder, error = rig.run(spec, marks, connect=connect, preflight=preflight)
    assert error is None, error
    assert life.key is not None
    replacements = {life.key.public_b64: PLACEHOLDER_PUBLIC_KEY}
    real_api = _normalise(_wire_by_phase(rig.emulator.requests(), marks.marks), replacements)
    plan_api, _plan_ssh = (_normalise(x, {}) for x in _plan_events(build_plan(spec)))
    assert real_api == plan_api
    calls = [
        (phase, method, target.split("?")[0].rsplit("/", 1)[-1])
        for phase, method, target, _ in plan_api
    ]
    assert calls[:5] == [
        ("create", "GET", "tpu.googleapis.com"),  # the preflight: the API enabled ...
        ("create", "POST", "test-project:testIamPermissions"),  # ... and the permissions
        ("create", "POST", "queuedResources"),
        ("create", "GET", "<OP>"),
        ("create", "GET", spec.node_name),
    ]
    # The plan shows the QueuedResource body: node spec with our labels and key, window.
    body = plan_api[2][3]
    assert body["queueingPolicy"] == {"validUntilDuration": "600s"}
    (node_spec,) = body["tpu"]["nodeSpec"]
    assert node_spec["nodeId"] == spec.node_name
    assert node_spec["node"]["labels"] == spec.labels
    assert PLACEHOLDER_PUBLIC_KEY in node_spec["node"]["metadata"]["ssh-keys"]
    teardown = [c for c in calls if c[0] == "teardown"]
    assert ("teardown", "DELETE", spec.node_name) in teardown
    assert ("teardown", "GET", "queuedResources") in teardown  # the confirming list
    steps = build_plan(spec)
    wait = next(s for s in steps if s.action == "GetQueuedResource" and s.phase == "create")
    assert wait.poll is not None
    assert "ACTIVE" in wait.poll.until
    assert any(PLACEHOLDER_QR_OPERATION in (s.path or "") for s in steps)


def test_queued_wire_builders_match_what_the_client_sends(
    emulator: Emulator, tpu_api: GoogleTpuApi
) -> None:
    project, zone = tpu_api.project, "us-central1-a"
    node = NodeRequest(
        accelerator_type="v5litepod-4",
        runtime_version="v2-alpha-tpuv5-lite",
        labels=tpulab_labels("run-9"),
        metadata={"ssh-keys": "tpulab:ssh-ed25519 AAAA tpulab"},
        spot=True,
    )
    spot = QueuedResourceRequest(node_id="q-1", node=node, valid_for_seconds=45)
    plain = QueuedResourceRequest(node_id="q-2", node=node.model_copy(update={"spot": False}))
    expected = [
        rest.create_queued_resource(project, zone, "q-1", spot),
        rest.create_queued_resource(project, zone, "q-2", plain),
        rest.get_queued_resource(project, zone, "q-1"),
        rest.list_queued_resources(project, zone, page_size=1),
        rest.list_queued_resources(project, zone, page_size=1, page_token="1"),
        rest.delete_queued_resource(project, zone, "q-2", force=True),
    ]
    tpu_api.create_queued_resource(zone, "q-1", spot)
    tpu_api.create_queued_resource(zone, "q-2", plain)
    found = tpu_api.get_queued_resource(zone, "q-1")
    assert found.run_id == "run-9"
    assert found.spot
    paged = GoogleTpuApi(project, api_endpoint=emulator.url, list_page_size=1)
    assert [q.name for q in paged.list_queued_resources(zone)] == ["q-1", "q-2"]
    tpu_api.delete_queued_resource(zone, "q-2", force=True)
    log = [(e["method"], _target(e), e["body"]) for e in emulator.requests()]
    assert log == [(w.method, w.target, w.body) for w in expected]
