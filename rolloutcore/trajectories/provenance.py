"""Trajectory records checked against the journal that bound them (``records verify``).

A record's binding says: rollout ``rollout_id`` was admitted at journal seq ``seq`` under
committed generation ``generation``, whose weights are ``identity``. The journal is the
evidence: its ``admit`` record at that seq (``param`` = the rollout id, ``committed`` =
the generation), a later ``release`` of that rollout, and the identity of the
generation, taken only from verified evidence: for generation 1 the identity the
``bootstrap_ok`` decision was verified against (``evidence.expected.identity``), for a
published generation the one its cycle's ``validate_ok`` and ``probe_ok`` were verified
against (what the ``publish`` record names is not evidence), confirmed by every audit and
re-admission. A record is

* ``rejected`` when the journal contradicts it or lacks its admission: no admission at
  that seq, another rollout, another generation or identity than the admission's, a
  second record for one admission, an admission never released, a record that says it
  finished of a rollout the drain aborted (``release_aborted``) or the other way round;
  for a migrated rollout, each segment's admission is checked the same way and must be
  on the member it names and on the rollout's one generation; the journal's ``migrate``
  records are read too: an admission the rollout left by a migration must be followed by
  a segment (a record that stops there, or has no segments at all, omits what the
  rollout did on the member it moved to), and a segment may end before the last only
  where the journal migrated it;
* ``unverifiable`` when nothing contradicts it but the journal does not name the
  identity of its generation: said, never passed silently;
* ``consistent`` otherwise.

Memory: one pass over the journal (streamed, chain verified) builds a compact index,
about 33 bytes per admission in flat arrays (the rollout id is kept as a 64-bit digest)
plus one entry per generation; the records are then streamed against it.
"""

from __future__ import annotations

import hashlib
import os
from array import array
from bisect import bisect_left
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rolloutcore.errors import BadInput
from rolloutcore.journal import ChainReport, JournalReader, not_a_journal
from rolloutcore.spec.episodes import one_policy_per_segment, segments_in_order
from rolloutcore.trajectories.format import TrajectoryRecord

CONSISTENT, REJECTED, UNVERIFIABLE = "consistent", "rejected", "unverifiable"
_CONFLICT = "\0conflict"  # a generation the journal names two identities for
FINISHED, ABORTED = 1, 2  # how an admission was released (0: not released)


class ProvenanceInputError(BadInput, ValueError):
    """The journal file is not a RolloutCore journal."""


# ---------------------------------------------------------- the journal fields read


@dataclass(frozen=True)
class Fact:
    """What one journal record says about provenance (see :func:`journal_fact`)."""

    #: "admit" | "release" | "identity" | "verified" (the target's) | "publish" | "migrate"
    kind: str
    seq: int
    rollout_id: str | None = None
    generation: int = 0
    identity: str | None = None
    aborted: bool = False  # a release by the drain's abort (``release_aborted``)
    engine: str | None = None  # the fleet member it is about


#: Outcomes whose decision verified the engine against the identity it expected: of the
#: target (validation, the probe) or of the committed generation (bootstrap, audit,
#: re-admission).
_VERIFIES_TARGET = frozenset({"validate_ok", "probe_ok"})
_VERIFIES_COMMITTED = frozenset({"bootstrap_ok", "audit_ok", "readmit_ok"})


def journal_fact(rec: Mapping[str, Any]) -> Fact | None:
    """The provenance fact of a chain-verified journal record, or None. The only place
    that knows the journal's record schema: adapt it here when the schema changes.
    Identities come only from verified evidence (what an ``*_ok`` decision was decided
    against), never from what a record merely names: a publish establishes the identity
    its cycle's validation and probe verified."""
    step = rec.get("step")
    engine = rec.get("engine") if isinstance(rec.get("engine"), str) else None
    if step == "admit":
        return Fact("admit", rec["seq"], str(rec["param"]), rec["committed"], engine=engine)
    if step in ("release", "release_aborted"):
        return Fact("release", rec["seq"], str(rec["param"]),
                    aborted=step == "release_aborted")
    if step in _VERIFIES_COMMITTED:
        return Fact("identity", rec["seq"], None, rec["committed"], _verified_identity(rec),
                    engine=engine)
    if step in _VERIFIES_TARGET:
        return Fact("verified", rec["seq"], None, rec["target"], _verified_identity(rec),
                    engine=engine)
    if step == "publish":  # committed is the generation it establishes
        return Fact("publish", rec["seq"], None, rec["committed"], engine=engine)
    detail = rec.get("detail")
    if step == "migrate" and engine is None and isinstance(detail, dict):
        return Fact("migrate", rec["seq"], str(detail.get("rollout")))
    return None


def _verified_identity(rec: Mapping[str, Any]) -> str | None:
    """The identity an ``*_ok`` outcome's evidence was verified against."""
    evidence = rec.get("evidence")
    expected = evidence.get("expected") if isinstance(evidence, dict) else None
    ident = expected.get("identity") if isinstance(expected, dict) else None
    return ident if isinstance(ident, str) else None


# -------------------------------------------------------------------------- the index


def _digest(rollout_id: str) -> int:
    d = hashlib.blake2b(rollout_id.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(d, "little", signed=True)


@dataclass(frozen=True)
class RecordVerdict:
    """The verdict on one record; ``position`` is its line (JSON lines) or row (Parquet)."""

    position: int
    rollout_id: str
    generation: int
    identity: str | None
    seq: int
    verdict: str
    reasons: tuple[str, ...]

    def as_json(self) -> dict[str, Any]:
        return {"position": self.position, "rollout_id": self.rollout_id,
                "generation": self.generation, "identity": self.identity, "seq": self.seq,
                "verdict": self.verdict, "reasons": list(self.reasons)}


class JournalIndex:
    """Admissions (seq -> rollout digest, generation, released, first claim) and the
    identity of each generation, from one streamed pass over a journal."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        """Raises OSError if the journal cannot be read, :class:`ProvenanceInputError`
        if it is not a journal (not even its header verifies)."""
        self.seqs = array("q")  # admission seqs, increasing (the chain guarantees it)
        self.rollouts = array("q")
        self.generations = array("q")
        self.released = bytearray()
        self.claimed = array("q")  # 1 + position of the first record claiming it; 0: none
        self.migrated = bytearray()  # 1: the rollout left this admission by a migration
        #: The same for the other samples of a group: (admission index, sample) -> 1 +
        #: position (only groups' records fill it).
        self.claimed_samples: dict[tuple[int, int], int] = {}
        #: An episode's turns (a group's episodes too) share its segment's admission:
        #: (admission index, turn, episode) -> 1 + position; and per episode, its last
        #: turn's (turn, segment, generation).
        self.claimed_turns: dict[tuple[int, int, str], int] = {}
        self.episodes: dict[str, tuple[int, int, int]] = {}
        self.engines = array("i")  # the member it was admitted on, as an index of names
        self.engine_names: list[str | None] = []
        engine_ids: dict[str | None, int] = {}
        self.identities: dict[int, str | None] = {}
        open_: dict[str, int] = {}  # bound rollout id -> its admission's index
        #: Per engine, the (generation, identity) its validation and probe verified last.
        verified: dict[str | None, tuple[int, str | None]] = {}
        reader = JournalReader(path)
        for _line, rec in reader:
            fact = journal_fact(rec)
            if fact is None:
                continue
            if fact.kind == "admit" and fact.rollout_id is not None:
                open_[fact.rollout_id] = len(self.seqs)
                self.seqs.append(fact.seq)
                self.rollouts.append(_digest(fact.rollout_id))
                self.generations.append(fact.generation)
                self.released.append(0)
                self.claimed.append(0)
                self.migrated.append(0)
                if fact.engine not in engine_ids:
                    engine_ids[fact.engine] = len(self.engine_names)
                    self.engine_names.append(fact.engine)
                self.engines.append(engine_ids[fact.engine])
            elif fact.kind == "migrate" and fact.rollout_id is not None:
                i = open_.get(fact.rollout_id)
                if i is not None:
                    self.migrated[i] = 1
            elif fact.kind == "release" and fact.rollout_id is not None:
                i = open_.pop(fact.rollout_id, None)
                if i is not None:
                    self.released[i] = ABORTED if fact.aborted else FINISHED
            elif fact.kind == "verified":
                seen = verified.get(fact.engine)
                if seen is not None and seen[0] == fact.generation and seen[1] != fact.identity:
                    fact = Fact("verified", fact.seq, None, fact.generation, _CONFLICT)
                verified[fact.engine] = (fact.generation, fact.identity)
            elif fact.kind in ("identity", "publish"):
                ident = fact.identity
                if fact.kind == "publish":
                    seen = verified.pop(fact.engine, None)
                    ident = seen[1] if seen is not None and seen[0] == fact.generation else None
                known = self.identities.get(fact.generation)
                if known is None:
                    self.identities[fact.generation] = ident
                elif ident not in (None, known):
                    self.identities[fact.generation] = _CONFLICT
        self.chain: ChainReport = reader.report
        if self.chain.records == 0:
            raise ProvenanceInputError(not_a_journal(path, self.chain))

    @property
    def admissions(self) -> int:
        return len(self.seqs)

    def check(self, position: int, record: TrajectoryRecord, *,
              unit: str = "line") -> RecordVerdict:
        """Judge the record at ``position`` (a ``unit``: line or row) of its file: its
        admission, or each admission of a migrated rollout's segments."""
        b = record.binding
        reasons: list[str] = []
        gen = b.generation
        unverifiable = False
        parts = record.segments or (None,)
        for k, seg in enumerate(parts):
            last = k == len(parts) - 1
            seq = b.seq if seg is None else seg.seq
            what = "" if seg is None else f"segment {k} ({seg.engine}, tokens " \
                f"{seg.start}..{seg.end}): "
            i = bisect_left(self.seqs, seq)
            if i == len(self.seqs) or self.seqs[i] != seq:
                beyond = seq > self.chain.last_seq
                reasons.append(f"{what}no admission at journal seq {seq}"
                               + (f" (the journal ends at seq {self.chain.last_seq})"
                                  if beyond else ""))
                continue
            if self.rollouts[i] != _digest(b.rollout_id):
                reasons.append(f"{what}journal seq {seq} admits another rollout than "
                               f"{b.rollout_id!r}")
            if k == 0:
                gen = self.generations[i]
                if b.generation != gen:
                    reasons.append(f"claims generation {b.generation}, admitted under "
                                   f"generation {gen}")
                ident = self.identities.get(gen)
                if ident == _CONFLICT:
                    reasons.append(f"the journal names two identities for generation {gen}")
                elif ident is None:
                    unverifiable = True
                elif b.identity != ident:
                    reasons.append(f"claims identity {b.identity}, generation {gen} is "
                                   f"{ident} in the journal")
            elif self.generations[i] != b.generation:
                reasons.append(f"{what}admitted under generation {self.generations[i]}, the "
                               f"rollout under {b.generation}: one rollout, two policies")
            if seg is not None:
                if seg.generation != b.generation:
                    reasons.append(f"{what}claims generation {seg.generation}, the "
                                   f"rollout's binding {b.generation}")
                on = self.engine_names[self.engines[i]]
                if on != seg.engine:
                    reasons.append(f"{what}claims member {seg.engine!r}, journal seq {seq} "
                                   f"admitted it on {on!r}")
            turn = record.episode.turn if record.episode is not None else 0
            tkey = (i, turn, record.episode.episode if record.episode is not None else "")
            first = self.claimed_turns.get(tkey, 0) if turn else \
                self.claimed[i] if record.sample == 0 else \
                self.claimed_samples.get((i, record.sample), 0)
            if first:
                which = f"sample {record.sample} of " if record.sample else \
                    f"turn {turn} of " if turn else ""
                reasons.append(f"{what}a second record for {which}the admission at seq {seq} "
                               f"(the first is at {unit} {first - 1})")
            elif turn:
                self.claimed_turns[tkey] = position + 1
            elif record.sample == 0:
                self.claimed[i] = position + 1
            else:
                self.claimed_samples[(i, record.sample)] = position + 1
            if last and self.migrated[i]:
                reasons.append(f"{what}the journal migrated the rollout off its admission at "
                               f"seq {seq}: the record omits the segments that followed")
            elif not last and not self.migrated[i]:
                reasons.append(f"{what}ends before the rollout did, but the journal never "
                               f"migrated it off its admission at seq {seq}")
            if not self.released[i]:
                reasons.append(f"{what}its admission (seq {seq}) was never released in the "
                               "journal")
            elif last and (self.released[i] == ABORTED) != b.aborted:
                said = "aborted" if b.aborted else "finished"
                was = "aborted by the drain" if self.released[i] == ABORTED else "finished"
                reasons.append(f"claims it {said}; the journal released it as {was}")
            elif not last and self.released[i] == ABORTED:
                reasons.append(f"{what}the drain aborted it: the rollout cannot go on")
        if record.episode is not None:
            reasons += self._episode_turn(record)
        if reasons:
            return self._verdict(position, record, REJECTED, reasons)
        if unverifiable:
            return self._verdict(position, record, UNVERIFIABLE, [
                f"identity unverifiable: the journal names no identity for generation {gen}"])
        return self._verdict(position, record, CONSISTENT, [])

    def _episode_turn(self, record: TrajectoryRecord) -> list[str]:
        """An episode's turn: under its segment's admission (the gateway names a hold
        ``<episode or its group>#<segment>.<n>``, and the digest above ties the name to
        the journal),
        after the turn before it, and its segments in the spec's order: one generation
        per segment, each segment under a newer one (records in the order written)."""
        e = record.episode
        assert e is not None
        out = []
        if not record.rollout_id.startswith(f"{e.holder}#{e.segment}."):
            out.append(f"turn {e.turn} of episode {e.episode!r} claims segment {e.segment}"
                       + (f" of group {e.group!r}" if e.group else "") + f"; its admission "
                       f"{record.rollout_id!r} is not that segment's")
        last = self.episodes.get(e.episode)
        now = (e.segment, record.version)
        if last is not None:
            if e.turn <= last[0]:
                out.append(f"turn {e.turn} of episode {e.episode!r} comes after its turn "
                           f"{last[0]}")
            pair = ((last[1], last[2]), now)
            if not (one_policy_per_segment(pair) and segments_in_order(pair)):
                out.append(f"episode {e.episode!r}: segment {e.segment} under generation "
                           f"{record.version} follows segment {last[1]} under "
                           f"{last[2]} (one generation per segment, each newer)")
        self.episodes[e.episode] = (e.turn, *now)
        return out

    @staticmethod
    def _verdict(position: int, record: TrajectoryRecord, verdict: str,
                 reasons: list[str]) -> RecordVerdict:
        b = record.binding
        return RecordVerdict(position, b.rollout_id, b.generation, b.identity, b.seq,
                             verdict, tuple(reasons))


__all__ = ["CONSISTENT", "REJECTED", "UNVERIFIABLE", "Fact", "JournalIndex",
           "ProvenanceInputError", "RecordVerdict", "journal_fact"]
