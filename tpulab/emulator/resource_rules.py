"""Google's rules for a resource's labels and metadata, as the Cloud TPU API and Compute
Engine enforce them at create (and UpdateNode).

## Labels

Both APIs refuse a create whose labels break it, each in its own words (the first
found is named):
- keys: 1-63 characters, a lowercase letter (or an international character) first;
- keys and values: lowercase letters, digits, '_' and '-', or international
  characters; values may be empty, at most 63 characters;
- at most 64 labels on a resource.

The TPU API's words for a bad character are gcloud's report of a real refusal:
`INVALID_ARGUMENT: resource labels are invalid: value "pt-r1.9-resnet50-mp-func-v3-32-1vm"
contains invalid character '.' at index 5 for key "test-name"` (GoogleCloudPlatform/
ml-testing-accelerators#461). Compute's are its documented `Invalid value for field
'resource.labels': ''. Label value 'test-by-Ahtasham' violates format constraints. ...`
(googleapis/google-cloud-node-core#276; the key's from cloudfoundry-incubator/
kubo-deployment#159). What the sources do not quote (an over-long or empty key, too
many labels) is said in the same style.

tpulab checks its own labels before any call (`tpulab.models.check_label`, ASCII
only, so stricter); the emulator checks them as Google does, so that a label Google
would refuse cannot pass offline.

## Metadata
Compute's discovery document (`Metadata.items`): a key matches `[a-zA-Z0-9-_]+` and is
less than 128 bytes; a value is at most 262144 bytes (256 KiB). gcloud's `--metadata`
help adds that all entries together are at most 512 KB. A TPU VM's metadata is served
by the same metadata server, so the emulator holds a node's to the same rule. The
refusals' words here are the emulator's own: no source quotes Google's. What tpulab
sends (its startup-script carries the watchdog, ~35 KB) must stay inside these, and
every emulated run checks that it does.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

__all__ = [
    "MAX_LABELS",
    "MAX_METADATA_TOTAL",
    "MAX_METADATA_VALUE",
    "compute_label_problem",
    "metadata_problem",
    "tpu_label_problem",
]

MAX_LABELS = 64
MAX_METADATA_VALUE = 262_144
MAX_METADATA_TOTAL = 512 * 1024
_METADATA_KEY = re.compile(r"[a-zA-Z0-9_-]+")
MAX_LENGTH = 63
_ASCII_ALLOWED = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_-")


def _allowed(char: str) -> bool:
    """A lowercase ASCII letter, digit, '_' or '-', or an international character that
    is not an uppercase letter (Google: "international characters are allowed")."""
    if char.isascii():
        return char in _ASCII_ALLOWED
    return char.isprintable() and not char.isupper()


def _first_bad(text: str) -> int | None:
    return next((index for index, char in enumerate(text) if not _allowed(char)), None)


def _key_starts_badly(key: str) -> bool:
    first = key[:1]
    return not first or not _allowed(first) or first.isdigit() or first in "_-"


def tpu_label_problem(labels: Mapping[str, str]) -> str | None:
    """What the Cloud TPU API would say of `labels` (its INVALID_ARGUMENT message), or
    None when it takes them."""
    if len(labels) > MAX_LABELS:
        return (
            f"resource labels are invalid: {len(labels)} labels given, at most "
            f"{MAX_LABELS} are allowed"
        )
    for key, value in labels.items():
        for what, text in (("key", key), ("value", value)):
            bad = _first_bad(text)
            if bad is not None:
                return (
                    f'resource labels are invalid: {what} "{text}" contains invalid character '
                    f"'{text[bad]}' at index {bad} for key \"{key}\""
                )
            if len(text) > MAX_LENGTH:
                return (
                    f'resource labels are invalid: {what} "{text}" is longer than '
                    f'{MAX_LENGTH} characters for key "{key}"'
                )
        if _key_starts_badly(key):
            return f'resource labels are invalid: key "{key}" must start with a lowercase letter'
    return None


def compute_label_problem(labels: Mapping[str, str]) -> str | None:
    """What Compute Engine would say of `labels` (its `invalid` 400 message), or None."""
    prefix = "Invalid value for field 'resource.labels': ''. "
    if len(labels) > MAX_LABELS:
        return f"{prefix}A resource can have at most {MAX_LABELS} labels."
    for key, value in labels.items():
        if _first_bad(key) is not None or len(key) > MAX_LENGTH or _key_starts_badly(key):
            return (
                f"{prefix}Label key '{key}' violates format constraints. The key must start "
                "with a lowercase character, can only contain lowercase letters, numeric "
                "characters, underscores and dashes. The key can be at most 63 characters "
                "long. International characters are allowed."
            )
        if _first_bad(value) is not None or len(value) > MAX_LENGTH:
            return (
                f"{prefix}Label value '{value}' violates format constraints. The value can "
                "only contain lowercase letters, numeric characters, underscores and dashes. "
                "The value can be at most 63 characters long. International characters are "
                "allowed."
            )
    return None


def metadata_problem(metadata: Mapping[str, str]) -> str | None:
    """Why Google would refuse `metadata` (key -> value), or None when it takes it."""
    total = 0
    for key, value in metadata.items():
        if not _METADATA_KEY.fullmatch(key) or len(key.encode()) >= 128:
            return (
                f"Metadata key '{key}' is invalid: keys match [a-zA-Z0-9-_]+ and are less "
                "than 128 bytes."
            )
        size = len(value.encode())
        if size > MAX_METADATA_VALUE:
            return (
                f"Metadata value of key '{key}' is {size} bytes; at most "
                f"{MAX_METADATA_VALUE} bytes (256 KiB) are allowed."
            )
        total += len(key.encode()) + size
    if total > MAX_METADATA_TOTAL:
        return f"Metadata totals {total} bytes; at most {MAX_METADATA_TOTAL} bytes are allowed."
    return None
