"""``rolloutcore report``: the pictures of a run. What is drawn is first checked as data
(the :class:`Timeline` read from the journal: lanes, phase spans, rollout bars, marks),
then that the pictures are real PNGs of the promised size, that the page is
self-contained, and that the command keeps the project's exit codes and one-line errors.
The fleet journals come from the simulator's fleet scenarios; the hand-made ones are
sealed with the journal's own helpers."""

from __future__ import annotations

import base64
import dataclasses
import itertools
import json
import random
import subprocess
import sys
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from rolloutcore import report
from rolloutcore.adapters.contract import GenerationResult
from rolloutcore.cli import main
from rolloutcore.engine.controller import Binding
from rolloutcore.journal import HEADER, SCHEMA, ZERO_HASH, JournalReader, dumps_line, rechain
from rolloutcore.report import (
    MUTATION_PHASES,
    Bar,
    ReportInputError,
    Span,
    crossings,
    overlaps,
    read_timeline,
)
from rolloutcore.spec.fleet import FLEET
from rolloutcore.trajectories.format import (
    Decoding,
    Segment,
    Timing,
    TrajectoryRecord,
    record_from,
    write_jsonl,
    write_parquet,
)
from rolloutcore.trajectories.provenance import journal_fact

ROOT = Path(__file__).resolve().parent.parent
ENGINE_JOURNAL = ROOT / "conformance" / "traces" / "good" / "update_cycle.jsonl"
MEMBERS = ["a", "b", "c"]


# ----------------------------------------------------------------------------- inputs


@pytest.fixture(scope="module")
def fleet_journals(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Fleet journals of three simulated members, one per scenario."""
    from rolloutcore.conformance.fleet_scenarios import FleetRig, run_fleet_scenario

    out = {}
    for name in ("dies_halfway_quorum", "rolling_steady_load", "rolling_update_migrated"):
        rig = FleetRig.sim(tmp_path_factory.mktemp(name), 3)
        try:
            result = run_fleet_scenario(name, rig)
        finally:
            rig.close()
        assert result.passed, result.failures()
        assert result.journal is not None
        out[name] = Path(result.journal)
    return out


def _record(rollout: str, generation: int, seq: int, *,
            segments: tuple[Segment, ...] = ()) -> TrajectoryRecord:
    tokens = tuple(range(max(len(segments), 1)))
    r = record_from(Binding(rollout, generation, None, seq), f"gen-{generation}", (1, 2, 3),
                    GenerationResult((1, 2, 3), tokens, "length"), Decoding(0.0),
                    Timing(1.0, 0.1))
    if segments:
        r = dataclasses.replace(r, segments=segments)
    return r


def _admissions(journal: Path) -> list[tuple[str, int, int, str | None]]:
    """(rollout, generation, seq, member) of every admission, in journal order."""
    return [(f.rollout_id or "", f.generation, f.seq, f.engine)
            for _, rec in JournalReader(journal)
            if (f := journal_fact(rec)) is not None and f.kind == "admit"]


def _records_of(journal: Path, out: Path) -> Path:
    """A record for every admission of ``journal``, as the rollout's client writes it."""
    write_jsonl(out, [_record(r, g, s) for r, g, s, _ in _admissions(journal)])
    return out


def _step(seq: int, t: float, step: str, phase: str, *, committed: int = 1,
          param: str | None = None, engine: str | None = None, typ: str = "step",
          detail: dict[str, Any] | None = None) -> dict[str, Any]:
    rec: dict[str, Any] = {"seq": seq, "type": typ, "op": None, "step": step, "param": param,
                           "phase": phase, "committed": committed, "target": 0,
                           "pending": "none", "t": t, "prev": ""}
    if engine is not None:
        rec["engine"] = engine
    if detail is not None:
        rec["detail"] = detail
    return rec


def _write_journal(path: Path, steps: list[dict[str, Any]], *, spec: str = "RolloutCore",
                   t0: float = 1000.0) -> Path:
    header = {"seq": 0, "type": HEADER, "schema": SCHEMA, "spec": spec, "t": t0,
              "prev": ZERO_HASH}
    path.write_text("".join(dumps_line(r) for r in rechain([header, *steps])))
    return path


_CYCLE = (("request_update", "DRAINING"), ("pause_ok", "QUIESCED"),
          ("mutate_begin", "UPDATING"), ("mutate_ok", "INVALIDATING"),
          ("invalidated", "VALIDATING"), ("validate_ok", "RESUMING"))


def _crossing_journal(path: Path) -> Path:
    """An engine journal in which rollout r2 is still in flight while the weights mutate
    (what the trace checker rejects; the report must show it, not hide it)."""
    steps = [_step(1, 1001.0, "bootstrap_ok", "READY", typ="ok"),
             _step(2, 1002.0, "admit", "READY", param="r1"),
             _step(3, 1003.0, "admit", "READY", param="r2"),
             _step(4, 1004.0, "release", "READY", param="r1")]
    t, seq = 1004.0, 5
    for step, phase in _CYCLE:
        steps.append(_step(seq, t, step, phase))
        t, seq = t + 1.0, seq + 1
    steps += [_step(seq, t, "publish", "READY", committed=2),
              _step(seq + 1, t + 1.0, "release", "READY", committed=2, param="r2")]
    return _write_journal(path, steps)


def _busy_fleet_journal(path: Path, *, cycles: int = 4, per_cycle: int = 60,
                        seed: int = 7) -> Path:
    """A fleet journal with hundreds of rollouts: each member serves, drains (no new
    admission), waits for the last release, then mutates and publishes the next
    generation; members keep their own pace (a rolling fleet). Never a rollout across a
    mutation, by construction."""
    rnd = random.Random(seed)
    events: list[tuple[float, dict[str, Any]]] = []
    for m_i, m in enumerate(MEMBERS):
        t, gen, n = 0.05 + 0.1 * m_i, 1, 0
        events.append((t, _step(0, 0, "bootstrap_ok", "READY", engine=m, typ="ok")))
        for _ in range(cycles):
            serve_end, last = t + 1.0 + rnd.random(), t
            for _ in range(per_cycle):
                start = rnd.uniform(t, serve_end)
                end = start + rnd.uniform(0.05, 0.6)
                n += 1
                rid = f"{m}-{n}"
                events.append((start, _step(0, 0, "admit", "READY", committed=gen,
                                            param=rid, engine=m)))
                events.append((end, _step(0, 0, "release", "x", committed=gen, param=rid,
                                          engine=m)))
                last = max(last, end)
            events.append((serve_end, _step(0, 0, "request_update", "DRAINING",
                                            committed=gen, engine=m)))
            t = max(last, serve_end) + 0.01
            for step, phase in _CYCLE[1:]:
                events.append((t, _step(0, 0, step, phase, committed=gen, engine=m)))
                t += 0.02
            gen += 1
            events.append((t, _step(0, 0, "publish", "READY", committed=gen, engine=m)))
            t += 0.01
    events.sort(key=lambda e: e[0])
    phase = {m: "READY" for m in MEMBERS}  # a release leaves the member's phase as it is
    steps = [_step(1, 1000.01, "fleet_open", "READY", detail={"members": MEMBERS,
                                                               "min_serving": 2})]
    for i, (t, rec) in enumerate(events, 2):
        if rec["phase"] == "x":
            rec["phase"] = phase[rec["engine"]]
        phase[rec["engine"]] = rec["phase"]
        rec["seq"], rec["t"] = i, 1000.0 + t
        steps.append(rec)
    return _write_journal(path, steps, spec=FLEET.name)


# ------------------------------------------------------------------- the timeline data


def test_one_lane_per_member_with_its_phases_and_rollouts(
        fleet_journals: dict[str, Path]) -> None:
    journal = fleet_journals["dies_halfway_quorum"]
    tl = read_timeline(journal)
    assert tl.fleet and tl.lanes == MEMBERS
    admitted = _admissions(journal)
    assert len(tl.bars) == len(admitted) > 0
    assert [(b.rollout_id, b.generation, b.seq, b.lane) for b in tl.bars] == admitted
    assert all(b.end is not None and b.end >= b.start for b in tl.bars)
    for lane in MEMBERS:  # each lane's spans tile its time, one phase after another
        spans = tl.spans_of(lane)
        assert all(a.end == b.start and a.phase != b.phase
                   for a, b in itertools.pairwise(spans))
        assert spans[-1].end == tl.end
        assert {s.phase for s in spans} >= MUTATION_PHASES | {"READY"}
    # c died halfway: quarantined (TAINTED, drawn and marked), fenced, re-admitted
    assert tl.spans_of("c", ["TAINTED"]) and not tl.spans_of("a", ["TAINTED"])
    kinds = Counter((m.kind, m.lane) for m in tl.marks)
    assert kinds[("quarantine", "c")] == 1 and kinds[("fence", "c")] >= 1
    assert {lane for k, lane in kinds if k == "publish"} == set(MEMBERS)
    assert [m.generation for m in tl.marks if m.kind == "fleet_publish"] == [2]
    assert tl.generations == [1, 2]


def test_an_engine_journal_has_one_lane() -> None:
    tl = read_timeline(ENGINE_JOURNAL)
    assert not tl.fleet and tl.lanes == [report.ENGINE_LANE]
    assert [b.rollout_id for b in tl.bars] == ["r1", "r2", "r3", "r4"]
    assert [b.generation for b in tl.bars] == [1, 1, 2, 3]
    assert [m.generation for m in tl.marks if m.kind == "publish"] == [2, 3]
    assert tl.generations == [1, 2, 3] and tl.end == pytest.approx(12.0)
    assert tl.rows == {report.ENGINE_LANE: 2}  # r1 and r2 overlap


@pytest.mark.parametrize("scenario", ["dies_halfway_quorum", "rolling_steady_load",
                                      "rolling_update_migrated"])
def test_no_rollout_bar_crosses_a_mutation_span(fleet_journals: dict[str, Path],
                                                scenario: str) -> None:
    tl = read_timeline(fleet_journals[scenario])
    for lane in tl.lanes:  # not vacuous: every member mutated, with rollouts around
        assert tl.spans_of(lane, MUTATION_PHASES), lane
        assert not overlaps(tl.bars_of(lane), tl.spans_of(lane, MUTATION_PHASES)), lane
    assert crossings(tl) == []
    assert any("across a mutation span: 0" in line for line in tl.summary())


def test_the_same_helper_finds_a_crossing() -> None:
    """Negative controls: hand-made intervals, and a journal with a rollout in flight
    during the mutation."""
    span = Span("a", "UPDATING", 2.0, 3.0)
    inside = Bar("a", "r", 1, 1, 2.5, 2.6)
    across = Bar("a", "s", 1, 2, 1.0, 2.01)
    touching = Bar("a", "t", 1, 3, 1.0, 2.0)  # released as the span begins
    after = Bar("a", "u", 2, 4, 3.0, 4.0)
    other_lane = Bar("b", "v", 1, 5, 1.0, 5.0)
    never_released = Bar("a", "w", 1, 6, 0.5, None)
    found = overlaps([inside, across, touching, after, other_lane, never_released], [span])
    assert [b.rollout_id for b, _ in found] == ["r", "s", "w"]
    assert overlaps([never_released], [span], end=1.0) == []


def test_a_crossing_in_the_journal_is_found_and_said(tmp_path: Path) -> None:
    tl = read_timeline(_crossing_journal(tmp_path / "crossing.jsonl"))
    found = crossings(tl)
    assert {(b.rollout_id, s.phase) for b, s in found} == {
        ("r2", p) for p in MUTATION_PHASES}
    assert report.crossing_rollouts(tl) == [(found[0][0], ["UPDATING", "INVALIDATING",
                                                          "VALIDATING"])]
    assert "rollouts in flight across a mutation span: 1 (r2 on engine during UPDATING, " \
        "INVALIDATING, VALIDATING)" in tl.summary()
    png = report.draw_timeline(tl, tmp_path / "crossing.png")
    _assert_png(png, 1400, 450)


def test_sub_rows_never_overlap_and_are_as_few_as_possible(tmp_path: Path) -> None:
    tl = read_timeline(_busy_fleet_journal(tmp_path / "busy.jsonl"))
    assert tl.lanes == MEMBERS and len(tl.bars) == 3 * 4 * 60
    assert crossings(tl) == []
    for lane in MEMBERS:
        bars = tl.bars_of(lane)
        by_row: dict[int, list[Bar]] = {}
        for b in bars:
            by_row.setdefault(b.row, []).append(b)
        for row in by_row.values():
            row.sort(key=lambda b: b.start)
            assert all((a.end or 0) <= b.start for a, b in itertools.pairwise(row))
        # as many rows as rollouts at most in flight at once
        edges = sorted([(b.start, 1) for b in bars] + [(b.end or 0, -1) for b in bars],
                       key=lambda e: (e[0], e[1]))
        most = now = 0
        for _, d in edges:
            now += d
            most = max(most, now)
        assert tl.rows[lane] == most == len(by_row)


def test_staleness_of_records_comes_from_the_journal(fleet_journals: dict[str, Path],
                                                    tmp_path: Path) -> None:
    journal = fleet_journals["rolling_steady_load"]
    tl = read_timeline(journal)
    stats = report.attach_records(tl, _records_of(journal, tmp_path / "r.jsonl"))
    # by hand: the newest generation committed anywhere when each admission's release
    # was journalled, minus its generation
    newest, expected, admitted = 0, Counter[int](), {}
    for _, rec in JournalReader(journal):
        newest = max(newest, rec.get("committed", 0))
        if rec.get("step") == "admit":
            admitted[rec["param"]] = rec["committed"]
        elif rec.get("step") == "release":
            expected[newest - admitted.pop(rec["param"])] += 1
    assert stats.lags == expected and set(expected) == {0, 1}  # rolling: some were stale
    assert stats.records == stats.recorded == len(tl.bars) and stats.unmatched == 0
    assert all(b.recorded for b in tl.bars)


def test_parquet_records_say_the_same(fleet_journals: dict[str, Path],
                                     tmp_path: Path) -> None:
    journal = fleet_journals["rolling_steady_load"]
    records = [_record(r, g, s) for r, g, s, _ in _admissions(journal)]
    write_jsonl(tmp_path / "r.jsonl", records)
    write_parquet(tmp_path / "r.parquet", records)
    as_json = report.attach_records(read_timeline(journal), tmp_path / "r.jsonl")
    as_parquet = report.attach_records(read_timeline(journal), tmp_path / "r.parquet")
    assert as_parquet.lags == as_json.lags and as_parquet.records == len(records)


def test_a_migrated_record_is_as_stale_as_its_last_segment(
        fleet_journals: dict[str, Path], tmp_path: Path) -> None:
    journal = fleet_journals["rolling_update_migrated"]
    seqs = [(s, m) for r, _g, s, m in _admissions(journal) if r == "held-0"]
    assert [m for _, m in seqs] == ["a", "b"]  # admitted on a, moved to b
    (first, a), (last, b) = seqs
    segs = (Segment(str(a), first, 1, 0, 1), Segment(str(b), last, 1, 1, 2))
    records = tmp_path / "m.jsonl"
    write_jsonl(records, [_record("held-0", 1, first, segments=segs),
                          _record("ghost", 1, 10_000)])  # an admission the journal lacks
    tl = read_timeline(journal)
    stats = report.attach_records(tl, records)
    # a's part was released before generation 2 was published, b's after
    assert stats.lags == Counter({1: 1}) and stats.unmatched == 1
    assert sorted((b.lane, b.recorded) for b in tl.bars if b.rollout_id == "held-0") == [
        ("a", True), ("b", True)]
    assert any("1 name an admission the journal does not release" in line
               for line in tl.summary())


# ------------------------------------------------------------------------ the pictures


def _assert_png(path: Path, width: int, height: int) -> None:
    from matplotlib.image import imread

    data = path.read_bytes()
    assert data.startswith(report.PNG_SIGNATURE)
    pixels = imread(path)
    assert pixels.shape[:2] == (height, width)
    assert pixels.std() > 0.05  # something is drawn


def test_the_pictures_are_pngs_of_the_promised_size(fleet_journals: dict[str, Path],
                                                    tmp_path: Path) -> None:
    journal = fleet_journals["dies_halfway_quorum"]
    out = report.timeline_png(journal, tmp_path / "t.png",
                              records=_records_of(journal, tmp_path / "r.jsonl"))
    _assert_png(out, 1400, 300 + 150 * 3)
    _assert_png(report.timeline_png(ENGINE_JOURNAL, tmp_path / "e.png"), 1400, 450)
    steps = [{"step": i, "mean_reward": 0.1 * i + (i % 3) * 0.05, "generation": 1 + i // 4}
             for i in range(20)]
    _assert_png(report.reward_png(steps, tmp_path / "reward.png"), 1400, 450)
    _assert_png(report.reward_png([{"step": 0, "mean_reward": 1.0}], tmp_path / "r1.png"),
                1400, 450)
    _assert_png(report.lag_png({0: 40, 1: 9, 3: 1}, tmp_path / "lag.png",
                               title="lag", xlabel="generations"), 800, 450)


def test_hundreds_of_rollouts_and_many_generations_draw(tmp_path: Path) -> None:
    tl = read_timeline(_busy_fleet_journal(tmp_path / "busy.jsonl", cycles=12,
                                           per_cycle=20))
    assert len(tl.generations) == 13  # more than the palette: a colour bar instead
    _assert_png(report.draw_timeline(tl, tmp_path / "busy.png"), 1400, 750)
    colours = report.generation_colours(tl.generations)
    assert len(set(colours.values())) == 13


def test_bad_picture_inputs_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ReportInputError, match=r"steps\[1\]: mean_reward is missing"):
        report.reward_png([{"step": 0, "mean_reward": 1.0}, {"step": 1}], tmp_path / "x.png")
    with pytest.raises(ReportInputError, match="not finite"):
        report.reward_png([{"step": 0, "mean_reward": float("nan")}], tmp_path / "x.png")
    with pytest.raises(ReportInputError, match="lags"):
        report.lag_png({}, tmp_path / "x.png")
    with pytest.raises(ReportInputError, match="lags"):
        report.lag_png({0: -1}, tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


class _Refs(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.refs: list[tuple[str, str, str]] = []  # (tag, attribute, value)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in ("src", "href", "srcset", "data", "poster", "action"):
                self.refs.append((tag, name, value or ""))


def test_the_page_embeds_every_picture_and_references_no_file(
        fleet_journals: dict[str, Path], tmp_path: Path) -> None:
    journal = fleet_journals["rolling_steady_load"]
    steps = [{"step": i, "mean_reward": i / 10} for i in range(5)]
    files = report.write_report(journal, tmp_path / "rep",
                                records=_records_of(journal, tmp_path / "r.jsonl"),
                                steps=steps, lags={0: 3, 1: 2})
    names = [f.name for f in files]
    assert names == ["timeline.png", "staleness.png", "lag.png", "reward.png", "index.html"]
    page = files[-1].read_text()
    parser = _Refs()
    parser.feed(page)
    assert [tag for tag, _, _ in parser.refs] == ["img"] * 4
    prefix = "data:image/png;base64,"
    assert all(v.startswith(prefix) for _, _, v in parser.refs)
    embedded = [base64.b64decode(v[len(prefix):]) for _, _, v in parser.refs]
    assert embedded == [f.read_bytes() for f in files[:-1]]
    assert "url(" not in page and "<link" not in page and "<script" not in page
    for needle in ("engines: 3 (a, b, c)", "generations committed: 1..2", "rollouts:",
                   "time span:"):
        assert needle in page


def test_html_page_refuses_a_picture_that_is_not_a_png(tmp_path: Path) -> None:
    fake = tmp_path / "fake.png"
    fake.write_text("GIF89a")
    with pytest.raises(ReportInputError, match=r"fake\.png: not a PNG file"):
        report.html_page("t", [("x", fake)], tmp_path / "index.html")


def test_the_module_imports_without_matplotlib() -> None:
    code = ("import sys; sys.modules['matplotlib'] = None; import rolloutcore.report as r; "
            "print(r.drawing_unavailable())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout
    assert "matplotlib is not installed" in out


# ------------------------------------------------------------------------- the command


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(["report", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_report_writes_next_to_the_journal(fleet_journals: dict[str, Path], tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    journal = tmp_path / "run.jsonl"
    journal.write_bytes(fleet_journals["dies_halfway_quorum"].read_bytes())
    rc, out, err = _run(capsys, str(journal))
    assert rc == 0 and err == ""
    made = tmp_path / "run-report"
    assert sorted(p.name for p in made.iterdir()) == ["index.html", "timeline.png"]
    assert f"wrote {made / 'timeline.png'}" in out and "engines: 3 (a, b, c)" in out


def test_report_json_lists_the_files(fleet_journals: dict[str, Path], tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    journal = fleet_journals["rolling_steady_load"]
    records = _records_of(journal, tmp_path / "r.jsonl")
    steps = tmp_path / "steps.jsonl"
    steps.write_text("".join(json.dumps({"step": i, "mean_reward": i * 0.5,
                                         "generation": 1 + i // 2}) + "\n"
                             for i in range(4)))
    out_dir = tmp_path / "out"
    rc, out, err = _run(capsys, str(journal), str(records), "--out", str(out_dir),
                        "--steps", str(steps), "--json")
    assert rc == 0 and err == ""
    data = json.loads(out)
    assert [Path(f).name for f in data["files"]] == ["timeline.png", "staleness.png",
                                                     "reward.png", "index.html"]
    assert all(Path(f).is_file() and Path(f).parent == out_dir for f in data["files"])
    assert data["engines"] == MEMBERS and data["crossings"] == 0 and data["fleet"]
    assert data["records"]["unmatched"] == 0 and data["records"]["staleness"]["1"] >= 1


@pytest.fixture
def bad_inputs(tmp_path: Path) -> dict[str, Path]:
    torn = tmp_path / "torn.jsonl"
    line = json.dumps(_record("r1", 1, 3).to_dict())
    torn.write_text(line + "\n" + line[: len(line) // 2] + "\n")
    binary = tmp_path / "binary"
    binary.write_bytes(b"\x00\xff\x10PNG")
    text = tmp_path / "notes.txt"
    text.write_text("hello\n")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    steps = tmp_path / "steps.jsonl"
    steps.write_text('{"step": 0, "mean_reward": 1}\n{"step": "one", "mean_reward": 2}\n')
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    return {"torn": torn, "binary": binary, "text": text, "empty": empty, "steps": steps,
            "dir": tmp_path, "missing": tmp_path / "nope.jsonl", "a_file": a_file}


BAD = [  # (arguments, the start of the one stderr line after "error: ")
    (["{missing}"], "{missing}: no such file"),
    (["{dir}"], "{dir}: is a directory"),
    (["{binary}"], "{binary}:1: not a RolloutCore journal ("),
    (["{text}"], "{text}:1: not a RolloutCore journal ("),
    (["{empty}"], "{empty}:1: not a RolloutCore journal ("),
    (["{journal}", "{missing}"], "{missing}: no such file"),
    (["{journal}", "{dir}"], "{dir}: is a directory"),
    (["{journal}", "{torn}"], "{torn}:2: not JSON"),
    (["{journal}", "{empty}"], "{empty}: no records (empty file)"),
    (["{journal}", "--steps", "{steps}"], "{steps}:2: step is not a number"),
    (["{journal}", "--steps", "{missing}"], "{missing}: no such file"),
    (["{journal}", "--out", "{a_file}"], "--out {a_file}: exists and is not a directory"),
]


@pytest.mark.parametrize(("argv", "said"), BAD, ids=[" ".join(a) for a, _ in BAD])
@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_bad_input_is_one_line_and_exit_2(
        argv: list[str], said: str, as_json: bool, bad_inputs: dict[str, Path],
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    paths = {**{k: str(v) for k, v in bad_inputs.items()}, "journal": str(ENGINE_JOURNAL)}
    out_dir = tmp_path / "never"
    args = [a.format(**paths) for a in argv]
    if "--out" not in args:
        args += ["--out", str(out_dir)]
    rc, out, err = _run(capsys, *args, *(["--json"] if as_json else []))
    assert rc == 2
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: " + said.format(**paths)), err
    assert "Traceback" not in err
    if as_json:
        assert json.loads(out)["error"].startswith(said.format(**paths))
    else:
        assert out == ""
    assert not out_dir.exists()  # nothing written


def test_without_matplotlib_it_cannot_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    rc, out, err = _run(capsys, str(ENGINE_JOURNAL), "--out", str(tmp_path / "o"))
    assert rc == 3 and out == ""
    assert err.startswith("error: cannot draw: matplotlib is not installed") and \
        len(err.splitlines()) == 1
    assert not (tmp_path / "o").exists()
