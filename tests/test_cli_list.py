"""`tpulab list` and `tpulab emulator serve` through the real CLI, against emulators."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from typer.testing import CliRunner

from tpulab import paths
from tpulab.catalog import lookup
from tpulab.cleanup.report import ListEnvelope
from tpulab.cli import app
from tpulab.exits import EXIT_CLOUD, EXIT_CONFIG

if TYPE_CHECKING:
    from emulator_fixtures import EmulatorStarter

    from tpulab.cloud.google import GoogleTpuApi
    from tpulab.emulator import Emulator

pytest_plugins = ["emulator_fixtures"]

PROJECT = "test-project"
ZONE = "us-central1-a"


@pytest.fixture(autouse=True)
def no_cloud_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Nothing from this machine's gcloud or environment may choose project or zone."""
    for name in list(os.environ):
        if name.startswith(("CLOUDSDK_", "TPULAB_PROJECT", "TPULAB_ZONE", "GOOGLE_CLOUD")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "empty-gcloud-config"))


def run_cli(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args))
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def populate(api: GoogleTpuApi) -> None:
    from emulator_fixtures import node_request

    api.create_node(ZONE, "mine-a", node_request(run_id="run-a"))
    api.create_node(ZONE, "mine-spot", node_request("v5p-8", runtime="v2-alpha-tpuv5", spot=True))
    api.create_node(ZONE, "someone-elses", node_request(run_id=None))
    v6e = node_request("v6e-4", runtime="v2-alpha-tpuv6e", run_id="run-b")  # no v5e in -b
    api.create_node("us-central1-b", "mine-b", v6e)


def test_list_json_shows_only_tpulab_nodes_with_cost(
    emulator: Emulator, tpu_api: GoogleTpuApi
) -> None:
    populate(tpu_api)
    before = datetime.now(timezone.utc)
    code, out, _ = run_cli(
        "list", "--json", "--api-endpoint", emulator.url, "--project", PROJECT, "--zone", ZONE
    )
    after = datetime.now(timezone.utc)
    assert code == 0
    envelope = ListEnvelope.model_validate_json(out)  # the printed output is the contract
    assert envelope.command == "list"
    assert envelope.ok is True
    assert envelope.error is None
    assert envelope.zones == [ZONE]
    assert envelope.hidden == 1
    nodes = {n.name: n for n in envelope.nodes}
    assert set(nodes) == {"mine-a", "mine-spot"}
    spot = nodes["mine-spot"]
    assert (spot.project, spot.zone) == (PROJECT, ZONE)
    assert spot.accelerator_type == "v5p-8"
    assert spot.spot is True
    assert spot.managed_by_tpulab is True
    assert spot.run_id == "run-1"
    assert spot.state in {"CREATING", "READY"}
    assert spot.journal == "not in this machine's journal"
    # The estimate is the catalog's spot price times the node's age, from the API's
    # createTime, at some moment while the command ran (rounded to 4 places): recompute it
    # independently, at both ends of the command, so a slow machine cannot fail it.
    assert spot.create_time is not None
    price = lookup("v5p-8").price_per_hour(spot=True)
    assert spot.price_per_hour_usd == price
    least, most = (
        price * (moment - spot.create_time).total_seconds() / 3600 for moment in (before, after)
    )
    assert spot.estimated_cost_usd is not None
    assert least - 5e-5 <= spot.estimated_cost_usd <= most + 5e-5
    assert envelope.estimated_total_usd == pytest.approx(
        sum(n.estimated_cost_usd or 0 for n in nodes.values()), abs=1e-3
    )


def test_list_all_and_several_zones(emulator: Emulator, tpu_api: GoogleTpuApi) -> None:
    populate(tpu_api)
    code, out, _ = run_cli(
        "list",
        "--all",
        "--json",
        "--api-endpoint",
        emulator.url,
        "--project",
        PROJECT,
        "--zone",
        ZONE,
        "--zone",
        "us-central1-b",
    )
    assert code == 0
    names = [(n["zone"], n["name"]) for n in json.loads(out)["nodes"]]
    assert names == [
        (ZONE, "mine-a"),
        (ZONE, "mine-spot"),
        (ZONE, "someone-elses"),
        ("us-central1-b", "mine-b"),
    ]


def test_list_table_for_people(emulator: Emulator, tpu_api: GoogleTpuApi) -> None:
    populate(tpu_api)
    code, out, _ = run_cli(
        "list", "--api-endpoint", emulator.url, "--project", PROJECT, "--zone", ZONE
    )
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split()[:5] == ["NAME", "ZONE", "TYPE", "STATE", "AGE"]
    assert any(line.startswith("mine-a ") and "run-a" in line for line in lines)
    assert any("v5p-8 (spot)" in line for line in lines)
    assert not any("someone-elses" in line for line in lines)
    assert "1 non-tpulab node(s) hidden" in out
    assert "Estimated cost so far" in out


def test_list_empty_zone_says_so(emulator: Emulator) -> None:
    code, out, _ = run_cli(
        "list", "--api-endpoint", emulator.url, "--project", PROJECT, "--zone", "us-east1-d"
    )
    assert code == 0
    assert "No tpulab-managed nodes in us-east1-d" in out


def test_list_api_error_is_reported_with_the_api_words(emulator: Emulator) -> None:
    code, _, err = run_cli(
        "list", "--api-endpoint", emulator.url, "--project", PROJECT, "--zone", "us-nowhere1-a"
    )
    assert code == EXIT_CLOUD
    assert "Could not list nodes in us-nowhere1-a" in err
    assert "API said:" in err
    assert "hint:" in err


def test_list_bad_input_fails_before_any_api_call(emulator: Emulator) -> None:
    code, _, err = run_cli(
        "list", "--api-endpoint", emulator.url, "--project", PROJECT, "--zone", "Not A Zone"
    )
    assert code == EXIT_CONFIG
    assert "Invalid zone" in err
    code, _, err = run_cli("list", "--project", PROJECT)
    assert code == EXIT_CONFIG
    assert "zone" in err.lower()
    assert emulator.calls == {}


def test_list_emulate_reads_the_embedded_emulators_state(
    start_emulator: EmulatorStarter,
) -> None:
    from emulator_fixtures import api_for, node_request

    # A node left in the embedded emulator's state (as by a killed `run --emulate`).
    left = start_emulator(paths.emulator_state_dir())
    api_for(left, project="tpulab-emulated").create_node(
        "us-central1-a", "left-behind", node_request(run_id="killed-run")
    )
    left.stop()
    code, out, _ = run_cli("list", "--emulate", "--json")
    assert code == 0
    envelope = ListEnvelope.model_validate_json(out)
    assert envelope.project == "tpulab-emulated"
    assert [(n.name, n.run_id) for n in envelope.nodes] == [("left-behind", "killed-run")]


def test_emulator_serve_runs_until_sigterm(tmp_path: Path) -> None:
    state = tmp_path / "served"
    command = [sys.executable, "-m", "tpulab", "emulator", "serve", "--port", "0"]
    command += ["--state", str(state), "--ssh", "none", "--create-seconds", "0.1"]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        first = server.stdout.readline()
        assert first.startswith("Cloud TPU API emulator listening on http://127.0.0.1:"), first
        url = first.split()[-1]
        banner = [server.stdout.readline() for _ in range(5)]
        assert any("CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU=" + url in line for line in banner)
        from tpulab.cloud.google import GoogleTpuApi
        from tpulab.models import NodeRequest

        api = GoogleTpuApi(PROJECT, api_endpoint=url)
        request = NodeRequest(accelerator_type="v5litepod-1", runtime_version="v2-alpha-tpuv5-lite")
        api.wait_operation(api.create_node(ZONE, "served", request), timeout=10)
        server.send_signal(signal.SIGTERM)
        out, err = server.communicate(timeout=20)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    assert server.returncode == 0, err
    assert "Emulator stopped" in out
    saved: dict[str, Any] = json.loads((state / "state.json").read_text())
    assert [n["name"] for n in saved["nodes"].values()] == ["served"]


def test_emulator_serve_reports_a_busy_port(emulator: Emulator, tmp_path: Path) -> None:
    port = emulator.url.rsplit(":", 1)[1]
    started = time.monotonic()
    code, _, err = run_cli(
        "emulator", "serve", "--port", port, "--state", str(tmp_path / "s"), "--ssh", "none"
    )
    assert code == EXIT_CONFIG
    assert f"Cannot listen on 127.0.0.1:{port}" in err
    assert time.monotonic() - started < 10


def test_list_reports_open_journal_rows_only_for_the_api_it_listed(emulator: Emulator) -> None:
    """An open row whose node is gone is reported as missing — but only under the API
    (target and project) the row belongs to, not under every list."""
    from tpulab.cleanup.journal import TARGET_EMULATE, Journal, RunRow

    journal = Journal()
    for run_id, target, project in (
        ("run-here", emulator.url, PROJECT),
        ("run-emulate", TARGET_EMULATE, "tpulab-emulated"),
        ("run-other-project", emulator.url, "another-project"),
    ):
        journal.open_run(
            RunRow.for_this_process(
                run_id=run_id,
                project=project,
                zone=ZONE,
                node_name=f"tpulab-{run_id}",
                accelerator="v5litepod-4",
                target=target,
                emulated=True,
            )
        )
    status, out, _ = run_cli(
        "list", "--api-endpoint", emulator.url, "--project", PROJECT, "--zone", ZONE, "--json"
    )
    assert status == 0
    missing = ListEnvelope.model_validate_json(out).journal_missing
    assert [(row.run_id, row.node_name, row.project) for row in missing] == [
        ("run-here", "tpulab-run-here", PROJECT)
    ]
