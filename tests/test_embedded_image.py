"""Which image `--emulate`'s nodes boot (tpulab/app/embedded.py `load_image_kind`): the
bare one, like a real TPU VM, unless the state directory's image.json names another."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tpulab.app.embedded import load_image_kind
from tpulab.errors import ConfigError


def test_without_image_json_the_nodes_boot_the_bare_image(tmp_path: Path) -> None:
    assert load_image_kind(tmp_path) == "bare"


@pytest.mark.parametrize("kind", ["bare", "preloaded"])
def test_image_json_names_the_image(tmp_path: Path, kind: str) -> None:
    (tmp_path / "image.json").write_text(json.dumps({"kind": kind}))
    assert load_image_kind(tmp_path) == kind


# A file that is no JSON object at all ("[]", "preloaded", "") is refused by the reader
# every settings file shares: tests/test_emulator_settings_files.py.
@pytest.mark.parametrize("content", ['{"kind": "ubuntu"}', "{}", '{"kind": ["preloaded"]}'])
def test_an_unknown_image_is_refused_naming_the_file_and_the_choices(
    tmp_path: Path, content: str
) -> None:
    path = tmp_path / "image.json"
    path.write_text(content)
    with pytest.raises(ConfigError) as refused:
        load_image_kind(tmp_path)
    assert refused.value.message.startswith(f"{path} does not name an emulated image")
    assert refused.value.hint == (
        'Write {"kind": "bare"} or {"kind": "preloaded"} there, or delete it for the bare image.'
    )


# `run --emulate` refusing a damaged image.json before anything starts is tested with the
# other settings files: tests/test_emulator_settings_files.py.
