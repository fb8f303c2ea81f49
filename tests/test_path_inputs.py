"""Issue 20 #2, #5, #13, #4: path flags, symlink loops, a command line too long for the
VM, and file names that are not UTF-8.

The refusals go through the real CLI against a real emulator, which must have received
no API call at all (nothing created, nothing billed). Before the fix: an `--out` that
could not be created passed validation (the VM was created, then the fetch died with a
traceback); a symlink loop as a path flag or in the workspace raised `RuntimeError:
Symlink loop` (stdout empty with --json); a 131 KB argv was sent and read as a dropped
SSH connection; a non-UTF-8 file name in the run dir crashed the record after the
delete, leaving run.json "running" and the journal row open.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from typer.testing import CliRunner

from tpulab.cleanup.journal import Journal, RunJournalAdapter
from tpulab.cli import app
from tpulab.errors import ConfigError
from tpulab.exits import EXIT_CONFIG
from tpulab.remote import workload as wl
from tpulab.remote.selection import select_workspace
from tpulab.run.record import read_run_record

if TYPE_CHECKING:
    from run_rig import Rig

    from tpulab.emulator import Emulator

pytest_plugins = ["emulator_fixtures", "ssh_fixtures", "run_rig"]


def tpulab(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args))
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def run_with(emulator: Emulator, root: Path, *flags: str) -> tuple[int, str, str]:
    """`tpulab run` against `emulator` with the workspace `root` and `flags`; a stockout
    makes any create that slips through fail loudly, not run for minutes."""
    emulator.faults.stockout = True
    return tpulab(
        "run", "--accelerator", "v5litepod-4", "--api-endpoint", emulator.url,
        "--zone", "us-central1-a", "--project", "p-123456", "--workdir", str(root),
        *flags, "--", "python", "t.py",
    )  # fmt: skip


def refused(emulator: Emulator, code: int, err: str, *words: str) -> None:
    assert code == EXIT_CONFIG, err
    flat = " ".join(err.split())  # rich wraps long lines
    for word in words:
        assert word in flat, flat
    assert sum(emulator.calls.values()) == 0, dict(emulator.calls)
    assert emulator.node_names() == []


@pytest.fixture
def lab(tmp_path: Path) -> Path:
    root = tmp_path / "lab"
    root.mkdir()
    (root / "t.py").write_text("print(1)\n")
    (root / "FILE").write_text("a file, not a directory\n")
    return root


@pytest.fixture
def looped(lab: Path) -> Path:
    """The workspace with two links pointing at each other."""
    os.symlink("loop-b", lab / "loop-a")
    os.symlink("loop-a", lab / "loop-b")
    return lab


# -- #2: --out proven creatable and writable before the create ---------------------------


@pytest.mark.parametrize(
    ("out", "words"),
    [
        ("FILE/sub", ["--out", "FILE/sub cannot be created", "FILE is not a directory"]),
        ("FILE/a/b", ["--out", "FILE is not a directory"]),
        ("x" * 300, ["--out", "File name too long"]),
        ("ok/" + "y" * 300 + "/z", ["--out", "File name too long"]),
    ],
)
def test_an_out_that_cannot_be_created_creates_nothing(
    emulator: Emulator, lab: Path, out: str, words: list[str]
) -> None:
    code, _, err = run_with(emulator, lab, "--out", str(lab / out))
    refused(emulator, code, err, *words)
    assert not (lab / "ok").exists(), "a refused run left a directory behind"


def test_an_out_on_a_filesystem_that_refuses_writes_creates_nothing(
    emulator: Emulator, lab: Path
) -> None:
    # /proc refuses mkdir for everyone, root included (a chmod'ed directory would not
    # stop root, who runs the suite in containers).
    code, _, err = run_with(emulator, lab, "--out", "/proc/tpulab-out")
    refused(emulator, code, err, "--out /proc/tpulab-out cannot be written")


def test_an_out_that_is_not_utf8_creates_nothing(emulator: Emulator, lab: Path) -> None:
    # run.json and the journal's pointer record --out as text that must lead back to it.
    odd = os.fsdecode(bytes(lab) + b"/out-\xff")
    code, _, err = run_with(emulator, lab, "--out", odd)
    refused(emulator, code, err, "out-\\xff is not a UTF-8 path")
    assert not os.path.lexists(odd)


def test_the_default_out_is_checked_too(tmp_path: Path) -> None:
    from tpulab.config.local_paths import prove_creatable

    # The default ./tpulab-runs/<id>/ where the current directory is a file's child.
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match=r"cannot be created: .*file is not a directory"):
        prove_creatable(blocker / "tpulab-runs" / "r1", "--out (default)", hint="h")


def test_proving_an_out_leaves_nothing_behind(tmp_path: Path) -> None:
    from tpulab.config.local_paths import prove_creatable

    deep = tmp_path / "new" / "a" / "b"
    prove_creatable(deep, "--out", hint="h")
    assert list(tmp_path.iterdir()) == []
    existing = tmp_path / "empty"
    existing.mkdir()
    prove_creatable(existing, "--out", hint="h")
    assert list(existing.iterdir()) == []


def test_a_run_refused_after_the_out_check_leaves_no_out_behind(
    emulator: Emulator, lab: Path, tmp_path: Path
) -> None:
    # The secret check runs in the lifecycle's validation, after the --out probe.
    (lab / ".env").write_text("TOKEN=abc\n")
    out = tmp_path / "artifacts" / "run-1"
    code, _, err = run_with(emulator, lab, "--out", str(out))
    refused(emulator, code, err, ".env")
    assert not (tmp_path / "artifacts").exists()


# -- #5: symlink loops --------------------------------------------------------------------


@pytest.mark.parametrize("flag", ["--workdir", "--out", "--requirements"])
def test_a_symlink_loop_as_a_path_flag_is_exit_2(
    emulator: Emulator, looped: Path, flag: str
) -> None:
    lab = looped
    emulator.faults.stockout = True
    code, _, err = tpulab(
        "run", "--accelerator", "v5litepod-4", "--api-endpoint", emulator.url,
        "--zone", "us-central1-a", "--project", "p-123456",
        *(["--workdir", str(lab)] if flag != "--workdir" else []),
        flag, str(lab / "loop-a"), "--", "python", "t.py",
    )  # fmt: skip
    refused(emulator, code, err, flag, "loop-a goes through a symbolic link loop")


def test_a_symlink_loop_in_the_project_file_is_exit_2(emulator: Emulator, looped: Path) -> None:
    lab = looped
    (lab / "tpulab.toml").write_text('requirements = "loop-a"\n')
    code, _, err = run_with(emulator, lab)
    refused(emulator, code, err, "requirements in", "symbolic link loop")


def test_a_symlink_loop_with_json_still_prints_the_envelope(looped: Path) -> None:
    lab = looped
    code, out, _ = tpulab(
        "run", "--accelerator", "v5litepod-4", "--emulate", "--dry-run", "--json",
        "--workdir", str(lab), "--out", str(lab / "loop-b"), "--", "python", "t.py",
    )  # fmt: skip
    assert code == EXIT_CONFIG
    envelope = json.loads(out)
    assert envelope["ok"] is False
    assert envelope["error"]["exit_status"] == EXIT_CONFIG
    assert "symbolic link loop" in envelope["error"]["message"]


def test_a_symlink_loop_inside_the_workspace_is_skipped_and_named(looped: Path) -> None:
    lab = looped
    (lab / "deep").mkdir()
    os.symlink("self", lab / "deep" / "self")
    selection = select_workspace(lab)
    assert {path for path, _ in selection.files} == {"FILE", "t.py"}
    assert selection.loops == ("deep/self", "loop-a", "loop-b")
    assert selection.skipped["symlink loops"] == 3
    assert "3 symlink loops: deep/self, loop-a, loop-b" in selection.describe()
    # ... and a dry run over it plans the run instead of crashing.
    code, out, _ = tpulab(
        "run", "--accelerator", "v5litepod-4", "--emulate", "--dry-run", "--json",
        "--workdir", str(lab), "--out", str(lab.parent / "out"), "--", "python", "t.py",
    )  # fmt: skip
    assert code == 0, out
    assert json.loads(out)["ok"] is True


# -- #13: a command line the VM cannot exec -----------------------------------------------


@pytest.mark.parametrize(
    ("flags", "largest"),
    [
        (["--", "python", "t.py", "x" * 131_000], "argument 3 of the command, 131,000 bytes"),
        (
            ["--env", "A=" + "a" * 100_000, "--env", "B=" + "b" * 100_000, "--", "python", "t.py"],
            "the value of A, 100,000 bytes",
        ),
    ],
)
def test_a_command_line_over_the_bound_is_refused_before_the_create(
    emulator: Emulator, lab: Path, flags: list[str], largest: str
) -> None:
    emulator.faults.stockout = True
    code, _, err = tpulab(
        "run", "--accelerator", "v5litepod-4", "--api-endpoint", emulator.url,
        "--zone", "us-central1-a", "--project", "p-123456", "--workdir", str(lab), *flags,
    )  # fmt: skip
    refused(emulator, code, err, "over the 98,304-byte (96 KiB) limit", largest, "E2BIG")


def test_the_bound_applies_to_the_quoted_line_that_is_sent() -> None:
    env = {"TPULAB_RUN_ID": "r"}
    base = wl.launch_command(["python", "t.py", "x"], timeout=60)
    overhead = len(wl.checked_launch_line(base, env=env, timeout=100).encode()) - 1
    fits = wl.launch_command(
        ["python", "t.py", "x" * (wl.MAX_COMMAND_LINE_BYTES - overhead)], timeout=60
    )
    assert len(wl.checked_launch_line(fits, env=env, timeout=100)) == wl.MAX_COMMAND_LINE_BYTES
    over = wl.launch_command(
        ["python", "t.py", "x" * (wl.MAX_COMMAND_LINE_BYTES - overhead + 1)], timeout=60
    )
    with pytest.raises(ConfigError, match="98,305 bytes"):
        wl.checked_launch_line(over, env=env, timeout=100)
    # Quoting counts: 6 000 single quotes are sent as 102 KB (17 bytes each, quoted twice).
    quotes = wl.launch_command(["echo", "'" * 6000], timeout=60)
    with pytest.raises(ConfigError, match="argument 2 of the command, 6,000 bytes"):
        wl.checked_launch_line(quotes, env=env, timeout=100)


# -- #4: file names that are not UTF-8 ----------------------------------------------------


def test_undecodable_names_are_escaped_as_their_bytes() -> None:
    from tpulab.envelope import escape_undecodable

    name = os.fsdecode(b"run/\xff\xfe.bin")
    assert escape_undecodable(name) == "run/\\xff\\xfe.bin"
    assert escape_undecodable("café.bin") == "café.bin"  # valid UTF-8 stays as it is


@pytest.mark.slow
def test_a_non_utf8_file_name_is_recorded_and_the_run_closes(
    embedded_rig: Rig, tmp_path: Path
) -> None:
    from test_workload_e2e import with_workload, workspace

    work = workspace(tmp_path, {"w.py": _WRITES_ODD_NAMES})
    out = tmp_path / "out"
    # A 90 KiB argument travels too: a command line under the bound runs on the VM.
    filler = "z" * (90 * 1024)
    spec = with_workload(embedded_rig.spec(), work, out, "python", "w.py", filler)
    _life, _recorder, error = embedded_rig.run(spec, journal=RunJournalAdapter())
    assert error is None, error
    assert embedded_rig.leftovers() == []
    assert (out / "run" / os.fsdecode(b"\xff.bin")).read_bytes() == b"odd\n"
    assert (out / "run" / "argv.txt").read_text() == str(len(filler))

    record = read_run_record(out / "run.json")
    assert record.state == "finished"
    assert record.ok
    fetched = {entry.path for entry in record.fetch}
    assert {"run/\\xff.bin", "run/ok-\\xfe\\xfd.txt", "run/argv.txt"} <= fetched
    row = Journal().get(spec.run_id)
    assert row is not None
    assert row.teardown == "confirmed"
    assert row.detail == "ok"

    shown = CliRunner().invoke(app, ["runs", "show", spec.run_id, "--json"])
    assert shown.exit_code == 0, shown.output
    assert "run/\\xff.bin" in {entry["path"] for entry in json.loads(shown.stdout)["fetch"]}


_WRITES_ODD_NAMES = """\
import os, sys
run = os.environ["TPULAB_RUN_DIR"].encode()
with open(os.path.join(run, b"\\xff.bin"), "w") as handle:
    handle.write("odd\\n")
with open(os.path.join(run, b"ok-\\xfe\\xfd.txt"), "w") as handle:
    handle.write("odder\\n")
with open(os.path.join(run, b"argv.txt"), "w") as handle:
    handle.write(str(len(sys.argv[1])))
"""


@pytest.mark.slow
def test_a_record_that_cannot_be_written_at_the_end_still_closes_the_journal_row(
    embedded_rig: Rig, tmp_path: Path
) -> None:
    """A failure after the delete (here: the final run.json refused with an error that is
    not an OSError, as the surrogates of a non-UTF-8 name were) is a note; the journal row
    still says the teardown was confirmed, and run.json is written without the file lists.
    Before, the error escaped _finish: the row stayed open (later closed as 'deleted by
    its watchdog') and run.json said "running"."""
    from test_workload_e2e import with_workload, workspace

    from tpulab.run.record import RunRecord, write_run_record

    def refuses_the_end(record: RunRecord, out: Path) -> Path:
        if record.state == "finished" and record.fetch:
            raise ValueError("the record cannot hold this")
        return write_run_record(record, out)

    work = workspace(tmp_path, {"hello.py": "print('hello')\n"})
    spec = with_workload(embedded_rig.spec(), work, tmp_path / "out", "python", "hello.py")
    _life, recorder, error = embedded_rig.run(
        spec, journal=RunJournalAdapter(), write_record=refuses_the_end
    )
    assert error is None, error
    assert embedded_rig.leftovers() == []
    row = Journal().get(spec.run_id)
    assert row is not None
    assert (row.teardown, row.detail) == ("confirmed", "ok")
    assert any("could not write run.json: ValueError" in note for note in recorder.notes)
    # ... and run.json says how the run ended (not the start's "running"), without the
    # file lists it could not hold; their counts stay.
    record = read_run_record(tmp_path / "out" / "run.json")
    assert (record.state, record.ok, record.fetch) == ("finished", True, [])
    assert record.workload.exit_status == 0
    assert record.workload.fetched_files  # output.log at least
