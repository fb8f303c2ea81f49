"""One exception tree for everything tpulab can report.

    TpuLabError                      .hint says what the user can do about it
    ├── ConfigError                  bad input or missing configuration; nothing was created
    │   ├── UnknownAcceleratorError      not in the catalog (suggests the nearest name)
    │   ├── UnsupportedAcceleratorError  known, but not runnable yet (multi-host)
    │   └── WorkspaceError               the upload or a --fetch pattern is refused
    │                                        (missing, over the cap, secret-looking)
    ├── CloudError                   the Cloud TPU API said no (.status, .api_message)
    │   ├── StockoutError                zone has no capacity (operation code 8, or 9 for
    │   │                                    reserved capacity)
    │   ├── LocationError                403 "Location Z is not found or access is unauthorized"
    │   ├── QuotaError                   429 RESOURCE_EXHAUSTED on a quota
    │   ├── InvalidArgumentError         400 INVALID_ARGUMENT
    │   ├── AlreadyExistsError           409 ALREADY_EXISTS
    │   ├── NotFoundError                404 NOT_FOUND
    │   ├── PermissionDeniedError        403 PERMISSION_DENIED / 401
    │   ├── TransientError               5xx or rate limiting; worth retrying
    │   │   ├── UnreachableError             never sent (refused, DNS): nothing happened
    │   │   └── OutcomeUnknownError          sent, no answer (timeout, reset): may have acted
    │   ├── EndpointDownError            nothing at the endpoint answered this command at
    │   │   │                                all: no wait rides it out (tpulab.polling)
    │   │   ├── EndpointUnreachableError     ... and no try was even sent (also Unreachable)
    │   │   └── EndpointSilentError          ... a try was sent, none answered (also
    │   │                                        OutcomeUnknown)
    │   ├── DeadlineError                an operation or state did not arrive in time
    │   └── PreemptedError               a spot node was preempted under the run
    ├── RemoteError                  talking to the VM over SSH went wrong
    │   ├── ConnectError                 no SSH session could be opened in time
    │   ├── AuthError                    the server refused our per-run key
    │   ├── HostKeyMismatchError         host key differs from the pinned one
    │   ├── CommandFailedError           a remote command exited non-zero
    │   │   ├── TpuBusyError                 another process owns the TPU
    │   │   └── BootstrapError               an extra package (--with) would not install
    │   ├── RemoteTimeoutError           a remote command ran past its timeout
    │   └── NodeVanishedError            the node was deleted under the run (its
    │                                        watchdog, or someone else)
    ├── LocalRunError                the payload run on this machine (verify --local)
    │                                    gave no receipt: did not start, timed out, TPU busy
    ├── VerificationError            the receipt does not prove the run (.failures)
    ├── WorkloadFailedError          the user's `-- CMD` exited non-zero or timed out
    ├── TeardownError                deletion could not be confirmed (.leaked)
    ├── JournalError                 the local run journal is unreadable, or its disk
    │                                    refuses its writes
    ├── ReceiptStoreError            the local receipt store cannot be read or written
    ├── ArtifactWriteError           the fetched artifacts cannot be written into --out
    │                                    here (a full disk)
    └── InterruptedRun               a signal stopped the run (teardown still ran)

Only `tpulab.cli` turns these into exit statuses and text on the terminal; the core raises.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

__all__ = [
    "TARGET_EMULATE",
    "TARGET_GOOGLE",
    "AlreadyExistsError",
    "ArtifactWriteError",
    "AuthError",
    "BootstrapError",
    "CloudError",
    "CommandFailedError",
    "ConfigError",
    "ConnectError",
    "DeadlineError",
    "EndpointDownError",
    "EndpointSilentError",
    "EndpointUnreachableError",
    "HostKeyMismatchError",
    "InterruptedRun",
    "InvalidArgumentError",
    "JournalError",
    "LeakedNode",
    "LocalRunError",
    "LocationError",
    "NodeVanishedError",
    "NotFoundError",
    "OutcomeUnknownError",
    "PermissionDeniedError",
    "PreemptedError",
    "QueueExpiredError",
    "QuotaError",
    "ReceiptStoreError",
    "RemoteError",
    "RemoteTimeoutError",
    "RequirementFailure",
    "StateFileError",
    "StockoutError",
    "TeardownError",
    "TpuBusyError",
    "TpuLabError",
    "TransientError",
    "UnknownAcceleratorError",
    "UnreachableError",
    "UnsupportedAcceleratorError",
    "VerificationError",
    "WorkloadFailedError",
    "WorkspaceError",
    "shown",
    "target_for",
]


class TpuLabError(Exception):
    """Base of every error tpulab reports; `hint` tells the user what to do next."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        # The slice worker it happened on (tpulab.run.workers.name_worker); None when
        # not a slice's, or not known.
        self.worker: int | None = None


def shown(value: str, limit: int = 60) -> str:
    """`value` as error messages quote user input: repr'd, and cut short when long, so
    that a pasted file or a 100 kB flag does not flood the terminal."""
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}... ({len(value)} characters)"


class ConfigError(TpuLabError):
    """Input or configuration is wrong or missing. Raised before any API call."""


class UnknownAcceleratorError(ConfigError):
    def __init__(self, name: str, suggestion: str | None, valid: Sequence[str]) -> None:
        guess = f" Did you mean {suggestion!r}?" if suggestion else ""
        super().__init__(
            f"Unknown accelerator type {shown(name)}.{guess}",
            hint="Valid types: " + ", ".join(valid),
        )
        self.name = name
        self.suggestion = suggestion


class UnsupportedAcceleratorError(ConfigError):
    """A type the catalog knows but `run` cannot drive yet (multi-host slices)."""


class WorkspaceError(ConfigError):
    """The workspace cannot go up as it is, or a `--fetch` pattern is not allowed.

    Raised before any API call, so nothing exists yet."""


class CloudError(TpuLabError):
    """The Cloud TPU API refused or failed a request.

    `status` is the google.rpc status name (e.g. RESOURCE_EXHAUSTED) and `api_message`
    the API's own words, kept verbatim because they are what support will ask for.
    """

    def __init__(
        self,
        message: str,
        *,
        status: str = "UNKNOWN",
        api_message: str = "",
        hint: str | None = None,
    ) -> None:
        super().__init__(message, hint=hint)
        self.status = status
        self.api_message = api_message


class StockoutError(CloudError):
    pass


class QueueExpiredError(StockoutError):
    """A queued resource's --valid-for window passed before capacity came (FAILED): no
    capacity in time, said as such rather than as an ordinary stockout."""


class LocationError(CloudError):
    """The zone does not exist, offers no TPUs, or this project may not use TPUs there."""


class QuotaError(CloudError):
    pass


class InvalidArgumentError(CloudError):
    pass


class AlreadyExistsError(CloudError):
    pass


class NotFoundError(CloudError):
    pass


class PermissionDeniedError(CloudError):
    pass


class TransientError(CloudError):
    pass


class UnreachableError(TransientError):
    """The request never left: connection refused, DNS failure, connect timeout.

    The server cannot have acted on it, so after a CreateNode nothing exists."""


class OutcomeUnknownError(TransientError):
    """The request was sent but no answer came (read timeout, connection reset).

    The server may have acted: after a CreateNode the node may exist."""


class EndpointDownError(CloudError):
    """No request of this command got any answer from the endpoint, for longer than the
    reach budget (tpulab.cloud.reach): it is down or mistyped, or this machine is offline.

    Not a TransientError of its own: every wait stops on it at once (tpulab.polling), and
    later calls of the same command raise it again without waiting. An endpoint that
    answered once is never declared down: losing it later stays a TransientError that
    the waits (and a run's teardown) ride out under their own deadlines."""


class EndpointUnreachableError(EndpointDownError, UnreachableError):
    """No try was even sent (refused, DNS, connect timeout): nothing can have happened."""


class EndpointSilentError(EndpointDownError, OutcomeUnknownError):
    """A try was sent (the endpoint accepted the connection) but none was answered."""


class DeadlineError(CloudError):
    pass


class PreemptedError(CloudError):
    pass


class RemoteError(TpuLabError):
    """Something went wrong on the SSH side."""


class ConnectError(RemoteError):
    pass


class AuthError(RemoteError):
    pass


class HostKeyMismatchError(RemoteError):
    pass


class CommandFailedError(RemoteError):
    def __init__(
        self, message: str, *, exit_status: int, output_tail: str = "", hint: str | None = None
    ) -> None:
        super().__init__(message, hint=hint)
        self.exit_status = exit_status
        self.output_tail = output_tail


class TpuBusyError(CommandFailedError):
    """libtpu reported that another process holds the TPU (a stale run)."""

    # libtpu's words when another process owns the chips (docs/architecture.md §7). Kept with the
    # error so that every place that reads command output (the SSH layer, the receipt
    # judgement, the local run) recognises the same words.
    PATTERN: ClassVar[re.Pattern[str]] = re.compile(
        r"TPU is already in use by process[^\n]*|/dev/vfio/\S*:? Device or resource busy|"
        r"open\(/dev/vfio/\S*\) failed[^\n]*busy",
        re.IGNORECASE,
    )
    HINT: ClassVar[str] = (
        "A stale process from an earlier run owns the TPU. On the VM run "
        "`sudo lsof -w /dev/vfio/*` and kill it, or delete the VM and run again."
    )

    @classmethod
    def evidence_in(cls, *texts: str) -> str | None:
        """libtpu's complaint, quoted from the first of `texts` that contains it."""
        for text in texts:
            found = cls.PATTERN.search(text)
            if found:
                return found.group(0)
        return None


class BootstrapError(CommandFailedError):
    """The venv could not get the user's extra packages (--with, --requirements);
    `packages` names the ones the installer's output blames."""

    def __init__(
        self,
        message: str,
        *,
        packages: Sequence[str],
        exit_status: int,
        output_tail: str = "",
        hint: str | None = None,
    ) -> None:
        super().__init__(message, exit_status=exit_status, output_tail=output_tail, hint=hint)
        self.packages = tuple(packages)


class RemoteTimeoutError(RemoteError):
    pass


class NodeVanishedError(RemoteError):
    """The node disappeared (gone or DELETING) while the run still needed it."""


@dataclass(frozen=True)
class RequirementFailure:
    """One named requirement of a receipt that did not hold."""

    requirement: str
    expected: str
    observed: str

    def __str__(self) -> str:
        return f"{self.requirement}: expected {self.expected}, observed {self.observed}"


class VerificationError(TpuLabError):
    def __init__(
        self, message: str, failures: Sequence[RequirementFailure] = (), *, hint: str | None = None
    ) -> None:
        super().__init__(message, hint=hint)
        self.failures = list(failures)


# Which API a node lives behind, as the journal records it: Google, the embedded emulator
# of `--emulate`, or else the URL of an `--api-endpoint`.
TARGET_GOOGLE = "google"
TARGET_EMULATE = "emulate"


def target_for(api_endpoint: str | None, *, embedded_emulator: bool = False) -> str:
    """The name of the API a node lives behind, as the journal records it."""
    if embedded_emulator:
        return TARGET_EMULATE
    return api_endpoint.rstrip("/") if api_endpoint else TARGET_GOOGLE


@dataclass(frozen=True)
class LeakedNode:
    """A node that may still exist (and bill) after a teardown that was not confirmed.

    The commands it prints work as printed for the API the node lives behind: gcloud for
    Google, gcloud pointed at the endpoint for a served emulator, and tpulab itself for
    the embedded emulator (which lives only inside tpulab processes).
    """

    project: str
    zone: str
    name: str
    target: str = TARGET_GOOGLE
    run_id: str | None = None
    # The QueuedResource holding the node (`run --queued`): deleting it with --force is
    # what deletes both; deleting only the node would leave the queued resource behind.
    queued_resource: str | None = None
    # Which API holds it: "tpu-api" (a node) or "compute" (a VM instance), whose gcloud
    # commands differ; each API is blind to the other's resources.
    provider: str = "tpu-api"

    def manual_delete_command(self) -> str:
        if self.target == TARGET_EMULATE:
            return self.sweep_command() + " --yes"
        if self.provider == "compute":
            return self._compute_delete_command()
        gcloud = (
            f"gcloud compute tpus tpu-vm delete {self.name} "
            f"--project={self.project} --zone={self.zone} --quiet"
        )
        if self.queued_resource:
            gcloud = (
                f"gcloud compute tpus queued-resources delete {self.queued_resource} --force "
                f"--project={self.project} --zone={self.zone} --quiet"
            )
        if self.target == TARGET_GOOGLE:
            return gcloud
        # gcloud against the endpoint, as in docs/guides/emulator.md.
        return (
            f"CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU={self.target.rstrip('/')}/ "
            f"CLOUDSDK_AUTH_DISABLE_CREDENTIALS=true {gcloud}"
        )

    def _compute_delete_command(self) -> str:
        gcloud = (
            f"gcloud compute instances delete {self.name} "
            f"--project={self.project} --zone={self.zone} --quiet"
        )
        if self.target == TARGET_GOOGLE:
            return gcloud
        # Compute's root on an emulator is <endpoint>/compute/v1/ (tpulab.cloud.preflight).
        return (
            f"CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE={self.target.rstrip('/')}/compute/v1/ "
            f"CLOUDSDK_AUTH_DISABLE_CREDENTIALS=true {gcloud}"
        )

    def sweep_command(self) -> str:
        """`tpulab teardown --verify` for this node's API, zone and run."""
        if self.target == TARGET_EMULATE:
            where = "--emulate"
        elif self.target == TARGET_GOOGLE:
            where = ""
        else:
            where = f"--api-endpoint {self.target}"
        parts = ["tpulab teardown --verify", where, f"--project {self.project}"]
        parts.append(f"--zone {self.zone}")
        if self.run_id:
            parts.append(f"--run-id {self.run_id}")
        return " ".join(part for part in parts if part)

    def forget_command(self) -> str | None:
        """`tpulab teardown --forget` for a non-Google endpoint (None for the others): what
        closes the journal row once that endpoint no longer exists."""
        if self.target in (TARGET_GOOGLE, TARGET_EMULATE):
            return None
        parts = [f"tpulab teardown --forget --api-endpoint {self.target}"]
        parts.append(f"--project {self.project}")
        if self.run_id:
            parts.append(f"--run-id {self.run_id}")
        return " ".join(parts)

    def what_to_do(self) -> str:
        """Every way to finish this node's teardown by hand, one per line."""
        delete, sweep = self.manual_delete_command(), self.sweep_command()
        steps = delete if delete.startswith(sweep) else f"{delete}\n  or: {sweep}"
        forget = self.forget_command()
        if forget:
            steps += f"\n  or, if {self.target} is gone for good: {forget}"
        return steps


class TeardownError(TpuLabError):
    """Deletion could not be confirmed: resources may still be billing."""

    def __init__(
        self, message: str, leaked: Sequence[LeakedNode], *, delete_attempts: int = 0
    ) -> None:
        commands = "\n".join(node.what_to_do() for node in leaked)
        super().__init__(message, hint="Delete by hand:\n" + commands if commands else None)
        self.leaked = list(leaked)
        self.delete_attempts = delete_attempts  # DeleteNode requests sent before giving up


class JournalError(TpuLabError):
    pass


class StateFileError(TpuLabError):
    """One of tpulab's own state files (a session's state) is damaged (it was set
    aside, and the other files are unaffected), or could not be written."""


class ReceiptStoreError(TpuLabError):
    """The receipts directory (or one receipt in it) cannot be read or written."""


class ArtifactWriteError(TpuLabError):
    """What the VM sent back cannot be written on this machine (a full disk, a write
    error): this machine's failure, not the VM's or the SSH connection's."""


class LocalRunError(TpuLabError):
    """The verifier payload run on this machine produced no receipt to judge.

    Not a RemoteError: nothing ran on a VM. `exit_status` is the payload's (-1 when it
    never started or was stopped) and `output_tail` the end of its stderr.
    """

    def __init__(
        self, message: str, *, exit_status: int, output_tail: str = "", hint: str | None = None
    ) -> None:
        super().__init__(message, hint=hint)
        self.exit_status = exit_status
        self.output_tail = output_tail


class WorkloadFailedError(TpuLabError):
    """The user's command ran on the verified VM and failed: a non-zero exit or past its
    --timeout. Its artifacts were fetched; `exit_status` is the command's own (None when
    it was killed at the timeout before exiting by itself)."""

    def __init__(
        self,
        message: str,
        *,
        exit_status: int | None,
        timed_out: bool = False,
        output_tail: str = "",
        hint: str | None = None,
    ) -> None:
        super().__init__(message, hint=hint)
        self.exit_status = exit_status
        self.timed_out = timed_out
        self.output_tail = output_tail


class InterruptedRun(TpuLabError):
    """A signal (Ctrl-C, SIGTERM, SIGHUP) ended the run; teardown has already run."""

    def __init__(self, signal_name: str) -> None:
        super().__init__(f"Interrupted by {signal_name}")
        self.signal_name = signal_name
