"""The provisioning phases: create the node (directly or through a queued resource), wait
for READY, pin its host key. Each is a function of the run's context (tpulab.run.context)
and returns the line the progress display shows.

`create` marks the create sent just before the request leaves and accepted once the API
took it (`RunContext.create_is_sent`, `create_is_accepted`): the teardown
(tpulab.run.ending) reads them to decide what may exist.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from tpulab.cloud import tpu_v2
from tpulab.contract import EMULATOR_COORDINATOR_PORT_ATTRIBUTE, EMULATOR_SSH_USER_ATTRIBUTE
from tpulab.errors import (
    AlreadyExistsError,
    CloudError,
    InvalidArgumentError,
    LocationError,
    NotFoundError,
    OutcomeUnknownError,
    PermissionDeniedError,
    QuotaError,
    RemoteError,
    TpuLabError,
    TransientError,
    UnreachableError,
)
from tpulab.models import NodeInfo, NodeRequest, NodeState
from tpulab.polling import Backoff, retry_call
from tpulab.run.progress import Phase
from tpulab.run.workers import Worker, fan_out

if TYPE_CHECKING:
    from tpulab.remote.keys import HostKey
    from tpulab.run.context import RunContext

__all__ = ["create", "node_request", "pin_host_key", "wait_ready"]

# Sync refusals: the API said no before creating anything, so there is nothing to delete.
_REFUSED = (
    LocationError,
    QuotaError,
    InvalidArgumentError,
    AlreadyExistsError,
    PermissionDeniedError,
    NotFoundError,
)


def node_request(ctx: RunContext) -> NodeRequest:
    """The node this run asks for: its labels, its per-run SSH key, the watchdog."""
    assert ctx.key is not None
    script = None
    if ctx.watchdog is not None:  # the startup-script that arms the VM's watchdog at boot
        from tpulab.remote.watchdog import startup_script

        script = startup_script(ctx.watchdog)
    return tpu_v2.node_request(
        ctx.spec, ssh_keys=ctx.key.metadata_entry(ctx.spec.ssh_user), startup_script=script
    )


def create(ctx: RunContext) -> str:
    """Ask the project's preflight (a definite problem refuses the run, nothing created),
    journal the run, send CreateNode with labels + ssh key, wait for the operation."""
    if ctx.preflight is not None:
        _preflight(ctx)
    if ctx.journal is not None:
        ctx.journal.run_started(ctx.spec)
        ctx.journalled = True
        ctx.journal_phase(Phase.CREATE)
    request = node_request(ctx)
    if ctx.spec.queued:
        return _create_through_queue(ctx, request)
    return _CreateNode(ctx, request).send()


def _preflight(ctx: RunContext) -> None:
    """The project's cheap checks; a definite problem refuses the run (ConfigError,
    nothing created). Project APIs that cannot be reached decide nothing: the create
    then meets the same endpoint and says what it found, as it always has ("never
    sent", or a create sent and never answered)."""
    from tpulab.cloud.preflight import refuse_on_problems

    assert ctx.preflight is not None
    try:
        checks = ctx.preflight()
    except UnreachableError as error:
        ctx.observer.note(f"the project's preflight could not be asked ({error.message})")
        return
    refuse_on_problems(checks)


class _CreateNode:
    """One CreateNode, resent only after an answered refusal that proves nothing exists."""

    def __init__(self, ctx: RunContext, request: NodeRequest) -> None:
        self.ctx = ctx
        self.request = request
        self.attempts = 0
        self.seen_before_resend = ""

    def send(self) -> str:
        ctx = self.ctx
        name = ctx.spec.node_name
        deadline = ctx.clock() + ctx.spec.timeouts.create
        ctx.create_is_sent()
        try:
            operation = retry_call(
                self._once,
                retry_if=self._refused_and_absent,
                timeout=ctx.spec.timeouts.create,
                clock=ctx.clock,
                sleep=ctx.sleep,
                backoff=ctx.poll if ctx.poll is not None else Backoff(1.0, 10.0),
                on_retry=self._on_retry,
            )
        except (*_REFUSED, UnreachableError):
            # Refused synchronously, or never sent (connection refused, DNS): every
            # earlier attempt was proven absent before resending, so nothing exists.
            ctx.create_is_sent(False)
            raise
        ctx.create_is_accepted()
        if operation is None:
            ctx.observer.note(f"node {name} was created by an earlier attempt; using it")
            return f"node {name} (adopted after a refused create)"
        try:
            ctx.api.wait_operation(operation, timeout=max(0.0, deadline - ctx.clock()))
        except AlreadyExistsError:
            # The name belongs to a node someone else created: it is not ours, so the
            # teardown must only confirm that nothing with this run's label exists.
            ctx.create_is_accepted(False)
            raise
        return f"node {name}" + (" (spot)" if ctx.spec.spot else "")

    def _once(self) -> str | None:
        """One CreateNode; None when an earlier attempt's node turns out to exist."""
        self.attempts += 1
        ctx = self.ctx
        try:
            return ctx.api.create_node(ctx.spec.zone.value, ctx.spec.node_name, self.request)
        except AlreadyExistsError as taken:
            if self.attempts == 1:
                raise
            # A resend after a refusal meets the node an earlier attempt created after
            # all (the API acted, then failed to answer): ours by run label.
            try:
                node = named_like_ours(ctx)
            except CloudError as check:
                # Ours or not, something exists: never report "nothing created".
                raise OutcomeUnknownError(
                    f"{taken.message} Whether the node is this run's could not be "
                    f"checked ({check.message}).",
                    status=taken.status,
                    api_message=taken.api_message,
                ) from None
            if _is_ours(ctx, node):
                return None
            raise

    def _refused_and_absent(self, error: Exception) -> bool:
        # Resend only an ANSWERED refusal (503, rate-limit 429): never a request whose
        # fate is unknown (timeout, reset) -- and only once GetNode proves no node of this
        # name exists, or that it is this run's (the resend then hears 409 and adopts
        # it). The name is ours to choose, so a resend cannot make a second node; the
        # check is what keeps us from mistaking someone else's for ours.
        if not isinstance(error, TransientError) or isinstance(
            error, UnreachableError | OutcomeUnknownError
        ):
            return False
        try:
            node = named_like_ours(self.ctx)
        except CloudError:
            return False  # cannot prove anything: leave it to the full teardown
        if node is None:
            self.seen_before_resend = "no such node exists"
            return True
        if _is_ours(self.ctx, node):
            self.seen_before_resend = "this run's node exists after all"
            return True
        return False  # a stranger's node has the name: resending cannot help

    def _on_retry(self, error: Exception, delay: float) -> None:
        message = error.message if isinstance(error, TpuLabError) else str(error)
        self.ctx.observer.note(
            f"create of {self.ctx.spec.node_name} refused ({message}); "
            f"{self.seen_before_resend}, sending it again in {delay:.1f} s"
        )


def _create_through_queue(ctx: RunContext, request: NodeRequest) -> str:
    """--queued: the same node request, through a QueuedResource (run/queued.py)."""
    from tpulab.run.queued import create_through_queue

    return create_through_queue(
        ctx.api,
        ctx.spec,
        request,
        on_sent=ctx.create_is_sent,
        on_refused=lambda: ctx.create_is_sent(False),
        on_accepted=ctx.create_is_accepted,
        note=ctx.observer.note,
        poll=ctx.poll,
        clock=ctx.clock,
        sleep=ctx.sleep,
    )


def named_like_ours(ctx: RunContext) -> NodeInfo | None:
    """GetNode by this run's node name; None on NOT_FOUND."""
    try:
        return ctx.api.get_node(ctx.spec.zone.value, ctx.spec.node_name)
    except NotFoundError:
        return None


def _is_ours(ctx: RunContext, node: NodeInfo | None) -> bool:
    return node is not None and node.managed_by_tpulab and node.run_id == ctx.spec.run_id


def wait_ready(ctx: RunContext) -> str:
    """Poll the node until READY; PreemptedError if a spot node is reclaimed."""
    from tpulab.cloud.polling import wait_for_state

    node = wait_for_state(
        ctx.api,
        ctx.spec.zone.value,
        ctx.spec.node_name,
        {NodeState.READY},
        timeout=ctx.spec.timeouts.ready,
        poll=ctx.poll,
        clock=ctx.clock,
        sleep=ctx.sleep,
    )
    ctx.milestone("ready_seen")
    ctx.node = node
    _check_reachable(ctx, node)
    return f"READY at {node.external_ip or node.ip_address or 'no address'}"


def pin_host_key(ctx: RunContext) -> str:
    """Wait for each worker's host key guest attribute and pin it (every worker VM's
    guest agent publishes its own); nothing is sent over SSH."""
    from tpulab.cloud.polling import operation_schedule
    from tpulab.remote.keys import SshTarget, ssh_port_from, wait_for_host_key

    spec = ctx.spec
    hosts = spec.accelerator.hosts
    published: list[dict[str, str]] = [{} for _ in range(hosts)]

    def wait(worker: int) -> HostKey:
        seen = published[worker]

        def fetch() -> dict[str, str]:
            seen.clear()
            seen.update(ctx.api.guest_attributes(spec.zone.value, spec.node_name, worker=worker))
            return dict(seen)

        return wait_for_host_key(
            fetch,
            timeout=spec.timeouts.host_key,
            sleep=ctx.sleep,
            clock=ctx.clock,
            # A local emulator's host publishes its key within milliseconds of READY:
            # look again at the quick local cadence, not the cloud's first half second
            # (which was most of an emulated run's controller overhead when it missed).
            backoff=operation_schedule(local=True) if spec.emulated else None,
        )

    # Each worker's wait is its own (the fan-out runs them at once); worker 0's alone
    # is what a single host has always done.
    keys = fan_out(
        range(hosts), wait, what="host key", clock=ctx.clock, max_parallel=ctx.parallel_workers
    ).results
    # The address may be assigned after READY (the emulator does so once the node's SSH
    # host runs); ask again now that the guest agents are up.
    node = ctx.node = ctx.api.get_node(spec.zone.value, spec.node_name)
    addresses = _worker_addresses(ctx, node, hosts)
    workers: list[Worker] = []
    for index, (host_key, address) in enumerate(zip(keys, addresses, strict=True)):
        seen = published[index]
        user = spec.ssh_user
        if spec.emulated:
            # An emulated OpenSSH host can only log in an existing account; it says which.
            # Honoured for emulated runs only: a real VM's attributes never pick the user.
            user = seen.get(EMULATOR_SSH_USER_ATTRIBUTE) or user
        workers.append(Worker(index, SshTarget(address, ssh_port_from(seen), user, host_key)))
    ctx.workers = workers
    if hosts > 1:
        ctx.coordinator = _coordinator(ctx, node, published[0])
    first = workers[0].target
    pinned = f"{first.host_key.key_type} pinned for {first.host}:{first.port}"
    return pinned if hosts == 1 else f"{hosts} workers' host keys pinned; worker 0's {pinned}"


def _coordinator(ctx: RunContext, node: NodeInfo, worker0: Mapping[str, str]) -> str:
    """Where a slice's JAX processes meet: worker 0's internal address (the workers
    reach each other inside the VPC, not through external IPs) at COORDINATOR_PORT;
    an emulated slice's workers share one machine, so its emulator publishes a free
    port instead (honoured for emulated runs only, as the SSH port is)."""
    from tpulab.remote.payload import COORDINATOR_PORT

    port = COORDINATOR_PORT
    published = worker0.get(EMULATOR_COORDINATOR_PORT_ATTRIBUTE)
    if ctx.spec.emulated and published is not None and published.isdecimal():
        port = int(published)
    address = node.workers[0].ip_address if node.workers else node.ip_address
    if not address:
        raise RemoteError(
            f"Node {node.name} reports no internal address for worker 0, where the slice's "
            "JAX processes must meet.",
            hint="The slice is not fully up; check it with `tpulab list`, and retry the run.",
        )
    return f"{address}:{port}"


def _worker_addresses(ctx: RunContext, node: NodeInfo, hosts: int) -> list[str]:
    """Each worker's address (Node.networkEndpoints[i] is worker i); RemoteError when the
    node reports fewer workers than its type has, which no SSH timeout should discover."""
    if hosts == 1:
        return [_check_reachable(ctx, node)]
    if len(node.workers) < hosts:
        raise RemoteError(
            f"Node {node.name} ({node.accelerator_type}) reports {len(node.workers)} network "
            f"endpoint(s), but a {ctx.spec.accelerator.name} has {hosts} workers.",
            hint="The slice is not fully up; check it with `tpulab list`, and retry the run.",
        )
    return [
        _check_reachable(ctx, node.model_copy(update=worker.model_dump()), worker=index)
        for index, worker in enumerate(node.workers[:hosts])
    ]


def _check_reachable(ctx: RunContext, node: NodeInfo, worker: int | None = None) -> str:
    """The address SSH will use; RemoteError at once (not after the SSH timeouts) when the
    node has none this machine can reach. `worker` names a slice's worker in errors."""
    whose = node.name if worker is None else f"{node.name} (worker {worker})"
    if ctx.spec.internal_ip:
        if node.ip_address:
            return node.ip_address
        raise RemoteError(
            f"Node {whose} reports no internal IP address.",
            hint="Check the node's network in the console; retry the run.",
        )
    if node.external_ip:
        return node.external_ip
    raise RemoteError(
        f"Node {whose} has no external IP, so this machine cannot reach it over SSH"
        + (f" (its internal address is {node.ip_address})." if node.ip_address else "."),
        hint="An organisation policy (constraints/compute.vmExternalIpAccess) or the "
        "network may forbid external IPs. Run from inside the VM's VPC with "
        "--internal-ip, or ask an admin to allow external IPs for TPU VMs.",
    )
