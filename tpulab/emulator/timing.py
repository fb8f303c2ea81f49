"""How long the emulated cloud takes. Real creates take minutes; tests want milliseconds."""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Timing"]


@dataclass(frozen=True)
class Timing:
    create_seconds: float = 3.0
    """CREATING -> READY (the create operation finishes at the same moment)."""
    delete_seconds: float = 1.0
    """DELETING -> gone (the delete operation finishes then)."""
    update_seconds: float = 1.0
    """How long an UpdateNode operation runs; its changes apply when it ends."""
    stockout_seconds: float = 0.5
    """How long a create operation runs before failing with a stockout."""
    queue_seconds: float = 1.0
    """How long a queued resource waits (WAITING_FOR_RESOURCES) at least, capacity or not,
    before it is provisioned."""
    tick_seconds: float = 0.05
    """The ticker's granularity: it advances state and starts or stops SSH hosts when a
    write wakes it or a timed transition is due, at most once per tick_seconds."""
    idle_tick_seconds: float = 0.5
    """The longest the ticker sleeps with nothing due: what it cannot be told of
    (another process's write to the same state, a dead emulator's hosts, a fault
    changed in-process) is noticed within this."""
    page_size: int = 50
    """Default and maximum list page size (the client may ask for less)."""

    def __post_init__(self) -> None:
        for name in (
            "create_seconds",
            "delete_seconds",
            "update_seconds",
            "stockout_seconds",
            "queue_seconds",
            "tick_seconds",
            "idle_tick_seconds",
        ):
            value = getattr(self, name)
            # NaN compares false with everything, so `< 0` alone would let it through;
            # a string or a boolean (timing.json's) is no number of seconds at all.
            if not _is_number(value) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number of seconds >= 0, not {value!r}")
        if self.tick_seconds <= 0:
            raise ValueError("tick_seconds must be > 0")
        size = self.page_size
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"page_size must be a whole number >= 1, not {size!r}")

    @classmethod
    def fast(cls) -> Timing:
        """The timing tests use: every transition within a fraction of a second."""
        return cls(
            create_seconds=0.2,
            delete_seconds=0.1,
            update_seconds=0.1,
            stockout_seconds=0.1,
            queue_seconds=0.05,
            tick_seconds=0.02,
        )


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
