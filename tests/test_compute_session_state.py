"""A session's provider on disk (tpulab.run.session.SessionState.provider): a
session.json written before sessions knew their provider loads as the Cloud TPU API's;
a provider tpulab does not know is damage, set aside like any; and `list`'s reading of
sessions never concludes a Compute session gone from a listing Compute was not part of.
Real session store and journal on disk; nothing is mocked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tpulab.cleanup.journal import Journal, target_for
from tpulab.cleanup.sessions import SessionStore, reconcile_listed
from tpulab.errors import StateFileError
from tpulab.run.session_state import SessionState

ZONE = "us-central1-c"
PROJECT = "state-proj"
ENDPOINT = "http://127.0.0.1:9/"

# A session.json exactly as `tpulab up` wrote it before sessions recorded a provider
# (every field of that version, sorted, indented: SessionState.to_json then).
OLD_SESSION_JSON = """{
  "accelerator_type": "v6e-4",
  "api_endpoint": "http://127.0.0.1:9/",
  "coordinator": null,
  "deadline_at": 1800007200.0,
  "host_key_b64": "AAAAC3NzaC1lZDI1NTE5AAAAIGq9cR0tZV5cM3QmB7Q4Bd2tq5m4b7nZ7m1l6fQd1m4P",
  "host_key_type": "ssh-ed25519",
  "idle_seconds": 1800.0,
  "name": "old",
  "node_name": "tpulab-20270115t080000-a1b2c3",
  "other_workers": [],
  "project": "state-proj",
  "receipt_id": "20270115t080000-a1b2c3",
  "renewed_at": 1800000000.0,
  "run_id": "20270115t080000-a1b2c3",
  "spot": false,
  "ssh_host": "127.0.0.1",
  "ssh_port": 2222,
  "ssh_user": "tpulab",
  "started_at": 1800000000.0,
  "watchdog": {
    "boot_grace_seconds": 300.0,
    "lease_seconds": 1800.0,
    "max_duration_seconds": 7200.0,
    "node_name": "tpulab-20270115t080000-a1b2c3",
    "project": "state-proj",
    "queued_resource": null,
    "run_id": "20270115t080000-a1b2c3",
    "zone": "us-central1-c"
  },
  "zone": "us-central1-c"
}
"""


def _write(store: SessionStore, name: str, text: str) -> None:
    store.reserve(name, b"private key")
    (store.root / name / "session.json").write_text(text, encoding="utf-8")


def test_a_session_file_from_before_providers_loads_as_the_tpu_apis(tmp_path: Path) -> None:
    store = SessionStore(tmp_path / "sessions")
    _write(store, "old", OLD_SESSION_JSON)
    state = store.load("old").state
    assert state.provider == "tpu-api"
    assert state.watchdog_config().provider == "tpu-api"
    # Saved again (an exec's renewal), it says so, and reads back the same.
    store.save(state.renewed(state.renewed_at + 60))
    saved = json.loads((store.root / "old" / "session.json").read_text())
    assert saved["provider"] == "tpu-api"
    assert store.load("old").state == state.renewed(state.renewed_at + 60)


def test_a_compute_session_round_trips_and_an_unknown_provider_is_damage(
    tmp_path: Path,
) -> None:
    store = SessionStore(tmp_path / "sessions")
    compute = {**json.loads(OLD_SESSION_JSON), "name": "iron", "provider": "compute"}
    _write(store, "iron", json.dumps(compute))
    assert store.load("iron").state.provider == "compute"

    # Strict as every field: a provider no tpulab knows (or of the wrong type) would be
    # asked of the wrong API later; the file is set aside, never guessed.
    for name, provider in (("gce", "gce"), ("nulled", None)):
        _write(store, name, json.dumps({**compute, "name": name, "provider": provider}))
        with pytest.raises(StateFileError, match="provider"):
            store.load(name)
        assert not store.exists(name)
    assert [damaged.name for damaged in store.damaged] == ["gce", "nulled"]
    assert store.names() == ["iron"]


def test_list_concludes_no_compute_session_gone_when_compute_was_not_asked(
    tmp_path: Path,
) -> None:
    """Compute could not be asked (disabled, no permission): its session is not in the
    listing, yet nothing is known of it; the TPU API's session missing from its listing
    is gone."""
    store = SessionStore(tmp_path / "sessions")
    journal = Journal(tmp_path / "journal.sqlite3")
    base = SessionState.from_json(OLD_SESSION_JSON)
    node = SessionState.from_json(
        json.dumps({**json.loads(OLD_SESSION_JSON), "name": "on-tpu", "node_name": "n-tpu"})
    )
    instance = SessionState.from_json(
        json.dumps({**json.loads(base.to_json()), "name": "on-gce", "node_name": "n-gce",
                    "provider": "compute"})
    )  # fmt: skip
    for state in (node, instance):
        store.reserve(state.name, b"private key")
        store.save(state)

    def reconcile(providers: list[str]) -> tuple[list[str], list[str]]:
        up, gone = reconcile_listed(
            store,
            target=target_for(ENDPOINT),
            project=PROJECT,
            zones=[ZONE],
            listed=set(),
            seen_by="tpulab list",
            providers=providers,
            journal=journal,
            now=lambda: base.started_at + 60,
        )
        return [files.state.name for files in up], [c.name for c in gone]

    assert reconcile(["tpu-api"]) == (["on-gce"], ["on-tpu"])
    assert store.names() == ["on-gce"]
    # Once Compute answers and does not list it, it is gone too.
    assert reconcile(["tpu-api", "compute"]) == ([], ["on-gce"])
    assert store.names() == []
