"""The typed `--json` envelopes: one pydantic model per command output, all versioned.

Every `--json` output is a subclass of `Envelope` (pipx's `result.py` is the anchor): a
`schema_version`, the `command`, `ok`, and an `error` when it failed; the command's own
fields follow. A test pins each model's JSON schema (tests/schemas/<Model>.json), so a
field renamed or dropped is a visible, deliberate change.

    Envelope                 schema_version, command, ok, error: ErrorReport | None
    ├── ErrorEnvelope        a command that failed before it had anything else to say
    └── <Command>Envelope    one per command, defined next to the code that fills it in

Field names agree across commands, so a script reads every output the same way:

- `accelerator_type` wherever an accelerator is named (the Cloud TPU API's own word);
- `name` is a node's own name inside a node object (`NodeReport`, as the API says it);
  anything else that refers to a node says `node_name`;
- `project`, `zone`, `zones`, `run_id` mean the same thing everywhere;
- money is `*_usd` and comes with the `price_date` of the list prices it estimates from;
  durations are `*seconds`.

Parse a printed document back with `Model.model_validate_json(text)`: the models are
strict (unknown fields are rejected), so what parses is exactly the contract.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict
from pydantic_core import PydanticSerializationError

from tpulab.errors import TpuLabError, VerificationError
from tpulab.exits import exit_status_for
from tpulab.models import DEFER_BUILD

__all__ = [
    "SCHEMA_VERSION",
    "Envelope",
    "ErrorEnvelope",
    "ErrorReport",
    "FailedRequirement",
    "NodeReport",
    "error_report",
    "escape_undecodable",
]

SCHEMA_VERSION = 1


class _Strict(BaseModel):
    model_config = ConfigDict(defer_build=DEFER_BUILD, extra="forbid", frozen=True)


class FailedRequirement(_Strict):
    """One requirement a receipt did not meet, by name."""

    requirement: str
    expected: Any
    observed: Any


class ErrorReport(_Strict):
    """Why a command failed: the error class, what to do, and the exit status chosen."""

    type: str
    message: str
    hint: str | None
    exit_status: int
    failures: list[FailedRequirement] = []

    @classmethod
    def from_error(cls, error: TpuLabError, *, exit_status: int) -> ErrorReport:
        """The report of `error` with `exit_status` (`error_report` gives the table's)."""
        failures = error.failures if isinstance(error, VerificationError) else []
        return cls(
            type=type(error).__name__,
            message=error.message,
            hint=error.hint,
            exit_status=exit_status,
            failures=[
                FailedRequirement(
                    requirement=f.requirement, expected=f.expected, observed=f.observed
                )
                for f in failures
            ],
        )


class Envelope(_Strict):
    """The fields every `--json` output starts with."""

    schema_version: int = SCHEMA_VERSION
    command: str
    ok: bool
    error: ErrorReport | None = None

    def to_json(self) -> str:
        """The document as printed: keys in declaration order, two-space indent. A text
        that UTF-8 cannot carry (a file name that is not UTF-8) is written escaped, by
        `escape_undecodable`, instead of failing the whole document."""
        try:
            return self.model_dump_json(indent=2)
        except PydanticSerializationError:
            escaped = _escaped(self.model_dump(mode="python", round_trip=True))
            return type(self).model_validate(escaped).model_dump_json(indent=2)


class ErrorEnvelope(Envelope):
    """What any command prints with `--json` when it failed before its own result existed
    (bad input, an unreachable API...): the common fields, `ok` false, and the error."""

    ok: Literal[False] = False
    error: ErrorReport


class NodeReport(_Strict):
    """A TPU node as `list` and `teardown` report it; each adds its own fields."""

    project: str
    zone: str
    name: str
    accelerator_type: str
    state: str
    run_id: str | None
    age_seconds: float | None
    estimated_cost_usd: float | None


def escape_undecodable(text: str) -> str:
    """`text`, with what UTF-8 cannot carry written out in ASCII; unchanged otherwise.

    Python reads a file name that is not UTF-8 (b"\\xff.bin", from os.scandir or a tar
    member) with the surrogateescape handler: each undecodable byte becomes one lone
    surrogate (U+DCFF for 0xff). JSON and SQLite refuse those, so each is written as the
    four characters \\xNN of its byte ("\\xff.bin"), as Python's backslashreplace shows
    it; any other lone surrogate as \\uXXXX. docs/guides/experiment.md documents the form.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "".join(_escape_char(char) for char in text)
    return text


def _escape_char(char: str) -> str:
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # surrogateescape's stand-in for the byte code - 0xDC00
        return f"\\x{code - 0xDC00:02x}"
    if 0xD800 <= code <= 0xDFFF:
        return f"\\u{code:04x}"
    return char


def _escaped(value: object) -> object:
    """A model dump with every string passed through `escape_undecodable`."""
    if isinstance(value, str):
        return escape_undecodable(value)
    if isinstance(value, dict):
        return {_escaped(key): _escaped(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_escaped(item) for item in value)
    return value


def error_report(error: TpuLabError) -> ErrorReport:
    """An error as the `error` member of a JSON envelope (and of run.json), with the exit
    status it causes (tpulab.exits)."""
    return ErrorReport.from_error(error, exit_status=exit_status_for(error))
