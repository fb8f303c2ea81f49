"""Recording seams: the `Lifecycle` of `tpulab run --dry-run` runs against these.

`PlanRecorder` hands the real lifecycle a `TpuApi`, an SSH `connect` factory, a journal,
an observer, a clock and the run's secrets, all of which record instead of acting:

- The API is the run's own provider verbs (`tpulab.cloud.tpu_v2.TpuV2Api`, or
  Compute's) over a `RecordingTransport` (tpulab.run.recording_transport): it records
  each wire request they send (the very requests `GoogleTpuApi` sends through the
  client) and answers in the API's REST JSON: operations done, the node READY at a
  placeholder address, a placeholder host key published, nothing listed once the delete
  went out. A request made inside a poll loop is recorded once, with that loop's
  schedule and timeout (`polling.active_wait`).
- `RecordingSession` (tpulab.run.recording_ssh) records the exact command line
  `tpulab.remote.ssh.Connection` would execute for each `run` (`tpulab.remote.cmdline`)
  and each transfer with its sha256 check, and answers as a freshly booted image would.
- The plan stops where a real run's evidence begins: downloading the receipt records the
  transfer and the local judgement that would follow, then raises `PlanEnds`. The
  lifecycle treats that like any failure after create, so the teardown in the plan is
  the one `Lifecycle.run()`'s finally path really sends.
- With a `-- CMD`, the plan goes on as if the receipt verified (the recorder's `judge`
  says so, and the step says that a real run stops there unless it does): the workspace
  upload (its archive read here, so the step lists the files and bytes that would go),
  the installs, the command's argv, and the fetch, where the evidence is the artifacts
  and `PlanEnds` is raised instead.

Nothing is contacted and nothing is written: no journal row, no receipt, no key file.
Values only a real run makes are placeholders, listed in `PLACEHOLDERS`; the steps and
those placeholders are tpulab.run.plan_steps.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tpulab import catalog
from tpulab.cloud.project_apis import Check, ProjectApis
from tpulab.config import RunSpec
from tpulab.evidence.judge import Judgement, Verdict
from tpulab.evidence.receipt import Expectation
from tpulab.evidence.store import Integrity, KeptReceipt, Provenance, ReceiptStore
from tpulab.remote.keys import RunKey, SshTarget
from tpulab.run.plan_steps import (
    PLACEHOLDER_NONCE,
    PLACEHOLDER_PUBLIC_KEY,
    PLACEHOLDER_RECEIPT_ID,
    Kind,
    PlanStep,
)
from tpulab.run.progress import Phase, TeardownStatus
from tpulab.run.record import RUN_RECORD_NAME, RunRecord
from tpulab.run.recording_ssh import RecordingSession
from tpulab.run.recording_transport import RecordingTransport, recording_api

__all__ = ["PlaceholderKey", "PlanRecorder", "RecordingJournal", "RecordingStore"]


class PlaceholderKey(RunKey):
    """The per-run key's stand-in: a marked public half, and no private half at all."""

    def __init__(self) -> None:  # no key generation: nothing secret exists in a plan
        self._b64 = PLACEHOLDER_PUBLIC_KEY

    @property
    def fingerprint(self) -> str:
        return "SHA256:" + PLACEHOLDER_PUBLIC_KEY

    def openssh_private_bytes(self) -> bytes:
        raise TypeError("a plan's stand-in key has no private half")


class PlanRecorder:
    """The seams of one dry run, and the steps they recorded."""

    def __init__(self, spec: RunSpec) -> None:
        self.spec = spec
        self.steps: list[PlanStep] = []
        self.phase = Phase.VALIDATE.value
        self.now = 0.0
        self.transport = RecordingTransport(self)
        self.api = recording_api(self, self.transport)
        self.journal = RecordingJournal(self)
        self.store = RecordingStore(self)

    # -- recording ------------------------------------------------------------------------

    def add(self, kind: Kind, action: str, *, phase: str | None = None, **fields: Any) -> None:
        self.steps.append(PlanStep(phase=phase or self.phase, kind=kind, action=action, **fields))

    def local(self, action: str, *, phase: str | None = None) -> None:
        self.add("local", action, phase=phase)

    # -- the lifecycle's seams ------------------------------------------------------------

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(0.0, seconds)  # answers come at once; a wait would only advance

    def new_key(self) -> RunKey:
        self.local(
            "generate the run's ed25519 key pair (in memory; public half "
            f"{PLACEHOLDER_PUBLIC_KEY} goes into the VM's ssh-keys metadata)"
        )
        return PlaceholderKey()

    def new_nonce(self) -> str:
        self.local(f"draw the run's nonce {PLACEHOLDER_NONCE} (the payload must echo it)")
        return PLACEHOLDER_NONCE

    def preflight(self) -> list[Check]:
        """The project's checks before the create, through the same `preflight` a run
        asks, over a recording `ProjectApis` that answers as a ready project."""
        from tpulab.cloud.network_checks import placement_of
        from tpulab.cloud.preflight import checks_for, preflight

        apis = RecordingProjectApis(self)
        placement = placement_of(self.spec)
        return list(
            preflight(
                apis,
                self.spec.project.value,
                account="",
                service_account=self.spec.service_account,
                internal_ip=placement,
                # the run's provider's checks, as a real run asks them (app.doctor)
                checks=checks_for(self.spec.provider, external_ip=placement is None),
            )
        )

    def connect(self, target: SshTarget, key: RunKey) -> RecordingSession:
        return RecordingSession(self, target, key)

    def write_record(self, record: RunRecord, out: Path) -> Path:
        """Where a run would write its run.json (at its start, then at its end); nothing
        is written."""
        target = out / RUN_RECORD_NAME
        if record.state == "running":
            self.local(
                f"write the run's start record to {target} (state running; the end "
                "replaces it, so a run killed before then still shows in `tpulab runs`)"
            )
            return target
        self.local(
            f"write the run's record to {target} (and point its journal row at it)",
            phase=Phase.TEARDOWN.value,
        )
        return target

    def judge(self, raw: bytes, expectation: Expectation) -> Judgement:
        """Reached only with a `-- CMD` (otherwise the receipt download ended the plan):
        the verdict the plan assumes so that it can show what follows a verified one."""
        del raw
        from tpulab.catalog import closed_form_sum_of_squares

        self.local(
            "a receipt that does not verify ends the run here, before anything of yours "
            "is uploaded or run; the plan goes on as if it verified",
            phase=Phase.VERIFY.value,
        )
        return Judgement(
            verdict=Verdict.VERIFIED,
            requirements=[],
            expected_total=closed_form_sum_of_squares(expectation.local_devices),
        )

    # The observer: only the phase matters here.

    def phase_started(self, phase: Phase) -> None:
        self.phase = phase.value

    def phase_finished(self, phase: Phase, seconds: float, detail: str) -> None:
        pass

    def phase_failed(self, phase: Phase, seconds: float, error: BaseException) -> None:
        pass

    def remote_output(self, stream: str, line: str) -> None:
        pass

    def note(self, message: str) -> None:
        pass

    def milestone(self, name: str, at: float) -> None:
        pass


class RecordingStore(ReceiptStore):
    """The receipt store of a plan: shows the writability probe, touches no disk."""

    def __init__(self, recorder: PlanRecorder) -> None:
        super().__init__(Path("<receipts directory>"))
        self.recorder = recorder

    def check_writable(self) -> None:
        self.recorder.local(
            "check that the receipt store is writable (a receipt that cannot be kept "
            "would make the VM a waste)"
        )

    def keep(
        self, raw: bytes, expectation: Expectation, judgement: Judgement, provenance: Provenance
    ) -> KeptReceipt:
        del raw, expectation, judgement, provenance  # recorded by the download's step
        where = self.root / f"{PLACEHOLDER_RECEIPT_ID}.json"
        return KeptReceipt(
            id=PLACEHOLDER_RECEIPT_ID,
            path=where,
            record_path=where,
            integrity=Integrity.INTACT,
            record=None,
        )


class RecordingJournal:
    """Records what the journal would be told; writes no row."""

    def __init__(self, recorder: PlanRecorder) -> None:
        self.recorder = recorder

    def run_started(self, spec: RunSpec) -> None:
        kind = catalog.vm_kind(spec.provider)
        self.recorder.local(
            f"journal row for run {spec.run_id}: {kind} {spec.node_name} in {spec.zone.value} "
            "(committed before the create request, so `tpulab teardown --verify` can find it)"
        )

    def phase_changed(self, run_id: str, phase: str) -> None:
        pass

    def run_finished(self, run_id: str, teardown: TeardownStatus, detail: str) -> None:
        self.recorder.local(f"journal row for run {run_id} closed with the teardown's status")


class RecordingProjectApis(ProjectApis):
    """`ProjectApis` whose requests are plan steps (path and query as sent, the body as
    JSON), answered as a project that is ready: the provider's API enabled, every permission
    asked for held, every subnetwork with Private Google Access."""

    def __init__(self, recorder: PlanRecorder) -> None:
        super().__init__(None, None)
        self.recorder = recorder

    def _send(self, method: str, url: str, **kwargs: Any) -> tuple[int, dict[str, Any]]:
        from urllib.parse import urlsplit

        parts = urlsplit(url)
        params = kwargs.get("params") or {}
        path = parts.path + (
            "?" + "&".join(f"{k}={v}" for k, v in params.items()) if params else ""
        )
        body = kwargs.get("json")
        action = _project_api_action(path)
        self.recorder.add(
            "api",
            action,
            method=method,
            path=path,
            body=body,
            detail=f"{parts.netloc}: answered as a ready project in a plan",
        )
        if action == "TestIamPermissions":
            return 200, {"permissions": list((body or {}).get("permissions") or [])}
        if action == "GetNetwork":  # an auto-mode network: one subnetwork per region
            name = path.rsplit("/", 1)[-1]
            project = path.split("/projects/", 1)[1].split("/", 1)[0]
            region = catalog.region_of(self.recorder.spec.zone.value)
            link = f"projects/{project}/regions/{region}/subnetworks/{name}"
            return 200, {"name": name, "subnetworks": [link]}
        if action == "GetSubnetwork":
            return 200, {"name": path.rsplit("/", 1)[-1], "privateIpGoogleAccess": True}
        return 200, {"name": path.lstrip("/"), "state": "ENABLED"}


def _project_api_action(path: str) -> str:
    """The plan's name for a project API request, by its path."""
    if path.endswith(":testIamPermissions"):
        return "TestIamPermissions"
    if "/subnetworks/" in path:
        return "GetSubnetwork"
    if "/global/networks/" in path:
        return "GetNetwork"
    return "GetService"
