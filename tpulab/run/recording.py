"""Recording seams: the `Lifecycle` of `tpulab run --dry-run` runs against these.

`PlanRecorder` hands the real lifecycle a `TpuApi`, an SSH `connect` factory, a journal,
an observer, a clock and the run's secrets, all of which record instead of acting:

- The API is the run's own TPU v2 verbs (`tpulab.cloud.tpu_v2.TpuV2Api`) over a
  `RecordingTransport`: it records each wire request they send (the very requests
  `GoogleTpuApi` sends through the client) and answers in the API's REST JSON:
  operations done, the node READY at a placeholder address, a placeholder host key
  published, nothing listed once the delete went out. A request made inside a poll loop
  is recorded once, with that loop's schedule and timeout (`polling.active_wait`).
- `RecordingSession` records the exact command line `tpulab.remote.ssh.Connection` would
  execute for each `run` (`tpulab.remote.cmdline`) and each transfer with its sha256
  check, and answers as a freshly booted image would.
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
Values only a real run makes are placeholders, listed in `PLACEHOLDERS`.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO, Literal

from pydantic import BaseModel, ConfigDict

from tpulab import catalog
from tpulab.cloud import rest
from tpulab.cloud.api import TpuApi
from tpulab.cloud.polling import operation_schedule
from tpulab.cloud.preflight import Check, ProjectApis
from tpulab.cloud.tpu_v2 import TpuV2Api
from tpulab.cloud.transport import Answer
from tpulab.config import RunSpec
from tpulab.config.endpoint import classify_endpoint
from tpulab.contract import HOST_KEY_ATTRIBUTE, STARTUP_SCRIPT_METADATA, WATCHDOG_STATE_ATTRIBUTE
from tpulab.errors import NotFoundError
from tpulab.evidence.judge import Judgement, Verdict
from tpulab.evidence.receipt import Expectation
from tpulab.evidence.store import Integrity, KeptReceipt, Provenance, ReceiptStore
from tpulab.polling import active_wait
from tpulab.remote import bootstrap as boot
from tpulab.remote import workload as wl
from tpulab.remote.cmdline import SHA256_TIMEOUT, remote_command, remote_path, sha256_command
from tpulab.remote.keys import RunKey, SshTarget
from tpulab.remote.tpu_release import RELEASE_MARKER, release_command
from tpulab.remote.workspace import planned_answer
from tpulab.run.progress import Phase, TeardownStatus
from tpulab.run.record import RUN_RECORD_NAME, RunRecord

__all__ = [
    "PLACEHOLDERS",
    "PLACEHOLDER_NONCE",
    "PlanEnds",
    "PlanRecorder",
    "PlanStep",
    "PollCadence",
]

# Stand-ins for what only a real run has; each satisfies the validator of the real value.
PLACEHOLDER_NONCE = "PLACEHOLDER-NONCE-made-per-run"
PLACEHOLDER_PUBLIC_KEY = "<PER-RUN-PUBLIC-KEY>"
PLACEHOLDER_NODE_IP = "<NODE-IP>"


def worker_ip_placeholder(worker: int) -> str:
    """A slice's worker's address in a plan ("<WORKER-2-IP>")."""
    return f"<WORKER-{worker}-IP>"


PLACEHOLDER_SSH_PORT = "<EMULATOR-SSH-PORT>"
# Shell-safe (shlex.quote leaves it alone), so a command line quotes it as a real path.
PLACEHOLDER_REMOTE_HOME = "@REMOTE-HOME@"
PLACEHOLDER_CREATE_OPERATION = "<CREATE-OPERATION-ID>"
PLACEHOLDER_DELETE_OPERATION = "<DELETE-OPERATION-ID>"
PLACEHOLDER_QR_OPERATION = "<QUEUED-RESOURCE-OPERATION-ID>"
PLACEHOLDER_IMAGE = "<TPU-VM-IMAGE: pass --image>"
PLACEHOLDER_FROM_VM = "<reported by the VM>"
PLACEHOLDER_RECEIPT_ID = "<RECEIPT-ID>"
# A label value (lowercase, [a-z0-9_-]): a plan on a home that has none makes none.
PLACEHOLDER_OWNER = "this-homes-owner-id"
PLACEHOLDERS: dict[str, str] = {
    PLACEHOLDER_NONCE: "the run's random nonce (secrets.token_hex), made at validate",
    PLACEHOLDER_PUBLIC_KEY: "the public half of the run's fresh ed25519 key pair",
    PLACEHOLDER_NODE_IP: "the node's address, known once it is READY",
    PLACEHOLDER_SSH_PORT: "the emulated node's loopback SSH port (a guest attribute)",
    PLACEHOLDER_REMOTE_HOME: "the login directory on the VM (SFTP's '.')",
    PLACEHOLDER_CREATE_OPERATION: "the operation id CreateNode answers with",
    PLACEHOLDER_DELETE_OPERATION: "the operation id DeleteNode answers with",
    PLACEHOLDER_QR_OPERATION: "the operation id a queued-resource create or delete answers with",
    PLACEHOLDER_IMAGE: "the Compute instance's boot image (--image); a real run refuses "
    "to start without one",
    PLACEHOLDER_FROM_VM: "whatever the VM's bootstrap scripts report",
    PLACEHOLDER_RECEIPT_ID: "the id the receipt store gives the kept receipt",
    PLACEHOLDER_OWNER: "this tpulab home's owner id, made by its first real run",
}
# A well-formed ed25519 key blob (type string + 32 zero bytes) that no host presents:
# the lifecycle validates the published key, so the stand-in must parse.
_PLACEHOLDER_HOST_KEY = base64.b64encode(
    b"\x00\x00\x00\x0bssh-ed25519\x00\x00\x00\x20" + bytes(32)
).decode("ascii")

Kind = Literal["api", "ssh", "local"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PollCadence(_Model):
    """How a polled request repeats in a real run (shown once in the plan)."""

    until: str
    schedule: str  # the schedule object's repr, e.g. Backoff(initial=1.0, cap=10.0, ...)
    timeout_seconds: float


class PlanStep(_Model):
    """One thing a run does, in order: an API request, a remote action or a local one."""

    phase: str
    kind: Kind
    action: str  # the RPC, the SSH action (connect, exec, put, get) or what is done locally
    method: str | None = None
    path: str | None = None  # with the query, as sent (not percent-encoded)
    body: dict[str, Any] | None = None
    argv: list[str] | None = None  # as the lifecycle passed it (None: a shell snippet)
    env: dict[str, str] | None = None
    command: str | None = None  # the exact line the remote shell receives
    remote_path: str | None = None
    target: str | None = None
    detail: str | None = None  # what the step relies on, in words (e.g. the pinned key)
    poll: PollCadence | None = None


class PlanEnds(Exception):
    """Raised where the run would need evidence only a real VM makes (the receipt)."""


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
            f"{PLACEHOLDER_PUBLIC_KEY} goes into the node's ssh-keys metadata)"
        )
        return PlaceholderKey()

    def new_nonce(self) -> str:
        self.local(f"draw the run's nonce {PLACEHOLDER_NONCE} (the payload must echo it)")
        return PLACEHOLDER_NONCE

    def preflight(self) -> list[Check]:
        """The project's checks before the create, through the same `preflight` a run
        asks, over a recording `ProjectApis` that answers as a ready project."""
        from tpulab.cloud.preflight import checks_for, placement_of, preflight

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
        self.recorder.local(
            f"journal row for run {spec.run_id}: node {spec.node_name} in {spec.zone.value} "
            "(committed before CreateNode, so `tpulab teardown --verify` can find it)"
        )

    def phase_changed(self, run_id: str, phase: str) -> None:
        pass

    def run_finished(self, run_id: str, teardown: TeardownStatus, detail: str) -> None:
        self.recorder.local(f"journal row for run {run_id} closed with the teardown's status")


class RecordingTransport:
    """The dry run's `Transport` (tpulab.cloud.transport): records each wire request the
    TPU v2 verbs send (tpulab.cloud.tpu_v2, the very code of a real run) and answers it
    as the API would, in its REST JSON: a node is READY at once, an operation done."""

    def __init__(self, recorder: PlanRecorder) -> None:
        self.recorder = recorder
        spec = recorder.spec
        self.project = spec.project.value
        self.calls = 0
        # The node as CreateNode sent it (its REST body), and whether it was deleted since.
        self.created: Answer | None = None
        self.deleted = False
        self.queued: Answer | None = None  # --queued: the QueuedResource's REST body

    @property
    def call_count(self) -> int:
        return self.calls

    def send(self, wire: rest.WireRequest, *, what: str, idempotent: bool) -> Answer:
        del what, idempotent  # nothing fails in a plan, so nothing is resent
        self.calls += 1
        wait = active_wait()  # answers come at once, so each loop probes exactly once
        poll = (
            PollCadence(
                until=wait.until, schedule=repr(wait.schedule), timeout_seconds=wait.timeout
            )
            if wait is not None
            else None
        )
        self.recorder.add(
            "api", wire.rpc, method=wire.method, path=wire.target, body=wire.body, poll=poll
        )
        return self._answer(wire)

    def _answer(self, wire: rest.WireRequest) -> Answer:
        if wire.rpc.startswith("compute."):
            return self._compute_answer(wire)
        rpc, name = wire.rpc, str(wire.message.get("name") or wire.message.get("parent"))
        if rpc == "GetOperation":
            return {"name": name, "done": True}
        if rpc == "CreateNode":
            self.created = dict(wire.message["node"])
            return self._operation(name, PLACEHOLDER_CREATE_OPERATION)
        if rpc == "CreateQueuedResource":
            self.queued = dict(wire.message["queuedResource"])
            spec = self.queued["tpu"]["nodeSpec"][0]
            self.created = {**spec["node"], "schedulingConfig": {"spot": "spot" in self.queued}}
            return self._operation(name, PLACEHOLDER_QR_OPERATION)
        if rpc == "ListNodes":
            node_name = rest.node_path(self.project, _zone(name), self.recorder.spec.node_name)
            return {"nodes": [self._node(node_name)]} if self._exists() else {}
        if rpc == "ListQueuedResources":
            qr_id = self.recorder.spec.node_name
            found = self.queued is not None and not self.deleted
            path = rest.queued_resource_path(self.project, _zone(name), qr_id)
            return {"queuedResources": [self._queued_resource(path)]} if found else {}
        if rpc in ("GetQueuedResource", "DeleteQueuedResource"):
            answer = self._queued_resource(name)  # NOT_FOUND, as the API would, if none
            if rpc == "GetQueuedResource":
                return answer
            self.deleted = True  # force: its node goes with it
            return self._operation(name, PLACEHOLDER_QR_OPERATION)
        node = self._node(name)  # GetNode, DeleteNode, GetGuestAttributes: NOT_FOUND if none
        if rpc == "DeleteNode":
            self.deleted = True
            return self._operation(name, PLACEHOLDER_DELETE_OPERATION)
        if rpc == "GetGuestAttributes":
            return self._guest_attributes(node)
        return node

    def _compute_answer(self, wire: rest.WireRequest) -> Answer:
        """Compute Engine's answers (tpulab.cloud.compute_v1): an operation DONE at the
        first look, the instance RUNNING at a placeholder address, its guest attributes
        as the TPU API's, nothing listed once the delete went out."""
        rpc, path = wire.rpc, str(wire.message.get("name"))
        zone_path = "/".join(path.split("/")[:4])  # projects/P/zones/Z
        if rpc == "compute.zoneOperations.get":
            return {"name": path.rsplit("/", 1)[-1], "status": "DONE"}
        if rpc == "compute.instances.insert":
            self.created = dict(wire.body or {})
            return {"name": PLACEHOLDER_CREATE_OPERATION, "status": "PENDING"}
        if rpc == "compute.instances.list":
            return {"items": [self._instance(zone_path)]} if self._exists() else {}
        instance = self._instance(zone_path)  # get, delete, guest attributes: NOT_FOUND if none
        if rpc == "compute.instances.delete":
            self.deleted = True
            return {"name": PLACEHOLDER_DELETE_OPERATION, "status": "PENDING"}
        if rpc == "compute.instances.getGuestAttributes":
            attributes = self._guest_attributes({"metadata": self._metadata_of(instance)})
            return _under_query_path(attributes, str(wire.message.get("queryPath") or ""))
        return instance

    @staticmethod
    def _metadata_of(instance: Answer) -> dict[str, str]:
        items = (instance.get("metadata") or {}).get("items") or []
        return {str(item["key"]): str(item.get("value", "")) for item in items}

    def _instance(self, zone_path: str) -> Answer:
        if self.created is None or self.deleted:
            name = self.recorder.spec.node_name
            raise NotFoundError(f"Instance {name} was not found.", status="NOT_FOUND")
        body = self.created
        interfaces = []
        for interface in body.get("networkInterfaces") or [{}]:
            answered: Answer = {**interface, "networkIP": PLACEHOLDER_NODE_IP}
            if interface.get("accessConfigs"):
                # As Compute answers: an external address only when one was asked for.
                answered["accessConfigs"] = [
                    {**config, "natIP": PLACEHOLDER_NODE_IP}
                    for config in interface["accessConfigs"]
                ]
            interfaces.append(answered)
        return {
            **body,
            "zone": zone_path,
            "status": "RUNNING",
            "networkInterfaces": interfaces,
        }

    def _exists(self) -> bool:
        return self.created is not None and not self.deleted

    def _operation(self, resource: str, placeholder: str) -> Answer:
        parent = "/".join(resource.split("/")[:4])  # projects/P/locations/Z
        return {"name": f"{parent}/operations/{placeholder}", "done": False}

    def _node(self, name: str) -> Answer:
        if self.created is None or self.deleted:
            zone, node_id = _zone(name), name.split("/")[-1]
            raise NotFoundError(f"Node {node_id} in {zone} was not found.", status="NOT_FOUND")
        body = self.created
        external = (body.get("networkConfig") or {}).get("enableExternalIps")
        hosts = self.recorder.spec.accelerator.hosts
        endpoints: list[Answer] = []
        for worker in range(hosts):
            # One endpoint per worker VM (a slice's worker i at networkEndpoints[i]).
            address = PLACEHOLDER_NODE_IP if hosts == 1 else worker_ip_placeholder(worker)
            endpoint: Answer = {"ipAddress": address}
            if external:
                # As the API answers: an external address only when the create asked for one.
                endpoint["accessConfig"] = {"externalIp": address}
            endpoints.append(endpoint)
        return {**body, "name": name, "state": "READY", "networkEndpoints": endpoints}

    def _guest_attributes(self, node: Answer) -> Answer:
        published = {HOST_KEY_ATTRIBUTE: _PLACEHOLDER_HOST_KEY}
        if STARTUP_SCRIPT_METADATA in (node.get("metadata") or {}):
            published[WATCHDOG_STATE_ATTRIBUTE] = "armed"  # as a permitted watchdog says
        items = [
            {"namespace": key.split("/", 1)[0], "key": key.split("/", 1)[1], "value": value}
            for key, value in published.items()
        ]
        return {"guestAttributes": [{"queryPath": "", "queryValue": {"items": items}}]}

    def _queued_resource(self, name: str) -> Answer:
        if self.queued is None or self.deleted:
            qr_id, zone = name.split("/")[-1], _zone(name)
            raise NotFoundError(
                f"Queued resource {qr_id} in {zone} was not found.", status="NOT_FOUND"
            )
        # Accepted, then ACTIVE with its node READY at the first look (the plan shows the
        # wait's cadence once, as for every poll).
        return {**self.queued, "name": name, "state": {"state": "ACTIVE"}}


def _under_query_path(attributes: Answer, query: str) -> Answer:
    """Compute's answer to getGuestAttributes?queryPath= ("ns/" or "ns/key"): the items
    under it, or its 404 when nothing is published there (as a real VM's emulator
    namespace never is)."""
    items = attributes["guestAttributes"][0]["queryValue"]["items"]
    namespace, _, key = query.partition("/")
    found = [i for i in items if i["namespace"] == namespace and (not key or i["key"] == key)]
    if not found:
        raise NotFoundError(
            f"Guest attributes {query} were not found.",
            status="NOT_FOUND",
            api_message=f"The resource '{query}' of type 'Guest Attribute' was not found.",
        )
    return {"queryPath": query, "queryValue": {"items": found}}


def _zone(resource: str) -> str:
    parts = resource.split("/")  # projects/P/locations/Z/...
    return parts[3] if len(parts) > 3 else ""


def recording_api(recorder: PlanRecorder, transport: RecordingTransport) -> TpuApi:
    """The run's provider over the recording transport -- the TPU v2 verbs, or Compute
    Engine's -- polling operations on the schedule the real one would use."""
    spec = recorder.spec
    local = spec.mode == "emulate" or classify_endpoint(spec.api_endpoint).is_loopback
    if spec.provider == "compute":
        from tpulab import catalog
        from tpulab.cloud.compute_v1 import EMULATOR_NAMESPACE, HOST_KEYS_QUERY, ComputeTpuApi

        return ComputeTpuApi(
            spec.project.value,
            transport,
            machine_type_of=lambda name: str(catalog.lookup(name).machine_type),
            image=spec.image or PLACEHOLDER_IMAGE,
            poll=lambda: operation_schedule(local=local),
            published=(HOST_KEYS_QUERY, EMULATOR_NAMESPACE) if local else (HOST_KEYS_QUERY,),
            clock=recorder.clock,
            sleep=recorder.sleep,
        )
    return TpuV2Api(
        spec.project.value,
        transport,
        poll=lambda: operation_schedule(local=local),
        clock=recorder.clock,
        sleep=recorder.sleep,
    )


class _Reply:
    """What a command printed, as `boot.CommandResult`."""

    def __init__(self, stdout: str = "", exit_status: int = 0, stderr: str = "") -> None:
        self.exit_status = exit_status
        self.stdout = stdout
        self.stderr = stderr


class _Held:
    """What a held command printed first, as `wl.HeldAnswer`: it runs on (no status)."""

    def __init__(self, stdout: str) -> None:
        self.exit_status: int | None = None
        self.stdout = stdout
        self.stderr = ""


class RecordingSession:
    """A RemoteSession that records the command lines a `Connection` would execute.

    Answers as a fresh image would: the bootstrap's scripts report success, a real TPU
    image has no jax until the install ran (an emulated image ships it), the payload
    exits 0. The receipt download ends the plan (`PlanEnds`).
    """

    def __init__(self, recorder: PlanRecorder, target: SshTarget, key: RunKey) -> None:
        self.recorder = recorder
        self.target = target
        self.key = key
        self.installed = recorder.spec.emulated

    def _target_text(self) -> str:
        port = PLACEHOLDER_SSH_PORT if self.recorder.spec.emulated else str(self.target.port)
        return f"{self.target.user}@{self.target.host}:{port}"

    def open(self) -> None:
        self.recorder.add(
            "ssh",
            "connect",
            target=self._target_text(),
            detail=f"authenticates with the run's key ({PLACEHOLDER_PUBLIC_KEY}); trusts only "
            f"the {self.target.host_key.key_type} host key the API published (any other "
            "aborts before anything is sent)",
        )

    def close(self) -> None:
        pass

    def run(
        self,
        argv: Sequence[str] | str,
        *,
        env: Mapping[str, str] | None = None,
        timeout: float,
        on_line: Callable[[str, str], None] | None = None,
        check: bool = False,
    ) -> _Reply:
        command = remote_command(argv, env=env, timeout=timeout)
        self.recorder.add(
            "ssh",
            "exec",
            argv=None if isinstance(argv, str) else list(argv),
            env=dict(env) if env else None,
            command=command,
        )
        return self._reply(argv)

    def hold(
        self,
        argv: Sequence[str],
        *,
        timeout: float,
        answer_within: float,
        beat_every: float | None = None,
    ) -> _Held:
        # All but the holder's note (this run, laptop and pid) and the silence it lets go
        # after is the lock's argv.
        is_lock = list(argv[:-2]) == wl.lock_command(run_id="", host="", pid=0)[:-2]
        what = (
            f"takes the session's exec lock (flock on ~/{wl.LOCK_PATH}, noting this run, "
            "laptop and pid) or says who holds it -- then the exec is refused, nothing "
            "synced or started; "
            if is_lock
            else ""
        )
        self.recorder.add(
            "ssh",
            "exec",
            argv=list(argv),
            command=remote_command(argv, timeout=timeout),
            detail=f"{what}answers within {answer_within:g}s, then stays running, its "
            "stdin open, until the connection closes (the exec's end, or the laptop's)"
            + (
                f" or {argv[-1]}s pass without the heartbeat byte sent every {beat_every:g}s"
                if beat_every is not None
                else ""
            )
            + ": what it holds goes with it",
        )
        return _Held(wl.LOCKED_REPORT if is_lock else "")  # an idle node: the lock is free

    def run_streaming(
        self,
        argv: Sequence[str],
        *,
        stdin: BinaryIO | Iterable[bytes] | None,
        stdout: BinaryIO | None,
        timeout: float,
        env: Mapping[str, str] | None = None,
    ) -> _Reply:
        command = remote_command(argv, env=env, timeout=timeout)
        argv = list(argv)
        # A transfer (tpulab.remote.workspace's script) or not; which way it goes.
        verb = argv[3] if planned_answer(argv) is not None else None
        detail = None
        answer = b""
        if verb == "unpack" and stdin is not None:
            # Read the archive a run would stream, so the plan lists what would go up.
            entries = _archive_manifest(stdin)
            total = sum(entry["bytes"] for entry in entries)
            names = ", ".join(entry["path"] for entry in entries[:20])
            more = f", ... and {len(entries) - 20} more" if len(entries) > 20 else ""
            detail = (
                f"streams {len(entries)} files, {total} bytes as one tar on stdin "
                f"(sha256 trailer; the VM checks each file): {names}{more}"
            )
            answer = json.dumps({"manifest": entries}).encode()
        elif verb == "pack":
            detail = "the VM streams back one tar of these, checked file by file into --out"
        elif verb is not None:  # `manifest`: what the VM holds decides what goes up
            detail = "the VM lists what it holds (path, bytes, sha256); a fresh VM: nothing"
            answer = planned_answer(argv) or b""
        self.recorder.add(
            "ssh",
            "exec",
            argv=argv,
            env=dict(env) if env else None,
            command=command,
            detail=detail,
        )
        if verb == "pack":
            raise PlanEnds("the artifacts exist only after a real run")
        if stdout is not None and answer:
            stdout.write(answer)
        return _Reply()

    def _reply(self, argv: Sequence[str] | str) -> _Reply:
        if isinstance(argv, str):
            return _Reply()
        argv = list(argv)
        spec = self.recorder.spec
        if argv in (boot.venv_command(i, spec.python) for i in boot.INSTALLERS):
            return _Reply(boot.VENV_MARKER + PLACEHOLDER_FROM_VM + "\n")
        if argv == boot.probe_command():
            have = PLACEHOLDER_FROM_VM if self.installed else None
            names = ("jax", "jaxlib", "numpy", "libtpu")
            versions = {name: have for name in names} | {"python": PLACEHOLDER_FROM_VM}
            if self.installed and spec.jax_version:
                versions["jax"] = spec.jax_version  # what a pinned install resolves
            return _Reply(boot.VERSIONS_MARKER + json.dumps(versions) + "\n")
        if argv[:2] == ["sh", "-c"] and any(
            argv == boot.install_command(spec.platform, i, spec.jax_version)
            for i in boot.INSTALLERS
        ):
            self.installed = True
            return _Reply(boot.INSTALLER_MARKER + argv[5] + "\n")
        if argv[:3] == boot.extras_command(boot.Extras())[:3]:
            return _Reply(
                boot.INSTALLER_MARKER + argv[5] + "\n" + boot.EXTRAS_MARKER + "installed\n"
            )
        if argv[:3] == boot.probe_command() and len(argv) > 3:
            versions = {name: PLACEHOLDER_FROM_VM for name in argv[3:]}
            return _Reply(
                boot.VERSIONS_MARKER
                + "{}\n"
                + boot.EXTRA_VERSIONS_MARKER
                + json.dumps(versions)
                + "\n"
            )
        if argv == wl.busy_command():  # an exec's check: a kept node where nothing runs
            return _Reply(wl.IDLE_REPORT)
        if argv == release_command():  # a fresh node: nothing holds its TPU
            return _Reply(RELEASE_MARKER + "killed= refused= lockfile=no\n")
        if argv[:2] == [boot.VENV_PYTHON, wl.STAGED_LAUNCHER]:
            report = {"exit_status": 0, "started": True, "timed_out": False, "stopped": None}
            return _Reply(stderr=wl.WORKLOAD_MARKER + json.dumps(report) + "\n")
        return _Reply()

    def _transfer(self, action: str, remote: str) -> None:
        path = remote_path(PLACEHOLDER_REMOTE_HOME, remote)
        check = remote_command(sha256_command(path), timeout=SHA256_TIMEOUT)
        self.recorder.add("ssh", action, remote_path=path, command=check)

    def put(self, local: Path | bytes, remote: str) -> str:
        data = local if isinstance(local, bytes) else local.read_bytes()
        self._transfer("put", remote)
        return hashlib.sha256(data).hexdigest()  # what the check would find

    def get(self, remote: str, local: Path, *, max_bytes: int) -> str:
        from tpulab.evidence.receipt import expectation_for

        self._transfer("get", remote)
        spec = self.recorder.spec
        expectation = expectation_for(
            spec.accelerator.name, emulated=spec.emulated, nonce=PLACEHOLDER_NONCE
        )
        self.recorder.local(
            f"judge the receipt (at most {max_bytes} bytes): {expectation.describe()}, "
            "nonce, sha256, numbers against the closed form; keep it in the receipt store "
            "before the teardown starts",
            phase=Phase.VERIFY.value,
        )
        if spec.workload is None:
            raise PlanEnds("the receipt exists only after a real run")
        # With a command the plan goes on (to the recorder's judge). The lifecycle reads
        # the download back from its scratch directory, so there must be a file there.
        local.write_bytes(b"")
        return PLACEHOLDER_RECEIPT_ID


class _ChunkReader:
    """A read()-able view of the chunks a transfer would stream, for tarfile's "r|"."""

    def __init__(self, stream: BinaryIO | Iterable[bytes]) -> None:
        self._stream = stream
        self._chunks = None if hasattr(stream, "read") else iter(stream)
        self._buffer = b""

    def read(self, size: int = -1) -> bytes:
        if self._chunks is None:
            return self._stream.read(size)  # type: ignore[union-attr]
        while size < 0 or len(self._buffer) < size:
            chunk = next(self._chunks, None)
            if chunk is None:
                break
            self._buffer += chunk
        cut = len(self._buffer) if size < 0 else size
        data, self._buffer = self._buffer[:cut], self._buffer[cut:]
        return data


def _archive_manifest(stream: BinaryIO | Iterable[bytes]) -> list[dict[str, Any]]:
    """What the VM's unpacker would answer: each regular file's path, size and sha256."""
    import tarfile

    entries: list[dict[str, Any]] = []
    with tarfile.open(fileobj=_ChunkReader(stream), mode="r|") as archive:  # type: ignore[call-overload]
        for member in archive:
            if not member.isfile():
                continue
            content = archive.extractfile(member)
            digest = hashlib.sha256(content.read() if content else b"").hexdigest()
            entries.append({"path": member.name, "bytes": member.size, "sha256": digest})
    return entries


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
