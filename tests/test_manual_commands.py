"""Every printed "finish it by hand" command works as printed, for the API it came from.

A teardown that cannot be confirmed prints how to delete the node by hand. For a node
behind Google that is gcloud; behind a served emulator, gcloud pointed at that endpoint;
behind the embedded emulator of `--emulate` (which lives only inside tpulab processes),
tpulab's own sweep. Each test runs the printed text through a shell, as a user pasting
it would, and checks the node is gone.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import require_tool

from tpulab.app.embedded import emulated_target
from tpulab.cleanup.journal import Journal, RunRow
from tpulab.cloud.google import GoogleTpuApi
from tpulab.emulator.server import Emulator
from tpulab.emulator.timing import Timing
from tpulab.errors import TARGET_EMULATE, TARGET_GOOGLE, LeakedNode
from tpulab.models import NodeRequest, tpulab_labels

ZONE = "us-central1-a"
RUN = "20261201t000000-c0ffee"


def _create(api: GoogleTpuApi, name: str) -> None:
    request = NodeRequest(
        accelerator_type="v5litepod-4",
        runtime_version="v2-alpha-tpuv5-lite",
        labels=tpulab_labels(RUN),
    )
    api.wait_operation(api.create_node(ZONE, name, request), timeout=30)


def _paste(command: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    # `tpulab` in a printed command is the installed entry point next to this python.
    path = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    return subprocess.run(
        ["sh", "-c", command],
        env={**env, "PATH": path},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def test_google_gets_plain_gcloud_and_the_sweep() -> None:
    node = LeakedNode("proj-1", ZONE, "n1", TARGET_GOOGLE, RUN)
    assert node.manual_delete_command() == (
        f"gcloud compute tpus tpu-vm delete n1 --project=proj-1 --zone={ZONE} --quiet"
    )
    assert node.sweep_command() == (
        f"tpulab teardown --verify --project proj-1 --zone {ZONE} --run-id {RUN}"
    )
    assert node.sweep_command() in node.what_to_do()


@pytest.mark.gcloud
def test_a_served_emulators_node_is_deleted_by_the_printed_gcloud_command(
    tmp_path: Path,
) -> None:
    require_tool(shutil.which("gcloud") is not None, "gcloud (Google Cloud SDK)")
    with Emulator(tmp_path / "served", timing=Timing.fast()) as emulator:
        api = GoogleTpuApi("proj-served", api_endpoint=emulator.url)
        _create(api, "tpulab-leaked")
        node = LeakedNode("proj-served", ZONE, "tpulab-leaked", emulator.url, RUN)
        # A clean gcloud: no project, no endpoint, no credentials of the user's.
        env = {k: v for k, v in os.environ.items() if not k.startswith("CLOUDSDK_")}
        env["CLOUDSDK_CONFIG"] = str(tmp_path / "gcloud-config")
        done = _paste(node.manual_delete_command(), env)
        assert done.returncode == 0, done.stderr
        assert emulator.node_names("proj-served") == []


# The printed command starts `tpulab` through a shell (the entry point on PATH), which
# the tiers' source patterns cannot see: said outright, or it ran in the quick tier.
@pytest.mark.e2e
def test_an_embedded_emulators_node_is_deleted_by_the_printed_tpulab_command(
    tpulab_home: Path,
) -> None:
    with emulated_target(timing=Timing.fast()) as target:
        _create(target.api, "tpulab-embedded-leak")
    # The run that made it is dead; its row is what `teardown --verify` starts from.
    row = RunRow.for_this_process(
        run_id=RUN,
        project=target.project,
        zone=ZONE,
        node_name="tpulab-embedded-leak",
        accelerator="v5litepod-4",
        target=TARGET_EMULATE,
        emulated=True,
    )
    Journal().open_run(RunRow(**{**row.__dict__, "pid": None}))
    node = LeakedNode(target.project, ZONE, "tpulab-embedded-leak", TARGET_EMULATE, RUN)
    assert "gcloud" not in node.what_to_do()  # gcloud cannot reach an in-process emulator
    done = _paste(node.manual_delete_command(), dict(os.environ))
    assert done.returncode == 0, done.stdout + done.stderr
    with emulated_target() as target:
        assert target.emulator.node_names(target.project) == []
