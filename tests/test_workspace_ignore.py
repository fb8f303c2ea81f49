"""The gitignore matcher is pinned against git itself: for each table row, the files that
`select_workspace` uploads must be exactly the untracked, non-ignored files that
`git ls-files --others --exclude-standard` lists for the same tree (and, for
`.tpulabignore`, with git told to read that file name instead)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import require_tool

from tpulab.remote.workspace import select_workspace

# A tree with names each rule below has to get right (no symlinks, nothing in
# ALWAYS_EXCLUDED: those are tested on their own).
TREE = [
    "a.log",
    "keep.log",
    "sub/b.log",
    "sub/keep.log",
    "build/out.o",
    "src/build",  # a FILE named build: a dir-only rule must not take it
    "src/main.py",
    "src/util.py",
    "src/data.csv",
    "root_only.txt",
    "sub/root_only.txt",
    "docs/guide.md",
    "docs/deep/guide.md",
    "README.md",
    "tmp/x",
    "deep/er/tmp/y",
    "a/z",
    "a/b/z",
    "a/b/c/z",
    "a/b/c/w",
    "logs/1/2.txt",
    "logs/top.txt",
    "cache/k",
    "src/cache/k",
    "a.txt",
    "b.txt",
    "d.txt",
    "xy.txt",
    "ay.txt",
    "1.dat",
    "12.dat",
    "#hash",
    "!bang",
    "trailing-space",
    "sub/note.txt",
    "sub/important.txt",
    "sub/more/other.txt",
    "sub/page.md",
    "data/keep",
    "data/drop",
    "notes.TXT",
    "weird name.txt",
]

CASES: dict[str, dict[str, str]] = {
    "negation": {".gitignore": "*.log\n!keep.log\n"},
    "negation-anchored": {".gitignore": "*.log\n!/keep.log\n"},
    "dir-only": {".gitignore": "build/\n"},
    "anchored": {".gitignore": "/root_only.txt\n"},
    "unanchored-name": {".gitignore": "root_only.txt\n"},
    "middle-slash": {".gitignore": "docs/*.md\n"},
    "leading-double-star": {".gitignore": "**/tmp\n"},
    "inner-double-star": {".gitignore": "a/**/z\n"},
    "trailing-double-star": {".gitignore": "logs/**\n!logs/top.txt\n"},
    "dir-only-anywhere": {".gitignore": "**/cache/\n"},
    "classes": {".gitignore": "[ab].txt\n[!x]y.txt\n?.dat\n"},
    "escapes-and-comments": {".gitignore": "# a comment\n\\#hash\n\\!bang\ntrailing-space   \n"},
    "nested-files": {
        ".gitignore": "sub/*.md\n",
        "sub/.gitignore": "*.txt\n!important.txt\n",
    },
    "cannot-reinclude-under-excluded-dir": {".gitignore": "data/\n!data/keep\n"},
    "reinclude-under-star": {".gitignore": "data/*\n!data/keep\n"},
    "whitelist": {".gitignore": "*\n!*/\n!*.py\n"},
    "deeper-overrides": {".gitignore": "!*.log\n", "sub/.gitignore": "*.log\n"},
    "star-in-dir-name": {".gitignore": "a/*/z\n"},
    "case-sensitive": {".gitignore": "*.txt\n"},
    "blank-and-space": {".gitignore": "\n   \nweird name.txt\n"},
}


def _make_tree(root: Path, ignore_files: dict[str, str], ignore_name: str) -> None:
    for rel in TREE:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(rel)
    for rel, text in ignore_files.items():
        target = root / rel.replace(".gitignore", ignore_name)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)


def _git_selection(root: Path, ignore_name: str) -> set[str]:
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    flag = (
        "--exclude-standard"
        if ignore_name == ".gitignore"
        else f"--exclude-per-directory={ignore_name}"
    )
    listed = subprocess.run(
        ["git", "-C", str(root), "ls-files", "--others", "-z", flag],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return {name for name in listed.split("\0") if name}


@pytest.mark.parametrize("ignore_name", [".gitignore", ".tpulabignore"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_selection_matches_git(case: str, ignore_name: str, tmp_path: Path) -> None:
    require_tool(shutil.which("git") is not None, "git")
    root = tmp_path / "ws"
    _make_tree(root, CASES[case], ignore_name)
    expected = _git_selection(root, ignore_name)
    shutil.rmtree(root / ".git")  # always excluded anyway; keep the walk identical
    selected = {path for path, _size in select_workspace(root).files}
    assert selected == expected


def test_exclude_patterns_use_the_same_rules(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    _make_tree(root, {}, ".gitignore")
    selection = select_workspace(root, exclude=["*.log", "!keep.log", "a/**/z", "/docs/"])
    selected = {path for path, _size in selection.files}
    assert "a.log" not in selected
    assert "sub/b.log" not in selected
    assert {"keep.log", "sub/keep.log", "src/main.py"} <= selected
    assert not {"a/z", "a/b/z", "a/b/c/z"} & selected
    assert "a/b/c/w" in selected
    assert not any(path.startswith("docs/") for path in selected)
    assert selection.skipped["ignored"] >= 6
