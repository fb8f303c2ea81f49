"""Real payload runs shared by the receipt tests: each (devices, platform, emulated) once.

Each run is a fresh interpreter importing jax (~1-3 s), so the results are cached for the
whole pytest process instead of being repeated per test or per module.
"""

from __future__ import annotations

import functools
import hashlib
import json
from typing import Any

from tpulab.evidence.localrun import LocalRunResult, run_local_payload

__all__ = ["real_run", "rehash", "tamper"]


@functools.cache
def real_run(devices: int, *, platform: str = "cpu", emulated: bool = False) -> LocalRunResult:
    return run_local_payload(
        devices=devices,
        platform=platform,
        emulated=emulated,
        nonce=f"test-nonce-{devices}-{platform}-{int(emulated)}",
        timeout=180,
    )


def rehash(document: dict[str, Any]) -> bytes:
    """Serialise with a recomputed sha256, as a forger who knows the scheme would."""
    body = {key: value for key, value in document.items() if key != "sha256"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    digest = hashlib.sha256(canonical.encode("ascii")).hexdigest()
    return json.dumps({**body, "sha256": digest}).encode()


def tamper(raw: bytes, *, keep_hash: bool = False, **changes: Any) -> bytes:
    """A copy of a real receipt with dotted-path fields replaced (section__field=value)."""
    document = json.loads(raw)
    for dotted, value in changes.items():
        *parents, leaf = dotted.split("__")
        target = document
        for part in parents:
            target = target[part]
        target[leaf] = value
    return json.dumps(document).encode() if keep_hash else rehash(document)
