"""The journal: an append-only, hash-chained, fsynced record of every controller step.

One JSON object per line, keys sorted, compact separators, in Jepsen style: a begin
step is an ``invoke``, its outcome ``ok``, ``fail`` (proven to have had no effect) or
``info`` (may or may not have happened); controller decisions that are not part of an
operation (admit, publish, ...) are ``step``. The types are derived from the spec's
action table, not listed by hand (:mod:`~rolloutcore.journal.codec`, with the
encoding, redaction and hashing).

Each record carries ``prev`` (the previous record's ``hash``; 64 zeros for the header)
and ``hash`` (sha256 of the canonical JSON of the record without ``hash``), so an
edited, dropped or reordered line breaks the chain. The journal is the controller's
trace sink (:mod:`~rolloutcore.journal.writer`): the line is written and fsynced before
the sink returns, so a step is durable before the runner relies on it (performs its
effect). A crash mid-write leaves a torn final line without its newline: that step did
not happen (:mod:`~rolloutcore.journal.reader` verifies the chain as it streams it).

Recovery (:mod:`~rolloutcore.journal.recovery`) reads the journal back and restarts the
controller in a state the spec proves safe: READY only when nothing had been paused or
mutated, otherwise TAINTED.
"""

from rolloutcore.journal.codec import (
    CONTINUES,
    DECISION,
    HEADER,
    REDACTED,
    SCHEMA,
    ZERO_HASH,
    canonical,
    dumps_line,
    jepsen_type,
    jepsen_types,
    rechain,
    redact,
    seal,
)
from rolloutcore.journal.reader import (
    ChainReport,
    JournalReader,
    not_a_journal,
    read_journal,
    verify_chain,
)
from rolloutcore.journal.recovery import apply_record, open_controller, recover, restart_step
from rolloutcore.journal.writer import Journal, JournalError

__all__ = [
    "CONTINUES", "DECISION", "HEADER", "REDACTED", "SCHEMA", "ZERO_HASH", "ChainReport",
    "Journal", "JournalError", "JournalReader", "apply_record", "canonical", "dumps_line",
    "jepsen_type", "jepsen_types", "not_a_journal", "open_controller", "read_journal",
    "rechain", "recover", "redact", "restart_step", "seal", "verify_chain",
]
