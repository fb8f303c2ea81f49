"""The files beside the emulator's state.json that change how the emulated cloud behaves
(faults.json, timing.json, image.json) share one reader (tpulab/emulator/persist.py
`read_settings_file`): a damaged one stops the emulator with an error that names the
file, what is wrong with it and what to do, never a traceback and never silently the
default."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import invoke

from tpulab import paths
from tpulab.app.embedded import EMBEDDED_TIMING, load_image_kind, load_timing
from tpulab.emulator import Emulator, Timing
from tpulab.emulator.persist import EmulatorStateError
from tpulab.exits import EXIT_CONFIG

READERS: dict[str, Callable[[Path], object]] = {
    "faults.json": lambda state: Emulator(state),
    "timing.json": load_timing,
    "image.json": load_image_kind,
}

DAMAGED_FORMS = [
    pytest.param(b"{not json", "is not valid JSON (", id="not-json"),
    pytest.param(b"", "is not valid JSON (", id="empty"),
    pytest.param(b"\xff\xfe{}", "is not valid JSON ('utf-8' codec", id="not-utf8"),
    pytest.param(b"[1]", "holds a JSON array, not an object of names and values", id="array"),
    pytest.param(b'"fast"', "holds a JSON string, not an object", id="string"),
    pytest.param(b"null", "holds a JSON null, not an object", id="null"),
]


@pytest.mark.parametrize("name", sorted(READERS))
@pytest.mark.parametrize(("content", "problem"), DAMAGED_FORMS)
def test_a_damaged_settings_file_is_refused_naming_it_and_what_is_wrong(
    tmp_path: Path, name: str, content: bytes, problem: str
) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(EmulatorStateError) as refused:
        READERS[name](tmp_path)
    assert refused.value.message.startswith(f"The emulator {name.split('.')[0]} file {path} ")
    assert problem in refused.value.message
    assert "delete it" in (refused.value.hint or "")


@pytest.mark.parametrize("name", sorted(READERS))
def test_a_settings_path_that_is_no_file_is_refused_not_ignored(tmp_path: Path, name: str) -> None:
    (tmp_path / name).mkdir()
    with pytest.raises(EmulatorStateError, match="cannot be read"):
        READERS[name](tmp_path)
    (tmp_path / name).rmdir()
    (tmp_path / name).symlink_to(tmp_path / "nowhere")  # dangling: someone meant a file
    with pytest.raises(EmulatorStateError, match="cannot be read"):
        READERS[name](tmp_path)


@pytest.mark.parametrize(
    ("values", "problem"),
    [
        (
            {"create_seconds": "fast"},
            "create_seconds must be a finite number of seconds >= 0, not 'fast'",
        ),
        (
            {"create_seconds": True},
            "create_seconds must be a finite number of seconds >= 0, not True",
        ),
        ({"delete_seconds": -1}, "delete_seconds must be a finite number of seconds >= 0, not -1"),
        ({"page_size": 2.5}, "page_size must be a whole number >= 1, not 2.5"),
        ({"tick_seconds": 0}, "tick_seconds must be > 0"),
        ({"create_secs": 0.1}, "unknown field(s) ['create_secs']"),
    ],
)
def test_a_timing_file_with_a_bad_value_names_the_field(
    tmp_path: Path, values: dict[str, object], problem: str
) -> None:
    path = tmp_path / "timing.json"
    path.write_text(json.dumps(values))
    with pytest.raises(EmulatorStateError) as refused:
        load_timing(tmp_path)
    assert refused.value.message == (
        f"The emulator timing file {path} is not a valid timing ({problem})."
    )
    assert refused.value.hint is not None
    assert "create_seconds" in refused.value.hint
    assert "page_size, a count" in refused.value.hint


def test_a_timing_file_overrides_only_the_fields_it_names(tmp_path: Path) -> None:
    assert load_timing(tmp_path) == EMBEDDED_TIMING
    (tmp_path / "timing.json").write_text(json.dumps({"create_seconds": 0.25, "page_size": 7}))
    loaded = load_timing(tmp_path)
    assert (loaded.create_seconds, loaded.page_size) == (0.25, 7)
    assert loaded.delete_seconds == EMBEDDED_TIMING.delete_seconds
    assert isinstance(loaded, Timing)


@pytest.mark.parametrize(
    ("name", "content", "said"),
    [
        pytest.param(
            "timing.json",
            '{"create_seconds": "fast"}',
            "The emulator timing file {path} is not a valid timing",
            id="timing",
        ),
        pytest.param(
            "image.json",
            '{"kind": "ubuntu"}',
            "{path} does not name an emulated image (kind 'ubuntu')",
            id="image",
        ),
        pytest.param(
            "faults.json",
            '{"stockot": true}',
            "The emulator faults file {path} is not a valid fault plan",
            id="faults",
        ),
    ],
)
def test_run_emulate_with_a_damaged_settings_file_exits_2_before_anything_starts(
    name: str, content: str, said: str
) -> None:
    state = paths.emulator_state_dir()
    state.mkdir(parents=True, exist_ok=True)
    (state / name).write_text(content)
    code, _out, err = invoke("run", "--accelerator", "v5litepod-4", "--emulate")
    assert code == EXIT_CONFIG, err
    assert said.format(path=state / name) in " ".join(err.split())
    assert "Traceback" not in err
    assert not (state / "state.json").exists()  # no emulator ever wrote its state
    assert not list(state.glob("sandboxes/**/*"))
