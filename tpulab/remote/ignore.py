"""gitignore matching, stdlib only: what `git check-ignore` would say for a workspace path.

Supported (pinned against real git by tests/test_workspace_ignore.py): comments, escaped
`\\#` and `\\!`, trailing spaces, `!` negation, dir-only `x/`, anchored `/x` and `a/b`,
`*`, `?`, `[...]` (with `!`/`^` negation), leading `**/`, inner `/**/`, trailing `/**`.
Rules of deeper ignore files come after (and so override) those of shallower ones; the
last matching rule wins. Git's other rule, that nothing inside an excluded directory can
be re-included, follows from the walk: an excluded directory is never entered.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = ["IgnoreRule", "IgnoreRules", "parse_ignore_lines"]


@dataclass(frozen=True)
class IgnoreRule:
    base: str  # the directory of the ignore file, relative to the root ("" = the root)
    pattern: str  # as written, for messages
    regex: re.Pattern[str]  # over the path relative to `base`
    negated: bool
    dir_only: bool

    def matches(self, path: str, is_dir: bool) -> bool:
        if self.dir_only and not is_dir:
            return False
        if self.base:
            if not path.startswith(self.base + "/"):
                return False
            path = path[len(self.base) + 1 :]
        return self.regex.fullmatch(path) is not None


def _translate(pattern: str) -> str:
    """A gitignore glob (already anchored to its base) as a regular expression."""
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        if pattern.startswith("**/", i) and (i == 0 or pattern[i - 1] == "/"):
            out.append("(?:.*/)?")  # zero or more directories
            i += 3
            continue
        if pattern.startswith("/**", i) and i + 3 == n:
            out.append("/.*")  # everything inside
            i += 3
            continue
        char = pattern[i]
        if char == "*":
            while i < n and pattern[i] == "*":
                i += 1  # other runs of asterisks are a plain `*`
            out.append("[^/]*")
            continue
        if char == "?":
            out.append("[^/]")
        elif char == "\\" and i + 1 < n:
            i += 1
            out.append(re.escape(pattern[i]))
        elif char == "[":
            end = pattern.find("]", i + 2 if pattern[i + 1 : i + 2] in ("!", "^") else i + 1)
            if end < 0:
                out.append(re.escape(char))
            else:
                body = pattern[i + 1 : end]
                negate = body[:1] in ("!", "^")
                body = body[1:] if negate else body
                body = body.replace("\\", "\\\\").replace("[", "\\[")
                # A class never matches "/" (git's wildmatch with WM_PATHNAME).
                out.append(f"[^/{body}]" if negate else f"(?!/)[{body}]")
                i = end
        else:
            out.append(re.escape(char))
        i += 1
    return "".join(out)


def _strip_trailing_spaces(line: str) -> str:
    while line.endswith(" ") and not line.endswith("\\ "):
        line = line[:-1]
    return line


def parse_ignore_lines(lines: Iterable[str], base: str = "") -> list[IgnoreRule]:
    """The rules of one ignore file living in directory `base` (relative to the root)."""
    rules: list[IgnoreRule] = []
    for raw in lines:
        line = _strip_trailing_spaces(raw.rstrip("\r\n"))
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        if negated:
            line = line[1:]  # (an escaped "\\!" or "\\#" is a literal, see _translate)
        dir_only = line.endswith("/") and not line.endswith("\\/")
        body = line.rstrip("/") if dir_only else line
        if not body:
            continue
        # A slash at the start or in the middle anchors the pattern to its file's dir;
        # otherwise it matches a name at any depth below.
        anchored = "/" in body
        body = body.lstrip("/") if body.startswith("/") else body
        if not anchored:
            body = "**/" + body
        rules.append(
            IgnoreRule(
                base=base,
                pattern=raw.strip(),
                regex=re.compile(_translate(body), re.DOTALL),
                negated=negated,
                dir_only=dir_only,
            )
        )
    return rules


class IgnoreRules:
    """An ordered list of rules; `ignored(path)` is the verdict of the last one matching."""

    def __init__(self, rules: Sequence[IgnoreRule] = ()) -> None:
        self._rules: list[IgnoreRule] = list(rules)

    def extended(self, rules: Sequence[IgnoreRule]) -> IgnoreRules:
        return IgnoreRules([*self._rules, *rules]) if rules else self

    def ignored(self, path: str, *, is_dir: bool) -> bool:
        for rule in reversed(self._rules):
            if rule.matches(path, is_dir):
                return not rule.negated
        return False
