"""The capacity flags of `tpulab run`: which zones to try, and how long and how often.

    --zone Z (repeatable, or a comma list; `auto` = every zone the catalog says offers
    the accelerator, cheapest region first) -> the zones, in the order they are tried
    (without --zone, the workspace's [tool.tpulab] `zone` list, read the same way)
    --retry-until-up [--retry-for D]        -> pass over the zones again until up
    --spot --recover N                      -> start again after up to N preemptions

All checked here, before anything is contacted (docs/architecture.md §3.1): a malformed zone, an
`auto` no zone satisfies, --recover without --spot or --retry-for without
--retry-until-up is a ConfigError and nothing is created.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tpulab import catalog
from tpulab.config.resolve import Resolved, check_seconds, given, zone_flags
from tpulab.errors import ConfigError
from tpulab.models import check_node_name

__all__ = [
    "AUTO_ZONE",
    "MAX_RECOVERIES",
    "Capacity",
    "attempt_suffix",
    "check_attempt_names",
    "choose_capacity",
    "split_attempt",
]

AUTO_ZONE = "auto"
MAX_RECOVERIES = 20
# Attempts after the first are "<run id>-a<N>" / "<node name>-a<N>"; names are checked
# with room for this many digits, so no attempt can produce an invalid name mid-run.
_MAX_ATTEMPT_DIGITS = 5


def attempt_suffix(number: int) -> str:
    """What attempt `number` adds to the run id and node name ("" for the first)."""
    if number < 1 or len(str(number)) > _MAX_ATTEMPT_DIGITS:
        raise ValueError(f"attempt number out of range: {number}")
    return "" if number == 1 else f"-a{number}"


def split_attempt(run_id: str) -> tuple[str, int]:
    """The inverse of `attempt_suffix`: ("<id>", N) for "<id>-aN", else (run_id, 1).

    Only the shape is read: a run id that merely ends like a suffix ("exp-a2") splits
    too, so callers group by it only when the first attempt's "<id>" is there as well."""
    base, dash, digits = run_id.rpartition("-a")
    if (
        dash
        and base
        and digits.isascii()
        and digits.isdigit()
        and not digits.startswith("0")
        and len(digits) <= _MAX_ATTEMPT_DIGITS
        and int(digits) >= 2
    ):
        return base, int(digits)
    return run_id, 1


@dataclass(frozen=True)
class Capacity:
    """The validated capacity flags. `zones` is empty when no --zone was given (the
    run's zone then comes from the environment or gcloud, as before)."""

    zones: tuple[Resolved, ...] = ()
    recover: int = 0
    retry_until_up: bool = False
    retry_for: float | None = None  # None with retry_until_up: until Ctrl-C

    @property
    def may_retry(self) -> bool:
        """Whether a run may take more than one attempt."""
        return len(self.zones) > 1 or self.recover > 0 or self.retry_until_up


def _expand(values: Sequence[str], accelerator: str, source: str) -> tuple[Resolved, ...]:
    zones: dict[str, Resolved] = {}
    for value in values:
        given(value, source, hint="Pass a zone such as us-central1-a, or leave --zone out.")
        parts = [part.strip() for part in value.split(",")]
        if not all(parts):
            raise ConfigError(
                f"{source} {value!r} has an empty entry.",
                hint="Pass zones as --zone A --zone B or --zone A,B (no empty items).",
            )
        for part in parts:
            if part == AUTO_ZONE:
                offering = catalog.zones_offering(accelerator)
                if not offering:
                    # tpulab's zone table is the Cloud TPU API's; a Compute-only type
                    # (TPU7x) has none, and its zones are Compute's machine types.
                    machine = catalog.lookup(accelerator).machine_type
                    where = (
                        f"`gcloud compute machine-types list --filter=name={machine}`"
                        if machine
                        else "`gcloud compute tpus accelerator-types list --zone=ZONE`"
                    )
                    raise ConfigError(
                        f"{source} auto found no zone that offers {accelerator}.",
                        hint=f"Name the zone yourself with --zone ({where}).",
                    )
                for zone in offering:
                    zones.setdefault(zone, Resolved(zone, f"{source} auto (catalog)"))
                continue
            zone = zone_flags([part], source)[0]
            zones.setdefault(zone, Resolved(zone, source))
    return tuple(zones.values())


def choose_capacity(
    *,
    accelerator: str,
    zones: Sequence[str] = (),
    zones_source: str = "--zone",
    spot: bool = False,
    recover: int = 0,
    retry_until_up: bool = False,
    retry_for: float | None = None,
) -> Capacity:
    """The capacity flags, validated (`retry_for` already in seconds). `zones_source`
    names where the zones came from: the flags, or the workspace's [tool.tpulab] list."""
    if isinstance(recover, bool) or not isinstance(recover, int) or recover < 0:
        raise ConfigError(
            f"Invalid --recover {recover!r}.",
            hint="Pass how many preemptions to recover from, e.g. --recover 2.",
        )
    if recover > MAX_RECOVERIES:
        raise ConfigError(
            f"--recover {recover} is more than {MAX_RECOVERIES}.",
            hint="A spot node preempted that often will not finish; run on demand instead.",
        )
    if recover and not spot:
        raise ConfigError(
            "--recover needs --spot: only spot nodes are preempted.",
            hint="Add --spot, or leave --recover out.",
        )
    if retry_for is not None:
        if not retry_until_up:
            raise ConfigError(
                "--retry-for needs --retry-until-up.",
                hint="Add --retry-until-up (e.g. --retry-until-up --retry-for 20m).",
            )
        retry_for = check_seconds("--retry-for", retry_for)
    return Capacity(_expand(zones, accelerator, zones_source), recover, retry_until_up, retry_for)


def check_attempt_names(capacity: Capacity, run_id: str, node_name: str) -> None:
    """Refuse a --name too long to carry an attempt suffix, when attempts may follow."""
    if not capacity.may_retry:
        return
    longest = "-a" + "9" * _MAX_ATTEMPT_DIGITS
    try:
        check_node_name(node_name + longest)
    except ConfigError:
        raise ConfigError(
            f"Node name {node_name!r} leaves no room for an attempt suffix ({longest}).",
            hint=f"Retried attempts are named NAME{longest[:3]}..; pass a --name of at most "
            f"{63 - len(longest)} characters.",
        ) from None
    if len(run_id) + len(longest) > 63:
        raise ConfigError(
            f"Run id {run_id!r} leaves no room for an attempt suffix ({longest}).",
            hint=f"Use a run id of at most {63 - len(longest)} characters.",
        )
