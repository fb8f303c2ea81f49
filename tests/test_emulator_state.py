"""The emulator's state machine alone (no HTTP), driven by random create/delete/time
sequences: nodes only move forward CREATING -> READY -> DELETING -> gone, operations
finish exactly when due, and a JSON round trip (the on-disk form) changes nothing."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tpulab.emulator import FaultPlan, Timing
from tpulab.emulator.state import CloudState, node_key, operation_json
from tpulab.emulator.wire import ApiError

PROJECT = "p"
ZONE = "us-central1-a"
BODY = {"acceleratorType": "v5litepod-4", "runtimeVersion": "v2-alpha-tpuv5-lite"}
ORDER = {"CREATING": 0, "READY": 1, "PREEMPTED": 2, "DELETING": 3}

steps = st.lists(
    st.one_of(
        st.tuples(st.just("create"), st.sampled_from("abc")),
        st.tuples(st.just("delete"), st.sampled_from("abc")),
        st.tuples(st.just("wait"), st.floats(min_value=0.0, max_value=1.5)),
    ),
    max_size=30,
)


@settings(max_examples=150, deadline=None)
# A spot node taken through notice, stop and the API's lag, each still ahead at a step.
@example(
    script=[("create", "a"), ("wait", 0.6), ("wait", 0.3), ("wait", 0.5), ("wait", 0.5)],
    spot=True,
    preempt_after=0.1,
    notice=0.7,
    lag=0.4,
)
@given(
    script=steps,
    spot=st.booleans(),
    preempt_after=st.one_of(st.none(), st.floats(min_value=0.0, max_value=2.0)),
    notice=st.sampled_from([0.0, 0.7]),
    lag=st.sampled_from([0.0, 0.4]),
)
def test_random_histories_keep_the_invariants(
    script: list[tuple[str, str | float]],
    spot: bool,
    preempt_after: float | None,
    notice: float,
    lag: float,
) -> None:
    timing = Timing(create_seconds=0.5, delete_seconds=0.3, stockout_seconds=0.2)
    data = {"version": 1, "nodes": {}, "operations": {}, "next_id": 1}
    now = 1000.0
    last_state: dict[str, str] = {}
    for action, argument in script:
        data = json.loads(json.dumps(data))  # what persistence does between requests
        faults = FaultPlan(
            preempt_after=preempt_after, preempt_notice=notice, preempt_state_lag=lag
        )
        cloud = CloudState(data, timing, faults)
        cloud.advance(now)
        name = str(argument)
        present = node_key(PROJECT, ZONE, name) in cloud.nodes
        if action == "create" and present:
            with pytest.raises(ApiError, match="already exists"):
                cloud.create_node(PROJECT, ZONE, name, BODY, now)
        elif action == "create":
            body = {**BODY, "schedulingConfig": {"spot": spot}}
            cloud.create_node(PROJECT, ZONE, name, body, now)
            last_state.pop(name, None)
        elif action == "delete" and not present:
            with pytest.raises(ApiError, match="not found"):
                cloud.delete_node(PROJECT, ZONE, name, now)
        elif action == "delete":
            cloud.delete_node(PROJECT, ZONE, name, now)
        else:
            now += float(argument)
        cloud.advance(now)
        for node in cloud.nodes.values():
            state = node["state"]
            assert state in ORDER
            previous = last_state.get(node["name"])
            if previous is not None:
                assert ORDER[state] >= ORDER[previous], (previous, state)
            last_state[node["name"]] = state
            if state in {"READY", "PREEMPTED"}:
                assert node["ready_time"] is not None
                assert node["ready_time"] <= now
            if state == "PREEMPTED":
                assert spot
                assert preempt_after is not None
                assert now >= node["ready_time"] + preempt_after
        for operation in cloud.operations.values():
            rendered = operation_json(operation, None, now=now, as_int=False)
            due = operation["done_at"]
            assert rendered["done"] == (due is not None and now >= due)
            if rendered["done"] and operation["verb"] == "delete":
                assert node_key(PROJECT, ZONE, operation["node"]) not in cloud.nodes or (
                    cloud.nodes[node_key(PROJECT, ZONE, operation["node"])]["delete_op"]
                    != operation["name"]
                )
        gone = set(last_state) - {n["name"] for n in cloud.nodes.values()}
        for name in gone:
            last_state.pop(name)
        _next_due_is_when_the_next_change_comes(data, timing, faults, now)


def _next_due_is_when_the_next_change_comes(
    data: dict[str, Any], timing: Timing, faults: FaultPlan, now: float
) -> None:
    """The ticker sleeps until `next_due` (server.py): nothing may change before it,
    and something must change at it. (A finished operation is forgotten an hour on, a
    change no one waits for: the operations are left out of the comparison, and what
    an operation's end changes shows in its node.)"""

    def advanced(at: float) -> tuple[str, float]:
        probe = CloudState(json.loads(json.dumps(data)), timing, dataclasses.replace(faults))
        probe.advance(at)
        seen = {k: v for k, v in probe.data.items() if k != "operations"}
        return json.dumps(seen, sort_keys=True), probe.next_due

    unchanged, due = advanced(now)
    if due == math.inf:
        assert advanced(now + 1e6)[0] == unchanged
        return
    assert due > now
    assert advanced(now + (due - now) / 2)[0] == unchanged
    assert advanced(due)[0] != unchanged
