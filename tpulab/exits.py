"""tpulab's exit statuses: which status each failure causes.

The table is a contract (docs/reference/exit-status.md, summed up in the README): the CLI
exits with these (tpulab.cli._exit), JSON envelopes and run.json carry them
(tpulab.envelope), and a third Ctrl-C during a teardown quits with EXIT_TEARDOWN
(tpulab.run.signals) -- for a library call as for a command. Change them only with
those documents.
"""

from __future__ import annotations

from tpulab import errors as E

__all__ = [
    "EXIT_CLOUD",
    "EXIT_CODES",
    "EXIT_CONFIG",
    "EXIT_INTERNAL",
    "EXIT_INTERRUPTED",
    "EXIT_LOCAL_STATE",
    "EXIT_OK",
    "EXIT_PREEMPTED",
    "EXIT_REMOTE",
    "EXIT_TEARDOWN",
    "EXIT_VERIFY",
    "EXIT_WORKLOAD",
    "exit_status_for",
]

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_CONFIG = 2
EXIT_CLOUD = 3
EXIT_REMOTE = 4
EXIT_VERIFY = 5
EXIT_TEARDOWN = 6
EXIT_PREEMPTED = 7
EXIT_LOCAL_STATE = 8
EXIT_WORKLOAD = 9
EXIT_INTERRUPTED = 130

EXIT_CODES: dict[int, str] = {
    EXIT_OK: "success (for run: receipt verified AND teardown confirmed)",
    EXIT_INTERNAL: "unexpected internal error (a bug: please report it)",
    EXIT_CONFIG: "bad input or missing configuration; nothing was created",
    EXIT_CLOUD: "the Cloud TPU API refused or failed (stockout, quota, permission...)",
    EXIT_REMOTE: "SSH, bootstrap or the payload failed on the VM",
    EXIT_VERIFY: "the receipt did not verify (wrong platform, devices, totals, nonce...)",
    EXIT_TEARDOWN: "teardown NOT confirmed: resources may still be billing",
    EXIT_PREEMPTED: "the spot node was preempted during the run",
    EXIT_LOCAL_STATE: "the local journal, receipt store or a session's state is unreadable, "
    "or the disk refuses to write it or the fetched artifacts into --out (a full disk)",
    EXIT_WORKLOAD: "your command (`-- CMD`) failed or timed out on the verified VM; "
    "its artifacts were fetched and its own status is in the summary",
    EXIT_INTERRUPTED: "interrupted by a signal; teardown ran and was confirmed",
}

_EXIT_FOR_ERROR: tuple[tuple[type[E.TpuLabError], int], ...] = (
    (E.TeardownError, EXIT_TEARDOWN),
    (E.InterruptedRun, EXIT_INTERRUPTED),
    (E.PreemptedError, EXIT_PREEMPTED),
    (E.WorkloadFailedError, EXIT_WORKLOAD),
    (E.ConfigError, EXIT_CONFIG),
    (E.CloudError, EXIT_CLOUD),
    (E.RemoteError, EXIT_REMOTE),
    (E.VerificationError, EXIT_VERIFY),
    (E.LocalRunError, EXIT_VERIFY),  # verify --local got no receipt: nothing verified
    (E.JournalError, EXIT_LOCAL_STATE),
    (E.ReceiptStoreError, EXIT_LOCAL_STATE),
    (E.StateFileError, EXIT_LOCAL_STATE),
    (E.ArtifactWriteError, EXIT_LOCAL_STATE),
)


def exit_status_for(error: E.TpuLabError) -> int:
    for error_type, status in _EXIT_FOR_ERROR:
        if isinstance(error, error_type):
            return status
    return EXIT_INTERNAL
