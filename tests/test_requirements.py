"""`--requirements FILE` with relative references works on the VM as on the laptop.

The file is read as pip reads it (tpulab.config.requirements). A workspace file is
installed from the synced copy with the installer run in the workspace root, so nested
`-r`/`-c` files resolve relative to the file naming them and the other local paths
relative to the workspace root; a file outside the workspace may name packages by name
or URL only. Every refusal is exit 2 before any API call (the emulator sees none and
holds no node) and names the file, the line, the reference and what to do. The install
itself, on a real emulated VM, is in tests/test_requirements_e2e.py.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from helpers import workload_spec
from typer.testing import CliRunner

from tpulab.cli import app
from tpulab.config.requirements import read_requirements, references
from tpulab.errors import ConfigError
from tpulab.exits import EXIT_CONFIG
from tpulab.remote import bootstrap as boot
from tpulab.remote.workload import WORKSPACE_DIR
from tpulab.run.plan import build_plan
from tpulab.run.progress import Phase
from tpulab.run.workload import extras_for

if TYPE_CHECKING:
    from tpulab.emulator import Emulator

pytest_plugins = ["emulator_fixtures"]

ZONE = "us-central1-a"
PROJECT_TOML = '[project]\nname = "local-pkg"\nversion = "0.1"\n'


def tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text, encoding="utf-8")
    return root


# -- reading a file as pip does -------------------------------------------------------


def test_every_kind_of_reference_is_found_with_pip_line_numbers() -> None:
    text = (
        "# a comment\n"
        "-r base.txt\n"
        "--constraint=pins/constraints.txt\n"
        "-e .\n"
        "--editable ./pkg[extra]\n"
        "./wheels/x-1.0-py3-none-any.whl\n"
        "file:./vendored\n"
        "numpy>=1.0 ; python_version >= '3.8'  # trailing comment\n"
        "flax==0.1 \\\n"
        "    --hash=sha256:abc\n"
        "local @ ./src/local\n"
        "remote @ https://example.com/remote-1.0.whl\n"
        "-e git+https://example.com/repo.git#egg=repo\n"
        "-i https://pypi.org/simple\n"
        "-f ./wheels\n"
        "-rmore.txt\n"
    )
    found = [(r.line, r.kind, r.local, r.name) for r in references(text)]
    assert found == [
        (2, "requirements", "base.txt", None),
        (3, "constraints", "pins/constraints.txt", None),
        (4, "editable", ".", None),
        (5, "editable", "./pkg", None),
        (6, "path", "./wheels/x-1.0-py3-none-any.whl", None),
        (7, "path", "./vendored", None),
        (8, "name", None, "numpy"),
        (9, "name", None, "flax"),  # a continued line keeps its first line's number
        (11, "path", "./src/local", "local"),
        (12, "path", None, "remote"),
        (13, "editable", None, None),
        (14, "find-links", None, None),
        (15, "find-links", "./wheels", None),
        (16, "requirements", "more.txt", None),
    ]


def test_a_workspace_file_resolves_nested_files_beside_it_and_paths_at_the_root(
    tmp_path: Path,
) -> None:
    work = tree(
        tmp_path / "work",
        {
            "reqs/main.txt": "-r base.txt\n-c ../pins.txt\n-e ./pkg\n./dist/w-1-py3-none-any.whl\n",
            "reqs/base.txt": "optax>=0.2\n",
            "pins.txt": "optax<1\n",
            "pkg/pyproject.toml": PROJECT_TOML,
            "dist/w-1-py3-none-any.whl": "not really a wheel",
        },
    )
    reqs = read_requirements(work / "reqs" / "main.txt", workdir=work, cwd=work)
    assert reqs.workspace_path == "reqs/main.txt"
    assert reqs.nested == (("reqs/base.txt", "optax>=0.2\n"), ("pins.txt", "optax<1\n"))
    assert [(u.path, u.project_file) for u in reqs.uploads] == [
        ("reqs/main.txt", None),
        ("reqs/base.txt", None),
        ("pins.txt", None),
        ("pkg", "pyproject.toml"),
        ("dist/w-1-py3-none-any.whl", None),
    ]
    assert reqs.names == ["optax"]


def test_a_file_outside_the_workspace_naming_packages_only_is_staged(tmp_path: Path) -> None:
    tree(tmp_path, {"reqs.txt": "flax\n-i https://pypi.org/simple\nx @ https://e.com/x.whl\n"})
    (tmp_path / "work").mkdir()
    spec = workload_spec(tmp_path, workdir="work", requirements="reqs.txt")
    assert spec.workload is not None
    assert spec.workload.requirements is not None
    assert spec.workload.requirements.workspace_path is None
    assert spec.workload.requirements.names == ["flax", "x"]


# -- refusals, each naming file, line and reference -----------------------------------


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        ("-e .", "editable project (-e)"),
        ("-r base.txt", "requirements file (-r)"),
        ("-c constraints.txt", "constraints file (-c)"),
        ("./wheels/x-1.0-py3-none-any.whl", "local package path"),
        ("file:./pkg", "local package path"),
        ("-f ./wheels", "local package location"),
    ],
)
def test_a_file_outside_the_workspace_may_not_name_local_paths(
    tmp_path: Path, line: str, kind: str
) -> None:
    tree(tmp_path, {"outside/reqs.txt": f"flax\n{line}\n", "work/train.py": ""})
    with pytest.raises(ConfigError) as refused:
        workload_spec(tmp_path, workdir="work", requirements="outside/reqs.txt")
    message = refused.value.message
    assert f"{tmp_path / 'outside' / 'reqs.txt'}, line 2" in message
    assert kind in message
    assert "outside the workspace" in message
    hint = refused.value.hint or ""
    assert "Move reqs.txt" in hint
    assert "--with NAME" in hint


@pytest.mark.parametrize(
    ("files", "words"),
    [
        (
            {"requirements.txt": "flax\n\n-r base.txt\n"},
            "line 3: '-r base.txt' (requirements file (-r)) is not a file",
        ),
        ({"requirements.txt": "-r ../base.txt\n"}, "leaves the workspace"),
        ({"requirements.txt": "-e ./pkg\n"}, "'-e ./pkg' (editable project (-e)) does not exist"),
        ({"requirements.txt": "-e ./pkg\n", "pkg/README": ""}, "without pyproject.toml"),
        ({"requirements.txt": "-e /opt/pkg\n"}, "is an absolute path"),
        ({"requirements.txt": "x @ file:///opt/x\n"}, "is an absolute path"),
        ({"requirements.txt": "../sibling/x.whl\n"}, "leaves the workspace"),
        (
            {"requirements.txt": "-r base.txt\n", "base.txt": "flax\n# pins\n-e ./gone\n"},
            "base.txt, line 3: '-e ./gone' (editable project (-e)) does not exist",
        ),
        ({"requirements.txt": "-r 'unterminated\n"}, "line 1: cannot parse"),
        ({"requirements.txt": "flax\n-e\n"}, "line 2: -e has no value"),
    ],
)
def test_a_workspace_file_must_keep_its_references_in_the_workspace(
    tmp_path: Path, files: dict[str, str], words: str
) -> None:
    work = tree(tmp_path / "work", files)
    with pytest.raises(ConfigError) as refused:
        workload_spec(work, requirements="requirements.txt")
    assert words in refused.value.message
    assert "requirements.txt" in refused.value.message  # the file given, nested or not


def test_a_path_that_only_exists_from_the_users_own_directory_says_so(tmp_path: Path) -> None:
    # The user runs tpulab from tmp_path with --workdir work: pip on the laptop, run from
    # here, would find ./pkg; the VM runs pip in the workspace root, where it is not.
    tree(tmp_path, {"pkg/pyproject.toml": PROJECT_TOML, "work/requirements.txt": "-e ./pkg\n"})
    with pytest.raises(ConfigError) as refused:
        workload_spec(tmp_path, workdir="work", requirements="work/requirements.txt")
    message = refused.value.message
    assert "runs in the workspace root" in message
    assert f"exists relative to your current directory {tmp_path.resolve()}" in message


def test_nested_files_that_name_each_other_are_read_once(tmp_path: Path) -> None:
    work = tree(tmp_path / "w", {"a.txt": "-r b.txt\nflax\n", "b.txt": "-r a.txt\noptax\n"})
    reqs = read_requirements(work / "a.txt", workdir=work, cwd=work)
    assert reqs.nested == (("b.txt", "-r a.txt\noptax\n"),)
    assert reqs.names == ["flax", "optax"]


# -- the install command: the synced copy, run in the workspace root ------------------


def test_the_install_runs_in_the_workspace_root_and_the_stamp_covers_nested_files(
    tmp_path: Path,
) -> None:
    work = tree(tmp_path / "w", {"requirements.txt": "-r base.txt\n", "base.txt": "flax\n"})
    spec = workload_spec(work, requirements="requirements.txt")
    assert spec.workload is not None
    wanted = extras_for(spec.workload)
    argv = boot.extras_command(wanted)
    # $5 the file relative to $6, the directory the installer runs in.
    assert argv[8:10] == ["requirements.txt", WORKSPACE_DIR]
    assert not wanted.staged
    assert wanted.names == ["flax"]
    edited = dataclasses.replace(wanted, nested_texts=("flax==0.2\n",))
    assert edited.stamp != wanted.stamp  # editing base.txt installs again
    staged = boot.Extras((), "flax\n")
    assert staged.staged
    assert boot.extras_command(staged)[8:10] == [boot.STAGED_REQUIREMENTS, ""]


def test_the_dry_run_shows_that_pip_command_after_the_verifier(
    tmp_path: Path, tpulab_home: Path
) -> None:
    work = tree(
        tmp_path / "w",
        {
            "train.py": "",
            "requirements.txt": "-r base.txt\n-e ./pkg\n-e .\n-f .\n",
            "base.txt": "flax\n",
            "pkg/pyproject.toml": PROJECT_TOML,
            "pyproject.toml": PROJECT_TOML,  # the workspace is a project itself: `-e .`
        },
    )
    spec = workload_spec(work, requirements="requirements.txt")
    steps = build_plan(spec)
    phases = [s.phase for s in steps]
    install = next(s for s in steps if s.phase == Phase.INSTALL.value and s.argv)
    assert install.argv is not None
    assert install.argv[8:10] == ["requirements.txt", WORKSPACE_DIR]
    assert phases.index(Phase.VERIFY.value) < phases.index(Phase.INSTALL.value)
    assert phases.index(Phase.SYNC.value) < phases.index(Phase.INSTALL.value)
    # Nothing is staged beside the synced copy.
    assert not any(s.remote_path == boot.STAGED_REQUIREMENTS for s in steps)


# -- through the CLI: exit 2, and the emulator saw nothing ----------------------------


@pytest.fixture
def no_cloud_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.startswith(("CLOUDSDK_", "TPULAB_PROJECT", "TPULAB_ZONE", "GOOGLE_CLOUD")):
            monkeypatch.delenv(name)
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "empty-gcloud-config"))


@pytest.mark.usefixtures("no_cloud_config")
@pytest.mark.parametrize(
    ("files", "requirements", "words"),
    [
        (
            {"outside.txt": "flax\n-e .\n", "ws/train.py": ""},
            "outside.txt",
            "outside.txt, line 2: '-e .' names a local editable project (-e)",
        ),
        (
            {"ws/requirements.txt": "-r base.txt\n"},
            "ws/requirements.txt",
            "line 1: '-r base.txt' (requirements file (-r)) is not a file",
        ),
        (
            # In the workspace but ignored: the synced copy would lack it.
            {
                "ws/requirements.txt": "-e ./pkg\n",
                "ws/pkg/pyproject.toml": PROJECT_TOML,
                "ws/.tpulabignore": "pkg/\n",
            },
            "ws/requirements.txt",
            "pkg/pyproject.toml is in the workspace but not in its upload",
        ),
        (
            {"ws/requirements.txt": "flax\n", "ws/.gitignore": "requirements.txt\n"},
            "ws/requirements.txt",
            "requirements.txt is in the workspace but not in its upload",
        ),
    ],
)
def test_bad_references_create_nothing(
    emulator: Emulator, tmp_path: Path, files: dict[str, str], requirements: str, words: str
) -> None:
    tree(tmp_path, files)
    emulator.faults.stockout = True
    result = CliRunner().invoke(
        app,
        [
            "run", "--accelerator", "v5litepod-4", "--api-endpoint", emulator.url,
            "--zone", ZONE, "--project", "p-123456", "--workdir", str(tmp_path / "ws"),
            "--requirements", str(tmp_path / requirements), "--", "python", "train.py",
        ],
    )  # fmt: skip
    assert result.exit_code == EXIT_CONFIG, result.stderr
    assert words in " ".join(result.stderr.split()), result.stderr
    assert sum(emulator.calls.values()) == 0, dict(emulator.calls)
    assert emulator.node_names() == []


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("./wheels/x.whl", "names a local package path, but"),  # once "a local local ..."
        ("--find-links ./wheels", "names a local package location, but"),
        ("-e .", "names a local editable project (-e), but"),
    ],
)
def test_a_local_reference_outside_the_workspace_is_named_once(
    tmp_path: Path, line: str, said: str
) -> None:
    (tmp_path / "ws").mkdir()
    outside = tmp_path / "outside.txt"
    outside.write_text(f"{line}\n")
    with pytest.raises(ConfigError) as refused:
        read_requirements(outside, workdir=tmp_path / "ws", cwd=tmp_path)
    assert said in refused.value.message
    assert "local local" not in refused.value.message
