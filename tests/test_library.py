"""The library facade (`import tpulab`) and the version's single source.

The facade's calls are the commands: run against real emulators (served, or embedded
on the shared state directory) with real SSH hosts, as the CLI tests do.
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import tpulab
from tpulab import paths
from tpulab.config import TargetFlags, build_run_spec
from tpulab.errors import ConfigError, StockoutError, TeardownError, UnknownAcceleratorError

if TYPE_CHECKING:
    from emulator_fixtures import EmulatorStarter
    from run_rig import Rig

pytest_plugins = ["emulator_fixtures", "run_rig"]

ROOT = Path(__file__).resolve().parent.parent
PROJECT = "library-project"
ZONE = "us-central1-a"


def test_import_tpulab_loads_nothing_heavy() -> None:
    # Checked in a fresh interpreter: this one has loaded everything already.
    probe = (
        "import json, sys\n"
        "import tpulab\n"
        "tpulab.__version__, tpulab.run_tpu, tpulab.sweep, tpulab.verify_local\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in\n"
        "    {'jax', 'jaxlib', 'numpy', 'paramiko', 'asyncssh', 'grpc', 'typer', 'rich',\n"
        "     'google'})\n"
        "print(json.dumps(heavy))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert json.loads(done.stdout) == []


def test_the_facades_types_load_on_first_use() -> None:
    from tpulab.cleanup.report import TeardownEnvelope
    from tpulab.run.outcome import RunOutcome

    assert tpulab.RunOutcome is RunOutcome
    assert tpulab.TeardownEnvelope is TeardownEnvelope
    with pytest.raises(AttributeError, match="no attribute 'nonesuch'"):
        getattr(tpulab, "nonesuch")  # noqa: B009 - the lazy __getattr__ must still refuse


def test_the_version_has_one_source() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+; the check needs a TOML reader
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "version" not in project["project"], "the version is tpulab.__version__ only"
    assert project["project"]["dynamic"] == ["version"]
    assert project["tool"]["hatch"]["version"]["path"] == "tpulab/__init__.py"
    assert importlib.metadata.version("tpulab") == tpulab.__version__
    done = subprocess.run(
        [sys.executable, "-m", "tpulab", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.strip() == f"tpulab {tpulab.__version__}"


def test_bad_input_raises_before_anything_is_created() -> None:
    with pytest.raises(UnknownAcceleratorError, match="v5litepod-4"):
        tpulab.run_tpu(accelerator="v5litepod-3", emulate=True)
    assert not paths.emulator_state_dir().exists(), "no emulator may have been started"
    assert not paths.journal_path().exists(), "no journal row may have been written"


def test_a_spec_and_keyword_inputs_together_are_refused(
    start_emulator: EmulatorStarter, tmp_path: Path
) -> None:
    served = start_emulator(tmp_path / "served")
    spec = build_run_spec(target=TargetFlags(accelerator="v5litepod-1", api_endpoint=served.url))
    with pytest.raises(ConfigError, match="not both"):
        tpulab.run_tpu(spec, zone="us-central1-b")
    with pytest.raises(ConfigError, match="needs a spec or an accelerator"):
        tpulab.run_tpu(emulate=True)
    assert sum(served.calls.values()) == 0


def test_a_failed_run_raises_or_returns_its_outcome(
    start_emulator: EmulatorStarter, tmp_path: Path
) -> None:
    served = start_emulator(tmp_path / "served")
    served.faults.stockout = True
    with pytest.raises(StockoutError):
        tpulab.run_tpu(
            accelerator="v5litepod-4", api_endpoint=served.url, project=PROJECT, zone=ZONE
        )
    # A validated spec is the other way in (the CLI builds the same one).
    spec = build_run_spec(
        target=TargetFlags(accelerator="v5litepod-4", api_endpoint=served.url, project=PROJECT)
    )
    outcome = tpulab.run_tpu(spec, check=False)
    assert outcome.spec is spec
    assert isinstance(outcome.error, StockoutError)
    assert outcome.verdict is None
    assert outcome.teardown_status == "confirmed"  # what the stockout left was deleted
    assert served.node_names() == []
    assert served.calls["create_node"] == 2


def test_a_library_run_fails_over_to_the_next_zone(embedded_rig: Rig) -> None:
    """`run_tpu` is `tpulab run`: zones are tried in order (the command's --zone ...)."""
    stocked_out, free = "us-central1-a", "us-west1-c"
    embedded_rig.emulator.faults.stockout_zones = [stocked_out]
    outcome = tpulab.run_tpu(
        accelerator="v5litepod-4",
        api_endpoint=embedded_rig.emulator.url,
        project=PROJECT,
        zones=[stocked_out, free],
    )
    assert outcome.spec.zone.value == free
    assert outcome.verdict is not None
    assert outcome.verdict.value == "verified"
    assert outcome.teardown_status == "confirmed"
    created_in = [
        request["path"].split("/locations/")[1].split("/")[0]
        for request in embedded_rig.emulator.requests()
        if request["method"] == "POST" and request["path"].endswith("/nodes")
    ]
    assert created_in == [stocked_out, free]
    assert embedded_rig.leftovers() == []


def _orphan_in_the_embedded_emulator(start_emulator: EmulatorStarter) -> str:
    from emulator_fixtures import api_for, node_request

    left = start_emulator(paths.emulator_state_dir())
    api_for(left, project=PROJECT).create_node(ZONE, "left-behind", node_request(run_id="dead"))
    left.stop()
    return "left-behind"


def test_sweep_deletes_what_a_dead_run_left(start_emulator: EmulatorStarter) -> None:
    orphan = _orphan_in_the_embedded_emulator(start_emulator)
    (paths.emulator_state_dir() / "timing.json").write_text(
        json.dumps({"create_seconds": 0.1, "delete_seconds": 0.1})
    )
    with pytest.raises(TeardownError, match="remain"):
        tpulab.sweep(emulate=True, project=PROJECT, dry_run=True)
    looked = tpulab.sweep(emulate=True, project=PROJECT, dry_run=True, check=False)
    assert (looked.ok, looked.dry_run, [n.name for n in looked.found]) == (False, True, [orphan])
    # gcloud cannot reach the embedded emulator: the command is tpulab's own sweep.
    assert looked.manual_commands == [
        f"tpulab teardown --verify --emulate --project {PROJECT} --zone {ZONE} --run-id dead --yes"
    ]
    swept = tpulab.sweep(emulate=True, project=PROJECT, timeout=30)
    assert (swept.ok, swept.deleted, swept.remaining) == (True, [orphan], [])


def test_verify_local_judges_and_keeps_the_receipt() -> None:
    checked = tpulab.verify_local(devices=2)
    assert checked.verified
    assert checked.stored.path.is_file()
    assert checked.stored.path.parent == paths.receipts_dir()


@pytest.mark.slow
def test_the_library_example_runs_with_one_import() -> None:
    example = ROOT / "examples" / "library_run.py"
    imports = [
        line
        for line in example.read_text(encoding="utf-8").splitlines()
        if line.startswith(("import ", "from ")) and "__future__" not in line
    ]
    assert imports == ["import tpulab"]
    done = subprocess.run(
        [sys.executable, str(example)], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "receipt verified: sums [140.0, 1100.0, 3084.0, 6092.0]" in done.stdout
    assert "teardown confirmed" in done.stdout
    assert "nodes left: []" in done.stdout
