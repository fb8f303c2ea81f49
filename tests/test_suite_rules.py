"""Rules the suite keeps about itself, checked on its own source."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent

# A plain skipif on a missing tool skips under CI=true too, so a CI machine without it
# would pass without running the test: helpers.require_tool skips locally, fails in CI.
_TOOL_SKIPIF = re.compile(r"skipif\(\s*(not\s+)?(shutil\.which|\w*_available\()")


def test_no_test_skips_a_missing_tool_in_ci() -> None:
    offenders = [
        f"{path.relative_to(TESTS)}:{text[: match.start()].count(chr(10)) + 1}"
        for path in sorted(TESTS.rglob("*.py"))
        if path != Path(__file__).resolve()
        for text in [path.read_text(encoding="utf-8")]
        for match in _TOOL_SKIPIF.finditer(text)
    ]
    assert offenders == [], f"use helpers.require_tool instead: {offenders}"
