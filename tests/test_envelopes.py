"""The `--json` contract: every Envelope model's JSON schema is pinned in tests/schemas/.

A field renamed, retyped or dropped changes the schema and fails here until the snapshot
is regenerated (`python -m tests.regen_schemas`) and the diff reviewed: scripts read these
documents. The end-to-end checks that each command's printed JSON parses back into its
model live with the command's tests (test_run_cli, test_cli_list, test_teardown_cli).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from regen_schemas import (
    REGENERATE,
    SCHEMA_DIR,
    envelope_models,
    import_every_module,
    schema_text,
    snapshot_path,
)

from tpulab.envelope import SCHEMA_VERSION, Envelope, ErrorEnvelope

MODELS = envelope_models()


def test_the_walk_finds_the_envelopes_of_every_command() -> None:
    # The walk imports every module, the CLI's included (a module that cannot be imported
    # on its own fails here), and finds models however deep they subclass Envelope.
    names = {model.__name__ for model in MODELS}
    assert {"ErrorEnvelope", "RunEnvelope", "ListEnvelope", "TeardownEnvelope"} <= names
    assert "tpulab.cli.teardown" in import_every_module()


def test_model_names_are_unique() -> None:
    # One snapshot file per name: two models of the same name would share it.
    names = [model.__name__ for model in MODELS]
    assert len(names) == len(set(names)), names


@pytest.mark.parametrize("model", MODELS, ids=lambda model: model.__name__)
def test_schema_matches_its_snapshot(model: type[Envelope]) -> None:
    path = snapshot_path(model)
    assert path.is_file(), (
        f"{model.__module__}.{model.__name__} has no schema snapshot {path}; "
        f"run `{REGENERATE}` and commit the file."
    )
    assert path.read_text(encoding="utf-8") == schema_text(model), (
        f"The JSON schema of {model.__name__} changed: scripts reading `--json` may break. "
        f"If deliberate, run `{REGENERATE}` and review the diff."
    )


def test_every_snapshot_has_a_model() -> None:
    current = {snapshot_path(model).name for model in MODELS}
    stale = sorted(p.name for p in SCHEMA_DIR.glob("*.json") if p.name not in current)
    assert not stale, f"snapshots without a model: {stale}; run `{REGENERATE}`"


@pytest.mark.parametrize("model", MODELS, ids=lambda model: model.__name__)
def test_every_envelope_starts_with_the_common_fields(model: type[Envelope]) -> None:
    fields = list(model.model_fields)
    assert fields[:4] == ["schema_version", "command", "ok", "error"]
    assert model.model_fields["schema_version"].default == SCHEMA_VERSION


def test_accelerators_and_nodes_are_named_alike_everywhere() -> None:
    # accelerator_type is the Cloud TPU API's word; a reference to a node is node_name.
    # `accelerator` and `node` were the old names in run and teardown.
    for model in MODELS:
        text = schema_text(model)
        properties = _property_names(json.loads(text))
        rule = "field names agree across commands: see tpulab/envelope.py's docstring"
        assert "accelerator" not in properties, f"{model.__name__}: accelerator_type ({rule})"
        assert "node" not in properties, f"{model.__name__}: node_name ({rule})"


def _property_names(schema: object) -> set[str]:
    found: set[str] = set()
    if isinstance(schema, dict):
        properties = schema.get("properties")
        if isinstance(properties, dict):
            found |= set(properties)
        for value in schema.values():
            found |= _property_names(value)
    elif isinstance(schema, list):
        for item in schema:
            found |= _property_names(item)
    return found


def test_a_failed_command_prints_the_error_envelope_and_its_exit_status() -> None:
    # Bad input: nothing is contacted, and --json still gets a document on stdout.
    done = subprocess.run(
        [sys.executable, "-m", "tpulab", "list", "--json", "--emulate", "--zone", "Not A Zone"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    document = ErrorEnvelope.model_validate_json(done.stdout)
    assert document.command == "list"
    assert document.ok is False
    assert document.error.type == "ConfigError"
    assert "Not A Zone" in document.error.message
    assert document.error.exit_status == done.returncode == 2
