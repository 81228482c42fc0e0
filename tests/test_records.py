"""Trajectory records: exact round trips, the version comes from the binding only, schema
version checked on read, bad input refused with a clear error."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import httpx
import pytest

from rolloutcore.adapters.contract import GenerationResult
from rolloutcore.cli import main as cli_main
from rolloutcore.conformance.replay import ReplayError, parse_prompt_logprobs, replay
from rolloutcore.engine.controller import Binding, Controller, ControlState
from rolloutcore.engine.runner import rollout_record
from rolloutcore.spec.lifecycle import ALL_EVIDENCE, NO_OP, Phase
from rolloutcore.trajectories.format import (
    SCHEMA_VERSION,
    Decoding,
    RecordError,
    Segment,
    Timing,
    TrajectoryRecord,
    greedy,
    read_jsonl,
    read_parquet,
    read_records,
    record_from,
    write_jsonl,
    write_parquet,
)

IDENT = "ab" * 32


def _record(i: int = 0, *, generation: int = 3, stop_reason: str | int | None = None,
            logprobs: bool = True) -> TrajectoryRecord:
    resp = tuple(range(10 + i, 17 + i))
    # awkward floats on purpose: subnormal, long mantissas, -0.0
    lps = (-0.1, -1 / 3, -2.220446049250313e-16, -5e-324, -0.0, -17.25, -math.pi)
    return record_from(
        Binding(f"r{i}", generation, IDENT, 40 + i), f"v{generation}", (1, 2, 3, i),
        GenerationResult((1, 2, 3, i), resp, "stop" if stop_reason is not None else "length",
                         lps if logprobs else None,
                         extra={"stop_reason": stop_reason} if stop_reason is not None else {}),
        Decoding(0.7, 0.95, 7, 0, ("\n\n", "END"), seed=1234 + i) if i % 2 else Decoding(0.0),
        Timing(1764400000.123456 + i, 0.0123456789))


def _records() -> list[TrajectoryRecord]:
    return [_record(0), _record(1, stop_reason="END"), _record(2, stop_reason=2),
            _record(3, logprobs=False),
            dataclasses.replace(_record(4), binding=Binding("r4", 1, None, 0)),
            # a rollout the drain aborted: its partial output, marked
            dataclasses.replace(_record(5), binding=Binding("r5", 3, IDENT, 45, aborted=True)),
            # a migrated rollout: two members' parts, one generation
            dataclasses.replace(_record(6), segments=(Segment("e0", 46, 3, 0, 3),
                                                      Segment("e1", 50, 3, 3, 7)))]


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_round_trip_exact(tmp_path: Path, fmt: str) -> None:
    recs = _records()
    path = tmp_path / f"recs.{fmt}"
    (write_jsonl if fmt == "jsonl" else write_parquet)(path, recs)
    back = (read_jsonl if fmt == "jsonl" else read_parquet)(path)
    assert back == recs
    assert read_records(path) == recs  # format told apart by content
    for a, b in zip(back, recs, strict=True):  # bit for bit, -0.0 included
        if a.logprobs is not None and b.logprobs is not None:
            assert [x.hex() for x in a.logprobs] == [x.hex() for x in b.logprobs]
        assert a.timing.started_at.hex() == b.timing.started_at.hex()
        assert type(a.stop_reason) is type(b.stop_reason)


def test_jsonl_and_parquet_agree(tmp_path: Path) -> None:
    recs = _records()
    write_jsonl(tmp_path / "a.jsonl", recs)
    write_parquet(tmp_path / "a.parquet", read_jsonl(tmp_path / "a.jsonl"))
    write_jsonl(tmp_path / "b.jsonl", read_parquet(tmp_path / "a.parquet"))
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()


def test_version_is_the_bindings() -> None:
    ctl = Controller()
    ctl.identity = IDENT
    ctl.restore(ControlState(Phase.READY, 5, 5, NO_OP, frozenset(), ALL_EVIDENCE))
    with ctl.rollout("x") as binding:
        result = GenerationResult((1, 2), (3,), "length", (-0.5,))
    rec = record_from(binding, "v5", (1, 2), result, Decoding(0.0), Timing(0.0, 0.1))
    assert rec.version == binding.generation == 5
    assert rec.identity == IDENT
    # there is no field through which another version could be claimed
    with pytest.raises(TypeError):
        record_from(binding, "v5", (1, 2), result, Decoding(0.0), Timing(0.0, 0.1),
                    version=6)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        dataclasses.replace(rec, version=6)  # type: ignore[call-arg]
    with pytest.raises(AttributeError):
        rec.version = 6  # type: ignore[misc]
    # a file that adds a version beside the binding is refused, not believed
    d = rec.to_dict()
    d["version"] = 6
    with pytest.raises(RecordError, match="unknown version"):
        TrajectoryRecord.from_dict(d)


def test_result_of_another_prompt_refused() -> None:
    with pytest.raises(RecordError, match="different prompt"):
        record_from(Binding("r", 1, None, 1), "v1", (1, 2),
                    GenerationResult((1, 3), (4,), "length"), Decoding(0.0), Timing(0.0, 0.0))


def test_schema_version_checked_on_read(tmp_path: Path) -> None:
    d = _record().to_dict()
    d["schema_version"] = SCHEMA_VERSION + 1
    p = tmp_path / "future.jsonl"
    p.write_text(json.dumps(d) + "\n")
    with pytest.raises(RecordError, match=rf"future.jsonl:1: schema_version "
                       rf"{SCHEMA_VERSION + 1} is not supported"):
        read_jsonl(p)
    # A record of the previous version (no binding.aborted) is refused by name.
    d["schema_version"] = SCHEMA_VERSION - 1
    del d["binding"]["aborted"]
    p.write_text(json.dumps(d) + "\n")
    with pytest.raises(RecordError, match=rf"schema_version {SCHEMA_VERSION - 1} is not "
                       rf"supported \(this build reads {SCHEMA_VERSION}\)"):
        read_jsonl(p)
    # Parquet: the schema version lives in the file metadata
    import pyarrow.parquet as pq

    pp = tmp_path / "ok.parquet"
    write_parquet(pp, [_record()])
    table = pq.read_table(pp)
    meta = dict(table.schema.metadata)
    meta[b"rolloutcore.trajectory.schema_version"] = b"99"
    pq.write_table(table.replace_schema_metadata(meta), tmp_path / "future.parquet")
    with pytest.raises(RecordError, match="schema_version '99' is not supported"):
        read_parquet(tmp_path / "future.parquet")


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda d: d.pop("timing"), "missing timing"),
    (lambda d: d["binding"].__setitem__("generation", 0), "binding.generation: must be >= 1"),
    (lambda d: d["binding"].__setitem__("generation", "3"), "expected an integer"),
    (lambda d: d.__setitem__("logprobs", [-0.1]), "1 values for 7 response tokens"),
    (lambda d: d.__setitem__("response_token_ids", [1, -2]), "must be >= 0"),
    (lambda d: d["decoding"].__setitem__("top_p", 0), "decoding.top_p"),
    (lambda d: d.__setitem__("schema", "other"), "schema: expected"),
    (lambda d: d.__setitem__("prompt_token_ids", []), "prompt_token_ids: must not be empty"),
])
def test_bad_records_refused(tmp_path: Path, mutate: object, message: str) -> None:
    d = _record().to_dict()
    mutate(d)  # type: ignore[operator]
    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps(d) + "\n")
    with pytest.raises(RecordError, match=message):
        read_jsonl(p)


@pytest.mark.parametrize(("segments", "message"), [
    ([("e0", 40, 3, 0, 7)], "a rollout that was not migrated has none"),
    ([("e0", 41, 3, 0, 3), ("e1", 50, 3, 3, 7)], "the first is admission 41, the binding's "
                                                   "is 40"),
    ([("e0", 40, 3, 0, 3), ("e1", 50, 3, 4, 7)], "starts at token 4, the one before ends at 3"),
    ([("e0", 40, 3, 0, 3), ("e1", 50, 3, 3, 6)], "they end at token 6, the response has 7"),
    ([("e0", 40, 3, 0, 3), ("e1", 40, 3, 3, 7)], "admission 40 is not after 40"),
    ([("e0", 40, 3, 0, 3), ("e1", 50, 3, 5, 3)], "end 3 is before start 5"),
    ([("", 40, 3, 0, 3), ("e1", 50, 3, 3, 7)], "segments\\[\\].engine: must not be empty"),
])
def test_bad_segments_refused(tmp_path: Path, segments: list[tuple[Any, ...]],
                              message: str) -> None:
    d = _record().to_dict()
    d["segments"] = [dict(zip(("engine", "seq", "generation", "start", "end"), x,
                              strict=True)) for x in segments]
    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps(d) + "\n")
    with pytest.raises(RecordError, match=message):
        read_jsonl(p)


def test_bad_files_refused(tmp_path: Path) -> None:
    p = tmp_path / "x.jsonl"
    write_jsonl(p, [_record()])
    with open(p, "a") as fh:
        fh.write('{"torn": \n')
    with pytest.raises(RecordError, match=r"x.jsonl:2: not JSON"):
        read_jsonl(p)
    nan = _record().to_dict()
    p.write_text(json.dumps(nan).replace("-0.1", "NaN") + "\n")
    with pytest.raises(RecordError, match="non-finite"):
        read_jsonl(p)
    with pytest.raises(RecordError, match="no such file"):
        read_records(tmp_path / "missing.jsonl")
    fake = tmp_path / "fake.parquet"
    fake.write_bytes(b"PAR1 not really")
    with pytest.raises(RecordError, match="not a readable Parquet file"):
        read_parquet(fake)


def test_non_finite_logprob_refused() -> None:
    with pytest.raises(RecordError, match="finite"):
        _record().__class__(**{**{f.name: getattr(_record(), f.name)
                                  for f in dataclasses.fields(TrajectoryRecord)},
                               "logprobs": (math.nan,) * 7})


def test_cli_show(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "r.parquet"
    write_parquet(p, _records())
    assert cli_main(["records", "show", str(p)]) == 0
    out = capsys.readouterr().out
    assert "7 records" in out and "r1: version 3 (v3" in out
    assert out.count("ABORTED by the drain") == 1
    assert out.count("migrated: e0 0..3, e1 3..7;") == 1
    assert cli_main(["records", "show", str(p), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [TrajectoryRecord.from_dict(d) for d in data["records"]] == _records()
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{}\n")
    assert cli_main(["records", "show", str(bad)]) == 2
    assert "bad.jsonl:1" in capsys.readouterr().err


# ------------------------------------------------------------- replay (fake engine)


def _fake_engine(shift: float, *, status: int = 200) -> httpx.MockTransport:
    """Answers a scoring request with the recorded logprobs of ``_record(0)`` + shift."""
    rec = _record(0)
    assert rec.logprobs is not None
    table = dict(zip(rec.response_token_ids, rec.logprobs, strict=True))

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        assert body["max_tokens"] == 1 and body["prompt_logprobs"] == 0
        toks = body["prompt"]
        plp: list[Any] = [None] + [
            {str(t): {"logprob": table.get(t, -1.0) + shift, "rank": 1}} for t in toks[1:]]
        return httpx.Response(status, json={"choices": [{
            "token_ids": [0], "prompt_token_ids": toks, "prompt_logprobs": plp}]})

    return httpx.MockTransport(handler)


def test_replay_verdicts_against_a_fake_engine() -> None:
    rec = _record(0)
    same = replay([rec], "http://engine", transport=_fake_engine(0.0))[0]
    assert same.verdict == "match" and same.max_abs_diff == 0.0 and same.tokens == 7
    near = replay([rec], "http://engine", transport=_fake_engine(5e-4))[0]
    assert near.verdict == "match"
    far = replay([rec], "http://engine", transport=_fake_engine(0.5))[0]
    assert far.verdict == "mismatch" and far.over_tolerance == 7 and far.first_over == 0
    assert far.seq_diff == pytest.approx(3.5)
    err = replay([rec], "http://engine", transport=_fake_engine(0.0, status=500))[0]
    assert err.verdict == "error" and "HTTP 500" in err.detail
    none = replay([_record(3, logprobs=False)], "http://engine",
                  transport=_fake_engine(0.0))[0]
    assert none.verdict == "unscorable"


def test_parse_prompt_logprobs_refuses_other_tokens() -> None:
    body = {"choices": [{"prompt_token_ids": [1, 2], "prompt_logprobs": [None, {"2": {
        "logprob": -1.0}}]}]}
    assert parse_prompt_logprobs(body, [1, 2]) == [None, -1.0]
    with pytest.raises(ReplayError, match="different token sequence"):
        parse_prompt_logprobs(body, [1, 3])
    body["choices"][0]["prompt_token_ids"] = [1, 3]
    with pytest.raises(ReplayError, match="no logprob for token 3"):
        parse_prompt_logprobs(body, [1, 3])
    with pytest.raises(ReplayError, match="no prompt_logprobs"):
        parse_prompt_logprobs({"choices": []}, [1])


def test_runner_rollouts_are_recorded_under_their_generation(tmp_path: Path) -> None:
    from rolloutcore.adapters.sim import SimAdapter, SimEngine, sim_target
    from rolloutcore.engine.runner import LifecycleRunner, RunnerPolicy

    policy = RunnerPolicy(step_timeout_s=0.5, retries=2, retry_backoff_s=0.0,
                          drain_timeout_s=5, mutation_base_s=0.3,
                          mutation_floor_bytes_per_s=1e12)
    runner = LifecycleRunner(Controller(), SimAdapter(SimEngine("ckpt-1", label="rc-1")),
                             policy)
    t1 = sim_target(1, "ckpt-1")
    assert runner.bootstrap(t1).trigger == "bootstrap_ok"
    before = rollout_record(runner, "a", (1, 2, 3), 5)
    t2 = sim_target(2, "ckpt-2")
    assert runner.update(t2).published
    after = rollout_record(runner, "b", (1, 2, 3), 5)
    assert (before.version, before.label, before.identity) == (1, t1.label, t1.identity)
    assert (after.version, after.label, after.identity) == (2, t2.label, t2.identity)
    assert before.decoding == after.decoding == greedy(5)
    write_parquet(tmp_path / "r.parquet", [before, after])
    assert read_parquet(tmp_path / "r.parquet") == [before, after]
