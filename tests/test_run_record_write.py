"""run.json when the disk or the record refuses it (tpulab/run/record.py `write_or_reduce`).

A run's record is a note when it cannot be written, never a reason to misreport the run;
a record whose file lists cannot be written (a name that cannot be encoded) is written
without them, so it still says how the run ended rather than the start's "running".
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tpulab.run.record import FileEntry, RunRecord, write_or_reduce

ENTRY = FileEntry(path="data/a.bin", bytes=3, sha256="0" * 64)


def _record() -> RunRecord:
    # model_construct: the writers below never serialize it, so only the fields the
    # fallback touches matter.
    return RunRecord.model_construct(
        command="run", ok=True, upload=[ENTRY], fetch=[ENTRY], upload_sent=[ENTRY]
    )


class Disk:
    """A `write` seam that refuses what it is told to, and keeps what it was given."""

    def __init__(self, refuse: list[BaseException | None]) -> None:
        self.refuse = refuse
        self.given: list[RunRecord] = []

    def __call__(self, record: RunRecord, out: Path) -> Path:
        self.given.append(record)
        error = self.refuse[len(self.given) - 1]
        if error is not None:
            raise error
        return out / "run.json"


def test_a_record_written_first_time_says_nothing(tmp_path: Path) -> None:
    notes: list[str] = []
    disk = Disk([None])
    assert write_or_reduce(_record(), tmp_path, write=disk, note=notes.append) == (
        tmp_path / "run.json"
    )
    assert notes == []
    assert disk.given[0].upload == [ENTRY]


def test_file_lists_the_record_cannot_hold_are_dropped_and_said(tmp_path: Path) -> None:
    notes: list[str] = []
    disk = Disk([UnicodeEncodeError("utf-8", "\udcff", 0, 1, "surrogates not allowed"), None])
    path = write_or_reduce(_record(), tmp_path, write=disk, note=notes.append)
    assert path == tmp_path / "run.json"
    reduced = disk.given[1]
    assert (reduced.upload, reduced.fetch, reduced.upload_sent) == ([], [], None)
    assert reduced.ok is True  # how the run ended is kept
    assert notes[0].startswith("could not write run.json: UnicodeEncodeError")
    assert notes[1] == "run.json was written without its file lists"


def test_a_disk_that_refuses_is_not_asked_again(tmp_path: Path) -> None:
    notes: list[str] = []
    disk = Disk([OSError(28, "No space left on device"), None])
    assert write_or_reduce(_record(), tmp_path, write=disk, note=notes.append) is None
    assert len(disk.given) == 1
    assert notes == ["could not write run.json: OSError: [Errno 28] No space left on device"]


@pytest.mark.parametrize("again", [ValueError("still bad"), OSError(5, "I/O error")])
def test_when_the_reduced_record_fails_too_both_are_said(
    tmp_path: Path, again: BaseException
) -> None:
    notes: list[str] = []
    disk = Disk([ValueError("bad name"), again])
    assert write_or_reduce(_record(), tmp_path, write=disk, note=notes.append) is None
    assert notes == [
        "could not write run.json: ValueError: bad name",
        f"could not write run.json without its file lists: {again}",
    ]
