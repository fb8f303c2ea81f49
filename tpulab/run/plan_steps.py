"""What a dry run's plan is made of: its steps, the stand-ins for what only a real run
has, and `StepSink`, what the recording seams (tpulab.run.recording and the modules it
composes: recording_transport, recording_ssh) write their steps to."""

from __future__ import annotations

import base64
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict

from tpulab.config import RunSpec
from tpulab.models import DEFER_BUILD

__all__ = [
    "PLACEHOLDERS",
    "PLACEHOLDER_NONCE",
    "Kind",
    "PlanEnds",
    "PlanStep",
    "PollCadence",
    "StepSink",
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
    model_config = ConfigDict(defer_build=DEFER_BUILD, extra="forbid", frozen=True)


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


class StepSink(Protocol):
    """What a recording seam needs of the plan it records into (`PlanRecorder`)."""

    spec: RunSpec

    def add(self, kind: Kind, action: str, *, phase: str | None = None, **fields: Any) -> None: ...

    def local(self, action: str, *, phase: str | None = None) -> None: ...

    def clock(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...
