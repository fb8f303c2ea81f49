"""The watchdog's flags, defaults and how a run shows them: validated before anything
is created, carried in CreateNode (so `--dry-run` shows them), reported in the summary.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from helpers import invoke

from tpulab.config import RunSpec, TargetFlags, TimeoutFlags, Timeouts, build_run_spec, run_inputs
from tpulab.config.watchdog import WatchdogRequest
from tpulab.errors import ConfigError
from tpulab.remote.watchdog import parse_state, renew_command, startup_script
from tpulab.run.lease import watchdog_config
from tpulab.run.outcome import RunOutcome
from tpulab.run.plan import build_plan
from tpulab.run.summary import summary_lines

BASE = TargetFlags(accelerator="v5litepod-4", project="p-123456", zone="us-central1-a")


def _spec(**watchdog: str | bool | None) -> RunSpec:
    return build_run_spec(target=BASE, watchdog=WatchdogRequest(**watchdog), env={})  # type: ignore[arg-type]


def _text(lines: list[list[tuple[str, str]]]) -> str:
    return "\n".join("".join(text for text, _style in line) for line in lines)


def test_defaults_outlast_the_controllers_own_waits() -> None:
    spec = _spec()
    assert spec.watchdog is not None
    assert spec.watchdog.lease_seconds == 600
    # Host key + SSH wait (180 s each by default) + 2 min: never before the first renewal.
    assert spec.watchdog.boot_grace_seconds == 180 + 180 + 120
    assert spec.max_duration_seconds == sum(vars(Timeouts()).values()) + 600


def test_durations_parse_and_are_bounded() -> None:
    spec = _spec(lease="15s", boot_grace="1m30s", max_duration="2h")
    assert spec.watchdog is not None
    assert (spec.watchdog.lease_seconds, spec.watchdog.boot_grace_seconds) == (15, 90)
    assert spec.max_duration_seconds == 7200
    for flag, value, said in (
        ("lease", "5s", "--lease '5s' is too short: the minimum is 10s."),
        ("lease", "2d", "--lease '2d' is too long: the maximum is 1d."),
        ("max_duration", "31d", "--max-duration '31d' is too long: the maximum is 30d."),
    ):
        with pytest.raises(ConfigError) as refused:
            _spec(**{flag: value})
        assert refused.value.message == said
        assert refused.value.hint is not None
        assert "e+" not in refused.value.hint  # once "Use between 60 s and 2.592e+06 s."
    with pytest.raises(ConfigError, match="Invalid --lease"):
        _spec(lease="ten minutes")
    with pytest.raises(ConfigError, match="--lease is empty"):
        _spec(lease=" ")


def test_no_watchdog_refuses_its_tuning_flags_and_arms_nothing() -> None:
    with pytest.raises(ConfigError, match="--max-duration has no effect with --no-watchdog"):
        _spec(enabled=False, max_duration="1h")
    spec = _spec(enabled=False)
    assert spec.watchdog is None
    assert watchdog_config(spec) is None
    create = next(s for s in build_plan(spec) if s.action == "CreateNode")
    assert "startup-script" not in (create.body or {})["metadata"]
    assert "serviceAccount" not in (create.body or {})


def test_service_account_is_validated_and_sent_with_the_cloud_platform_scope() -> None:
    email = "runner@p-123456.iam.gserviceaccount.com"
    target = replace(BASE, service_account=email)
    spec = build_run_spec(target=target, env={})
    create = next(s for s in build_plan(spec) if s.action == "CreateNode")
    assert (create.body or {})["serviceAccount"] == {
        "email": email,
        "scope": ["https://www.googleapis.com/auth/cloud-platform"],
    }
    default = next(s for s in build_plan(_spec()) if s.action == "CreateNode")
    # No email: the project's default compute service account, with cloud-platform.
    assert (default.body or {})["serviceAccount"] == {
        "scope": ["https://www.googleapis.com/auth/cloud-platform"]
    }
    with pytest.raises(ConfigError, match="not a service account e-mail"):
        build_run_spec(target=replace(BASE, service_account="runner"), env={})


def test_the_startup_script_is_the_watchdog_with_this_runs_config() -> None:
    spec = _spec(lease="15s", max_duration="20s")
    config = watchdog_config(spec)
    assert config is not None
    script = startup_script(config)
    create = next(s for s in build_plan(spec) if s.action == "CreateNode")
    assert (create.body or {})["metadata"]["startup-script"] == script
    assert script.startswith("#!/bin/sh\n")
    source = (Path(__file__).parent.parent / "remote_payloads" / "watchdog.py").read_text()
    assert source.rstrip() in script
    # The config it embeds is what the run asked for, and no secret: names and numbers.
    embedded = json.loads(shlex.split(script.split("--config ", 1)[1].split(" <<", 1)[0])[0])
    assert embedded["node_name"] == spec.node_name
    assert (embedded["lease_seconds"], embedded["max_duration_seconds"]) == (15, 20)
    assert embedded["lease_path"] == f"/tmp/tpulab-lease-{spec.run_id}"
    # It parses as a shell script (the heredoc is closed).
    checked = subprocess.run(["sh", "-n", "-c", script], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr


def test_the_renewal_quotes_everything_and_writes_atomically() -> None:
    spec = _spec(lease="15s")
    config = watchdog_config(spec)
    assert config is not None
    argv = renew_command(config, 7)
    assert argv[:2] == ["sh", "-c"]
    assert json.loads(argv[4]) == {"lease_seconds": 15.0, "seq": 7}
    assert argv[5] == config.lease_path
    assert "mv -f" in argv[2]


def test_the_human_dry_run_summarises_the_script_and_json_carries_it_whole() -> None:
    args = ["run", "--accelerator", "v5litepod-4", "--project", "p-123456"]
    status, out, err = invoke(*args, "--zone", "us-central1-a", "--dry-run")
    assert status == 0, err
    assert "<the tpulab watchdog: " in out
    assert "TPULAB_WATCHDOG_SOURCE_END" not in out
    status, out, err = invoke(*args, "--zone", "us-central1-a", "--dry-run", "--json")
    assert status == 0, err
    create = next(s for s in json.loads(out)["steps"] if s["action"] == "CreateNode")
    assert "TPULAB_WATCHDOG_SOURCE_END" in create["body"]["metadata"]["startup-script"]


def test_no_watchdog_warns() -> None:
    status, _out, err = invoke(
        "run", "--accelerator", "v5litepod-4", "--project", "p-123456",
        "--zone", "us-central1-a", "--dry-run", "--no-watchdog",
    )  # fmt: skip
    assert status == 0
    assert "--no-watchdog: the VM will not delete itself" in err


def test_run_inputs_pass_the_flags_through() -> None:
    inputs = run_inputs(
        target=TargetFlags(accelerator="v5litepod-4", emulate=True),
        timeouts=TimeoutFlags(teardown=600),
        watchdog=WatchdogRequest(lease="30s", boot_grace="45s", max_duration="1h"),
    )
    assert inputs.spec.watchdog is not None
    assert inputs.spec.watchdog.lease_seconds == 30
    assert inputs.spec.watchdog.boot_grace_seconds == 45
    assert inputs.spec.max_duration_seconds == 3600


def test_the_summary_says_armed_or_plainly_not_with_the_fix() -> None:
    spec = _spec(lease="15s")
    outcome = RunOutcome(spec, watchdog=parse_state("armed"), lease_renewals=9)
    armed = _text(summary_lines(outcome, laptop_jax=lambda: None))
    assert "watchdog  armed" in armed
    assert "lease 15s" in armed
    assert "9 renewals" in armed

    outcome = replace(
        outcome,
        watchdog=parse_state(
            "no-permission: 123-compute@developer.gserviceaccount.com lacks tpu.nodes.delete"
        ),
    )
    refused = _text(summary_lines(outcome, laptop_jax=lambda: None))
    assert "watchdog not armed: 123-compute@developer.gserviceaccount.com lacks" in refused
    assert "roles/tpu.admin" in refused
    assert "the project's default compute service account" in refused

    named = replace(spec, service_account="runner@p-123456.iam.gserviceaccount.com")
    outcome = RunOutcome(named, watchdog=parse_state(None))
    silent = _text(summary_lines(outcome, laptop_jax=lambda: None))
    assert "watchdog not armed: it published no state" in silent
    assert "runner@p-123456.iam.gserviceaccount.com" in silent

    off = _text(summary_lines(RunOutcome(_spec(enabled=False)), laptop_jax=lambda: None))
    assert "watchdog  off (--no-watchdog)" in off


def test_session_times_name_the_bound_they_broke() -> None:
    from tpulab.config.sessions import session_times

    with pytest.raises(ConfigError) as short:
        session_times("1s", None)
    # Once "--ttl '1s' is out of range: a session lives at most 24 h".
    assert short.value.message == "--ttl '1s' is too short: the minimum is 3m."
    with pytest.raises(ConfigError) as long:
        session_times("25h", None)
    assert long.value.message == "--ttl '25h' is too long: the maximum is 1d."
    with pytest.raises(ConfigError) as idle:
        session_times("1h", "2h")
    assert idle.value.message == "--idle '2h' is too long: the maximum is 1h (the --ttl)."


def test_durations_are_shown_as_the_flags_write_them() -> None:
    from tpulab.config.resolve import format_duration

    shown = [format_duration(s) for s in (0.5, 10, 90, 5400, 86400, 2_592_000, 93784)]
    assert shown == ["0.5s", "10s", "1m30s", "1h30m", "1d", "30d", "1d2h3m4s"]
