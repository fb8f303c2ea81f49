"""Project/zone resolution (DESIGN.md §1) and RunSpec validation before any API call."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpulab.config import (
    EMULATED_PROJECT,
    EMULATED_ZONE,
    Timeouts,
    build_run_spec,
    gcloud_config_value,
    resolve_project,
    resolve_zone,
    resolve_zones,
)
from tpulab.errors import ConfigError, UnknownAcceleratorError, UnsupportedAcceleratorError


def write_gcloud(root: Path, name: str, body: str, *, active: str | None = None) -> None:
    (root / "configurations").mkdir(parents=True, exist_ok=True)
    (root / "configurations" / f"config_{name}").write_text(body)
    if active is not None:
        (root / "active_config").write_text(active + "\n")


@pytest.fixture
def gcloud_dir(tmp_path: Path) -> Path:
    root = tmp_path / "gcloud"
    write_gcloud(
        root,
        "work",
        "[core]\nproject = from-gcloud\n\n[compute]\nzone = europe-west4-a\n",
        active="work",
    )
    write_gcloud(root, "default", "[core]\nproject = default-project\n")
    return root


def test_flag_wins_over_everything(gcloud_dir: Path) -> None:
    env = {"CLOUDSDK_CONFIG": str(gcloud_dir), "TPULAB_PROJECT": "env-project"}
    found = resolve_project("flag-project", env=env, adc_project=lambda: "adc-project")
    assert (found.value, found.source) == ("flag-project", "--project")


@pytest.mark.parametrize(
    ("env", "expected", "source"),
    [
        (
            {
                "TPULAB_PROJECT": "a-1",
                "CLOUDSDK_CORE_PROJECT": "b-2",
                "GOOGLE_CLOUD_PROJECT": "c-3",
            },
            "a-1",
            "$TPULAB_PROJECT",
        ),
        (
            {"CLOUDSDK_CORE_PROJECT": "b-2", "GOOGLE_CLOUD_PROJECT": "c-3"},
            "b-2",
            "$CLOUDSDK_CORE_PROJECT",
        ),
        ({"GOOGLE_CLOUD_PROJECT": "c-3"}, "c-3", "$GOOGLE_CLOUD_PROJECT"),
    ],
)
def test_environment_order(
    gcloud_dir: Path, env: dict[str, str], expected: str, source: str
) -> None:
    found = resolve_project(None, env={**env, "CLOUDSDK_CONFIG": str(gcloud_dir)})
    assert (found.value, found.source) == (expected, source)


def test_active_gcloud_configuration_file_is_read(gcloud_dir: Path) -> None:
    env = {"CLOUDSDK_CONFIG": str(gcloud_dir)}
    assert resolve_project(None, env=env).value == "from-gcloud"
    assert "'work'" in resolve_project(None, env=env).source
    assert resolve_zone(None, env=env).value == "europe-west4-a"
    # CLOUDSDK_ACTIVE_CONFIG_NAME switches configuration the way gcloud does.
    other = {**env, "CLOUDSDK_ACTIVE_CONFIG_NAME": "default"}
    assert resolve_project(None, env=other).value == "default-project"
    assert gcloud_config_value("compute", "zone", other) is None


def test_home_gcloud_dir_is_the_default(tmp_path: Path) -> None:
    write_gcloud(tmp_path / ".config" / "gcloud", "default", "[core]\nproject = home-proj\n")
    assert resolve_project(None, env={"HOME": str(tmp_path)}).value == "home-proj"


def test_adc_is_last_and_only_when_offered(tmp_path: Path) -> None:
    env = {"CLOUDSDK_CONFIG": str(tmp_path / "empty")}
    calls: list[int] = []

    def adc() -> str | None:
        calls.append(1)
        return "adc-project"

    found = resolve_project(None, env=env, adc_project=adc)
    assert (found.value, found.source) == ("adc-project", "Application Default Credentials")
    resolve_project(None, env={**env, "TPULAB_PROJECT": "x-project"}, adc_project=adc)
    assert calls == [1], "ADC must not be consulted when an earlier source answers"


def test_missing_project_names_every_source(tmp_path: Path) -> None:
    env = {"CLOUDSDK_CONFIG": str(tmp_path / "empty")}
    with pytest.raises(ConfigError) as caught:
        resolve_project(None, env=env, adc_project=lambda: None)
    assert "No Google Cloud project" in caught.value.message
    hint = caught.value.hint or ""
    for source in ("--project", "TPULAB_PROJECT", "CLOUDSDK_CORE_PROJECT", "gcloud", "Default"):
        assert source in hint


def test_missing_and_invalid_zone(tmp_path: Path) -> None:
    env = {"CLOUDSDK_CONFIG": str(tmp_path / "empty")}
    with pytest.raises(ConfigError, match="No zone"):
        resolve_zone(None, env=env)
    with pytest.raises(ConfigError, match="Invalid zone"):
        resolve_zone("us-central1", env=env)
    assert resolve_zone(None, env={**env, "TPULAB_ZONE": "us-east5-b"}).source == "$TPULAB_ZONE"
    assert resolve_zones(["us-east5-b", "us-east5-b", "europe-west4-a"], env=env) == [
        "us-east5-b",
        "europe-west4-a",
    ]


def test_corrupt_gcloud_file_is_ignored(tmp_path: Path) -> None:
    root = tmp_path / "gcloud"
    write_gcloud(root, "default", "this is [not an ini\n= =\n")
    assert gcloud_config_value("core", "project", {"CLOUDSDK_CONFIG": str(root)}) is None


def test_emulated_spec_defaults_and_labels() -> None:
    spec = build_run_spec(accelerator="v5litepod-4", mode="emulate", env={})
    assert (spec.project.value, spec.zone.value) == (EMULATED_PROJECT, EMULATED_ZONE)
    assert spec.emulated
    assert spec.platform == "cpu"
    assert spec.node_name == f"tpulab-{spec.run_id}"
    assert spec.labels == {"managed-by": "tpulab", "tpulab-run": spec.run_id}


def test_endpoint_mode_is_emulated_only_on_loopback() -> None:
    local = build_run_spec(
        accelerator="v5litepod-4", mode="endpoint", api_endpoint="http://127.0.0.1:8470", env={}
    )
    assert local.emulated
    assert local.platform == "cpu"
    remote = build_run_spec(
        accelerator="v5litepod-4",
        mode="endpoint",
        api_endpoint="https://tpu.example.com",
        project="p-1",
        zone="us-central1-a",
        env={},
    )
    assert not remote.emulated
    assert remote.platform == "tpu"


def test_google_mode_requires_project_and_zone(tmp_path: Path) -> None:
    env = {"CLOUDSDK_CONFIG": str(tmp_path / "none")}
    with pytest.raises(ConfigError, match="No zone"):
        build_run_spec(accelerator="v5litepod-4", mode="google", project="p-1", env=env)
    spec = build_run_spec(
        accelerator="v6e-1", mode="google", zone="us-east5-b", env=env, adc_project=lambda: "adc-p"
    )
    assert spec.project.value == "adc-p"
    assert not spec.emulated


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"accelerator": "v5litepod-3"}, UnknownAcceleratorError, "v5litepod-4"),
        ({"accelerator": "v5litepod-16"}, UnsupportedAcceleratorError, "multi-host"),
        ({"name": "Bad_Name"}, ConfigError, "Invalid node name"),
        ({"name": "x" * 64}, ConfigError, "Invalid node name"),
        ({"zone": "mars"}, ConfigError, "Invalid zone"),
        ({"project": "https://console.cloud.google.com"}, ConfigError, "Invalid project"),
        ({"payload_timeout": 0.0}, ConfigError, "payload timeout"),
        ({"payload_timeout": float("nan")}, ConfigError, "payload timeout"),
        ({"api_endpoint": "http://127.0.0.1:1"}, ConfigError, "cannot be combined"),
        ({"payload": Path("/nonexistent/payload.py")}, ConfigError, "does not exist"),
    ],
)
def test_bad_input_is_refused_before_anything(
    kwargs: dict[str, object], error: type[Exception], words: str
) -> None:
    arguments: dict[str, object] = {"accelerator": "v5litepod-4", "mode": "emulate", "env": {}}
    arguments.update(kwargs)
    with pytest.raises(error) as caught:
        build_run_spec(**arguments)  # type: ignore[arg-type]
    text = str(caught.value) + str(getattr(caught.value, "hint", ""))
    assert words in text


def test_endpoint_url_is_checked() -> None:
    with pytest.raises(ConfigError, match="Invalid API endpoint"):
        build_run_spec(accelerator="v5litepod-4", mode="endpoint", api_endpoint="127.0.0.1:80")


def test_timeouts_override_only_the_payload() -> None:
    spec = build_run_spec(
        accelerator="v5litepod-1",
        mode="emulate",
        env={},
        timeouts=Timeouts(teardown=5.0),
        payload_timeout=42.0,
    )
    assert (spec.timeouts.payload, spec.timeouts.teardown) == (42.0, 5.0)


def test_run_ids_are_unique_label_values() -> None:
    ids = {
        build_run_spec(accelerator="v5litepod-1", mode="emulate", env={}).run_id for _ in range(50)
    }
    assert len(ids) == 50
