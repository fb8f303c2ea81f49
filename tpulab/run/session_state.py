"""What a kept session is (`tpulab up`): `SessionState`, the session.json every later
command reads to reach the node again.

It holds the name, run id, node, zone, project, API endpoint and provider (a Cloud TPU
API node, or a Compute Engine instance: docs/reference/providers.md), SSH
user/address/port, the pinned host key, the watchdog's config (to renew its lease), the
hard deadline and the idle expiry (wall clock, UTC epoch seconds). A multi-host slice's
other workers (`WorkerAddress`: each its own address, port and pinned host key) and
where its JAX processes meet are kept too: every worker's watchdog reads its own lease,
so every command that renews the lease must reach them all (`worker_targets`). The
private key is not in it: the store keeps that in a 0600 file beside it
(tpulab.cleanup.sessions). How a session is brought up and taken down is
tpulab.run.session.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from tpulab.catalog import Provider, vm_kind
from tpulab.remote.watchdog import WatchdogConfig

if TYPE_CHECKING:
    from tpulab.remote.keys import SshTarget

__all__ = ["SessionState", "WorkerAddress"]


@dataclass(frozen=True)
class WorkerAddress:
    """Where one of a slice's other workers listens, and the host key `up` pinned for it
    (each worker VM has its own)."""

    host: str
    port: int
    host_key_type: str
    host_key_b64: str

    @classmethod
    def of(cls, target: SshTarget) -> WorkerAddress:
        return cls(target.host, target.port, target.host_key.key_type, target.host_key.b64)


@dataclass(frozen=True)
class SessionState:
    name: str
    run_id: str
    node_name: str
    zone: str
    project: str
    api_endpoint: str | None  # None: Google's default endpoint
    accelerator_type: str
    spot: bool
    ssh_user: str
    ssh_host: str
    ssh_port: int
    host_key_type: str
    host_key_b64: str
    watchdog: dict[str, Any]  # WatchdogConfig's fields
    started_at: float  # wall clock (epoch seconds) when the create was sent, roughly
    deadline_at: float  # the watchdog's hard deadline (--ttl), epoch seconds
    idle_seconds: float  # the lease (--idle)
    renewed_at: float  # the last lease renewal, epoch seconds
    # The id of the receipt `up` verified on this node: the gate every `exec` passes
    # (DESIGN §3.9). A default, so a session.json written before it existed still loads.
    receipt_id: str | None = None
    # A slice's workers 1..N-1, in worker order (worker 0 is ssh_host, ssh_port and the
    # host_key_* fields above, as for a single host); empty for a single host, and in a
    # session.json written before slices had sessions (which then loads as one worker).
    other_workers: tuple[WorkerAddress, ...] = ()
    # A slice's "address:port" where its JAX processes meet (worker 0's internal
    # address): what `exec` passes as JAX_COORDINATOR_ADDRESS. None for a single host.
    coordinator: str | None = None
    # Which API the node lives behind: "tpu-api" (a TPU node) or "compute" (a Compute
    # Engine instance); every later command rebuilds that API to find, follow and delete
    # it. A session.json written before Compute had sessions loads as "tpu-api". No image
    # is kept: only a create sends one, and a session's node exists already.
    provider: Provider = "tpu-api"

    @property
    def vm_kind(self) -> str:
        """What its provider calls the VM, for what the user reads: "node" (Cloud TPU
        API) or "instance" (Compute Engine), as gcloud names them."""
        return vm_kind(self.provider)

    @property
    def idle_expires_at(self) -> float:
        return self.renewed_at + self.idle_seconds

    @property
    def worker_count(self) -> int:
        return 1 + len(self.other_workers)

    def watchdog_config(self) -> WatchdogConfig:
        return WatchdogConfig(**self.watchdog)

    def ssh_target(self) -> SshTarget:
        """Where its node listens, with the host key `up` pinned."""
        from tpulab.remote.keys import HostKey, SshTarget

        host_key = HostKey(self.host_key_type, self.host_key_b64)
        return SshTarget(self.ssh_host, self.ssh_port, self.ssh_user, host_key)

    def worker_targets(self) -> list[SshTarget]:
        """Every worker's target, worker 0 first (one for a single host)."""
        from tpulab.remote.keys import HostKey, SshTarget

        others = [
            SshTarget(w.host, w.port, self.ssh_user, HostKey(w.host_key_type, w.host_key_b64))
            for w in self.other_workers
        ]
        return [self.ssh_target(), *others]

    def check_worker(self, worker: int) -> None:
        """ConfigError (exit 2) for a worker the node has not, before anything is sent."""
        from tpulab.errors import ConfigError

        count = self.worker_count
        if 0 <= worker < count:
            return
        have = "one worker (0)" if count == 1 else f"{count} workers (0-{count - 1})"
        raise ConfigError(
            f"Session {self.name}'s node ({self.accelerator_type}) has {have}: "
            f"there is no worker {worker}.",
            hint=f"Pass --worker between 0 and {count - 1}.",
        )

    def worker_target(self, worker: int) -> SshTarget:
        """Worker `worker`'s target (`check_worker` first)."""
        self.check_worker(worker)
        return self.worker_targets()[worker]

    def renewed(self, at: float) -> SessionState:
        return replace(self, renewed_at=at)

    def moved_to(self, addresses: Sequence[tuple[str, int]]) -> SessionState:
        """The session with its workers at `addresses` (host, port; worker 0 first, one
        per worker); their pinned host keys stay as they are."""
        (host, port), others = addresses[0], addresses[1:]
        moved = tuple(
            replace(worker, host=address[0], port=address[1])
            for worker, address in zip(self.other_workers, others, strict=True)
        )
        return replace(self, ssh_host=host, ssh_port=port, other_workers=moved)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> SessionState:
        """Parse a session.json strictly (types included: a port of "22" or a missing
        deadline would fail later, in the middle of a command); ValueError saying what
        is wrong, in a few words."""
        from pydantic import TypeAdapter, ValidationError

        if not text.strip():
            raise ValueError("the file is empty")
        try:
            return TypeAdapter(cls).validate_json(text, strict=True)
        except ValidationError as error:
            raise ValueError(_what_is_wrong(error)) from None


def _what_is_wrong(error: Any) -> str:
    """A pydantic ValidationError in one short phrase (a dozen missing fields would
    otherwise fill the screen)."""
    problems: list[dict[str, Any]] = list(error.errors())
    missing = [".".join(map(str, p["loc"])) for p in problems if p["type"] == "missing"]
    if missing and len(missing) == len(problems):
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        return f"fields missing: {', '.join(missing[:3])}{more}"
    first = problems[0]
    where = ".".join(map(str, first["loc"]))
    said = f"{where}: {first['msg']}" if where else str(first["msg"])
    if first["type"] == "dataclass_type":
        said = "not a JSON object"
    return said + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")
