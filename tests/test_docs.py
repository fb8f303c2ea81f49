"""The front door: the README and the docs site say only what works.

- every command and option has help text, and the generated CLI reference lists them all;
- every page under docs/ is in the site's nav, and every relative link of the README and
  the docs points at a file that exists;
- every `tpulab ...` example in the README, the docs and the commands' help that carries
  `--emulate` or `--dry-run` runs as pasted (from a directory holding a copy of
  examples/) and exits 0.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tpulab.cli._reference import cli_reference, missing_help, walk

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"


def _doc_files() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md") if "hooks" not in p.parts)


def test_every_command_and_option_has_help() -> None:
    assert missing_help() == []


def test_the_reference_lists_every_command_and_option() -> None:
    reference = cli_reference()
    for entry in walk():
        if entry.path == "tpulab":
            continue
        assert f"`{entry.path}`" in reference, entry.path
        for param in entry.command.params:
            if getattr(param, "hidden", False):
                continue
            for opt in getattr(param, "opts", []):
                if opt.startswith("-") and opt != "--help":
                    assert f"`{opt}" in reference, f"{entry.path} {opt}"


def test_every_page_is_in_the_nav() -> None:
    config = (REPO / "mkdocs.yml").read_text()
    nav = set(re.findall(r":\s*([\w/-]+\.md)\s*$", config, flags=re.MULTILINE))
    pages = {p.relative_to(DOCS).as_posix() for p in _doc_files()}
    assert pages == nav


_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


@pytest.mark.parametrize(
    "page", [REPO / "README.md", *_doc_files()], ids=lambda p: p.relative_to(REPO).as_posix()
)
def test_relative_links_resolve(page: Path) -> None:
    # Code (fenced blocks and `spans`) is not prose: `[a-z](...)` there is no link.
    prose = re.sub(r"`[^`\n]*`", "", _FENCE.sub("", page.read_text()))
    broken = [
        target
        for target in _LINK.findall(prose)
        if "://" not in target
        and not target.startswith("mailto:")
        and not (page.parent / target).exists()
    ]
    assert broken == []


# -- the examples, run as pasted -------------------------------------------------------

_FENCE = re.compile(r"```(?:bash|sh|console)?\n(.*?)```", flags=re.DOTALL)


def _commands(text: str) -> list[str]:
    """`tpulab ...` command lines of the shell blocks in `text`: continuations joined,
    trailing comments dropped, a leading install (`... && .venv/bin/tpulab ...`) cut."""
    found = []
    for block in _FENCE.findall(text):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#\s.*$", "", line).strip()
            line = re.sub(r"^.*&&\s*\.venv/bin/(?=tpulab )", "", line)
            if line.startswith("tpulab "):
                found.append(" ".join(line.split()))
    return found


def _is_synopsis(argv: list[str]) -> bool:
    # `tpulab run [--zone Z ...|auto]` describes a command's shape; it is not an example.
    return any(token.startswith(("[", "|")) or token in ("...", "S", "URL") for token in argv)


def _examples() -> list[str]:
    sources = [(REPO / "README.md").read_text(), *(p.read_text() for p in _doc_files())]
    help_text = "\n".join(f"```bash\n{line.strip()}\n```" for line in cli_reference().splitlines())
    commands = [*(c for s in sources for c in _commands(s)), *_commands(help_text)]
    chosen = []
    for command in commands:
        argv = shlex.split(command)
        if _is_synopsis(argv) or not {"--emulate", "--dry-run"} & set(argv):
            continue
        if command not in chosen:
            chosen.append(command)
    return chosen


def test_the_examples_are_found() -> None:
    examples = _examples()
    # The quickstart's emulated run and the README's first dry run, at least.
    assert "tpulab run --accelerator v5litepod-4 --emulate" in examples
    assert any("--dry-run" in e for e in examples)


@pytest.mark.parametrize("command", _examples())
def test_example_runs_as_pasted(command: str, tmp_path: Path) -> None:
    shutil.copytree(REPO / "examples", tmp_path / "examples")
    argv = shlex.split(command)
    result = subprocess.run(
        [sys.executable, "-m", "tpulab", *argv[1:]],
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=280,
        env={**os.environ, "COLUMNS": "200"},
        check=False,
    )
    assert result.returncode == 0, f"{command}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"


def test_run_up_and_exec_show_every_option_in_a_named_panel() -> None:
    """`--help` of the long commands reads as short lists: every option of run, up and
    exec is in one of tpulab/cli/_panels.py's panels (a new option must be placed)."""
    from tpulab.cli._panels import PANELLED_COMMANDS

    unplaced = [
        f"{entry.path} {max(param.opts, key=len)}"
        for entry in walk()
        if entry.path.split(" ")[-1] in PANELLED_COMMANDS
        for param in entry.command.params
        if param.param_type_name == "option"
        and not getattr(param, "hidden", False)
        and "--help" not in param.opts
        and getattr(param, "rich_help_panel", None) is None
    ]
    assert unplaced == []
