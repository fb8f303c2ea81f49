"""Issue 12 #7: a workspace's defaults in pyproject.toml [tool.tpulab] or tpulab.toml.

Real files in a temporary workspace, read by the real loader and resolved through the
real `run_inputs`; nothing is patched. Each refusal names the file and the key.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from helpers import grouped

from tpulab.config import RunInputs, TimeoutFlags, load_project_file, run_inputs
from tpulab.config.project_file import ALLOWED_KEYS, NO_PROJECT_FILE
from tpulab.config.workload import WorkloadFlags
from tpulab.errors import ConfigError

PYPROJECT_SOURCE = "pyproject.toml [tool.tpulab]"


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def pyproject(workdir: Path, body: str) -> Path:
    return write(workdir / "pyproject.toml", "[project]\nname = 'lab'\n" + textwrap.dedent(body))


def inputs(
    workdir: Path,
    *,
    command: tuple[str, ...] = ("python", "train.py"),
    env: dict[str, str] | None = None,
    **kwargs: object,
) -> RunInputs:
    flags: dict[str, object] = {
        "timeouts": TimeoutFlags(teardown=60.0),
        # An empty gcloud directory: nothing from this machine may choose a value.
        "env": {"CLOUDSDK_CONFIG": str(workdir / ".no-gcloud"), **(env or {})},
        "cwd": workdir,
        "workload": WorkloadFlags(command=command),
    }
    flags.update(kwargs)
    return run_inputs(**grouped(**flags))


FULL = """
[tool.tpulab]
accelerator = "v5litepod-8"
zone = "us-west4-a"
project = "lab-project"
python = "3.11"
with = ["flax", "optax>=0.2"]
requirements = "reqs/extra.txt"
fetch = ["ckpt/", "./metrics.jsonl"]
exclude = ["data/raw/"]

[tool.tpulab.env]
WANDB_MODE = "offline"
"""


def test_pyproject_supplies_every_default_with_its_source(tmp_path: Path) -> None:
    write(tmp_path / "reqs" / "extra.txt", "numpy\n")
    pyproject(tmp_path, FULL)
    spec = inputs(tmp_path).spec
    assert spec.accelerator.name == "v5litepod-8"
    assert (spec.project.value, spec.zone.value, spec.python) == (
        "lab-project",
        "us-west4-a",
        "3.11",
    )
    work = spec.workload
    assert work is not None
    assert work.with_packages == ("flax", "optax>=0.2")
    assert work.requirements is not None
    assert work.requirements.path == (tmp_path / "reqs" / "extra.txt").resolve()
    assert work.fetch == ("ckpt/", "metrics.jsonl")
    assert work.env == (("WANDB_MODE", "offline"),)
    assert "data/raw/" in work.exclude
    for key in ("accelerator", "project", "zone", "python", "with_packages", "fetch", "env"):
        assert spec.sources[key] == PYPROJECT_SOURCE, key
    assert spec.sources["out"] == "default"


def test_flags_override_the_file(tmp_path: Path) -> None:
    pyproject(tmp_path, FULL.replace('requirements = "reqs/extra.txt"\n', ""))
    spec = inputs(
        tmp_path,
        accelerator="v6e-1",
        zone="europe-west4-a",
        project="flag-project",
        python="3.12",
        workload=WorkloadFlags(
            command=("python", "x.py"),
            with_packages=("numpy",),
            fetch=("out/",),
            env=("WANDB_MODE=online", "SEED=3"),
        ),
    ).spec
    assert spec.accelerator.name == "v6e-1"
    assert (spec.project.value, spec.zone.value, spec.python) == (
        "flag-project",
        "europe-west4-a",
        "3.12",
    )
    # A list flag replaces the file's list; env names merge, the flag's value winning.
    work = spec.workload
    assert work is not None
    assert work.with_packages == ("numpy",)
    assert work.fetch == ("out/",)
    assert dict(work.env) == {"WANDB_MODE": "online", "SEED": "3"}
    assert spec.sources["accelerator"] == "--accelerator"
    assert spec.sources["with_packages"] == "--with"
    assert spec.sources["env"] == f"{PYPROJECT_SOURCE} + --env"


def test_file_sits_between_environment_and_gcloud_in_the_order(tmp_path: Path) -> None:
    pyproject(tmp_path, '[tool.tpulab]\naccelerator = "v5litepod-4"\nproject = "file-p"\n'
              'zone = "us-east5-a"\n')  # fmt: skip
    gcloud = tmp_path / "gcloud"
    write(gcloud / "active_config", "default")
    write(
        gcloud / "configurations" / "config_default",
        "[core]\nproject = gcloud-p\n[compute]\nzone = us-central1-b\n",
    )
    env = {"CLOUDSDK_CONFIG": str(gcloud)}
    spec = inputs(tmp_path, env=env).spec
    # The file beats the gcloud configuration...
    assert (spec.project.value, spec.zone.value) == ("file-p", "us-east5-a")
    assert spec.project.source == PYPROJECT_SOURCE
    # ...and loses to the environment.
    spec = inputs(
        tmp_path, env={**env, "GOOGLE_CLOUD_PROJECT": "env-p", "TPULAB_ZONE": "us-south1-a"}
    ).spec
    assert (spec.project.value, spec.project.source) == ("env-p", "$GOOGLE_CLOUD_PROJECT")
    assert (spec.zone.value, spec.zone.source) == ("us-south1-a", "$TPULAB_ZONE")


def test_accelerator_from_the_file_also_serves_a_run_without_a_command(tmp_path: Path) -> None:
    write(tmp_path / "tpulab.toml", 'accelerator = "v6e-4"\nzone = "us-east5-b"\n')
    spec = inputs(tmp_path, command=(), project="p-1").spec
    assert (spec.accelerator.name, spec.accelerator_source) == ("v6e-4", "tpulab.toml")
    assert spec.zone.source == "tpulab.toml"
    assert spec.workload is None


def test_no_accelerator_anywhere_says_where_to_put_one(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="No accelerator type") as caught:
        inputs(tmp_path, project="p-1", zone="us-central1-a")
    assert "[tool.tpulab]" in (caught.value.hint or "")


def test_the_embedded_emulator_ignores_the_files_project_and_zone(tmp_path: Path) -> None:
    # Like the environment: a real project's settings must not steer the local emulator.
    pyproject(tmp_path, FULL.replace('requirements = "reqs/extra.txt"\n', ""))
    spec = inputs(tmp_path, emulate=True).spec
    assert (spec.project.source, spec.zone.source) == ("emulator", "emulator")
    assert spec.accelerator_source == PYPROJECT_SOURCE


def test_a_pyproject_without_the_table_declares_nothing(tmp_path: Path) -> None:
    pyproject(tmp_path, "[tool.ruff]\nline-length = 100\n")
    assert load_project_file(tmp_path) == NO_PROJECT_FILE
    assert load_project_file(tmp_path / "missing") == NO_PROJECT_FILE


def test_both_files_setting_defaults_is_refused(tmp_path: Path) -> None:
    pyproject(tmp_path, '[tool.tpulab]\nzone = "us-central1-a"\n')
    write(tmp_path / "tpulab.toml", 'zone = "us-central1-b"\n')
    with pytest.raises(ConfigError, match=r"Both .*pyproject\.toml.* and .*tpulab\.toml"):
        load_project_file(tmp_path)
    # A pyproject.toml without [tool.tpulab] next to a tpulab.toml is no conflict.
    pyproject(tmp_path, "")
    assert load_project_file(tmp_path).zones == ("us-central1-b",)


def test_unknown_keys_name_the_file_the_key_and_the_allowed_ones(tmp_path: Path) -> None:
    path = pyproject(tmp_path, '[tool.tpulab]\nacelerator = "v5litepod-4"\nspot = true\n')
    with pytest.raises(ConfigError) as caught:
        load_project_file(tmp_path)
    assert "'acelerator'" in caught.value.message
    assert "'spot'" in caught.value.message
    assert str(path) in caught.value.message
    assert all(key in (caught.value.hint or "") for key in ALLOWED_KEYS)


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ("accelerator = 4", "accelerator in"),
        ('accelerator = ""', "non-empty string"),
        ("zone = [1]", "zone in"),
        ("zone = []", "zone in"),
        ('with = "flax"', "with in"),
        ("with = [\"flax; python_version<'3'\"]", r"Invalid pyproject\.toml \[tool\.tpulab\] with"),
        ('with = ["--index-url=http://evil"]', r"Invalid pyproject\.toml \[tool\.tpulab\] with"),
        ('fetch = ["../up"]', "leaves the workspace"),
        ('fetch = ["/etc/passwd"]', "not inside the workspace"),
        ('requirements = "nope.txt"', "not a file"),
        ("env = 3", "env in"),
        ("env = { SEED = 3 }", "table of strings"),
        ('env = { "1BAD" = "x" }', "Malformed"),
        ('env = { JAX_PLATFORMS = "cpu" }', "set by tpulab itself"),
        ("exclude = [true]", "exclude in"),
        ('python = "2.7"', "Invalid python '2.7'"),
        ('accelerator = "v5litepod-3"', "Unknown accelerator"),
        ('zone = "Mars"', "Invalid zone"),
    ],
)
def test_wrong_values_are_refused_naming_the_file(tmp_path: Path, body: str, words: str) -> None:
    pyproject(tmp_path, "[tool.tpulab]\n" + body + "\n")
    accelerator = None if "accelerator" in body else "v5litepod-4"
    zone = None if "zone" in body else "us-central1-a"
    with pytest.raises(ConfigError, match=words) as caught:
        inputs(tmp_path, project="p-1", accelerator=accelerator, zone=zone)
    assert "pyproject.toml" in caught.value.message


def test_broken_toml_is_an_error_naming_the_file(tmp_path: Path) -> None:
    path = write(tmp_path / "tpulab.toml", "accelerator = \n")
    with pytest.raises(ConfigError, match="Cannot read") as caught:
        load_project_file(tmp_path)
    assert str(path) in caught.value.message
