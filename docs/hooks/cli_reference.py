"""MkDocs hook: replace the marker in reference/cli.md with the reference drawn from the
typer app (tpulab/cli/_reference.py), so the page and `--help` cannot disagree."""

from __future__ import annotations

from typing import Any

MARKER = "<!-- tpulab-cli-reference -->"


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if MARKER not in markdown:
        return markdown
    from tpulab.cli._reference import cli_reference

    return markdown.replace(MARKER, cli_reference())
