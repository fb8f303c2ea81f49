"""The typed `--json` envelopes: one pydantic model per command output, all versioned.

Every `--json` output is a subclass of `Envelope` (pipx's `result.py` is the anchor): a
`schema_version`, the `command`, `ok`, and an `error` when it failed; the command's own
fields follow. A test pins each model's JSON schema, so a field renamed or dropped is a
visible, deliberate change. Field names agree across commands (`accelerator_type`, the
Cloud TPU API's own word, wherever an accelerator is named).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

__all__ = ["SCHEMA_VERSION", "Envelope", "ErrorReport", "FailedRequirement"]

SCHEMA_VERSION = 1


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FailedRequirement(_Strict):
    """One requirement a receipt did not meet, by name."""

    requirement: str
    expected: Any
    observed: Any


class ErrorReport(_Strict):
    """Why a command failed: the error class, what to do, and the exit status chosen."""

    type: str
    message: str
    hint: str
    exit_status: int
    failures: list[FailedRequirement] = []


class Envelope(_Strict):
    """The fields every `--json` output starts with."""

    schema_version: int = SCHEMA_VERSION
    command: str
    ok: bool
    error: ErrorReport | None = None

    def to_json(self) -> str:
        """The document as printed: keys in declaration order, two-space indent."""
        return self.model_dump_json(indent=2)
