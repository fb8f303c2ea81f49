"""The gate the interruption tests hold phases with: it passes the real client's calls
through to the real emulator unchanged, and holds exactly the chosen node's requests."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from api_gate import ApiGate, served_gate
from helpers import create_ready_node

from tpulab.cloud.google import GoogleTpuApi
from tpulab.emulator.server import Emulator
from tpulab.emulator.timing import Timing
from tpulab.models import NodeRequest

PROJECT = "gate-proj"
ZONE = "us-central1-a"


@pytest.fixture
def gate(tmp_path: Path) -> Iterator[tuple[Emulator, ApiGate]]:
    with (
        Emulator(tmp_path / "emulator", timing=Timing.fast()) as emulator,
        served_gate(emulator.url) as served,
    ):
        yield emulator, served


def _in_thread(call: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    results: list[object] = []
    thread = threading.Thread(target=lambda: results.append(call()), daemon=True)
    thread.start()
    return thread, results


def test_calls_pass_through_unchanged(gate: tuple[Emulator, ApiGate]) -> None:
    emulator, served = gate
    api = GoogleTpuApi(PROJECT, api_endpoint=served.url)
    create_ready_node(api, "tpulab-through", {"team": "x"})
    (node,) = api.list_nodes(ZONE)
    assert (node.name, node.labels) == ("tpulab-through", {"team": "x"})
    assert emulator.node_names(PROJECT) == ["tpulab-through"]
    operation = api.delete_node(ZONE, "tpulab-through")
    api.wait_operation(operation, timeout=30)
    assert emulator.node_names(PROJECT) == []


def test_a_hold_stops_only_its_nodes_request_until_released(
    gate: tuple[Emulator, ApiGate],
) -> None:
    emulator, served = gate
    api = GoogleTpuApi(PROJECT, api_endpoint=served.url)
    for name in ("tpulab-held", "tpulab-free"):
        create_ready_node(api, name, {})
    hold = served.hold("tpulab-held", "delete")

    free = api.delete_node(ZONE, "tpulab-free")  # another node's delete is not held
    api.wait_operation(free, timeout=30)
    thread, results = _in_thread(lambda: api.delete_node(ZONE, "tpulab-held"))
    hold.wait_reached(timeout=30)
    thread.join(timeout=1.0)
    assert thread.is_alive(), "the held DeleteNode must not have been answered"
    assert "tpulab-held" in emulator.node_names(PROJECT)  # nor forwarded
    hold.release()
    thread.join(timeout=30)
    assert not thread.is_alive()
    api.wait_operation(str(results[0]), timeout=30)
    assert emulator.node_names(PROJECT) == []


def test_a_create_hold_holds_the_operation_the_create_returned(
    gate: tuple[Emulator, ApiGate],
) -> None:
    emulator, served = gate
    api = GoogleTpuApi(PROJECT, api_endpoint=served.url)
    hold = served.hold("tpulab-creating", "create-operation")
    request = NodeRequest(accelerator_type="v5litepod-4", runtime_version="v2-alpha-tpuv5-lite")
    operation = api.create_node(ZONE, "tpulab-creating", request)  # the create itself passes
    assert hold.operation is not None
    assert "tpulab-creating" in emulator.node_names(PROJECT)
    thread, _ = _in_thread(lambda: api.wait_operation(operation, timeout=60))
    hold.wait_reached(timeout=30)
    thread.join(timeout=1.0)
    assert thread.is_alive(), "the create operation must stay unanswered while held"
    hold.release()
    thread.join(timeout=30)
    assert not thread.is_alive()
