"""Project/zone resolution (docs/architecture.md §1) and RunSpec validation before any API call."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tpulab.config import (
    EMULATED_PROJECT,
    EMULATED_ZONE,
    PythonFlags,
    Scope,
    TargetFlags,
    TimeoutFlags,
    Timeouts,
    build_run_spec,
    choose_target,
    classify_endpoint,
    gcloud_config_value,
    list_scope,
    local_verify_inputs,
    resolve_project,
    resolve_zone,
    resolve_zones,
    run_inputs,
    teardown_inputs,
)
from tpulab.errors import ConfigError, UnknownAcceleratorError
from tpulab.models import check_zone
from tpulab.paths import owner_id, owner_id_path


@pytest.fixture(autouse=True)
def no_home_gcloud(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A HOME of our own: env={} must not read this machine's gcloud configuration."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("CLOUDSDK_CONFIG", raising=False)
    return home


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
    spec = build_run_spec(target=TargetFlags(accelerator="v5litepod-4", emulate=True), env={})
    assert (spec.project.value, spec.zone.value) == (EMULATED_PROJECT, EMULATED_ZONE)
    assert spec.emulated
    assert spec.platform == "cpu"
    assert spec.node_name == f"tpulab-{spec.run_id}"
    # What the node is, and which tpulab home made it: made once, then the same id.
    owner = owner_id()
    assert spec.labels == {
        "managed-by": "tpulab",
        "tpulab-run": spec.run_id,
        "tpulab-kind": "run",
        "tpulab-owner": owner,
    }
    assert owner_id_path().read_text().strip() == owner
    assert spec.labels["tpulab-owner"] == owner


def test_endpoint_mode_is_emulated_only_on_loopback() -> None:
    local = build_run_spec(
        target=TargetFlags(accelerator="v5litepod-4", api_endpoint="http://127.0.0.1:8470"), env={}
    )
    assert local.emulated
    assert local.platform == "cpu"
    remote = build_run_spec(
        target=TargetFlags(
            accelerator="v5litepod-4",
            api_endpoint="https://tpu.example.com",
            project="p-1",
            zone="us-central1-a",
        ),
        env={},
    )
    assert not remote.emulated
    assert remote.platform == "tpu"


def test_google_mode_requires_project_and_zone(tmp_path: Path) -> None:
    env = {"CLOUDSDK_CONFIG": str(tmp_path / "none")}
    with pytest.raises(ConfigError, match="No zone"):
        build_run_spec(target=TargetFlags(accelerator="v5litepod-4", project="p-1"), env=env)
    spec = build_run_spec(
        target=TargetFlags(accelerator="v6e-1", zone="us-east5-b"),
        env=env,
        adc_project=lambda: "adc-p",
    )
    assert spec.project.value == "adc-p"
    assert not spec.emulated


@pytest.mark.parametrize(
    ("target", "other", "error", "words"),
    [
        ({"accelerator": "v5litepod-3"}, {}, UnknownAcceleratorError, "v5litepod-4"),
        ({"name": "Bad_Name"}, {}, ConfigError, "Invalid node name"),
        ({"name": "x" * 64}, {}, ConfigError, "Invalid node name"),
        ({"zone": "mars"}, {}, ConfigError, "Invalid zone"),
        ({"project": "https://console.cloud.google.com"}, {}, ConfigError, "Invalid project"),
        ({}, {"timeouts": TimeoutFlags(payload=0.0)}, ConfigError, "--payload-timeout"),
        ({}, {"timeouts": TimeoutFlags(payload=float("nan"))}, ConfigError, "--payload-timeout"),
        ({"api_endpoint": "http://127.0.0.1:1"}, {}, ConfigError, "exclude each other"),
        ({}, {"payload": Path("/nonexistent/payload.py")}, ConfigError, "does not exist"),
    ],
)
def test_bad_input_is_refused_before_anything(
    target: dict[str, Any], other: dict[str, Any], error: type[Exception], words: str
) -> None:
    flags = TargetFlags(**{"accelerator": "v5litepod-4", "emulate": True, **target})
    with pytest.raises(error) as caught:
        build_run_spec(target=flags, env={}, **other)
    text = str(caught.value) + str(getattr(caught.value, "hint", ""))
    assert words in text


def test_endpoint_url_is_checked() -> None:
    with pytest.raises(ConfigError, match="Invalid API endpoint"):
        build_run_spec(target=TargetFlags(accelerator="v5litepod-4", api_endpoint="127.0.0.1:80"))


def test_timeout_flags_set_their_deadlines_and_keep_the_others() -> None:
    spec = build_run_spec(
        target=TargetFlags(accelerator="v5litepod-1", emulate=True),
        timeouts=TimeoutFlags(payload=42.0, teardown=5.0, boot=30.0),
        env={},
    )
    assert (spec.timeouts.payload, spec.timeouts.teardown) == (42.0, 5.0)
    # --boot-timeout is one budget for both waits after READY: host key, then SSH.
    assert (spec.timeouts.host_key, spec.timeouts.connect) == (30.0, 30.0)
    assert (spec.timeouts.create, spec.timeouts.collect) == (Timeouts.create, Timeouts.collect)


def test_run_ids_are_unique_label_values() -> None:
    ids = {
        build_run_spec(target=TargetFlags(accelerator="v5litepod-1", emulate=True), env={}).run_id
        for _ in range(50)
    }
    assert len(ids) == 50


# -- the endpoint rule (issue 9 item 4, issue 10 #1) --------------------------------


@pytest.mark.parametrize(
    ("url", "kind", "credentials"),
    [
        (None, "google", True),
        ("https://tpu.googleapis.com", "google", True),
        ("https://tpu.googleapis.com:443/", "google", True),
        ("https://private.p.googleapis.com", "google", True),
        ("http://127.0.0.1:8470", "loopback", False),
        ("http://127.0.0.2:8470", "loopback", False),
        ("http://127.255.1.9:1", "loopback", False),
        ("http://localhost:8470", "loopback", False),
        ("http://[::1]:8470", "loopback", False),
        ("https://127.0.0.2:8470", "loopback", False),
        ("http://10.0.0.5:8470", "other", False),
        ("https://tpu.example.com", "other", False),
        ("https://tpu.googleapis.com.evil.example", "other", False),
        ("https://notgoogleapis.com", "other", False),
    ],
)
def test_one_rule_says_what_an_endpoint_is_and_who_gets_credentials(
    url: str | None, kind: str, credentials: bool
) -> None:
    endpoint = classify_endpoint(url)
    assert endpoint.kind == kind
    assert endpoint.sends_credentials is credentials
    # The platform decision follows the same rule: only loopback runs are emulated.
    target = choose_target(emulate=False, api_endpoint=url)
    assert target.emulated is (kind == "loopback")


def test_run_on_any_loopback_address_is_emulated_and_anonymous() -> None:
    # 127.0.0.2 used to be emulated (CPU) by config while the client sent it ADC.
    spec = build_run_spec(
        target=TargetFlags(accelerator="v5litepod-4", api_endpoint="http://127.0.0.2:9"), env={}
    )
    assert spec.emulated
    assert spec.platform == "cpu"
    assert not classify_endpoint(spec.api_endpoint).sends_credentials


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("", "--api-endpoint is empty"),
        ("   ", "--api-endpoint is empty"),
        ("127.0.0.1:80", "Invalid API endpoint"),
        ("ftp://127.0.0.1", "Invalid API endpoint"),
        ("http://127.0.0.1:99999", "Invalid API endpoint"),
        ("http://user:secret@127.0.0.1:1", "user name or password"),
        ("http://127.0.0.1:1/v2?x=1", "only a scheme, host and port"),
        ("http://tpu.googleapis.com", "cleartext"),
    ],
)
def test_malformed_endpoints_are_refused(url: str, words: str) -> None:
    with pytest.raises(ConfigError, match=words) as caught:
        classify_endpoint(url)
    assert caught.value.hint


def test_emulate_and_endpoint_conflict_is_one_check_for_every_command() -> None:
    for call in (
        lambda: build_run_spec(
            target=TargetFlags(accelerator="v5litepod-4", emulate=True, api_endpoint=""), env={}
        ),
        lambda: list_scope(project=None, zones=[], emulate=True, api_endpoint="http://[::1]:1"),
        lambda: teardown_inputs(
            verify=True,
            project=None,
            zones=[],
            emulate=True,
            api_endpoint="http://127.0.0.1:1",
            run_id=None,
            timeout=60,
        ),
    ):
        with pytest.raises(ConfigError, match="exclude each other"):
            call()


# -- scopes of list and teardown (moved from test_sweep) -----------------------------


def test_scope_validation_happens_before_any_call() -> None:
    def scope(**kwargs: object) -> Scope:
        arguments: dict[str, object] = {
            "verify": True,
            "project": "p",
            "zones": [],
            "emulate": True,
            "api_endpoint": None,
            "run_id": None,
            "timeout": 60.0,
            "env": {},
        }
        arguments.update(kwargs)
        return teardown_inputs(**arguments).scope  # type: ignore[arg-type]

    with pytest.raises(ConfigError, match="Invalid zone"):
        scope(zones=["Mars"])
    with pytest.raises(ConfigError, match="Invalid label"):
        scope(run_id="Bad Id")
    with pytest.raises(ConfigError, match="Invalid API endpoint"):
        scope(emulate=False, api_endpoint="ftp://x")
    with pytest.raises(ConfigError, match="needs --verify"):
        scope(verify=False)
    for bad in (0.0, -1.0, float("inf"), 86401.0):
        with pytest.raises(ConfigError, match="--timeout"):
            scope(timeout=bad)
    found = scope(project=None)
    assert (found.project, found.zones, found.emulate) == (EMULATED_PROJECT, [EMULATED_ZONE], True)
    found = scope(project=None, emulate=False, api_endpoint="http://127.0.0.1:9/")
    assert (found.zones, found.api_endpoint) == ([EMULATED_ZONE], "http://127.0.0.1:9/")
    # A non-loopback endpoint is no emulator: it needs a real project and gets no ADC.
    with pytest.raises(ConfigError, match="No Google Cloud project"):
        scope(project=None, emulate=False, api_endpoint="https://tpu.example.com")


def test_list_needs_a_zone_and_checks_it() -> None:
    with pytest.raises(ConfigError, match="No zone to list"):
        list_scope(project="p-1", zones=[], emulate=False, api_endpoint=None, env={})
    with pytest.raises(ConfigError, match="--zone is empty"):
        list_scope(project="p-1", zones=[""], emulate=False, api_endpoint=None, env={})
    found = list_scope(project="p-1", zones=["us-south1-ai1b"], emulate=False, api_endpoint=None)
    assert (found.project, found.zones, found.api_endpoint) == ("p-1", ["us-south1-ai1b"], None)


# -- issue 10 #4: an empty or malformed value never widens or moves the scope --------


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"name": ""}, "--name is empty"),
        ({"project": ""}, "--project is empty"),
        ({"zone": ""}, "--zone is empty"),
        ({"zone": "  "}, "--zone is empty"),
        ({"project": "Bad Project"}, "Invalid project id 'Bad Project'"),
    ],
)
def test_empty_flags_are_errors_not_defaults(kwargs: dict[str, str], words: str) -> None:
    google = {"project": "p-1", "zone": "us-central1-a"}  # all else resolved: Google too
    for target in ({"emulate": True}, {"api_endpoint": "http://127.0.0.1:1"}, google):
        flags = TargetFlags(**{"accelerator": "v5litepod-4", **target, **kwargs})  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match=words):
            build_run_spec(target=flags, env={})


def test_a_bogus_configured_zone_is_not_replaced_by_the_emulator_default() -> None:
    env = {"TPULAB_ZONE": "bogus"}
    with pytest.raises(ConfigError, match=r"Invalid zone 'bogus' \(from \$TPULAB_ZONE\)"):
        build_run_spec(
            target=TargetFlags(accelerator="v5litepod-4", api_endpoint="http://127.0.0.1:1"),
            env=env,
        )
    with pytest.raises(ConfigError, match="TPULAB_ZONE"):
        list_scope(
            project=None, zones=[], emulate=False, api_endpoint="http://127.0.0.1:1", env=env
        )


@pytest.mark.parametrize("name", ["TPULAB_ZONE", "CLOUDSDK_COMPUTE_ZONE"])
def test_an_empty_zone_variable_is_an_error(name: str) -> None:
    with pytest.raises(ConfigError, match=f"\\${name} is set but empty"):
        resolve_zone(None, env={name: ""})


@pytest.mark.parametrize(
    "name", ["TPULAB_PROJECT", "CLOUDSDK_CORE_PROJECT", "GOOGLE_CLOUD_PROJECT"]
)
def test_empty_or_malformed_project_variables_are_errors(name: str) -> None:
    with pytest.raises(ConfigError, match=f"\\${name} is set but empty"):
        resolve_project(None, env={name: " "})
    with pytest.raises(ConfigError, match=f"Invalid project id 'My Project' \\(from \\${name}\\)"):
        resolve_project(None, env={name: "My Project"})


def test_empty_or_malformed_values_in_the_gcloud_file_are_errors(tmp_path: Path) -> None:
    root = tmp_path / "gcloud"
    write_gcloud(root, "default", "[core]\nproject =\n\n[compute]\nzone = Mars\n")
    env = {"CLOUDSDK_CONFIG": str(root)}
    with pytest.raises(ConfigError, match="core/project is empty"):
        resolve_project(None, env=env)
    with pytest.raises(ConfigError, match="Invalid zone 'Mars' \\(from gcloud configuration"):
        resolve_zone(None, env=env)


def test_teardown_run_id_and_project_are_checked() -> None:
    base: dict[str, object] = {
        "verify": True,
        "zones": [],
        "emulate": False,
        "api_endpoint": "http://127.0.0.1:1",
        "timeout": 60.0,
        "env": {},
    }
    with pytest.raises(ConfigError, match="run id is empty"):
        teardown_inputs(**{**base, "project": None, "run_id": ""})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="Invalid project id 'Bad Project'"):
        teardown_inputs(**{**base, "project": "Bad Project", "run_id": None})  # type: ignore[arg-type]


# -- zones (issue 11 #4) ---------------------------------------------------------------


@pytest.mark.parametrize(
    "zone", ["us-central1-a", "us-central1-ai1a", "us-south1-ai1b", "europe-west4-b"]
)
def test_documented_zones_are_accepted(zone: str) -> None:
    assert check_zone(zone) == zone


@pytest.mark.parametrize(
    "zone", ["", "us-central1", "US-central1-a", "us-central1-", "us_central1-a"]
)
def test_malformed_zones_are_refused(zone: str) -> None:
    with pytest.raises(ConfigError, match="Invalid zone"):
        check_zone(zone)


# -- run and verify flags ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"python": PythonFlags(installer="conda")}, "Unknown installer"),
        ({"ssh_backend": "dropbear"}, "Unknown SSH backend"),
        ({"timeouts": TimeoutFlags(payload=0.0)}, "--payload-timeout"),
        ({"timeouts": TimeoutFlags(teardown=float("nan"))}, "--teardown-timeout"),
    ],
)
def test_run_flags_are_validated_in_config(kwargs: dict[str, Any], words: str) -> None:
    target = TargetFlags(accelerator="v5litepod-4", emulate=True)
    with pytest.raises(ConfigError, match=words):
        run_inputs(target=target, env={}, **kwargs)
    inputs = run_inputs(
        target=target,
        timeouts=TimeoutFlags(payload=42.0),
        python=PythonFlags(installer="pip"),
        env={},
    )
    assert (inputs.installer, inputs.spec.timeouts.payload) == ("pip", 42.0)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"local": False}, "pass --local"),
        ({"accelerator": "v5litepod-4", "devices": 4}, "both set the device count"),
        ({"expect_platform": "npu"}, "Unknown platform"),
        ({"devices": 0}, "out of range"),
        ({"devices": 65}, "out of range"),
        ({"accelerator": "v5litepod-3"}, "Unknown accelerator"),
        ({"accelerator": "v5litepod-4", "expect_platform": "gpu"}, "is a TPU"),
        ({"timeout": -1.0}, "--timeout"),
    ],
)
def test_verify_flags_are_validated_in_config(kwargs: dict[str, object], words: str) -> None:
    flags: dict[str, object] = {
        "local": True,
        "accelerator": None,
        "devices": None,
        "expect_platform": None,
        "timeout": 300.0,
    }
    flags.update(kwargs)
    with pytest.raises(ConfigError, match=words):
        local_verify_inputs(**flags)  # type: ignore[arg-type]


def test_the_embedded_emulator_never_reads_a_real_configuration(no_home_gcloud: Path) -> None:
    # A gcloud configuration (even a broken one) and env are a real project's, not
    # the embedded emulator's: --emulate takes only its flags.
    write_gcloud(no_home_gcloud / ".config" / "gcloud", "default", "[core]\nproject =\n")
    env = {"TPULAB_ZONE": "bogus", "TPULAB_PROJECT": ""}
    spec = build_run_spec(target=TargetFlags(accelerator="v5litepod-4", emulate=True), env=env)
    assert (spec.project.value, spec.zone.value) == (EMULATED_PROJECT, EMULATED_ZONE)
    scope = list_scope(project=None, zones=[], emulate=True, api_endpoint=None, env=env)
    assert (scope.project, scope.zones) == (EMULATED_PROJECT, [EMULATED_ZONE])
    spec = build_run_spec(
        target=TargetFlags(accelerator="v5litepod-4", emulate=True, zone="us-south1-ai1b"), env=env
    )
    assert (spec.zone.value, spec.zone.source) == ("us-south1-ai1b", "--zone")
