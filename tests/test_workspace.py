"""What `select_workspace` lets go up, and what it refuses before anything is created."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from helpers import write_tree

from tpulab.errors import ConfigError, WorkspaceError
from tpulab.remote.manifest import LeftBehind
from tpulab.remote.workspace import (
    Manifest,
    ManifestEntry,
    check_fetch_patterns,
    select_workspace,
)

PEM = (
    "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n"
    "-----END OPENSSH PRIVATE KEY-----\n"
)


def _paths(root: Path, **kwargs: object) -> set[str]:
    return {path for path, _size in select_workspace(root, **kwargs).files}  # type: ignore[arg-type]


def test_missing_or_non_directory_root_is_refused(tmp_path: Path) -> None:
    with pytest.raises(WorkspaceError, match="does not exist") as missing:
        select_workspace(tmp_path / "nope")
    assert missing.value.hint
    assert "--workdir" in missing.value.hint
    assert isinstance(missing.value, ConfigError)  # exit status 2, nothing created
    file = tmp_path / "file"
    file.write_text("x")
    with pytest.raises(WorkspaceError, match="not a directory"):
        select_workspace(file)


def test_always_excluded_whatever_the_ignore_files_say(tmp_path: Path) -> None:
    root = write_tree(
        tmp_path / "ws",
        {
            "train.py": "print()",
            ".git/config": "[core]",
            ".venv/bin/python": "x",
            "venv/lib/x.py": "x",
            "myenv/pyvenv.cfg": "home = /usr",  # a virtualenv by its marker, any name
            "myenv/lib/site.py": "x",
            "pkg/__pycache__/m.cpython-311.pyc": b"\0",
            "pkg/m.py": "x",
            "tpulab-runs/r1/run.json": "{}",
            ".nox/s/x": "x",
            ".gitignore": "!.venv/\n!tpulab-runs/\n!results/\n",  # cannot re-include them
            # An earlier run's --out inside the workdir, by tpulab's record in it...
            "results/r1/run.json": json.dumps({"schema_version": 1, "command": "run",
                                              "run_id": "20261207t111738-39c396"}),
            "results/r1/run/ckpt.npz": b"\0" * 1000,
            # ... not a directory with a run.json of the user's own.
            "conf/run.json": json.dumps({"steps": 10}),
        },
    )  # fmt: skip
    selection = select_workspace(root)
    assert {path for path, _ in selection.files} == {
        ".gitignore",
        "conf/run.json",
        "pkg/m.py",
        "train.py",
    }
    assert selection.skipped["always excluded"] == 8


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("deploy/server.pem", "cert"),
        ("tls.key", "k"),
        ("keys/id_rsa", "x"),
        ("id_ed25519", "x"),
        (".env", "TOKEN=1"),
        (".env.production", "TOKEN=1"),
        (".netrc", "machine x"),
        (".pypirc", "[pypi]"),
        ("notes/innocent.txt", "see below\n" + PEM),  # by content, whatever the name
        ("conf/sa.json", json.dumps({"type": "service_account", "project_id": "p"})),
        ("conf/adc.json", json.dumps({"type": "authorized_user", "refresh_token": "r"})),
        ("conf/other.json", json.dumps({"private_key": "-----BEGIN", "x": 1})),
    ],
)
def test_secret_looking_files_are_refused_unless_allowed(
    tmp_path: Path, name: str, content: str
) -> None:
    root = write_tree(tmp_path / "ws", {"train.py": "print()", name: content})
    with pytest.raises(WorkspaceError) as refused:
        select_workspace(root)
    assert name in refused.value.message
    assert refused.value.hint
    assert "--allow-secret" in refused.value.hint
    assert ".tpulabignore" in refused.value.hint
    assert _paths(root, allow_secrets=[name]) == {"train.py", name}
    assert _paths(root, allow_secrets=["./" + name]) == {"train.py", name}  # normalised


def test_ignored_secrets_are_not_refused_and_ordinary_json_is_fine(tmp_path: Path) -> None:
    root = write_tree(
        tmp_path / "ws",
        {
            "train.py": "print()",
            ".env": "TOKEN=1",
            "secrets/sa.json": json.dumps({"type": "service_account"}),
            ".tpulabignore": ".env\nsecrets/\n",
            "config.json": json.dumps({"type": "model", "layers": 2}),
            "id_rsa.pub": "ssh-rsa AAAA",  # the public half is not a secret
        },
    )
    assert _paths(root) == {".tpulabignore", "config.json", "id_rsa.pub", "train.py"}


def test_allow_secret_naming_nothing_is_an_error(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "ws", {"train.py": "x"})
    with pytest.raises(WorkspaceError, match="'keys/id_rsa'"):
        select_workspace(root, allow_secrets=["keys/id_rsa"])
    with pytest.raises(WorkspaceError, match="leaves the workspace"):
        select_workspace(root, allow_secrets=["../id_rsa"])


def test_over_the_cap_lists_the_largest_entries(tmp_path: Path) -> None:
    files: dict[str, str | bytes] = {f"small/{i}.txt": b"x" * 10 for i in range(30)}
    files |= {"data/big.bin": b"\0" * 5000, "data/medium.bin": b"\0" * 3000}
    root = write_tree(tmp_path / "ws", files)
    with pytest.raises(WorkspaceError) as refused:
        select_workspace(root, max_bytes=4000)
    message = refused.value.message
    assert "32 files" in message
    assert message.index("data/big.bin") < message.index("data/medium.bin")
    assert message.count("small/") == 8  # ten largest: two big ones, eight small
    assert refused.value.hint
    assert "--max-upload" in refused.value.hint
    assert ".tpulabignore" in refused.value.hint
    selection = select_workspace(root, max_bytes=8300)
    assert selection.total_bytes == 8300
    assert selection.largest(2) == [("data/big.bin", 5000), ("data/medium.bin", 3000)]


def test_a_workspace_over_the_cap_is_refused_on_its_sizes_before_any_content_is_read(
    tmp_path: Path,
) -> None:
    """`--workdir ~` (140,000 files here under /usr): every file's content was sniffed
    for secrets (15 s) before the cap refused it, and the refusal named the secrets, not
    the size."""
    root = write_tree(
        tmp_path / "ws", {"data/big.bin": b"\0" * 5000, "notes/innocent.txt": "x\n" + PEM}
    )
    with pytest.raises(WorkspaceError) as refused:
        select_workspace(root, max_bytes=4000)
    assert "over the 3.9 KiB cap" in refused.value.message
    assert "secret" not in refused.value.message
    # Under the cap, the secret is found as before.
    with pytest.raises(WorkspaceError, match="look like secrets"):
        select_workspace(root)


def test_describe_counts_files_and_bytes(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "ws", {f"f{i:04}": b"\0" * 512 for i in range(2000)})
    (root / ".git").mkdir()
    assert (
        select_workspace(root).describe() == "2 000 files, 1000.0 KiB (skipped: 1 always excluded)"
    )


def test_symlinks_inside_go_up_as_files_and_leaving_ones_are_skipped(tmp_path: Path) -> None:
    outside = write_tree(tmp_path / "outside", {"secret.txt": "not yours"})
    root = write_tree(tmp_path / "ws", {"real.txt": "real", "dir/a.txt": "a"})
    os.symlink("real.txt", root / "alias.txt")
    os.symlink(outside / "secret.txt", root / "escape.txt")
    os.symlink(outside, root / "escape_dir")
    os.symlink("dir", root / "dir_alias")
    selection = select_workspace(root)
    assert {path for path, _ in selection.files} == {"alias.txt", "dir/a.txt", "real.txt"}
    assert selection.skipped == {"symlinks leaving the workspace or to directories": 3}


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        ("", "not inside the workspace"),
        ("/etc/passwd", "not inside the workspace"),
        ("~/x", "not inside the workspace"),
        ("../x", r"leaves the workspace \(\.\.\)"),
        ("out/../../x", "leaves the workspace"),
        ("C:\\x", "not inside the workspace"),
        ("a\0b", "NUL"),
    ],
)
def test_fetch_patterns_outside_the_workspace_are_refused(pattern: str, why: str) -> None:
    with pytest.raises(WorkspaceError, match=why) as refused:
        check_fetch_patterns([pattern])
    assert refused.value.hint or why == "NUL"


def test_fetch_patterns_are_normalised_by_the_config_rule() -> None:
    assert check_fetch_patterns(["./out/", "ckpt/**/*.npz", "a//b", "."]) == (
        "out/",
        "ckpt/**/*.npz",
        "a/b",
        ".",
    )


def test_manifest_json_round_trip_and_refusals() -> None:
    entry = ManifestEntry("a/b.txt", 3, "0" * 64)
    manifest = Manifest((entry,))
    assert Manifest.from_json_obj(manifest.to_json_obj()) == manifest
    assert manifest.count == 1
    assert manifest.total_bytes == 3
    for bad in ({"path": "a"}, [{"path": "a", "bytes": -1, "sha256": "0" * 64}], [{"x": 1}]):
        with pytest.raises(ValueError):
            Manifest.from_json_obj(bad)
    with pytest.raises(ValueError, match="sha256"):
        Manifest.from_json_obj([{"path": "a", "bytes": 1, "sha256": "zz"}])


def test_what_a_fetch_left_reads_back_and_a_malformed_one_is_refused() -> None:
    first = ("a\nb.txt", "out/x", "out/y")
    left = LeftBehind(files=7, bytes=3 * 2**20, first=first, complete=False)
    assert Manifest.from_json_obj([], left=left.to_json_obj()) == Manifest((), left=left)
    # At least 7 (the VM stopped looking); a name with a newline cannot break the line.
    assert left.describe(gone=True) == (
        "at least 7 files (3.0 MiB) your command wrote in the workspace were not fetched "
        "and went with the VM: 'a\\nb.txt', out/x, out/y; --fetch 'out/**' brings them"
    )
    # A session's exec: they stay. The fetch's own line, before the teardown: neither.
    assert " not fetched (they stay in the workspace on the VM): " in left.describe(gone=False)
    assert " not fetched: 'a\\nb.txt'" in left.describe()
    good = left.to_json_obj()
    bad: object
    for bad in (
        [],
        {**good, "files": -1},
        {**good, "files": True},
        {**good, "first": "out/x"},
        {**good, "first": [1]},
        {**good, "complete": "yes"},
        {**good, "extra": 1},
    ):
        with pytest.raises(ValueError, match="malformed 'left'"):
            Manifest.from_json_obj([], left=bad)


def test_a_link_to_an_ignored_secret_is_skipped_like_its_target(tmp_path: Path) -> None:
    # `ln -s .env config.txt` once sent the ignored .env up under the link's name.
    root = write_tree(
        tmp_path / "ws",
        {"train.py": "print()", ".env": "TOKEN=1", ".gitignore": ".env\nlogs/\n"},
    )
    os.symlink(".env", root / "config.txt")
    write_tree(root, {"logs/run.log": "x"})
    os.symlink("logs/run.log", root / "latest.log")  # inside an ignored directory
    os.symlink(".git/config", root / "gitconfig")  # inside an always-excluded one
    write_tree(root, {".git/config": "[core]"})
    selection = select_workspace(root)
    assert {path for path, _ in selection.files} == {".gitignore", "train.py"}
    assert selection.skipped_links == (
        "config.txt -> .env (ignored)",
        "gitconfig -> .git/config (always excluded)",
        "latest.log -> logs/run.log (ignored)",
    )
    assert "config.txt -> .env (ignored)" in selection.describe()
    assert selection.skipped["links to ignored files"] == 2


@pytest.mark.parametrize("target", [".env", ".envrc", "keys/deploy.pem", ".pgpass"])
def test_a_link_to_a_secret_is_refused_naming_link_and_target(tmp_path: Path, target: str) -> None:
    root = write_tree(tmp_path / "ws", {"train.py": "print()", target: "TOKEN=1"})
    os.symlink(target, root / "config.txt")
    with pytest.raises(WorkspaceError) as refused:
        select_workspace(root, allow_secrets=[target])  # the target itself is allowed
    assert f"config.txt (a link to {target}):" in refused.value.message
    assert _paths(root, allow_secrets=[target, "config.txt"]) == {"train.py", target, "config.txt"}


@pytest.mark.parametrize("name", [".envrc", ".pgpass", ".my.cnf", ".s3cfg", ".vault-token"])
def test_more_credential_files_are_flagged_by_name(tmp_path: Path, name: str) -> None:
    root = write_tree(tmp_path / "ws", {"train.py": "print()", name: "x"})
    with pytest.raises(WorkspaceError, match=re.escape(f"{name}: a credentials file by name")):
        select_workspace(root)


def test_over_the_cap_says_by_how_much_and_exact_bytes_when_they_round_alike(
    tmp_path: Path,
) -> None:
    root = write_tree(tmp_path / "ws", {"a.bin": b"\0" * (3 * 2**20 + 1)})
    with pytest.raises(WorkspaceError) as barely:
        select_workspace(root, max_bytes=3 * 2**20)
    # Once "3.0 MiB, over the 3.0 MiB cap": no excess to be seen.
    assert "3.0 MiB: 1 B over the 3.0 MiB cap (3 145 729 bytes against 3 145 728)" in (
        barely.value.message
    )
    with pytest.raises(WorkspaceError) as clearly:
        select_workspace(root, max_bytes=2 * 2**20)
    assert "3.0 MiB: 1.0 MiB over the 2.0 MiB cap; the largest" in clearly.value.message
