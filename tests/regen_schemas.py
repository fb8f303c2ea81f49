"""Regenerate the pinned JSON schemas of every `--json` envelope: tests/schemas/<Model>.json.

    python -m tests.regen_schemas        # from the repository root

Run it after a deliberate change to an envelope model, and review the diff: a changed
schema is a changed contract for scripts (say so, and bump SCHEMA_VERSION if it breaks
them). tests/test_envelopes.py fails until the snapshots match the models.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
from pathlib import Path

import tpulab
from tpulab.envelope import Envelope

SCHEMA_DIR = Path(__file__).resolve().parent / "schemas"
REGENERATE = "python -m tests.regen_schemas"


def import_every_module() -> list[str]:
    """Import every module under tpulab, so that every Envelope subclass is defined."""
    names = [tpulab.__name__]
    for module in pkgutil.walk_packages(tpulab.__path__, prefix="tpulab."):
        importlib.import_module(module.name)
        names.append(module.name)
    return names


def envelope_models() -> list[type[Envelope]]:
    """Every subclass of Envelope that tpulab defines (at any depth), by name."""
    import_every_module()
    found: list[type[Envelope]] = []
    pending = list(Envelope.__subclasses__())
    while pending:
        model = pending.pop()
        pending.extend(model.__subclasses__())
        if model.__module__.startswith("tpulab.") and model not in found:
            found.append(model)
    return sorted(found, key=lambda model: model.__name__)


def schema_text(model: type[Envelope]) -> str:
    return json.dumps(model.model_json_schema(), sort_keys=True, indent=2) + "\n"


def snapshot_path(model: type[Envelope]) -> Path:
    return SCHEMA_DIR / f"{model.__name__}.json"


def main() -> None:
    SCHEMA_DIR.mkdir(exist_ok=True)
    models = envelope_models()
    for model in models:
        path = snapshot_path(model)
        text = schema_text(model)
        before = path.read_text(encoding="utf-8") if path.is_file() else None
        if before != text:
            path.write_text(text, encoding="utf-8")
            print(f"{'updated' if before else 'created'} {path}")
    current = {snapshot_path(model).name for model in models}
    for stale in sorted(SCHEMA_DIR.glob("*.json")):
        if stale.name not in current:
            stale.unlink()
            print(f"removed {stale} (no such envelope model)")


if __name__ == "__main__":
    main()
