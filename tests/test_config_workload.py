"""Issue 12 #1-4: the `-- CMD` part of a run, validated into a WorkloadSpec.

Real directories and files in tmp_path go through the real `run_inputs`; nothing is
patched. Each refusal must name what was wrong (the CLI tests check exit 2 and zero
creates on an emulator for the same inputs).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import workload_spec

from tpulab.config.workload import (
    DEFAULT_COMMAND_TIMEOUT,
    DEFAULT_MAX_FETCH,
    DEFAULT_MAX_UPLOAD,
    RUNS_DIR,
    check_env,
    check_exclude_pattern,
    check_requirement,
    check_workspace_pattern,
    parse_size,
)
from tpulab.errors import ConfigError


def test_a_run_without_a_command_has_no_workload(tmp_path: Path) -> None:
    assert workload_spec(tmp_path, command=()).workload is None
    # --workdir alone is fine: it names the workspace whose [tool.tpulab] is read.
    (tmp_path / "lab").mkdir()
    assert workload_spec(tmp_path, command=(), workdir="lab").workload is None
    with pytest.raises(ConfigError, match="does not exist"):
        workload_spec(tmp_path, command=(), workdir="missing")


def test_defaults(tmp_path: Path) -> None:
    spec = workload_spec(tmp_path)
    work = spec.workload
    assert work is not None
    assert work.command == ("python", "train.py")
    assert work.workdir == tmp_path.resolve()
    # ./tpulab-runs/<run id>/ of the directory tpulab was started in; nothing created yet.
    assert work.out == (tmp_path / RUNS_DIR / spec.run_id).resolve()
    assert not work.out.exists()
    assert (work.max_upload, work.max_fetch) == (DEFAULT_MAX_UPLOAD, DEFAULT_MAX_FETCH)
    assert work.timeout == DEFAULT_COMMAND_TIMEOUT
    assert spec.timeouts.payload == 600.0  # the verifier keeps its own limit
    assert work.sources["out"] == work.sources["timeout"] == "default"
    # The default out dir is inside the workspace: it must never be uploaded.
    assert f"/{RUNS_DIR}/{spec.run_id}/" in work.exclude


def test_every_flag_lands_in_the_spec_with_its_source(tmp_path: Path) -> None:
    workdir = tmp_path / "lab"
    workdir.mkdir()
    reqs = tmp_path / "requirements.txt"
    reqs.write_text("flax\n")
    spec = workload_spec(
        tmp_path,
        command=("python", "-c", "print(1)"),
        workdir="lab",
        out="elsewhere/run-1",
        env=("SEED=3", "EMPTY=", "EQ=a=b"),
        with_packages=("flax", "optax>=0.2,<1", "orbax-checkpoint[all]==0.6.4", "flax"),
        requirements="requirements.txt",
        fetch=("./ckpt/", "logs/*.json"),
        allow_secrets=("config/test.pem",),
        max_upload="1.5G",
        max_fetch="64K",
        timeout=90.0,
        quiet=True,
    )
    work = spec.workload
    assert work is not None
    assert work.command == ("python", "-c", "print(1)")
    assert work.workdir == workdir.resolve()
    assert work.out == (tmp_path / "elsewhere" / "run-1").resolve()
    assert work.env == (("SEED", "3"), ("EMPTY", ""), ("EQ", "a=b"))
    assert work.env_names == ("SEED", "EMPTY", "EQ")
    assert work.with_packages == ("flax", "optax>=0.2,<1", "orbax-checkpoint[all]==0.6.4")
    assert work.requirements is not None
    assert work.requirements.path == reqs.resolve()
    assert work.fetch == ("ckpt/", "logs/*.json")
    assert work.allow_secrets == ("config/test.pem",)
    assert (work.max_upload, work.max_fetch) == (int(1.5 * 2**30), 64 * 1024)
    assert (work.timeout, work.quiet) == (90.0, True)
    assert work.exclude == ()  # --out is outside the workspace
    expected = {
        "command": "--",
        "workdir": "--workdir",
        "out": "--out",
        "env": "--env",
        "with_packages": "--with",
        "requirements": "--requirements",
        "fetch": "--fetch",
        "allow_secrets": "--allow-secret",
        "max_upload": "--max-upload",
        "max_fetch": "--max-fetch",
        "timeout": "--timeout",
        "quiet": "--quiet",
    }
    assert {key: work.sources[key] for key in expected} == expected
    # RunSpec.sources is what the plan prints: the workload's fields are in it.
    assert spec.sources["fetch"] == "--fetch"
    assert spec.sources["accelerator"] == "--accelerator"


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--fetch", "--fetch"),
        ("--exclude", "--exclude"),
        ("--out", "--out"),
        ("--env", "--env"),
        ("--with", "--with"),
        ("--requirements", "--requirements"),
        ("--allow-secret", "--allow-secret"),
        ("--max-upload", "--max-upload"),
        ("--max-fetch", "--max-fetch"),
        ("--timeout", "--timeout"),
        ("--quiet", "--quiet"),
        ("--all-output", "--all-output"),
    ],
)
def test_workload_flags_without_a_command_are_refused(
    tmp_path: Path, option: str, value: str
) -> None:
    field = {
        "--fetch": ("fetch", ("x",)),
        "--exclude": ("exclude", ("*.bin",)),
        "--out": ("out", "o"),
        "--env": ("env", ("A=1",)),
        "--with": ("with_packages", ("flax",)),
        "--requirements": ("requirements", "r.txt"),
        "--allow-secret": ("allow_secrets", ("a.pem",)),
        "--max-upload": ("max_upload", "1G"),
        "--max-fetch": ("max_fetch", "1G"),
        "--timeout": ("timeout", 5.0),
        "--quiet": ("quiet", True),
        "--all-output": ("all_output", True),
    }[option]
    with pytest.raises(ConfigError, match=f"{value} needs a command after --"):
        workload_spec(tmp_path, command=(), **{field[0]: field[1]})


@pytest.mark.parametrize(
    ("workload", "words"),
    [
        ({"workdir": "missing"}, "does not exist"),
        ({"workdir": "a-file"}, "is not a directory"),
        ({"workdir": ""}, "--workdir is empty"),
        ({"requirements": "missing.txt"}, "cannot read"),
        ({"requirements": "."}, "is not a file"),
        ({"out": "a-file"}, "is a file"),
        ({"out": "full"}, "is not empty"),
        ({"command": ("",)}, "Invalid command"),
        ({"command": ("python", "a\0b")}, "Invalid command"),
        ({"timeout": 0.0}, "Invalid --timeout"),
        ({"timeout": 86401.0}, "Invalid --timeout"),
        ({"max_upload": "lots"}, "Invalid --max-upload"),
        ({"max_fetch": "0"}, "Invalid --max-fetch"),
        ({"env": ("NOEQUALS",)}, "Malformed --env"),
        ({"env": ("TPULAB_RUN_DIR=/x",)}, "set by tpulab itself"),
        ({"with_packages": ("-e .",)}, "Invalid --with"),
        ({"fetch": ("../x",)}, "leaves the workspace"),
        ({"fetch": ("/etc/passwd",)}, "not inside the workspace"),
        ({"allow_secrets": ("../id_rsa",)}, "leaves the workspace"),
        ({"exclude": ("#notes",)}, "--exclude '#notes' is a comment"),
        ({"exclude": ("data/*.bin", "../x")}, "--exclude '../x' names nothing inside"),
    ],
)
def test_bad_workload_input_is_refused(
    tmp_path: Path, workload: dict[str, object], words: str
) -> None:
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "run.json").write_text("{}")
    with pytest.raises(ConfigError, match=words):
        workload_spec(tmp_path, **workload)


def test_an_out_dir_inside_the_workspace_is_excluded_from_the_upload(tmp_path: Path) -> None:
    work = workload_spec(tmp_path, out="results/exp1").workload
    assert work is not None
    assert work.exclude == ("/results/exp1/",)
    # An existing empty directory is fine: nothing of another run is in it.
    (tmp_path / "empty").mkdir()
    assert workload_spec(tmp_path, out="empty").workload is not None


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("1000", 1000),
        (1000, 1000),
        ("256M", 256 * 2**20),
        ("256m", 256 * 2**20),
        ("1G", 2**30),
        ("1GiB", 2**30),
        ("1.5K", 1536),
        (" 2 MB ", 2 * 2**20),
        ("1T", 2**40),
    ],
)
def test_sizes(text: str | int, size: int) -> None:
    assert parse_size("--max-upload", text) == size


@pytest.mark.parametrize("text", ["", "M", "-1", "0", "1e9", "1P", "2T", "12 parsecs", "nan"])
def test_bad_sizes(text: str) -> None:
    with pytest.raises(ConfigError, match="Invalid --max-upload") as caught:
        parse_size("--max-upload", text)
    assert "256M" in (caught.value.hint or "")


@pytest.mark.parametrize(
    "item", ["=1", "1A=2", "A B=1", "A-B=1", "", "A", "JAX_PLATFORMS=cpu", "tpulab_x=1"]
)
def test_bad_env(item: str) -> None:
    with pytest.raises(ConfigError, match="--env"):
        check_env(item)


@pytest.mark.parametrize(
    "text",
    [
        "--index-url=https://evil.example/simple",
        "-r other.txt",
        "pkg @ https://example.com/pkg.whl",
        "pkg; sys_platform == 'linux'",
        "pkg==",
        "pkg[",
        "",
        "a b",
    ],
)
def test_bad_requirements(text: str) -> None:
    with pytest.raises(ConfigError, match="Invalid --with"):
        check_requirement(text)


@pytest.mark.parametrize(
    ("text", "normal"),
    [("ckpt/", "ckpt/"), ("./a/./b", "a/b"), ("logs/**/*.json", "logs/**/*.json"), ("a\\b", "a/b")],
)
def test_workspace_patterns_are_normalised(text: str, normal: str) -> None:
    assert check_workspace_pattern(text, "--fetch") == normal


@pytest.mark.parametrize("text", ["..", "../x", "a/../../b", "a/..", "/abs", "~/x", "C:/x", " "])
def test_workspace_patterns_outside_are_refused(text: str) -> None:
    with pytest.raises(ConfigError, match="--fetch"):
        check_workspace_pattern(text, "--fetch")


def test_exclude_flags_come_after_the_files_patterns(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[tool.tpulab]\nexclude = ["data/", "*.bin"]\n', encoding="utf-8"
    )
    work = workload_spec(
        tmp_path, exclude=("logs/", "!keep.bin", "logs/"), out=str(tmp_path / "o")
    ).workload
    assert work is not None
    # Added to, not replacing, the file's; in order (later gitignore rules win, so the
    # flag's "!keep.bin" brings back what the file's "*.bin" excludes); duplicates once.
    assert work.exclude == ("data/", "*.bin", "logs/", "!keep.bin", "/o/")
    assert work.sources["exclude"] == "pyproject.toml [tool.tpulab] + --exclude"
    only_file = workload_spec(tmp_path, out=str(tmp_path / "p")).workload
    assert only_file is not None
    assert only_file.exclude == ("data/", "*.bin", "/p/")
    assert only_file.sources["exclude"] == "pyproject.toml [tool.tpulab]"
    (tmp_path / "pyproject.toml").unlink()
    only_flag = workload_spec(tmp_path, exclude=("*.bin",), out=str(tmp_path / "q")).workload
    assert only_flag is not None
    assert (only_flag.exclude, only_flag.sources["exclude"]) == (("*.bin", "/q/"), "--exclude")


_BAD_EXCLUDES = [
    ("", "is not a pattern"),
    ("   ", "is not a pattern"),
    ("a\nb", "is not a pattern"),
    ("#notes", "is a comment"),
    ("data\\", "ends with a backslash"),
    ("../secrets", "names nothing inside the workspace"),
    ("a/../../b", "names nothing inside the workspace"),
    ("~/x", "names nothing inside the workspace"),
    ("!", "names nothing inside the workspace"),
    ("/", "names nothing inside the workspace"),
]


@pytest.mark.parametrize(("pattern", "words"), _BAD_EXCLUDES)
def test_bad_exclude_patterns_are_refused_from_the_flag_and_the_file(
    tmp_path: Path, pattern: str, words: str
) -> None:
    with pytest.raises(ConfigError, match=words) as flag:
        check_exclude_pattern(pattern)
    assert repr(pattern) in flag.value.message  # names the pattern
    assert flag.value.message.startswith("--exclude ")
    quoted = pattern.replace("\\", "\\\\").replace("\n", "\\n")
    (tmp_path / "pyproject.toml").write_text(
        f'[tool.tpulab]\nexclude = ["ok/", "{quoted}"]\n', encoding="utf-8"
    )
    # The file's patterns pass the same check (the empty ones fail its list check first).
    with pytest.raises(ConfigError, match=words if pattern.strip() else "non-empty") as file:
        workload_spec(tmp_path)
    assert "pyproject.toml" in file.value.message


@pytest.mark.parametrize(
    "pattern", ["*.bin", "/data/", "!keep.bin", "\\#literal", "**/cache/**", "a b", "x\\\\"]
)
def test_good_exclude_patterns_pass_as_written(pattern: str) -> None:
    assert check_exclude_pattern(pattern) == pattern


def test_all_output_is_kept_and_refused_beside_quiet(tmp_path: Path) -> None:
    spec = workload_spec(tmp_path, all_output=True)
    assert spec.workload is not None
    assert spec.workload.all_output
    with pytest.raises(ConfigError, match="--all-output and --quiet contradict"):
        workload_spec(tmp_path, all_output=True, quiet=True)
