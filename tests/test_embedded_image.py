"""Which image `--emulate`'s nodes boot (tpulab/app/embedded.py `load_image_kind`): the
bare one, like a real TPU VM, unless the state directory's image.json names another."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tpulab.app.embedded import load_image_kind


def test_without_image_json_the_nodes_boot_the_bare_image(tmp_path: Path) -> None:
    assert load_image_kind(tmp_path) == "bare"


@pytest.mark.parametrize("kind", ["bare", "preloaded"])
def test_image_json_names_the_image(tmp_path: Path, kind: str) -> None:
    (tmp_path / "image.json").write_text(json.dumps({"kind": kind}))
    assert load_image_kind(tmp_path) == kind


@pytest.mark.parametrize("content", ['{"kind": "ubuntu"}', "{}", '{"kind": ["preloaded"]}'])
def test_an_unknown_image_is_refused_naming_the_file_and_the_choices(
    tmp_path: Path, content: str
) -> None:
    path = tmp_path / "image.json"
    path.write_text(content)
    with pytest.raises(ValueError, match="unknown emulated image") as refused:
        load_image_kind(tmp_path)
    assert str(path) in str(refused.value)
    assert "'bare', 'preloaded'" in str(refused.value)
