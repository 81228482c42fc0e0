"""Generated from spec/lifecycle.py by `rolloutcore spec tla`. Do not edit."""

from __future__ import annotations

from enum import StrEnum
from typing import Final

from rolloutcore.spec.lifecycle import Result


class Trigger(StrEnum):
    """Every step the controller takes or journals (one per controller trigger)."""

    BOOTSTRAP_BEGIN = "bootstrap_begin"  # control
    BOOTSTRAP_OK = "bootstrap_ok"  # outcome
    BOOTSTRAP_FAILED = "bootstrap_failed"  # outcome
    BOOTSTRAP_MISMATCH = "bootstrap_mismatch"  # outcome
    ADMIT = "admit"  # control
    RELEASE = "release"  # control
    RELEASE_ABORTED = "release_aborted"  # control
    REQUEST_UPDATE = "request_update"  # control
    CANCEL_UPDATE = "cancel_update"  # control
    PAUSE_BEGIN = "pause_begin"  # control
    PAUSE_OK = "pause_ok"  # outcome
    PAUSE_FAILED = "pause_failed"  # outcome
    PAUSE_ABORT_BEGIN = "pause_abort_begin"  # control
    PAUSE_ABORT_OK = "pause_abort_ok"  # outcome
    PAUSE_ABORT_FAILED = "pause_abort_failed"  # outcome
    ABANDON_UPDATE = "abandon_update"  # control
    MUTATE_BEGIN = "mutate_begin"  # control
    MUTATE_OK = "mutate_ok"  # outcome
    MUTATE_REFUSED = "mutate_refused"  # outcome
    MUTATE_AMBIGUOUS = "mutate_ambiguous"  # outcome
    RESET_BEGIN = "reset_begin"  # control
    RESET_OK = "reset_ok"  # outcome
    RESET_FAILED = "reset_failed"  # outcome
    INVALIDATED = "invalidated"  # control
    VALIDATE_BEGIN = "validate_begin"  # control
    VALIDATE_OK = "validate_ok"  # outcome
    VALIDATE_FAILED = "validate_failed"  # outcome
    VALIDATE_MISMATCH = "validate_mismatch"  # outcome
    RESUME_BEGIN = "resume_begin"  # control
    RESUME_OK = "resume_ok"  # outcome
    RESUME_FAILED = "resume_failed"  # outcome
    PROBE_BEGIN = "probe_begin"  # control
    PROBE_OK = "probe_ok"  # outcome
    PROBE_FAILED = "probe_failed"  # outcome
    PROBE_MISMATCH = "probe_mismatch"  # outcome
    PUBLISH = "publish"  # control
    REOPEN = "reopen"  # control
    GIVE_UP = "give_up"  # control
    FENCE_BEGIN = "fence_begin"  # control
    FENCE_OK = "fence_ok"  # outcome
    FENCE_FAILED = "fence_failed"  # outcome
    READMIT_BEGIN = "readmit_begin"  # control
    READMIT_OK = "readmit_ok"  # outcome
    READMIT_MISMATCH = "readmit_mismatch"  # outcome
    READMIT_FAILED = "readmit_failed"  # outcome
    AUDIT_BEGIN = "audit_begin"  # control
    AUDIT_OK = "audit_ok"  # outcome
    AUDIT_MISMATCH = "audit_mismatch"  # outcome
    AUDIT_FAILED = "audit_failed"  # outcome
    SUSPECT = "suspect"  # control
    RESTART_UNINITIALIZED = "restart_uninitialized"  # restart
    RESTART_READY = "restart_ready"  # restart
    RESTART_TAINTED = "restart_tainted"  # restart


class Op(StrEnum):
    """The operations: a begin and its outcomes."""

    BOOTSTRAP = "bootstrap"
    PAUSE = "pause"
    PAUSE_ABORT = "pause_abort"
    MUTATE = "mutate"
    RESET = "reset"
    VALIDATE = "validate"
    RESUME = "resume"
    PROBE = "probe"
    FENCE = "fence"
    READMIT = "readmit"
    AUDIT = "audit"


#: The trigger of each result of each operation (its begin included).
OUTCOMES: Final[dict[Op, dict[Result, Trigger]]] = {
    Op.BOOTSTRAP: {
        Result.BEGIN: Trigger.BOOTSTRAP_BEGIN,
        Result.OK: Trigger.BOOTSTRAP_OK,
        Result.FAILED: Trigger.BOOTSTRAP_FAILED,
        Result.MISMATCH: Trigger.BOOTSTRAP_MISMATCH,
    },
    Op.PAUSE: {
        Result.BEGIN: Trigger.PAUSE_BEGIN,
        Result.OK: Trigger.PAUSE_OK,
        Result.FAILED: Trigger.PAUSE_FAILED,
    },
    Op.PAUSE_ABORT: {
        Result.BEGIN: Trigger.PAUSE_ABORT_BEGIN,
        Result.OK: Trigger.PAUSE_ABORT_OK,
        Result.FAILED: Trigger.PAUSE_ABORT_FAILED,
    },
    Op.MUTATE: {
        Result.BEGIN: Trigger.MUTATE_BEGIN,
        Result.OK: Trigger.MUTATE_OK,
        Result.REFUSED: Trigger.MUTATE_REFUSED,
        Result.AMBIGUOUS: Trigger.MUTATE_AMBIGUOUS,
    },
    Op.RESET: {
        Result.BEGIN: Trigger.RESET_BEGIN,
        Result.OK: Trigger.RESET_OK,
        Result.FAILED: Trigger.RESET_FAILED,
    },
    Op.VALIDATE: {
        Result.BEGIN: Trigger.VALIDATE_BEGIN,
        Result.OK: Trigger.VALIDATE_OK,
        Result.FAILED: Trigger.VALIDATE_FAILED,
        Result.MISMATCH: Trigger.VALIDATE_MISMATCH,
    },
    Op.RESUME: {
        Result.BEGIN: Trigger.RESUME_BEGIN,
        Result.OK: Trigger.RESUME_OK,
        Result.FAILED: Trigger.RESUME_FAILED,
    },
    Op.PROBE: {
        Result.BEGIN: Trigger.PROBE_BEGIN,
        Result.OK: Trigger.PROBE_OK,
        Result.FAILED: Trigger.PROBE_FAILED,
        Result.MISMATCH: Trigger.PROBE_MISMATCH,
    },
    Op.FENCE: {
        Result.BEGIN: Trigger.FENCE_BEGIN,
        Result.OK: Trigger.FENCE_OK,
        Result.FAILED: Trigger.FENCE_FAILED,
    },
    Op.READMIT: {
        Result.BEGIN: Trigger.READMIT_BEGIN,
        Result.OK: Trigger.READMIT_OK,
        Result.MISMATCH: Trigger.READMIT_MISMATCH,
        Result.FAILED: Trigger.READMIT_FAILED,
    },
    Op.AUDIT: {
        Result.BEGIN: Trigger.AUDIT_BEGIN,
        Result.OK: Trigger.AUDIT_OK,
        Result.MISMATCH: Trigger.AUDIT_MISMATCH,
        Result.FAILED: Trigger.AUDIT_FAILED,
    },
}
#: Restart triggers: what a restarted controller may assume.
RESTARTS: Final[tuple[Trigger, ...]] = (
    Trigger.RESTART_UNINITIALIZED,
    Trigger.RESTART_READY,
    Trigger.RESTART_TAINTED,
)
