"""Pictures of a run (``rolloutcore report``): what the journal says happened, drawn.

The timeline is the main one: one lane per engine (a fleet journal's members; an engine
journal has one), wall time across, the engine's lifecycle phase as coloured background
spans, and every rollout in flight as a thin bar from its ``admit`` to its ``release``,
coloured by the generation it was admitted under and stacked in sub-rows so that bars do
not overlap. Invariant 1 (one rollout, one policy) is then visible at a glance: no bar
crosses a mutation span (UPDATING, INVALIDATING, VALIDATING) on its lane;
:func:`crossings` says the same in data, and the summary counts them. Publishes,
quarantines, fences, migrations and a fleet's aborted updates are marked.

With trajectory records, a second picture: each record's staleness, the newest
generation committed anywhere in the fleet when its admission was released minus the
record's generation (the journal decides both times). An RL run adds its mean reward per
step (:func:`reward_png`). :func:`write_report` writes every picture that applies and one
self-contained HTML page (``index.html``: the PNGs embedded as data URLs).

The journal is streamed once (chain verified, through :class:`JournalReader`); what is
kept is what is drawn: one span per phase change, one bar per admission, one mark per
event. matplotlib is imported only when drawing (Agg, no pyplot: no global state), so
this module imports without it; :func:`drawing_unavailable` says whether it can draw.
"""

from __future__ import annotations

import base64
import heapq
import html
import json
import math
import os
from bisect import bisect_left
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rolloutcore.errors import BadInput, Refused, RolloutCoreError
from rolloutcore.inputs import unreadable
from rolloutcore.journal import ChainReport, JournalReader, not_a_journal
from rolloutcore.spec.fleet import FLEET, FleetPhase
from rolloutcore.spec.lifecycle import Phase
from rolloutcore.trajectories.format import RecordError, iter_records_at
from rolloutcore.trajectories.provenance import journal_fact

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

#: The phases in which the weights mutate: no rollout may be in flight on that engine.
MUTATION_PHASES = frozenset({Phase.UPDATING.value, Phase.INVALIDATING.value,
                             Phase.VALIDATING.value})
ENGINE_LANE = "engine"  # the one lane of a single-engine journal (it names no engine)
NO_MEMBER = "(no member)"  # a fleet record that should name a member and does not

#: One colour per phase, the same in every picture: serving is light (the bars go on
#: it), draining and quiesced warm, the mutation itself a purple family (the spans a bar
#: must never cross), resuming blue, TAINTED red.
PHASE_COLOURS: dict[str, str] = {
    Phase.UNINITIALIZED: "#d9d9d9",
    Phase.READY: "#edf7ed",
    Phase.DRAINING: "#fde3a7",
    Phase.QUIESCED: "#f9b97c",
    Phase.UPDATING: "#5b2c8f",
    Phase.INVALIDATING: "#8460c0",
    Phase.VALIDATING: "#b39ddf",
    Phase.RESUMING: "#9cc9ec",
    Phase.TAINTED: "#d62728",
}
#: The fleet's own phase, drawn in a strip above the members: not a member's phase
#: (its UPDATING means "admissions closed for a two-phase commit", not a mutation).
FLEET_COLOURS: dict[str, str] = {
    FleetPhase.READY: "#edf7ed",
    FleetPhase.UPDATING: "#8d99ae",
    FleetPhase.ROLLING: "#9fd8cb",
    FleetPhase.ABORTING: "#e76f51",
}
FLEET_MEANING: dict[str, str] = {
    FleetPhase.READY: "fleet: READY",
    FleetPhase.UPDATING: "fleet: UPDATING (closed)",
    FleetPhase.ROLLING: "fleet: ROLLING",
    FleetPhase.ABORTING: "fleet: ABORTING",
}
_UNKNOWN_PHASE_COLOURS = ("#bdbdbd", "#a1887f", "#90a4ae", "#c5e1a5")
#: Generation colours: qualitative, strong on the light serving background, avoiding
#: the mutation purples and the TAINTED red.
_GENERATION_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#8c564b", "#e377c2", "#17becf",
                       "#bcbd22", "#393b79", "#7f7f7f", "#637939")

#: Timeline geometry, in lane units (lane i spans y in [i, i + 1), the first on top):
#: the phase fills the lane; the bars keep off its top, where the phase always shows.
_LANE_TOP, _LANE_BOTTOM = 0.06, 0.94
_BARS_TOP = 0.30
_MAX_BAR = 0.13  # a bar is thin even when a lane has few rollouts at once
_FLEET_STRIP = (-0.42, -0.12)
_LEGEND_ROWS = 5
_GEN_LEGEND_X, _EVENT_LEGEND_X = 0.50, 0.72  # figure fractions: the legends' columns
_MIN_SPAN_PX = 2.5  # a phase span shorter than this is drawn this wide (else invisible)
_DPI = 100


class ReportInputError(BadInput, ValueError):
    """An input the report cannot use; the message names the file (``path: what`` or
    ``path:line: what``)."""


class JournalFailsVerification(Refused):
    """The journal's chain breaks before its end (anything but a torn final record, which
    recovery and the trace checker ignore as well): nothing is drawn, a negative verdict
    as ``journal verify`` gives."""

    def __init__(self, journal: Path, chain: ChainReport) -> None:
        super().__init__(f"{journal}: broken at line {chain.first_bad_line}: {chain.reason}")
        self.chain = chain


class DrawingUnavailable(RolloutCoreError, RuntimeError):
    """matplotlib is not installed: nothing can be drawn (not bad input)."""


# ------------------------------------------------------------------ what the journal says


@dataclass(frozen=True, slots=True)
class Span:
    """A lane in one phase from ``start`` to ``end`` (seconds from the journal's first
    record)."""

    lane: str
    phase: str
    start: float
    end: float


@dataclass(slots=True)
class Bar:
    """One admission: a rollout in flight on ``lane`` from ``start`` to ``end`` (None:
    the journal never releases it), under ``generation``, drawn in sub-row ``row``."""

    lane: str
    rollout_id: str
    generation: int
    seq: int  # the admission's journal seq
    start: float
    end: float | None = None
    aborted: bool = False  # released by the drain's abort
    row: int = 0
    newest: int = 0  # the newest generation committed anywhere when it was released
    recorded: bool | None = None  # with records: whether a trajectory record claims it


@dataclass(frozen=True, slots=True)
class Mark:
    """An event: ``publish`` (of ``generation`` on ``lane``), ``fleet_publish`` (the
    fleet's commit, ``lane`` None), ``quarantine`` (``lane`` turned TAINTED), ``fence``,
    ``fence_failed``, ``migrate`` (a rollout moved from ``lane`` to ``to_lane``),
    ``abort`` (a fleet update or wave given up)."""

    kind: str
    t: float
    lane: str | None
    generation: int = 0
    to_lane: str | None = None
    rollout_id: str | None = None  # migrate: the rollout moved


@dataclass
class Timeline:
    """What :func:`read_timeline` found in a journal: the lanes, their phase spans, the
    rollout bars, the marks. Times are seconds from the journal's first record (its
    header, at epoch ``t0``)."""

    journal: Path
    fleet: bool
    t0: float
    end: float
    lanes: list[str]
    spans: list[Span]
    fleet_spans: list[Span]
    bars: list[Bar]
    marks: list[Mark]
    rows: dict[str, int]  # sub-rows per lane: its most rollouts in flight at once
    generations: list[int]  # every generation committed in the journal, ascending
    chain: ChainReport
    records: RecordStats | None = None

    def spans_of(self, lane: str, phases: Iterable[str] | None = None) -> list[Span]:
        wanted = None if phases is None else frozenset(phases)
        return [s for s in self.spans
                if s.lane == lane and (wanted is None or s.phase in wanted)]

    def bars_of(self, lane: str) -> list[Bar]:
        return [b for b in self.bars if b.lane == lane]

    def summary(self) -> list[str]:
        """A few lines for people: engines, generations, rollouts, time span, crossings."""
        released = [b for b in self.bars if b.end is not None]
        aborted = sum(b.aborted for b in released)
        open_ = len(self.bars) - len(released)
        gens = self.generations
        first = datetime.fromtimestamp(self.t0, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
        cross = crossing_rollouts(self)
        lines = [
            f"journal: {self.journal.name} ({'fleet' if self.fleet else 'engine'} journal, "
            f"{self.chain.records} records, {_chain_note(self.chain)})",
            f"engines: {len(self.lanes)} ({', '.join(self.lanes)})",
            "generations committed: " + (f"{gens[0]}..{gens[-1]}" if len(gens) > 1 else
                                         str(gens[0]) if gens else "none"),
            f"rollouts: {len(self.bars)} admitted, {len(released) - aborted} finished, "
            f"{aborted} aborted by a drain, {open_} never released in the journal",
            f"time span: {self.end:.3f} s from {first} UTC",
            f"rollouts in flight across a mutation span: {len(cross)}"
            + (" (" + "; ".join(f"{b.rollout_id} on {b.lane} during {', '.join(phases)}"
                                for b, phases in cross[:5])
               + ("; ..." if len(cross) > 5 else "") + ")" if cross else ""),
        ]
        if self.records is not None:
            r = self.records
            lines.append(f"trajectory records: {r.records} ({r.path.name}); "
                         f"{r.recorded} of {len(self.bars)} admissions have one"
                         + (f"; {r.unmatched} name an admission the journal does not "
                            "release (not in the staleness picture)" if r.unmatched else ""))
        return lines

    def as_json(self) -> dict[str, Any]:
        released = [b for b in self.bars if b.end is not None]
        out: dict[str, Any] = {
            "journal": str(self.journal), "fleet": self.fleet, "engines": self.lanes,
            "generations": self.generations, "rollouts": len(self.bars),
            "aborted": sum(b.aborted for b in released),
            "never_released": len(self.bars) - len(released), "seconds": self.end,
            "start": self.t0, "chain_ok": self.chain.ok, "chain": _chain_note(self.chain),
            "crossings": len(crossing_rollouts(self))}
        if self.records is not None:
            out["records"] = self.records.as_json()
        return out


@dataclass
class RecordStats:
    """Trajectory records read against a timeline: the staleness histogram and the
    records whose (last) admission the journal does not release."""

    path: Path
    records: int = 0
    recorded: int = 0  # admissions some record claims
    unmatched: int = 0
    lags: Counter[int] = field(default_factory=Counter)

    def as_json(self) -> dict[str, Any]:
        return {"file": str(self.path), "records": self.records, "recorded": self.recorded,
                "unmatched": self.unmatched,
                "staleness": {str(k): v for k, v in sorted(self.lags.items())}}


def _chain_note(chain: ChainReport) -> str:
    if chain.ok:
        return "chain intact"
    if chain.truncated:
        return f"line {chain.first_bad_line} is a torn final record (ignored)"
    return f"chain broken at line {chain.first_bad_line}: {chain.reason}; drawn up to there"


class _Lanes:
    """The streaming state of :func:`read_timeline`: each lane's current phase, its
    rollouts in flight and their free sub-rows."""

    def __init__(self) -> None:
        self.order: list[str] = []
        self.phase: dict[str, tuple[str, float]] = {}  # lane -> (phase, since)
        self.free: dict[str, list[int]] = {}  # lane -> heap of free sub-rows
        self.rows: dict[str, int] = {}

    def see(self, lane: str) -> None:
        if lane not in self.rows:
            self.order.append(lane)
            self.rows[lane] = 0
            self.free[lane] = []

    def take_row(self, lane: str) -> int:
        self.see(lane)
        free = self.free[lane]
        if free:
            return heapq.heappop(free)
        self.rows[lane] += 1
        return self.rows[lane] - 1

    def give_row(self, lane: str, row: int) -> None:
        heapq.heappush(self.free[lane], row)


def _advance(current: dict[str, tuple[str, float]], spans: list[Span], lane: str,
             phase: str, x: float) -> str | None:
    """Lane ``lane`` is in ``phase`` from ``x`` on; close its previous span if the phase
    changed. Returns the phase it left (None: no change, or its first record)."""
    was = current.get(lane)
    if was is not None and was[0] == phase:
        return None
    if was is not None:
        spans.append(Span(lane, was[0], was[1], x))
    current[lane] = (phase, x)
    return None if was is None else was[0]


_FENCE_MARKS = {"fence_ok": "fence", "fence_failed": "fence_failed"}
_FLEET_PUBLISHES = frozenset({"fleet_publish", "fleet_publish_wave"})
_FLEET_ABORTS = frozenset({"fleet_abort", "fleet_abort_wave"})


def read_timeline(journal: str | os.PathLike[str]) -> Timeline:
    """The timeline of a journal (engine or fleet), in one streamed pass. Admissions and
    releases are read through :func:`rolloutcore.trajectories.provenance.journal_fact`, the
    one place that knows how records say them. Raises :class:`ReportInputError` if the journal
    cannot be read or is not a journal (not even its header verifies)."""
    path = Path(journal)
    reader = JournalReader(path)
    lanes = _Lanes()
    spans: list[Span] = []
    fleet_spans: list[Span] = []
    fleet_phase: dict[str, tuple[str, float]] = {}
    bars: list[Bar] = []
    marks: list[Mark] = []
    open_: dict[str, int] = {}  # rollout id -> its bar in flight
    members: list[str] = []  # as the fleet's fleet_open names them
    committed: set[int] = set()
    episodes_seen: dict[str, str] = {}  # "<episode>#<segment>" -> episode, once held
    t0, end, newest, fleet = 0.0, 0.0, 0, False
    try:
        for n, rec in reader:
            if n == 1:  # the header: the spec it follows, the time everything counts from
                t0, fleet = float(rec["t"]), rec.get("spec") == FLEET.name
                continue
            x = float(rec["t"]) - t0
            end = max(end, x)
            newest = max(newest, rec["committed"])
            if rec["committed"]:
                committed.add(rec["committed"])
            step, phase = rec["step"], rec["phase"]
            engine = rec.get("engine") if isinstance(rec.get("engine"), str) else None
            if fleet and engine is None:  # the fleet's own step
                _advance(fleet_phase, fleet_spans, "fleet", phase, x)
                _fleet_mark(rec, x, marks, members)
            else:
                lane = engine if engine is not None else ENGINE_LANE
                lanes.see(lane)
                left = _advance(lanes.phase, spans, lane, phase, x)
                if phase == Phase.TAINTED and left not in (None, Phase.TAINTED):
                    marks.append(Mark("quarantine", x, lane))
                if step in _FENCE_MARKS:
                    marks.append(Mark(_FENCE_MARKS[step], x, lane))
            fact = journal_fact(rec)
            if fact is None:
                continue
            if fact.kind == "admit" and fact.rollout_id is not None:
                lane = fact.engine or (NO_MEMBER if fleet else ENGINE_LANE)
                open_[fact.rollout_id] = len(bars)
                bars.append(Bar(lane, fact.rollout_id, fact.generation, fact.seq, x,
                                row=lanes.take_row(lane)))
                d = rec.get("detail")
                if isinstance(d, Mapping) and type(d.get("segment")) is int \
                        and d["segment"] > 1 and d.get("episode") != episodes_seen.get(
                            fact.rollout_id.rsplit(".", 1)[0]):
                    # an agentic episode's next segment starts here (a hold it takes again
                    # for the same segment is not a boundary)
                    marks.append(Mark("segment", x, lane, fact.generation,
                                      rollout_id=fact.rollout_id))
                if isinstance(d, Mapping) and isinstance(d.get("episode"), str):
                    episodes_seen[fact.rollout_id.rsplit(".", 1)[0]] = d["episode"]
            elif fact.kind == "release" and fact.rollout_id is not None:
                i = open_.pop(fact.rollout_id, None)
                if i is not None:  # a release of nothing in flight: the trace checker's
                    b = bars[i]
                    b.end, b.aborted, b.newest = x, fact.aborted, newest
                    lanes.give_row(b.lane, b.row)
            elif fact.kind == "publish":
                marks.append(Mark("publish", x, fact.engine or ENGINE_LANE, fact.generation))
    except OSError as e:
        raise ReportInputError(unreadable(path, e)) from None
    chain = reader.report
    if chain.records == 0:
        raise ReportInputError(not_a_journal(path, chain))
    for lane, (phase, since) in lanes.phase.items():
        spans.append(Span(lane, phase, since, end))
    for phase, since in fleet_phase.values():
        fleet_spans.append(Span("fleet", phase, since, end))
    spans.sort(key=lambda s: (s.lane, s.start))
    order = [m for m in members if m in lanes.rows] + \
        [lane for lane in lanes.order if lane not in members]
    order += [m for m in members if m not in lanes.rows]  # named, never heard of: shown
    return Timeline(path, fleet, t0, end, order, spans, fleet_spans, bars, marks,
                    {lane: lanes.rows.get(lane, 0) for lane in order}, sorted(committed),
                    chain)


def _fleet_mark(rec: Mapping[str, Any], x: float, marks: list[Mark],
                members: list[str]) -> None:
    step = rec["step"]
    raw = rec.get("detail")
    detail: Mapping[str, Any] = raw if isinstance(raw, dict) else {}
    if step == "fleet_open" and not members:
        members.extend(m for m in detail.get("members", ()) if isinstance(m, str))
    elif step in _FLEET_PUBLISHES:
        marks.append(Mark("fleet_publish", x, None, rec["committed"]))
    elif step in _FLEET_ABORTS:
        marks.append(Mark("abort", x, None))
    elif step == "migrate":
        moved = detail.get("members")
        if isinstance(moved, list) and len(moved) == 2 and all(isinstance(m, str)
                                                               for m in moved):
            rollout, gen = detail.get("rollout"), detail.get("generation")
            marks.append(Mark("migrate", x, moved[0], gen if type(gen) is int else 0,
                              to_lane=moved[1],
                              rollout_id=rollout if isinstance(rollout, str) else None))


def overlaps(bars: Iterable[Bar], spans: Iterable[Span], *,
             end: float = math.inf) -> list[tuple[Bar, Span]]:
    """Every (bar, span) on the same lane whose open intervals intersect: a rollout in
    flight during the span. A bar never released runs to ``end``. Touching ends (a
    release at the instant the span begins) do not overlap. The spans of one lane must
    not overlap one another (a lane is in one phase at a time: a timeline's never do)."""
    by_lane: dict[str, list[Span]] = {}
    for s in spans:
        by_lane.setdefault(s.lane, []).append(s)
    for lane_spans in by_lane.values():
        lane_spans.sort(key=lambda s: s.start)
    out: list[tuple[Bar, Span]] = []
    for b in bars:
        lane_spans = by_lane.get(b.lane, [])
        b_end = end if b.end is None else b.end
        # the spans of one lane do not overlap each other: those that may meet the bar
        # start before it ends, and among them only the last few end after it starts
        i = bisect_left(lane_spans, b_end, key=lambda s: s.start) - 1
        while i >= 0 and lane_spans[i].end > b.start:
            out.append((b, lane_spans[i]))
            i -= 1
    return out


def crossings(timeline: Timeline,
              phases: Iterable[str] = MUTATION_PHASES) -> list[tuple[Bar, Span]]:
    """The rollouts in flight across a span of ``phases`` (default: the mutation) on
    their own lane: empty when invariant 1 held throughout the journal."""
    wanted = frozenset(phases)
    return overlaps(timeline.bars, [s for s in timeline.spans if s.phase in wanted],
                    end=timeline.end)


def crossing_rollouts(timeline: Timeline) -> list[tuple[Bar, list[str]]]:
    """Each rollout in flight across a mutation, once, with the mutation phases it
    crossed (in time order)."""
    out: dict[int, tuple[Bar, list[tuple[float, str]]]] = {}
    for b, s in crossings(timeline):
        out.setdefault(id(b), (b, []))[1].append((s.start, s.phase))
    return [(b, [p for _, p in sorted(spans)]) for b, spans in out.values()]


def attach_records(timeline: Timeline, records: str | os.PathLike[str]) -> RecordStats:
    """Read trajectory records (JSON lines or Parquet, streamed) against the timeline:
    mark the bars some record claims, and count each record's staleness: the newest
    generation committed anywhere when its admission (a migrated rollout's last) was
    released, minus the record's generation. Raises :class:`ReportInputError` for a file
    that cannot be read or a malformed record (naming its line or row)."""
    path = Path(records)
    stats = RecordStats(path)
    bars = timeline.bars  # in admission order: seqs increase along the chain
    for b in bars:
        b.recorded = False
    try:
        for _pos, rec in iter_records_at(path):
            stats.records += 1
            seqs = [s.seq for s in rec.segments] or [rec.binding.seq]
            found: Bar | None = None
            for seq in seqs:
                i = bisect_left(bars, seq, key=lambda b: b.seq)
                found = bars[i] if i < len(bars) and bars[i].seq == seq else None
                if found is not None and not found.recorded:
                    found.recorded = True
                    stats.recorded += 1
            if found is None or found.end is None:
                stats.unmatched += 1
            else:
                stats.lags[found.newest - rec.binding.generation] += 1
    except RecordError as e:
        raise ReportInputError(str(e)) from None
    except OSError as e:
        raise ReportInputError(unreadable(path, e)) from None
    if stats.records == 0:
        raise ReportInputError(f"{path}: no records (empty file)")
    timeline.records = stats
    return stats


def read_steps(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Training steps from a JSON-lines file (one object a line: ``step``,
    ``mean_reward``, optionally ``generation``), checked as :func:`reward_png` needs.
    Raises :class:`ReportInputError` naming the line."""
    p = Path(path)
    out: list[dict[str, Any]] = []
    try:
        with open(p, encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except ValueError as e:
                    raise ReportInputError(f"{p}:{n}: not JSON: {e}") from None
                problem = _step_problem(obj)
                if problem:
                    raise ReportInputError(f"{p}:{n}: {problem}")
                out.append(obj)
    except (OSError, UnicodeDecodeError) as e:
        raise ReportInputError(unreadable(p, e)) from None
    if not out:
        raise ReportInputError(f"{p}: no steps (empty file)")
    return out


def _step_problem(obj: Any) -> str | None:
    if not isinstance(obj, dict):
        return "not a JSON object"
    for key, kinds in (("step", (int,)), ("mean_reward", (int, float))):
        v = obj.get(key)
        if not isinstance(v, kinds) or isinstance(v, bool):
            return f"{key} is {'missing' if key not in obj else f'not a number: {v!r:.40}'}"
        if isinstance(v, float) and not math.isfinite(v):
            return f"{key} is not finite: {v!r}"
    g = obj.get("generation")
    if g is not None and (not isinstance(g, int) or isinstance(g, bool)):
        return f"generation is not an integer: {g!r:.40}"
    return None


# --------------------------------------------------------------------------- drawing


def drawing_unavailable() -> str | None:
    """Why nothing can be drawn here (matplotlib missing), or None."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as e:
        return f"matplotlib is not installed ({e}); pip install 'matplotlib>=3.8'"
    return None


def _figure(width_in: float, height_in: float, *, constrained: bool = True) -> Figure:
    """A figure on the Agg canvas, outside pyplot (no global backend, no global state)."""
    why = drawing_unavailable()
    if why:
        raise DrawingUnavailable(why)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width_in, height_in), dpi=_DPI,
                 layout="constrained" if constrained else None)
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Figure, out: Path) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png", dpi=_DPI)
    return out


def generation_colours(generations: Sequence[int]) -> dict[int, str]:
    """A colour per generation. Up to ten: the qualitative palette, generation g in its
    g-th colour where that keeps them apart (so gen 1 is the same blue in every run).
    More: one step each of a sequential map over the generations' range (viridis from
    blue to green: no purple, no red, no yellow, so never confused with a mutation,
    TAINTED or a drain), with a colour bar."""
    gens = sorted(set(generations))
    k = len(_GENERATION_COLOURS)
    if len({(g - 1) % k for g in gens}) == len(gens):
        return {g: _GENERATION_COLOURS[(g - 1) % k] for g in gens}
    if len(gens) <= k:
        return {g: _GENERATION_COLOURS[i] for i, g in enumerate(gens)}
    from matplotlib.colors import to_hex

    cmap, norm = _generation_scale(gens[0], gens[-1])
    return {g: to_hex(cmap(norm(g))) for g in gens}


def _generation_scale(lo: int, hi: int) -> tuple[Any, Any]:
    """The sequential colour map and its discrete norm (one step per generation)."""
    from matplotlib import colormaps
    from matplotlib.colors import BoundaryNorm, ListedColormap

    steps = hi - lo + 1
    base = colormaps["viridis"]
    cmap = ListedColormap([base(0.22 + 0.6 * i / max(steps - 1, 1)) for i in range(steps)])
    return cmap, BoundaryNorm([g - 0.5 for g in range(lo, hi + 2)], steps)


def phase_colour(phase: str, *, fleet: bool = False) -> str:
    table = FLEET_COLOURS if fleet else PHASE_COLOURS
    if phase in table:
        return table[phase]
    # a phase this build does not know: drawn (and named in the legend) in a grey of
    # its own, never passed over
    return _UNKNOWN_PHASE_COLOURS[sum(map(ord, phase)) % len(_UNKNOWN_PHASE_COLOURS)]


def timeline_png(journal: Path, out: Path, *, records: Path | None = None) -> Path:
    """Draw the journal's timeline into ``out`` (PNG). With ``records``, the bars of
    admissions that no trajectory record claims are drawn hollow."""
    tl = read_timeline(journal)
    if records is not None:
        attach_records(tl, records)
    return draw_timeline(tl, out)


def draw_timeline(tl: Timeline, out: Path) -> Path:
    """Draw a :class:`Timeline` (see :func:`timeline_png`): 14 x (3 + 1.5 per lane)
    inches at 100 dpi, the legends in a row below the lanes."""
    from matplotlib.collections import PolyCollection
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    n = max(len(tl.lanes), 1)
    width_in, height_in = 14.0, 3.0 + 1.5 * n
    fig = _figure(width_in, height_in, constrained=False)
    # a fixed layout (inches), so that nothing depends on what the text happens to be
    strip = "(fleet)" if "fleet" in tl.lanes else "fleet"  # a member may be named so
    labels = [strip, *tl.lanes] if tl.fleet else list(tl.lanes)
    left = 0.35 + 0.085 * max(len(x) for x in labels or ["engine"])
    right, top, bottom = 0.25, 0.8, 1.75
    ax = fig.add_axes((left / width_in, bottom / height_in,
                       1 - (left + right) / width_in, 1 - (top + bottom) / height_in))
    span_s = tl.end if tl.end > 0 else 1.0
    axes_px = (width_in - left - right) * _DPI
    min_w = span_s * 1.02 * _MIN_SPAN_PX / axes_px
    y_of = {lane: i for i, lane in enumerate(tl.lanes)}
    top_y = _FLEET_STRIP[0] - 0.1 if tl.fleet else -0.02
    lane_px = (height_in - top - bottom) * _DPI / (n + 0.02 - top_y)

    # The phases, behind everything. A span too short to see is widened to min_w; the
    # mutation and TAINTED go second, so that a widened neighbour never hides them.
    polys: list[list[tuple[float, float]]] = []
    colours: list[str] = []
    phases_seen: set[str] = set()
    for urgent in (False, True):
        for s in sorted(tl.spans, key=lambda s: s.start):
            if (s.phase in MUTATION_PHASES or s.phase == Phase.TAINTED) != urgent:
                continue
            lane_y = y_of[s.lane]
            right_x = s.end if s.phase == Phase.READY else max(s.end, s.start + min_w)
            polys.append(_rect(s.start, right_x, lane_y + _LANE_TOP, lane_y + _LANE_BOTTOM))
            colours.append(phase_colour(s.phase))
            phases_seen.add(s.phase)
    fleet_seen: set[str] = set()
    for s in sorted(tl.fleet_spans, key=lambda s: s.start):
        right_x = s.end if s.phase == FleetPhase.READY else max(s.end, s.start + min_w)
        polys.append(_rect(s.start, right_x, *_FLEET_STRIP))
        colours.append(phase_colour(s.phase, fleet=True))
        fleet_seen.add(s.phase)
    ax.add_collection(PolyCollection(polys, facecolors=colours, edgecolors="none",
                                     zorder=1))

    # The rollouts: thin bars in sub-rows of the lane's lower part.
    gcol = generation_colours([b.generation for b in tl.bars] or [1])
    solid: list[list[tuple[float, float]]] = []
    solid_c: list[str] = []
    hollow: list[list[tuple[float, float]]] = []
    hollow_c: list[str] = []
    open_ends: list[tuple[float, float]] = []
    aborted: list[tuple[float, float]] = []
    bar_y: dict[int, float] = {}  # id(bar) -> its middle (the migration marks use it)
    crossed = {id(b) for b, _ in crossing_rollouts(tl)}
    flagged: list[list[tuple[float, float]]] = []  # outlined: a violation must stand out
    for b in tl.bars:
        rows = max(tl.rows.get(b.lane, 1), 1)
        h = min((_LANE_BOTTOM - _BARS_TOP) / rows, _MAX_BAR)
        # the stack of sub-rows sits in the middle of the lane's lower part
        y = y_of[b.lane] + (_BARS_TOP + _LANE_BOTTOM - rows * h) / 2 + b.row * h
        bar_y[id(b)] = y + h / 2
        pad = h * 0.15 if h * lane_px > 4 else 0.0  # bars thinner than 4 px: no gap
        end = tl.end if b.end is None else b.end
        r = _rect(b.start, max(end, b.start + min_w / 2), y + pad, y + h - pad)
        if b.recorded is False:
            hollow.append(r)
            hollow_c.append(gcol[b.generation])
        else:
            solid.append(r)
            solid_c.append(gcol[b.generation])
        if id(b) in crossed:
            flagged.append(r)
        if b.end is None:
            open_ends.append((end, y + h / 2))
        elif b.aborted:
            aborted.append((end, y + h / 2))
    if solid:
        ax.add_collection(PolyCollection(solid, facecolors=solid_c, edgecolors="none",
                                         alpha=0.65 if len(tl.bars) > 200 else 0.9,
                                         zorder=3))
    if hollow:
        ax.add_collection(PolyCollection(hollow, facecolors="none", edgecolors=hollow_c,
                                         linewidths=0.7, zorder=3))
    if flagged:
        ax.add_collection(PolyCollection(flagged, facecolors="none", edgecolors="#e00000",
                                         linewidths=1.8, zorder=4))
    if aborted:
        ax.plot(*zip(*aborted, strict=True), ls="none", marker="x", color="#222222", ms=4,
                mew=1, zorder=4)
    if open_ends:
        ax.plot(*zip(*open_ends, strict=True), ls="none", marker=">", color="#222222",
                ms=4, zorder=4)
    marks_seen = _draw_marks(ax, tl, y_of, bar_y)

    ax.set_ylim(n + 0.02, top_y)
    ax.set_xlim(-span_s * 0.01, span_s * 1.015)
    ticks = [i + (_LANE_TOP + _LANE_BOTTOM) / 2 for i in range(len(tl.lanes))]
    if tl.fleet:
        ticks.insert(0, sum(_FLEET_STRIP) / 2)
    ax.set_yticks(ticks, labels)
    ax.tick_params(axis="y", length=0, labelsize=11)
    ax.set_xlabel("seconds since the journal's first record", fontsize=10)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    ax.grid(axis="x", color="#d0d0d0", lw=0.5)
    ax.set_axisbelow(True)
    cross = len(crossed)
    gens = tl.generations
    fig.text(left / width_in, 1 - 0.15 / height_in,
             f"{tl.journal.name}: {len(tl.lanes)} engine{'s' if len(tl.lanes) != 1 else ''}"
             f", {len(tl.bars)} rollouts, generations "
             + (f"{gens[0]}-{gens[-1]}" if len(gens) > 1 else str(gens[0]) if gens else
                "none") + f", {tl.end:.3g} s", fontsize=13, va="top")
    fig.text(left / width_in, 1 - 0.45 / height_in,
             (f"{cross} rollout{'s' if cross != 1 else ''} in flight across a mutation"
              if cross else
              "no rollout in flight across a mutation")
             + " (UPDATING / INVALIDATING / VALIDATING) on its engine",
             fontsize=10.5, va="top", color="#b00000" if cross else "#333333")

    # The legends, in a row below: phases, generations, events.
    known = [p.value for p in Phase]
    phase_handles: list[Any] = [
        Patch(facecolor=phase_colour(p), edgecolor="#9a9a9a", lw=0.5, label=p)
        for p in sorted(phases_seen, key=lambda p: (known.index(p) if p in known
                                                    else len(known), p))]
    phase_handles += [Patch(facecolor=phase_colour(p, fleet=True), edgecolor="#9a9a9a",
                            lw=0.5, label=FLEET_MEANING.get(p, f"fleet {p}"))
                      for p in sorted(fleet_seen)]
    many_gens = len(gcol) > len(_GENERATION_COLOURS)
    gen_handles: list[Any] = [] if many_gens else [
        Patch(color=c, label=f"gen {g}") for g, c in gcol.items()]
    events = _mark_handles(fleet=tl.fleet)
    mark_handles: list[Any] = [events[k] for k in events if k in marks_seen]
    if hollow:
        mark_handles.append(Patch(facecolor="none", edgecolor="#444444", lw=0.8,
                                  label="no trajectory record"))
    if flagged:
        mark_handles.append(Patch(facecolor="none", edgecolor="#e00000", lw=1.8,
                                  label="in flight across a mutation"))
    if aborted:
        mark_handles.append(Line2D([], [], ls="none", marker="x", color="#222222",
                                   label="aborted by a drain"))
    if open_ends:
        mark_handles.append(Line2D([], [], ls="none", marker=">", color="#222222",
                                   label="never released"))
    legend_top = (bottom - 0.5) / height_in
    for x, title, handles in ((left / width_in, "phase", phase_handles),
                              (_GEN_LEGEND_X, "rollouts admitted under", gen_handles),
                              (_EVENT_LEGEND_X, "events", mark_handles)):
        if handles:
            fig.legend(handles=handles, loc="upper left", bbox_to_anchor=(x, legend_top),
                       title=title, alignment="left", fontsize=9, title_fontsize=9,
                       ncol=math.ceil(len(handles) / _LEGEND_ROWS), frameon=False,
                       handlelength=1.5, columnspacing=1.2, borderaxespad=0.0)
    if many_gens:  # too many to list: a colour bar, one step per generation
        from matplotlib.cm import ScalarMappable
        from matplotlib.ticker import MaxNLocator

        lo, hi = min(gcol), max(gcol)
        cmap, norm = _generation_scale(lo, hi)
        cax = fig.add_axes((_GEN_LEGEND_X, legend_top - 0.62 / height_in,
                            _EVENT_LEGEND_X - _GEN_LEGEND_X - 0.04, 0.16 / height_in))
        bar = fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), cax=cax,
                           orientation="horizontal")
        inner = [int(t) for t in MaxNLocator(nbins=8, integer=True).tick_values(lo, hi)
                 if lo < t < hi]
        gap = (hi - lo) / 12  # the ends are labelled too, unless a tick is that close
        bar.set_ticks(sorted({lo, hi, *inner} - {t for t in inner if min(t - lo, hi - t)
                                                  < gap}))
        bar.ax.tick_params(labelsize=8, length=2)
        bar.outline.set_linewidth(0.5)
        cax.set_title("rollouts admitted under generation", fontsize=9, loc="left")
    return _save(fig, out)


def _rect(x0: float, x1: float, y0: float, y1: float) -> list[tuple[float, float]]:
    return [(x0, y0), (x1, y0), (x1, y1), (x0, y1)]


_MARK_STYLE: dict[str, dict[str, Any]] = {
    "publish": {"marker": "v", "color": "#111111", "ms": 7, "label": "publish (member)"},
    # black on white edges: they are drawn on TAINTED red
    "quarantine": {"marker": "X", "color": "#111111", "mec": "white", "mew": 0.8, "ms": 9,
                   "label": "quarantined (TAINTED)"},
    "fence": {"marker": "s", "color": "#111111", "mec": "white", "mew": 0.8, "ms": 6,
              "label": "fenced"},
    "fence_failed": {"marker": "s", "color": "#111111", "mfc": "white", "mew": 1.0,
                     "ms": 6, "label": "fence failed"},
    "segment": {"marker": "D", "color": "#111111", "mfc": "white", "mew": 1.0, "ms": 4,
                "label": "episode: next segment"},
}
#: Where in its lane (from the lane's top, lane units) a mark goes: in the strip above
#: the bars, apart from one another since they often come at the same instant.
_MARK_Y = {"publish": _LANE_TOP + 0.03, "quarantine": 0.13, "fence": 0.23,
           "fence_failed": 0.23}


def _mark_handles(*, fleet: bool) -> dict[str, Any]:
    """Legend entries for the events, in the order they are listed."""
    from matplotlib.lines import Line2D

    out = {k: Line2D([], [], ls="none", **v) for k, v in _MARK_STYLE.items()}
    if not fleet:
        out["publish"].set_label("publish")
    out["fleet_publish"] = Line2D([], [], color="#111111", lw=1.2, ls="--",
                                  label="fleet publish")
    out["abort"] = Line2D([], [], color="#e76f51", lw=1.5, ls=":", label="update aborted")
    out["migrate"] = Line2D([], [], color="#333333", lw=1.2, marker="o", ms=3,
                            label="rollout migrated")
    return out


def _draw_marks(ax: Axes, tl: Timeline, y_of: Mapping[str, int],
                bar_y: Mapping[int, float]) -> set[str]:
    """Draw the events; return the kinds drawn (for the legend)."""
    seen: set[str] = set()
    moved = {m.rollout_id for m in tl.marks if m.kind == "migrate"}
    bars_of: dict[tuple[str, str], list[Bar]] = {}
    for b in tl.bars:
        if b.rollout_id in moved:
            bars_of.setdefault((b.rollout_id, b.lane), []).append(b)

    def joint(m: Mark, lane: str, leaving: bool) -> float:
        """Where a migration meets the rollout's bar on ``lane``: the end of the one it
        left (``leaving``), the start of the one it moved to."""
        near = bars_of.get((m.rollout_id or "", lane))
        if not near:
            return y_of[lane] + 0.62
        b = min(near, key=lambda b: abs((b.end if b.end is not None else tl.end) - m.t)
                if leaving else abs(b.start - m.t))
        return bar_y[id(b)]

    lane_top = _FLEET_STRIP[0] if tl.fleet else 0.0
    label_publishes = sum(m.kind == "fleet_publish" for m in tl.marks) <= 12
    for m in tl.marks:
        if m.kind in ("fleet_publish", "abort"):
            pub = m.kind == "fleet_publish"
            ax.vlines(m.t, lane_top, len(tl.lanes), colors="#111111" if pub else "#e76f51",
                      linestyles="--" if pub else ":", lw=1.1, zorder=5)
            if pub and label_publishes:
                ax.annotate(f"gen {m.generation}", (m.t, lane_top), xytext=(3, 1),
                            textcoords="offset points", fontsize=8, va="bottom",
                            annotation_clip=False)
        elif m.lane is None or m.lane not in y_of:
            continue  # every lane a mark names is drawn; a fleet mark is handled above
        elif m.kind == "segment":  # on the new segment's bar, where it starts
            bar = next((b for b in tl.bars if b.rollout_id == m.rollout_id and
                        b.start == m.t), None)
            if bar is None:
                continue
            style = {k: v for k, v in _MARK_STYLE[m.kind].items() if k != "label"}
            ax.plot([m.t], [bar_y[id(bar)]], ls="none", zorder=7, **style)
        elif m.kind == "migrate":
            if m.to_lane is None or m.to_lane not in y_of:
                continue
            ys = [joint(m, m.lane, True), joint(m, m.to_lane, False)]
            ax.plot([m.t, m.t], ys, color="#333333", lw=1.2, marker="o", ms=3, zorder=6)
        else:
            style = {k: v for k, v in _MARK_STYLE[m.kind].items() if k != "label"}
            ax.plot([m.t], [y_of[m.lane] + _MARK_Y[m.kind]], ls="none", zorder=6, **style)
        seen.add(m.kind)
    return seen


def reward_png(steps: Sequence[Mapping[str, Any]], out: Path) -> Path:
    """Mean reward per training step (a line), and the generation each step trained on
    (a step line on a second axis) where the steps say it."""
    _check_steps(steps)
    xs = [int(s["step"]) for s in steps]
    ys = [float(s["mean_reward"]) for s in steps]
    fig = _figure(14.0, 4.5)
    ax = fig.add_subplot()
    ax.plot(xs, ys, color="#1f77b4", lw=1.6, marker="o" if len(xs) <= 60 else None, ms=3,
            label="mean reward")
    ax.set_xlabel("training step")
    ax.set_ylabel("mean reward", color="#1f77b4")
    ax.grid(color="#dddddd", lw=0.5)
    ax.set_title(f"mean reward per step ({len(xs)} steps)", loc="left", fontsize=12)
    with_gen = [(int(s["step"]), int(s["generation"])) for s in steps
                if s.get("generation") is not None]
    if with_gen:
        from matplotlib.ticker import MaxNLocator

        ax2 = ax.twinx()
        gx, gy = zip(*with_gen, strict=True)
        ax2.step(gx, gy, where="post", color="#ff7f0e", lw=1.2, label="generation")
        ax2.set_ylabel("generation", color="#ff7f0e")
        ax.set_zorder(ax2.get_zorder() + 1)  # the reward in front of the generation line
        ax.patch.set_visible(False)
        ax2.yaxis.set_major_locator(MaxNLocator(integer=True))
        h1, l1 = ax.get_legend_handles_labels()
        h2, l2 = ax2.get_legend_handles_labels()
        ax.legend(h1 + h2, l1 + l2, loc="upper left", frameon=False)
    return _save(fig, out)


def _check_steps(steps: Sequence[Mapping[str, Any]]) -> None:
    if not steps:
        raise ReportInputError("steps: no steps")
    for i, s in enumerate(steps):
        problem = _step_problem(dict(s))
        if problem:
            raise ReportInputError(f"steps[{i}]: {problem}")


def _check_lags(lags: Mapping[int, int]) -> None:
    if not lags:
        raise ReportInputError("lags: nothing to draw (no rollout)")
    for k, v in lags.items():
        if type(k) is not int or type(v) is not int or v < 0:
            raise ReportInputError(f"lags: {k!r} -> {v!r} is not lag (int) -> count (int >= 0)")


def lag_png(lags: Mapping[int, int], out: Path, *,
            title: str = "staleness of the rollouts",
            xlabel: str = "lag (generations behind the newest committed)") -> Path:
    """A histogram: lag (generations) -> count, each bar labelled with its count."""
    _check_lags(lags)
    lo, hi = min(min(lags), 0), max(lags)
    xs = list(range(lo, hi + 1))
    ys = [lags.get(x, 0) for x in xs]
    fig = _figure(8.0, 4.5)
    ax = fig.add_subplot()
    bars = ax.bar(xs, ys, width=0.8, color="#1f77b4", edgecolor="#174a7c", lw=0.6)
    ax.bar_label(bars, [str(y) if y else "" for y in ys], padding=2, fontsize=9)
    ax.set_xticks(xs)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("rollouts")
    ax.set_ylim(0, max(ys) * 1.15 + 0.5)
    total = sum(ys)
    mean = sum(x * y for x, y in zip(xs, ys, strict=True)) / total if total else 0.0
    ax.set_title(f"{title}\n{total} rollouts, mean lag {mean:.2f}", loc="left", fontsize=12)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.grid(axis="y", color="#dddddd", lw=0.5)
    ax.set_axisbelow(True)
    return _save(fig, out)


# --------------------------------------------------------------------------- the page


def html_page(title: str, pictures: Sequence[tuple[str, Path]], out: Path, *,
              summary: Sequence[str] = ()) -> Path:
    """One self-contained HTML page: ``title``, the ``summary`` lines, then each picture
    (caption, PNG file) embedded as a ``data:`` URL; it references no other file."""
    figures = []
    for caption, png in pictures:
        data = Path(png).read_bytes()
        if not data.startswith(PNG_SIGNATURE):
            raise ReportInputError(f"{png}: not a PNG file")
        b64 = base64.b64encode(data).decode("ascii")
        figures.append(f'<figure><img alt="{html.escape(caption)}" '
                       f'src="data:image/png;base64,{b64}"><figcaption>'
                       f"{html.escape(caption)}</figcaption></figure>")
    items = "".join(f"<li>{html.escape(line)}</li>" for line in summary)
    page = (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{html.escape(title)}</title><style>"
        "body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;color:#222;"
        "max-width:1460px;margin:1.5em auto;padding:0 1em}"
        "h1{font-size:1.4em}ul{line-height:1.6;padding-left:1.2em}"
        "figure{margin:1.5em 0}img{max-width:100%;height:auto;border:1px solid #e3e3e3}"
        "figcaption{color:#555;font-size:.9em;margin-top:.3em}"
        f"</style></head><body><h1>{html.escape(title)}</h1>"
        + (f"<ul>{items}</ul>" if items else "") + "".join(figures) + "</body></html>\n")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page, encoding="utf-8")
    return out


@dataclass(frozen=True)
class Report:
    """What :func:`build_report` wrote, and the timeline it drew."""

    files: list[Path]
    timeline: Timeline

    def as_json(self) -> dict[str, Any]:
        return {"files": [str(p) for p in self.files], **self.timeline.as_json()}


def default_out_dir(journal: str | os.PathLike[str]) -> Path:
    """``<journal stem>-report/`` next to the journal."""
    p = Path(journal)
    return p.with_name(f"{p.stem}-report")


def build_report(journal: Path, out_dir: Path, *, records: Path | None = None,
                 steps: Sequence[Mapping[str, Any]] | None = None,
                 lags: Mapping[int, int] | None = None) -> Report:
    """Every picture that applies, and ``index.html``, into ``out_dir``: the timeline;
    with ``records`` the records' staleness (from the journal); with ``lags`` that
    histogram as given (``lag.png``); with ``steps`` the mean reward per step."""
    # every input is checked before anything is written
    if steps is not None:
        _check_steps(steps)
    if lags is not None:
        _check_lags(lags)
    tl = read_timeline(journal)
    if not (tl.chain.ok or tl.chain.truncated):
        raise JournalFailsVerification(Path(journal), tl.chain)
    stats = attach_records(tl, records) if records is not None else None
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    pictures = [("Timeline: each lane an engine, its phase behind, each rollout a bar "
                 "from admission to release coloured by the generation it was admitted "
                 "under.", draw_timeline(tl, out_dir / "timeline.png"))]
    if stats is not None and stats.lags:
        pictures.append((
            f"Staleness of the {sum(stats.lags.values())} trajectory records in "
            f"{stats.path.name}: the newest generation committed anywhere when the "
            "rollout was released, minus the record's generation.",
            lag_png(stats.lags, out_dir / "staleness.png",
                    title=f"staleness of the records in {stats.path.name}")))
    if lags is not None:
        pictures.append(("The trainer's lag: for each group it took (or dropped as too "
                         "stale), its generation when it took the group minus the "
                         "generation that generated it.",
                         lag_png(lags, out_dir / "lag.png", title="trainer's lag per group",
                                 xlabel="trained generation - behaviour generation")))
    if steps is not None:
        pictures.append(("Mean reward per training step.",
                         reward_png(steps, out_dir / "reward.png")))
    page = html_page(f"RolloutCore run: {Path(journal).name}", pictures,
                     out_dir / "index.html", summary=tl.summary())
    return Report([p for _, p in pictures] + [page], tl)


def write_report(journal: Path, out_dir: Path, *, records: Path | None = None,
                 steps: Sequence[Mapping[str, Any]] | None = None,
                 lags: Mapping[int, int] | None = None) -> list[Path]:
    """:func:`build_report`'s files: the pictures, then ``index.html``."""
    return build_report(journal, out_dir, records=records, steps=steps, lags=lags).files


__all__ = ["ENGINE_LANE", "FLEET_COLOURS", "MUTATION_PHASES", "PHASE_COLOURS", "Bar",
           "DrawingUnavailable", "JournalFailsVerification", "Mark", "RecordStats", "Report",
           "ReportInputError", "Span", "Timeline", "attach_records", "build_report",
           "crossing_rollouts", "crossings", "default_out_dir", "draw_timeline",
           "drawing_unavailable", "generation_colours", "html_page", "lag_png", "overlaps",
           "phase_colour", "read_steps", "read_timeline", "reward_png", "timeline_png",
           "write_report"]
