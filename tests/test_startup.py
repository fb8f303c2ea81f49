"""Drawing help is cheap: `tpulab --help` and every `tpulab CMD --help` import only what
draws help, so that asking for help never waits for pydantic, the Google client or SSH.

Every command and subcommand is taken from the typer app itself (a new command is
checked the day it is added), and each `--help` runs in a fresh interpreter through the
console entry point (`tpulab.cli:main`, with its help fix-ups), because this test
process has imported everything already. rich must not load either: help is drawn as
plain text (tpulab/cli/_panels.py), and typer's rich help alone cost ~90 ms.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main

from tpulab.cli import app

# Packages `--help` must not import (by top-level name: `google` covers google.cloud,
# google.auth, google.protobuf, google.api_core).
NOT_FOR_HELP = ("pydantic", "google", "grpc", "paramiko", "asyncssh", "jax", "numpy", "rich")

_PROBE = """
import json, sys
{preamble}
sys.argv = ["tpulab", *json.loads(sys.argv[1])]
from tpulab.cli import main
try:
    main()
except SystemExit as done:
    code = done.code
else:
    code = 0
print("\\nPROBE " + json.dumps({{"code": code, "loaded": sorted(sys.modules)}}))
"""


def _command_paths() -> list[tuple[str, ...]]:
    """Every command path of the app: (), ("run",), ("receipts",), ("receipts", "show")..."""
    found: list[tuple[str, ...]] = []

    def walk(command: object, path: tuple[str, ...]) -> None:
        found.append(path)
        for name, sub in sorted(getattr(command, "commands", {}).items()):
            walk(sub, (*path, name))

    walk(typer.main.get_command(app), ())
    return found


COMMANDS = _command_paths()


def _probe(
    argv: list[str], preamble: str = "", env: dict[str, str] | None = None
) -> tuple[object, list[str], str]:
    """Run `tpulab ARGV` fresh: its exit code, every module it loaded, its stdout."""
    done = subprocess.run(
        [sys.executable, "-c", _PROBE.format(preamble=preamble), json.dumps(argv)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )
    assert "\nPROBE " in done.stdout, done.stderr + done.stdout
    shown, _, probe = done.stdout.rpartition("\nPROBE ")
    found = json.loads(probe)
    return found["code"], found["loaded"], shown


def _help_of(path: tuple[str, ...], preamble: str = "") -> tuple[object, list[str], str]:
    """Run `tpulab PATH --help` fresh: its exit code, the top-level packages it loaded,
    its stdout."""
    code, loaded, shown = _probe([*path, "--help"], preamble)
    return code, sorted({name.split(".")[0] for name in loaded}), shown


def test_every_command_is_enumerated() -> None:
    # The walk must reach the nested commands, or the check below covers only the top.
    assert {(), ("run",), ("list",), ("receipts", "show"), ("runs", "list")} <= set(COMMANDS)
    assert ("emulator", "serve") in COMMANDS


@pytest.mark.parametrize("path", COMMANDS, ids=lambda path: " ".join(("tpulab", *path)))
def test_help_imports_nothing_heavy(path: tuple[str, ...]) -> None:
    code, loaded, shown = _help_of(path)
    assert code in (0, None), shown
    heavy = sorted(set(loaded) & set(NOT_FOR_HELP))
    assert heavy == [], f"`tpulab {' '.join(path)} --help` imported {heavy}"
    # It drew that command's help, not an error or another command's.
    usage = " ".join(("Usage: tpulab", *path))
    assert any(line.strip().startswith(usage) for line in shown.splitlines()), shown


def test_the_probe_would_notice_a_heavy_import() -> None:
    # The check above must be able to fail: an import of pydantic shows in the probe.
    _, loaded, _ = _help_of(("run",), preamble="import pydantic")
    assert "pydantic" in loaded


def _tpulab_models() -> list[type]:
    import importlib
    import pkgutil

    from pydantic import BaseModel

    import tpulab

    for module in pkgutil.walk_packages(tpulab.__path__, "tpulab."):
        importlib.import_module(module.name)
    found: list[type] = []
    pending: list[type] = [BaseModel]
    while pending:
        subclasses: list[type] = pending.pop().__subclasses__()
        for sub in subclasses:
            pending.append(sub)
            if sub.__module__.startswith("tpulab."):
                found.append(sub)
    return found


def test_every_model_builds_its_validator_when_first_used() -> None:
    """pydantic builds a model's validator when the class is made, unless the model defers
    it: about 1-5 ms a model, paid by every command that imports one, though most
    commands validate few (a dry run imports the receipt's models to plan a run and
    validates none of them). tpulab's models defer (`DEFER_BUILD`, where pydantic makes
    that thread-safe), so each is built on first use; a new model that does not would
    put its cost back on every start."""
    from tpulab.models import DEFER_BUILD

    # This pydantic (the one CI installs) builds deferred models under a lock.
    assert DEFER_BUILD
    models = _tpulab_models()
    assert len(models) > 30  # the walk found them
    eager = [
        f"{model.__module__}.{model.__qualname__}"
        for model in models
        if getattr(model, "model_config", {}).get("defer_build") is not DEFER_BUILD
    ]
    assert eager == []
    # Deferred is not broken: each builds now (an unresolvable annotation would
    # otherwise surface at a user's first validation, not at import in the tests).
    for model in models:
        assert model.model_rebuild(force=True) is True, model  # type: ignore[attr-defined]


def _callbacks(app: typer.Typer) -> list[object]:
    found: list[object] = [info.callback for info in app.registered_commands]
    if app.registered_callback is not None:
        found.append(app.registered_callback.callback)
    for group in app.registered_groups:
        assert group.typer_instance is not None
        found += _callbacks(group.typer_instance)
    return found


def test_commands_annotations_are_evaluated_once_at_import() -> None:
    """typer reads every command's signature on every start; an annotation kept as a
    string (`from __future__ import annotations`) is parsed and evaluated again each
    time, which cost `tpulab --help` ~15 ms of its ~0.1 s. So the modules that declare
    commands do without it (quoting only the names they import for type checking)."""
    callbacks = _callbacks(app)
    assert len(callbacks) > 15
    strings = [
        f"{getattr(callback, '__module__', '?')}.{getattr(callback, '__name__', '?')}: {name}"
        for callback in callbacks
        for name, annotation in getattr(callback, "__annotations__", {}).items()
        if isinstance(annotation, str)
    ]
    assert strings == []


# What `tpulab list` must not load: the run engine and its remote side (bootstrap,
# workspace transfer, SSH). Listing reads nodes, leases and the journal; it once loaded
# the workspace code through a Protocol in run.workers, ~14 ms of its start.
NOT_FOR_LIST = (
    "tpulab.run.lifecycle",
    "tpulab.run.context",
    "tpulab.remote.bootstrap",
    "tpulab.remote.workspace",
    "tpulab.remote.ssh",
    "paramiko",
    "asyncssh",
    "jax",
)


def test_list_loads_no_run_engine(tmp_path: Path) -> None:
    env = {**os.environ, "TPULAB_HOME": str(tmp_path / "home")}
    argv = ["list", "--emulate", "--project", "p", "--zone", "us-central1-a"]
    code, loaded, shown = _probe(argv, env=env)
    assert code in (0, None), shown
    assert "No tpulab-managed nodes" in shown, shown  # it listed, and found none
    assert "tpulab.cleanup.listing" in loaded  # the probe sees what list imports
    assert sorted(set(loaded) & set(NOT_FOR_LIST)) == []
