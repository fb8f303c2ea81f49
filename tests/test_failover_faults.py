"""The emulator faults zone failover needs, seen through the real REST client: each
answers in the API's own words, which the one classification table then scopes."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest

from tpulab import errors as E
from tpulab.cloud.classify import scope_of
from tpulab.cloud.polling import wait_for_state
from tpulab.models import NodeState

if TYPE_CHECKING:
    from tpulab.cloud.google import GoogleTpuApi
    from tpulab.emulator import Emulator

pytest_plugins = ["emulator_fixtures"]


def _create(api: GoogleTpuApi, zone: str, name: str, *, spot: bool = False) -> None:
    from emulator_fixtures import node_request

    api.wait_operation(api.create_node(zone, name, node_request(spot=spot)), timeout=10)


def test_quota_in_a_zone_is_zone_scoped_and_creates_nothing(
    emulator: Emulator, tpu_api: GoogleTpuApi
) -> None:
    emulator.faults.quota_zones = ["us-west4-a"]
    with pytest.raises(E.QuotaError) as caught:
        _create(tpu_api, "us-west4-a", "q1")
    assert "in zone us-west4-a" in caught.value.api_message
    assert scope_of(caught.value) == "zone"
    _create(tpu_api, "us-central1-a", "q2")  # other zones are untouched
    assert emulator.node_names() == ["q2"]


def test_quota_in_a_region_covers_each_of_its_zones(
    emulator: Emulator, tpu_api: GoogleTpuApi
) -> None:
    emulator.faults.quota_regions = ["us-central1"]
    for zone in ("us-central1-a", "us-central1-b"):
        with pytest.raises(E.QuotaError) as caught:
            _create(tpu_api, zone, "r1")
        assert "in region us-central1" in caught.value.api_message
        assert scope_of(caught.value) == "region"
    assert emulator.node_names() == []


def test_denied_zone_is_an_iam_refusal_of_create_only(
    emulator: Emulator, tpu_api: GoogleTpuApi
) -> None:
    emulator.faults.deny_zones = ["us-central1-a"]
    with pytest.raises(E.PermissionDeniedError) as caught:
        _create(tpu_api, "us-central1-a", "d1")
    assert "tpu.nodes.create" in caught.value.api_message
    assert scope_of(caught.value) == "fatal"
    assert tpu_api.list_nodes("us-central1-a") == []  # a teardown's list still works


def test_capacity_arrives_after_the_first_stockout(
    emulator: Emulator, tpu_api: GoogleTpuApi
) -> None:
    emulator.faults.stockout_zones = ["us-central1-a"]
    emulator.faults.capacity_after = {"us-central1-a": 1.0}
    with pytest.raises(E.StockoutError):
        _create(tpu_api, "us-central1-a", "c1")
    # Capacity comes 1 s after the first create met the stockout, which was before the
    # failure came back: count from here, not from before that create was sent.
    time.sleep(1.2)
    _create(tpu_api, "us-central1-a", "c2")
    assert emulator.node_names() == ["c2"]


def test_preempted_during_create_is_code_3_and_only_for_spot(
    emulator: Emulator, tpu_api: GoogleTpuApi
) -> None:
    emulator.faults.create_preempted = 1
    _create(tpu_api, "us-central1-a", "on-demand")  # never preempted, does not count
    with pytest.raises(E.PreemptedError) as caught:
        _create(tpu_api, "us-central1-a", "spot-1", spot=True)
    assert caught.value.status == "INVALID_ARGUMENT"  # code 3, as the API sends it
    assert "in state PREEMPTED" in caught.value.api_message
    _create(tpu_api, "us-central1-a", "spot-2", spot=True)  # the count is used up
    assert emulator.node_names() == ["on-demand", "spot-2"]


def test_preempt_nodes_limits_how_many_spot_nodes_are_preempted(
    emulator: Emulator, tpu_api: GoogleTpuApi
) -> None:
    emulator.faults.update({"preempt_after": 0.0, "preempt_nodes": 1})
    _create(tpu_api, "us-central1-a", "first", spot=True)
    with pytest.raises(E.PreemptedError):
        wait_for_state(tpu_api, "us-central1-a", "first", {NodeState.DELETING}, timeout=5)
    _create(tpu_api, "us-central1-a", "second", spot=True)
    # With preempt_after 0 the emulator decides a spot node's preemption in the same
    # step that makes it READY, so this first look after the create is the verdict;
    # the one preemption allowed is spent.
    assert tpu_api.get_node("us-central1-a", "second").state is NodeState.READY
    assert emulator.faults.preempt_nodes == 0


def test_new_faults_are_checked_over_the_admin_endpoint(emulator: Emulator) -> None:
    plan = emulator.faults
    plan.update({"create_preempted": 1, "preempt_nodes": 2, "quota_regions": ["us-east5"]})
    assert (plan.create_preempted, plan.preempt_nodes, plan.quota_regions) == (1, 2, ["us-east5"])
    plan.update({"preempt_nodes": None})
    assert plan.preempt_nodes is None
    for bad in ({"preempt_nodes": 1.5}, {"deny_zones": "z"}, {"create_preempted": -1}):
        with pytest.raises(ValueError):
            plan.update(bad)


def test_a_stocked_out_zone_not_named_in_capacity_after_stays_stocked_out(
    emulator: Emulator, tpu_api: GoogleTpuApi
) -> None:
    # capacity_after names when capacity arrives; a zone it does not name never gets any
    # (queued resources read the same map, where "not named" means "at once").
    emulator.faults.stockout_zones = ["us-central1-a", "us-west4-a"]
    emulator.faults.capacity_after = {"us-west4-a": 0.0}
    _create(tpu_api, "us-west4-a", "w1")
    with pytest.raises(E.StockoutError):
        _create(tpu_api, "us-central1-a", "c1")
    assert emulator.node_names() == ["w1"]
