"""Delete a run's node and prove it is gone: the one teardown `run` and `teardown --verify` share.

Contract of `delete_and_confirm`:

1. Unless the caller only suspects the node exists, GetNode it by name and send DeleteNode
   only if it carries our labels (below). NOT_FOUND means someone already deleted it, which
   is what we wanted. Any error from DeleteNode (503, 504, FAILED_PRECONDITION while the
   node is still CREATING, ...) is recorded and step 3 decides again: only `list` ends it.
2. Wait for the delete operation, but keep part of the deadline for step 3: an operation
   that never finishes must not stop us from looking.
3. `list` the zone until no node of this run remains. A node still DELETING is waited
   for; one that is not (a failed or lost delete) gets DeleteNode again.
4. Only then return a `TeardownReport` with `confirmed=True`. When the create's outcome
   is unknown (its reply was lost), absence counts only after `settle` seconds of empty
   lists, since the API may still be materialising the node; a list that shows the
   run's node or queued resource ends that doubt (the create acted). Past the deadline
   raise `TeardownError`, which names the node and carries the exact gcloud command.

With `queued_resource` (a run that asked for its node through a QueuedResource), step 1
deletes the queued resource with force=true instead (the API then deletes its node), and
step 3 lists queued resources too: confirmation needs neither a node nor a queued
resource of this run left. A node is deleted directly only once its queued resource is
gone (while one is DELETING, deleting its node is the service's job).

A node belongs to the run when it carries `managed-by=tpulab` and this run's `tpulab-run`
label (or, when no run id is known, `managed-by=tpulab` and the given name). A name alone
is never enough: a create that failed with ALREADY_EXISTS names someone else's node.
Nothing else is ever deleted (invariant 4); a node of our name that lacks our labels is
left alone and reported in `TeardownReport.spared`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tpulab.cloud.api import QueuedResourceInfo, TpuApi
from tpulab.errors import (
    CloudError,
    DeadlineError,
    EndpointDownError,
    LeakedNode,
    NotFoundError,
    TeardownError,
    TransientError,
)
from tpulab.models import NodeInfo, NodeState
from tpulab.polling import ActiveWait, Backoff, Tries, announce_wait, poll_until

__all__ = ["TeardownReport", "delete_and_confirm"]


@dataclass
class TeardownReport:
    """How a confirmed teardown went (an unconfirmed one raises TeardownError instead)."""

    project: str
    zone: str
    node_name: str
    run_id: str | None
    confirmed: bool = False
    already_gone: bool = False
    delete_attempts: int = 0
    list_calls: int = 0
    seconds: float = 0.0
    delete_sent_at: float | None = None
    problems: list[str] = field(default_factory=list)
    spared: list[str] = field(default_factory=list)  # named like ours, not our labels


class _Teardown:
    def __init__(
        self,
        api: TpuApi,
        zone: str,
        node_name: str,
        *,
        run_id: str | None,
        known_ours: bool,
        timeout: float,
        poll: float,
        max_poll: float,
        clock: Callable[[], float],
        sleep: Callable[[float], None],
        notify: Callable[[str], None],
        on_delete_sent: Callable[[float], None],
        settle: float = 0.0,
        queued_resource: str | None = None,
    ) -> None:
        self.api = api
        self.queued_resource = queued_resource
        # This run's queued resources still listed (None: the last list failed).
        self.queued_left: list[QueuedResourceInfo] | None = [] if queued_resource is None else None
        self.zone = zone
        self.name = node_name
        self.run_id = run_id
        self.known_ours = known_ours
        self.clock = clock
        self.sleep = sleep
        self.notify = notify
        self.on_delete_sent = on_delete_sent
        self.poll = poll
        self.max_poll = max_poll
        self.started = clock()
        self.deadline = self.started + timeout
        self.settled_at = self.started + min(settle, timeout)
        # Time kept back from waiting on a delete operation for the `list` that proves it.
        self.reserve = min(30.0, timeout * 0.25)
        self.report = TeardownReport(api.project, zone, node_name, run_id)
        self.first_round = True
        self._last_notified = ""
        # What the API itself last said about a failed delete: a later round that only
        # ran out of time must not hide it from the final message.
        self.api_failure: str | None = None
        self.deletes_accepted = 0  # DeleteNode (or queued resource) requests the API took
        # No jitter: one controller's teardown has nobody to fall into step with, and a
        # dry run shows the schedule as it is.
        self.schedule = Backoff(poll, max(poll, max_poll), factor=1.5, jitter=0.0)
        # Named so a dry run shows this loop's cadence (tpulab.polling.active_wait).
        what = "node or queued resource" if queued_resource else "node"
        self.listing = ActiveWait(
            f"no {what} of this run is listed in {zone}", self.schedule, timeout
        )

    def remaining(self) -> float:
        return self.deadline - self.clock()

    def belongs(self, node: NodeInfo | QueuedResourceInfo) -> bool:
        if not node.managed_by_tpulab:
            return False
        if self.run_id is not None:
            return node.run_id == self.run_id
        return node.name in (self.name, self.queued_resource)

    def problem(self, text: str) -> None:
        self.report.problems.append(text)
        # A dead endpoint fails every round the same way: say so once, not 300 times.
        if text != self._last_notified:
            self._last_notified = text
            self.notify(text)

    def delete(self, name: str) -> None:
        """Send one DeleteNode and wait for its operation within the deadline's share."""
        self._delete(name, lambda: self.api.delete_node(self.zone, name), is_node=True)

    def delete_queued(self, name: str) -> None:
        """DeleteQueuedResource with force (its node goes too); wait as `delete` does."""
        self._delete(
            f"queued resource {name}",
            lambda: self.api.delete_queued_resource(self.zone, name, force=True),
            is_node=False,
        )

    def _delete(self, what: str, send: Callable[[], str], *, is_node: bool) -> None:
        """One delete request and its operation; every failure is a `problem` for the
        list below to settle (wait, delete again, or give up at the deadline)."""
        self.report.delete_attempts += 1
        try:
            operation = send()
        except NotFoundError:
            if is_node:
                self.report.already_gone = self.report.delete_attempts == 1
            return
        except EndpointDownError:
            raise  # nothing answers: stop now (run() says what it means)
        except TransientError as error:
            self.problem(f"delete of {what} failed transiently ({error.message}); retrying")
            return
        except CloudError as error:
            # E.g. a 504, or FAILED_PRECONDITION while the node is still CREATING.
            self.problem(f"delete of {what} failed ({error.status}: {error.message}); retrying")
            return
        finally:
            if self.report.delete_sent_at is None:
                self.report.delete_sent_at = self.clock()
                self.on_delete_sent(self.report.delete_sent_at)
        self.deletes_accepted += 1
        wait = self.remaining() - self.reserve
        if wait <= 0:
            return
        try:
            self.api.wait_operation(operation, timeout=wait)
        except DeadlineError:
            self.problem(f"delete operation for {what} did not finish in {wait:.1f} s")
        except EndpointDownError:
            raise  # nothing answers: stop now (run() says what it means)
        except CloudError as error:
            self.api_failure = f"delete operation for {what} failed: {_with_api_words(error)}"
            self.problem(self.api_failure)

    def delete_queued_by_name(self) -> None:
        """Delete the queued resource the run created, once it shows our node's labels."""
        assert self.queued_resource is not None
        try:
            found = self.api.get_queued_resource(self.zone, self.queued_resource)
        except NotFoundError:
            return
        except EndpointDownError:
            raise  # nothing answers: stop now (run() says what it means)
        except CloudError as error:
            self.problem(f"get of queued resource {self.queued_resource} failed ({error.message})")
            return
        if not self.belongs(found):
            self.report.spared.append(found.name)
            self.problem(
                f"queued resource {found.name} exists but its node spec does not carry this "
                "run's tpulab labels; it is someone else's and was not deleted"
            )
            return
        self.delete_queued(found.name)

    def queued_leftovers(self) -> list[QueuedResourceInfo] | None:
        self.report.list_calls += 1
        try:
            listed = self.api.list_queued_resources(self.zone)
        except EndpointDownError:
            raise  # nothing answers: stop now (run() says what it means)
        except CloudError as error:
            self.problem(f"list of queued resources in {self.zone} failed: {error.message}")
            return None
        return [found for found in listed if self.belongs(found)]

    def leftovers(self) -> list[NodeInfo] | None:
        """This run's nodes still listed, or None when the list itself failed."""
        self.report.list_calls += 1
        try:
            return [node for node in self.api.list_nodes(self.zone) if self.belongs(node)]
        except EndpointDownError:
            raise  # nothing answers: stop now (run() says what it means)
        except CloudError as error:
            self.problem(f"list of zone {self.zone} failed: {error.message}")
            return None

    def delete_by_name(self) -> None:
        """Delete the node the caller created, once GetNode shows it carries our labels."""
        try:
            node = self.api.get_node(self.zone, self.name)
        except NotFoundError:
            self.report.already_gone = True
            return
        except EndpointDownError:
            raise  # nothing answers: stop now (run() says what it means)
        except CloudError as error:
            self.problem(f"get of {self.name} failed ({error.message}); looking by list")
            return
        if not self.belongs(node):
            self.report.spared.append(node.name)
            self.problem(
                f"node {node.name} exists but does not carry this run's tpulab labels; "
                "it is someone else's and was not deleted"
            )
            return
        self.delete(node.name)

    def step(self) -> list[NodeInfo] | None:
        """One round: (first time) delete by name, list, delete what is not DELETING."""
        if self.first_round:
            self.first_round = False
            if self.known_ours:
                if self.queued_resource is not None:
                    self.delete_queued_by_name()
                else:
                    self.delete_by_name()
        # Only the list is the poll: a dry run shows its cadence, the deletes as sent once.
        with announce_wait(self.listing):
            if self.queued_resource is not None:
                self.queued_left = self.queued_leftovers()
            nodes = self.leftovers()
        if nodes or self.queued_left:
            # The create's outcome is known once its node (or queued resource) is seen:
            # it acted, and one create makes one resource, so nothing of it can appear
            # after this one is gone. A Ctrl-C between a queued create's request and its
            # reply waited the whole settle (30 s) for a resource already deleted.
            self.settled_at = min(self.settled_at, self.clock())
        if self.clock() >= self.deadline:
            return nodes
        for found in self.queued_left or ():
            if found.state != "DELETING":
                self.delete_queued(found.name)
        if nodes and self.queued_left == []:
            for node in nodes:
                if node.state != NodeState.DELETING:
                    self.delete(node.name)
        return nodes

    def confirmed(self, nodes: list[NodeInfo] | None) -> bool:
        # An empty list before `settled_at` is too early to believe (the create's outcome
        # is unknown): look again before confirming.
        return nodes == [] and self.queued_left == [] and self.clock() >= self.settled_at

    def run(self) -> TeardownReport:
        def gone_too_late(tries: Tries[list[NodeInfo] | None]) -> Exception:
            return self.failure(tries.last)

        # Every round, its DeleteNode waits and the API's own retries run inside this one
        # deadline (tpulab.polling nests them), so nothing outlives `timeout`.
        try:
            poll_until(
                self.step,
                self.confirmed,
                timeout=max(0.0, self.deadline - self.clock()),
                clock=self.clock,
                sleep=self.sleep,
                backoff=self.schedule,
                expired=gone_too_late,
                announce=False,
            )
        except EndpointDownError as error:
            # Only an endpoint that never answered this command is declared down (one that
            # answered and then went away is waited for until the deadline): waiting on
            # cannot help, so say at once what may remain and how to finish.
            raise self.unreachable(error) from None
        self.report.confirmed = True
        self.report.seconds = self.clock() - self.started
        return self.report

    def unreachable(self, error: EndpointDownError) -> TeardownError:
        deleted = (
            "a delete was sent but could not be confirmed"
            if self.deletes_accepted
            else "nothing was deleted"
        )
        return TeardownError(
            f"Teardown NOT confirmed: {error.message} So {deleted}: node {self.name} "
            f"(project {self.api.project}, zone {self.zone}) may exist and still be "
            f"billing. {error.hint}",
            [LeakedNode(self.api.project, self.zone, self.name, provider=self.api.provider)],
            delete_attempts=self.report.delete_attempts,
        )

    def failure(self, nodes: list[NodeInfo] | None) -> TeardownError:
        names = [node.name for node in nodes] if nodes else [self.name]
        states = ", ".join(f"{node.name} is {node.state.value}" for node in nodes or ())
        if self.queued_left:
            states = ", ".join(
                [f"queued resource {q.name} is {q.state}" for q in self.queued_left]
                + ([states] if states else [])
            )
        last = self.report.problems[-1] if self.report.problems else "no further detail"
        if self.api_failure is not None and self.api_failure != last:
            last += f"; before that, {self.api_failure}"
        seen = states or "the zone could not be listed"
        message = (
            f"Teardown NOT confirmed after {self.clock() - self.started:.0f} s: {seen} "
            f"(project {self.api.project}, zone {self.zone}; last problem: {last}). "
            "Resources may still be billing."
        )
        return TeardownError(
            message,
            [
                LeakedNode(self.api.project, self.zone, name, provider=self.api.provider)
                for name in names
            ],
            delete_attempts=self.report.delete_attempts,
        )


def _with_api_words(error: CloudError) -> str:
    """The error's message, plus the API's own words when the message does not quote
    them: a failed operation is the API's report, and support asks for its words."""
    words = error.api_message.strip()
    if not words or words.rstrip(".") in error.message:
        return error.message
    return f"{error.message} (the API said: {words})"


def delete_and_confirm(
    api: TpuApi,
    zone: str,
    node_name: str,
    *,
    run_id: str | None,
    known_ours: bool = True,
    timeout: float = 600.0,
    poll: float = 2.0,
    max_poll: float = 10.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    notify: Callable[[str], None] | None = None,
    on_delete_sent: Callable[[float], None] | None = None,
    settle: float = 0.0,
    queued_resource: str | None = None,
) -> TeardownReport:
    """Delete `node_name` (or whatever carries this run's label) and confirm with `list`.

    `known_ours=False` is for a create whose outcome is unknown: nothing is looked up by
    name, only nodes found by `list` carrying `run_id`'s label. With `known_ours` the node
    is fetched by name first, and still deleted only if it carries our labels. `notify`
    hears about retries; `on_delete_sent` gets the monotonic time the first DeleteNode
    went out. `settle` (for a create whose outcome is unknown) is how long the lists must
    stay empty before absence counts as confirmed. `queued_resource` names the run's
    QueuedResource: it is deleted with force and must be gone too (module doc).
    Raises TeardownError (never returns unconfirmed) when the deadline passes.
    """
    if not known_ours and run_id is None:
        raise ValueError("without known_ours a run_id is needed to recognise the node")
    return _Teardown(
        api,
        zone,
        node_name,
        run_id=run_id,
        known_ours=known_ours,
        timeout=timeout,
        poll=poll,
        max_poll=max_poll,
        clock=clock,
        sleep=sleep,
        notify=notify or (lambda _message: None),
        on_delete_sent=on_delete_sent or (lambda _at: None),
        settle=settle,
        queued_resource=queued_resource,
    ).run()
