"""`teardown.delete_and_confirm` against the emulator: what counts as gone, what is never
touched, and how errors on the way are ridden out."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest
from delegating_api import DelegatingTpuApi

from tpulab.errors import CloudError, DeadlineError, InvalidArgumentError, TeardownError
from tpulab.models import NodeState
from tpulab.run.teardown import TeardownReport, delete_and_confirm

if TYPE_CHECKING:
    from tpulab.cloud.google import GoogleTpuApi
    from tpulab.emulator import Emulator

pytest_plugins = ["emulator_fixtures"]
ZONE = "us-central1-a"


def create(api: GoogleTpuApi, name: str, run_id: str | None) -> None:
    from emulator_fixtures import node_request

    api.wait_operation(api.create_node(ZONE, name, node_request(run_id=run_id)), timeout=10)


class RefusingDeletes(DelegatingTpuApi):
    """The real client for everything; DeleteNode answers with `errors` first, in order
    (the last one for ever if `forever`), as Google does with a 504 or FAILED_PRECONDITION."""

    def __init__(self, api: GoogleTpuApi, errors: list[CloudError], forever: bool = False) -> None:
        super().__init__(api)
        self.errors = errors
        self.forever = forever
        self.refused = 0

    def delete_node(self, zone: str, node_id: str) -> str:
        if self.errors:
            self.refused += 1
            raise self.errors[0] if self.forever else self.errors.pop(0)
        return super().delete_node(zone, node_id)


def test_deletes_only_this_runs_node(emulator: Emulator, tpu_api: GoogleTpuApi) -> None:
    create(tpu_api, "ours", "run-a")
    create(tpu_api, "other-run", "run-b")
    create(tpu_api, "users-own", None)
    report = delete_and_confirm(tpu_api, ZONE, "ours", run_id="run-a", timeout=10, poll=0.02)
    assert report.confirmed
    assert report.delete_attempts == 1
    assert report.delete_sent_at is not None
    assert sorted(emulator.node_names()) == ["other-run", "users-own"]


def test_not_found_counts_as_deleted(emulator: Emulator, tpu_api: GoogleTpuApi) -> None:
    report = delete_and_confirm(tpu_api, ZONE, "never-was", run_id="run-x", timeout=5, poll=0.02)
    assert report.confirmed
    assert report.already_gone
    assert emulator.calls["get_node"] == 1
    assert emulator.calls["delete_node"] == 0  # nothing to delete: GetNode said NOT_FOUND


def test_unknown_create_outcome_deletes_by_label_only(
    emulator: Emulator, tpu_api: GoogleTpuApi
) -> None:
    # A node with our would-be name but not our label belongs to someone else.
    create(tpu_api, "same-name", None)
    create(tpu_api, "labelled", "run-c")
    delete_and_confirm(
        tpu_api, ZONE, "same-name", run_id="run-c", known_ours=False, timeout=10, poll=0.02
    )
    assert emulator.node_names() == ["same-name"]
    with pytest.raises(ValueError, match="run_id"):
        delete_and_confirm(tpu_api, ZONE, "x", run_id=None, known_ours=False)


def test_transient_list_and_delete_errors_are_ridden_out(
    emulator: Emulator, tpu_api: GoogleTpuApi
) -> None:
    create(tpu_api, "flaky", "run-d")
    # The client rides out the ListNodes storm itself; DeleteNode it never resends, so
    # the teardown loop must go on.
    emulator.faults.transient = {"delete_node": 2, "list_nodes": 12}
    notes: list[str] = []
    report = delete_and_confirm(
        tpu_api, ZONE, "flaky", run_id="run-d", timeout=20, poll=0.02, notify=notes.append
    )
    assert report.confirmed
    assert report.delete_attempts >= 3
    assert notes
    assert emulator.node_names() == []


def test_a_node_already_deleting_is_waited_for_not_deleted_again(
    emulator: Emulator, tpu_api: GoogleTpuApi
) -> None:
    create(tpu_api, "slow-delete", "run-e")
    # The delete hangs until the teardown has seen the node DELETING and sleeps: a timed
    # delete could end before a loaded machine's next request and there be nothing to see.
    emulator.faults.delete_hangs = True
    tpu_api.delete_node(ZONE, "slow-delete")  # e.g. an earlier, interrupted teardown
    assert tpu_api.get_node(ZONE, "slow-delete").state is NodeState.DELETING

    def let_the_delete_finish(seconds: float) -> None:
        emulator.faults.delete_hangs = False
        time.sleep(seconds)

    report = delete_and_confirm(
        tpu_api, ZONE, "slow-delete", run_id="run-e", known_ours=False, timeout=10, poll=0.05,
        sleep=let_the_delete_finish,
    )  # fmt: skip
    assert report.confirmed
    assert report.list_calls >= 2
    assert report.delete_attempts == 0
    assert emulator.calls["delete_node"] == 1
    assert emulator.node_names() == []


def test_deadline_raises_with_every_leaked_node(emulator: Emulator, tpu_api: GoogleTpuApi) -> None:
    create(tpu_api, "stuck", "run-f")
    emulator.faults.delete_hangs = True
    with pytest.raises(TeardownError) as caught:
        delete_and_confirm(tpu_api, ZONE, "stuck", run_id="run-f", timeout=0.6, poll=0.05)
    error = caught.value
    assert "stuck is DELETING" in error.message
    assert [node.name for node in error.leaked] == ["stuck"]
    assert error.hint is not None
    assert "gcloud compute tpus tpu-vm delete stuck" in error.hint


@pytest.mark.parametrize(
    "refusal",
    [
        DeadlineError("Deadline exceeded", status="DEADLINE_EXCEEDED"),
        InvalidArgumentError("node is still being created", status="FAILED_PRECONDITION"),
    ],
    ids=["504", "failed-precondition"],
)
def test_a_refused_delete_is_retried_until_list_confirms(
    emulator: Emulator, tpu_api: GoogleTpuApi, refusal: CloudError
) -> None:
    create(tpu_api, "refused-once", "run-g")
    api = RefusingDeletes(tpu_api, [refusal])
    notes: list[str] = []
    report = delete_and_confirm(
        api, ZONE, "refused-once", run_id="run-g", timeout=10, poll=0.02, notify=notes.append
    )
    assert report.confirmed
    assert api.refused == 1
    assert report.delete_attempts == 2
    assert emulator.calls["delete_node"] == 1  # the retry, which the emulator saw
    assert any(refusal.status in note for note in notes)
    assert emulator.node_names() == []


def test_a_delete_refused_for_ever_ends_in_a_teardown_error_naming_the_node(
    emulator: Emulator, tpu_api: GoogleTpuApi
) -> None:
    create(tpu_api, "refused", "run-i")
    api = RefusingDeletes(
        tpu_api, [InvalidArgumentError("precondition", status="FAILED_PRECONDITION")], True
    )
    with pytest.raises(TeardownError) as caught:
        delete_and_confirm(api, ZONE, "refused", run_id="run-i", timeout=0.6, poll=0.05)
    assert api.refused >= 2  # kept trying until the deadline
    assert [node.name for node in caught.value.leaked] == ["refused"]
    assert "FAILED_PRECONDITION" in caught.value.message
    assert caught.value.hint is not None
    assert "gcloud compute tpus tpu-vm delete refused" in caught.value.hint
    assert emulator.node_names() == ["refused"]


@pytest.mark.parametrize("run_id", ["run-h", None], ids=["run-id", "no-run-id"])
def test_a_strangers_node_with_our_name_is_never_deleted(
    emulator: Emulator, tpu_api: GoogleTpuApi, run_id: str | None
) -> None:
    # Our create failed with ALREADY_EXISTS: the name is taken by someone else's node.
    create(tpu_api, "taken", None)
    notes: list[str] = []
    report = delete_and_confirm(
        tpu_api, ZONE, "taken", run_id=run_id, known_ours=True, timeout=5, poll=0.02,
        notify=notes.append,
    )  # fmt: skip
    assert emulator.node_names() == ["taken"]
    assert tpu_api.get_node(ZONE, "taken").state is NodeState.READY
    assert emulator.calls["delete_node"] == 0
    assert report.delete_attempts == 0
    assert not report.already_gone
    assert report.spared == ["taken"]
    assert any("taken" in note and "not deleted" in note for note in notes)


def test_another_runs_node_with_our_name_is_never_deleted(
    emulator: Emulator, tpu_api: GoogleTpuApi
) -> None:
    create(tpu_api, "tpulab-x", "run-z")  # tpulab's labels, but another run's
    report = delete_and_confirm(
        tpu_api, ZONE, "tpulab-x", run_id="run-y", known_ours=True, timeout=5, poll=0.02
    )
    assert emulator.node_names() == ["tpulab-x"]
    assert report.spared == ["tpulab-x"]


def test_a_dead_endpoint_is_reported_once_not_every_round(emulator: Emulator) -> None:
    # Issue 10 #3: a teardown against an endpoint where nothing listens printed ~300
    # "list of zone failed" lines. One that answered before (a run's, whose node was
    # created) still tries until its deadline (a node may exist and bill), but says each
    # distinct problem once. (One that never answered at all is given up on in seconds:
    # tests/test_dead_endpoint.py.)
    from tpulab.cloud.google import GoogleTpuApi

    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    api = GoogleTpuApi("p", api_endpoint=emulator.url, clock=lambda: now[0])
    assert api.list_nodes(ZONE) == []  # it answered: later losing it is a blip to ride out
    emulator.stop()  # now nothing listens on its port
    notes: list[str] = []
    with pytest.raises(TeardownError, match="could not be listed") as caught:
        delete_and_confirm(
            api, ZONE, "gone", run_id="run-dead", timeout=120, poll=0.5,
            clock=lambda: now[0], sleep=sleep, notify=notes.append,
        )  # fmt: skip
    assert now[0] == pytest.approx(120)
    assert api.call_count > 10  # kept trying all along...
    assert len(notes) == 2  # ...but said "get failed" and "list failed" once each
    assert all("cannot reach" in note for note in notes)
    assert [node.name for node in caught.value.leaked] == ["gone"]


# A create whose reply never came: its node may still appear, so an empty list counts
# only after `settle` seconds (run/ending.py passes 30). The clock is the test's: the
# settle passes in the teardown's own sleeps, never in real time.
SETTLE = 30.0


def _after_a_lost_reply(
    api: GoogleTpuApi, name: str, run_id: str, queued_resource: str | None = None
) -> TeardownReport:
    """The teardown `run` does for a create sent but not known accepted."""
    from helpers import FakeClock

    clock = FakeClock(1000.0)
    return delete_and_confirm(
        api, ZONE, name, run_id=run_id, known_ours=False, timeout=120, poll=0.5,
        max_poll=2.0, clock=clock, sleep=clock.sleep, settle=SETTLE,
        queued_resource=queued_resource,
    )  # fmt: skip


def test_a_create_never_seen_is_waited_for_the_whole_settle(tpu_api: GoogleTpuApi) -> None:
    report = _after_a_lost_reply(tpu_api, "never-listed", "run-s")
    assert report.confirmed
    assert report.seconds >= SETTLE  # every list was empty, and each was believed only late
    assert report.list_calls > 1


def test_a_node_the_list_shows_ends_the_settle_once_it_is_gone(
    emulator: Emulator, tpu_api: GoogleTpuApi
) -> None:
    create(tpu_api, "lost-reply", "run-t")  # created, its reply lost: found by its label
    report = _after_a_lost_reply(tpu_api, "lost-reply", "run-t")
    assert report.confirmed
    assert report.delete_attempts == 1
    assert report.seconds < SETTLE  # the create acted: nothing more of it can appear
    assert emulator.node_names() == []


def test_a_queued_resource_the_list_shows_ends_the_settle_once_it_is_gone(
    emulator: Emulator, tpu_api: GoogleTpuApi
) -> None:
    """What a Ctrl-C between `run --queued`'s CreateQueuedResource and its reply leaves:
    the run waited the whole 30 s for a queued resource it had already deleted."""
    from emulator_fixtures import node_request

    from tpulab.cloud.api import QueuedResourceRequest

    emulator.faults.capacity_after = {ZONE: 3600.0}  # it waits for capacity
    request = QueuedResourceRequest(node_id="lost-qr", node=node_request(run_id="run-q"))
    tpu_api.wait_operation(tpu_api.create_queued_resource(ZONE, "lost-qr", request), timeout=20)
    report = _after_a_lost_reply(tpu_api, "lost-qr", "run-q", queued_resource="lost-qr")
    assert report.confirmed
    assert report.seconds < SETTLE
    assert emulator.snapshot().get("queued_resources", {}) == {}
    assert emulator.node_names() == []
