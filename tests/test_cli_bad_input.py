"""Every CLI command over a corpus of bad inputs: the exit code, exactly one ``error:``
line on stderr for bad input (2), verdicts (0/1) on stdout only, never a traceback, and
nothing written. The list of commands is derived from the parser: a new command without
a case here fails :func:`test_every_command_has_bad_input_cases`."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rolloutcore import cli
from rolloutcore.adapters.contract import GenerationResult
from rolloutcore.conformance.make_traces import FixedClock, s_update_cycle
from rolloutcore.engine.controller import Binding, Controller
from rolloutcore.journal import Journal, dumps_line, read_journal, rechain
from rolloutcore.trajectories.format import Decoding, Timing, dumps, record_from

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Case:
    command: tuple[str, ...]  # the parser's command this case covers
    args: tuple[str, ...]  # the rest of argv; "{name}" is a corpus path (see _corpus)
    rc: int
    what: str

    @property
    def id(self) -> str:
        return f"{'-'.join(self.command)}:{self.what}"


def C(command: str, args: str, rc: int, what: str) -> Case:
    return Case(tuple(command.split()), tuple(args.split()), rc, what)


TRACE, VERIFY, SHOW = "trace check", "journal verify", "records show"
REPLAY, RVERIFY = "records replay", "records verify"
ENGINE = "--engine {engine}"  # loopback, nothing listening

CASES: list[Case] = [
    # spec: options only (argument validation runs even where TLC would be needed)
    C("spec check", "--rollouts 0", 2, "rollouts 0"),
    C("spec check", "--generations -1", 2, "generations -1"),
    C("spec check", "--faults x", 2, "faults not a number"),
    C("spec check", "--bogus", 2, "unknown option"),
    C("spec mutants", "--bogus", 2, "unknown option"),
    C("spec mutants", "extra", 2, "extra argument"),
    C("spec tla", "--bogus", 2, "unknown option"),
    C("spec doc", "--check extra", 2, "extra argument"),
    C("spec tlc", "--bogus", 2, "unknown option"),
    # trace check: a file that is not a journal is bad input; a journal is judged
    *(C(TRACE, f"{{{f}}}", 2, f) for f in (
        "notjson", "empty", "binary", "dir", "missing", "deep", "long_line",
        "journal_header_seq_list")),
    C(TRACE, "{notjson} --json", 2, "notjson json"),
    C(TRACE, "", 2, "no file"),
    C(TRACE, "{journal_seq_list}", 1, "seq is a list on line 3 (a broken record)"),
    C(TRACE, "{journal_torn}", 0, "torn tail (a crash mid-write: that step did not happen)"),
    # trace join: the fleet journal and each gateway's journal must be what they say
    C("trace join", "", 2, "no file"),
    C("trace join", "{journal}", 2, "no gateway journal"),
    *(C("trace join", f"{{{f}}} g1={{journal}}", 2, f) for f in (
        "notjson", "empty", "binary", "dir", "missing")),
    C("trace join", "{journal} g1={journal}", 2, "an engine's journal, not a fleet's"),
    C("trace join", "{journal} g1", 2, "a gateway without its path"),
    C("trace join", "{journal} g1={journal} --json", 2, "not a fleet journal json"),
    # journal verify: the same, streaming
    *(C(VERIFY, f"{{{f}}}", 2, f) for f in (
        "notjson", "empty", "binary", "dir", "missing", "deep", "long_line", "records",
        "journal_header_seq_list")),
    C(VERIFY, "{binary} --json", 2, "binary json"),
    C(VERIFY, "{journal_seq_list}", 1, "seq is a list on line 3 (a broken record)"),
    C(VERIFY, "{journal_torn}", 1, "torn tail (a verdict: truncated)"),
    C(VERIFY, "", 2, "no file"),
    # simulate: validated before anything is written
    C("simulate", "--cycles -1", 2, "cycles -1"),
    C("simulate", "--cycles 0", 2, "cycles 0"),
    C("simulate", "--cycles x", 2, "cycles not a number"),
    C("simulate", "--journal {new} --faults bogus", 2, "bad fault spec"),
    C("simulate", "--journal {new} --faults mutate=teleport", 2, "unknown fault"),
    C("simulate", "--journal {dir}", 2, "journal is a directory"),
    C("simulate", "--journal {notjson}", 2, "journal exists"),
    C("simulate", "--journal {missing}/j.jsonl", 2, "journal's directory missing"),
    # demo, conformance: options only (they need vLLM to do anything)
    C("demo", "--bogus", 2, "unknown option"),
    C("demo", "extra", 2, "extra argument"),
    C("conformance run", "--engine bogus", 2, "unknown engine"),
    C("conformance run", "--engine sim --scenario nope", 2, "unknown scenario"),
    C("conformance run", "--bogus", 2, "unknown option"),
    C("conformance run", "--checkpoint v1=/x", 2, "checkpoint without url"),
    C("conformance run", "--url http://127.0.0.1:9 --checkpoint v9=/x", 2, "unknown role"),
    C("conformance tour", "--engine bogus", 2, "unknown engine"),
    C("conformance tour", "--walk a,b", 2, "walk not integers"),
    C("conformance tour", "--walk -1", 2, "negative choice"),
    C("conformance tour", "--walks -1", 2, "negative walks"),
    C("conformance tour", "--token t", 2, "token without url"),
    C("demo", "--fleet 1", 2, "fleet of one"),
    C("demo", "--fleet 3 --lifecycle", 2, "two demos"),
    C("demo", "--steps 2", 2, "too few steps"),
    C("demo", "--steps x", 2, "steps not a number"),
    # records show: strict and streaming
    *(C(SHOW, f"{{{f}}}", 2, f) for f in (
        "notjson", "empty", "binary", "dir", "missing", "deep", "records_torn",
        "records_tokens_str", "fake_parquet", "journal")),
    C(SHOW, "{records_torn} --json", 2, "records torn json"),
    C(SHOW, "", 2, "no file"),
    # records replay: the URL first, then the file, then the engine (fails fast)
    *(C(REPLAY, f"{{{f}}} {ENGINE}", 2, f) for f in (
        "notjson", "empty", "binary", "dir", "missing", "records_torn", "records_tokens_str",
        "fake_parquet")),
    C(REPLAY, "{records} --engine http://[::1", 2, "malformed IPv6 URL"),
    C(REPLAY, "{records} --engine http://10.0.0.1:8000", 2, "plain http, not loopback"),
    C(REPLAY, "{records} --engine ftp://127.0.0.1", 2, "not http"),
    C(REPLAY, "{records} --engine http://127.0.0.1:99999", 2, "port out of range"),
    C(REPLAY, "{records} --engine", 2, "engine without a value"),
    C(REPLAY, "{records}", 2, "no engine"),
    C(REPLAY, "{records} {engine_opt} --tolerance -1", 2, "tolerance -1"),
    C(REPLAY, "{records} {engine_opt} --tolerance nan", 2, "tolerance nan"),
    C(REPLAY, "{records_then_garbage} {engine_opt}", 2, "engine not listening"),
    C(REPLAY, "{records_then_garbage} {engine_opt} --json", 2, "engine not listening json"),
    # records verify: either file unreadable is bad input; disagreement is a verdict
    *(C(RVERIFY, f"{{{f}}} --journal {{journal}}", 2, f"records {f}") for f in (
        "notjson", "empty", "binary", "dir", "missing", "records_torn", "records_tokens_str",
        "fake_parquet")),
    *(C(RVERIFY, f"{{records}} --journal {{{f}}}", 2, f"journal {f}") for f in (
        "notjson", "empty", "binary", "dir", "missing", "deep", "journal_header_seq_list")),
    C(RVERIFY, "{records}", 2, "no journal"),
    C(RVERIFY, "{records} --journal {journal_seq_list}", 1, "journal broken at line 3"),
    C(RVERIFY, "{records} --journal {journal}", 1, "records not bound by this journal"),
    # report: every input is read before anything (PNGs, index.html) is written
    *(C("report", f"{{{f}}}", 2, f) for f in (
        "notjson", "empty", "binary", "dir", "missing", "deep", "long_line",
        "journal_header_seq_list")),
    C("report", "{notjson} --json", 2, "notjson json"),
    C("report", "{journal_seq_list}", 1, "seq is a list on line 3: nothing drawn"),
    C("report", "{journal_seq_list} --json", 1, "broken json"),
    C("report", "", 2, "no journal"),
    *(C("report", f"{{journal}} {{{f}}}", 2, f"records {f}") for f in (
        "notjson", "empty", "binary", "dir", "missing", "records_torn", "records_tokens_str",
        "fake_parquet")),
    C("report", "{journal} {records_torn} --json", 2, "records torn json"),
    C("report", "{journal} --steps {notjson}", 2, "steps not JSON"),
    C("report", "{journal} --steps {missing}", 2, "steps missing"),
    C("report", "{journal} --out {notjson}", 2, "out is a file"),
    # fleet: the fleet file first, then the checkpoints, before anything is written
    *(C(f"fleet {cmd}", f"--fleet {{{f}}} {extra}", 2, f) for cmd, extra in (
        ("status", ""), ("update", "--checkpoint {dir} --label v2"),
        ("readmit", "--engine a"), ("audit", "")) for f in (
        "notjson", "empty", "binary", "dir", "missing", "fleet_dup", "fleet_bad_k",
        "fleet_bad_transfer", "fleet_unknown_key", "fleet_ray_no_table",
        "fleet_ray_bad_address", "fleet_ray_transfer")),
    C("fleet status", "", 2, "no fleet file"),
    # fleet launch: every argument checked before a Ray cluster is touched
    C("fleet launch", "--engines 1 --model {dir} --out {new}", 2, "without --ray"),
    C("fleet launch", "--ray --engines 0 --model {dir} --out {new}", 2, "no engines"),
    C("fleet launch", "--ray --engines 1 --model {missing} --out {new}", 2, "model missing"),
    C("fleet launch", "--ray --engines 1 --model {dir} --out {new}", 2, "model not a checkpoint"),
    C("fleet launch", "--ray --engines 1 --model {ckpt} --out {notjson}", 2, "out exists"),
    C("fleet launch", "--ray --engines 1 --model {ckpt} --out {missing}/x.toml", 2,
      "out in no directory"),
    C("fleet launch", "--ray --engines 1 --model {ckpt}", 2, "no --out"),
    C("fleet launch", "--ray --engines 1 --model {ckpt} --out {new} --cpus-per-engine 0", 2,
      "no CPUs"),
    C("fleet launch", "--ray --engines 1 --model {ckpt} --out {new} --gpus-per-engine 0.5", 2,
      "half a GPU"),

    *(C(f"fleet {cmd}", f"--fleet {{{f}}} {extra}", 2, f) for cmd, extra in (
        ("status", ""), ("update", "--checkpoint {dir} --label v2")) for f in (
        "fleet_c_without_k", "fleet_c_every_member", "fleet_k_string",
        "fleet_k_above_members", "fleet_peers_unstaged", "fleet_staged_string",
        "fleet_peers_ray")),
    C("fleet update", "--fleet {fleet_rolling} --checkpoint {dir} --label v2 --min-serving 1",
      2, "min serving on a rolling fleet"),
    C("fleet update", "--fleet {fleet_good} --label v2", 2, "no checkpoint"),
    C("fleet update", "--fleet {fleet_good} --checkpoint {missing} --label v2", 2,
      "checkpoint missing"),
    C("fleet update", "--fleet {fleet_good} --checkpoint {dir} --label v2", 2,
      "checkpoint without safetensors"),
    C("fleet update", "--fleet {fleet_good} --checkpoint {dir} --label v2 --min-serving 0", 2,
      "min serving 0"),
    C("fleet update", "--fleet {fleet_good} --checkpoint {dir} --label v2 --min-serving 5", 2,
      "min serving above the fleet"),
    C("fleet readmit", "--fleet {fleet_good} --engine nope", 2, "unknown engine"),
    C("fleet readmit", "--fleet {fleet_good} --engine a", 2, "no fleet journal yet"),
    C("fleet audit", "--fleet {fleet_good}", 2, "no fleet journal yet"),
    C("fleet audit", "", 2, "no fleet file"),
    # serve: everything is checked before the fleet's journal is opened or a port bound
    *(C("serve", f"--fleet {{{f}}}", 2, f) for f in (
        "notjson", "empty", "binary", "dir", "missing", "fleet_dup", "fleet_bad_k",
        "fleet_bad_transfer", "fleet_unknown_key", "fleet_bad_watchdog")),
    C("serve", "", 2, "no fleet file"),
    C("serve", "--fleet {fleet_good} --watchdog 0", 2, "watchdog period 0"),
    C("serve", "--fleet {fleet_good} --watchdog 5 --no-watchdog", 2, "watchdog both ways"),
    C("serve", "--fleet {fleet_good} --port 70000", 2, "port out of range"),
    C("serve", "--fleet {fleet_good} --port http", 2, "port not a number"),
    C("serve", "--fleet {fleet_good} --admin-token-file {missing}", 2, "token file missing"),
    C("serve", "--fleet {fleet_good} --admin-token-file {dir}", 2, "token file a directory"),
    C("serve", "--fleet {fleet_good} --admin-token-file {empty}", 2, "token file empty"),
    C("serve", "--fleet {fleet_good} --host 0.0.0.0", 2, "remote host without a token"),
    C("serve", "--fleet {fleet_good} --queue-depth -1", 2, "queue depth negative"),
    C("serve", "--fleet {fleet_good} --queue-wait nan", 2, "queue wait not a number"),
    C("serve", "--fleet {fleet_good} --stale maybe", 2, "unknown stale mode"),
    C("serve", "--fleet {fleet_good} --records {dir}", 2, "records a directory"),
    C("serve", "--fleet {fleet_good}", 2, "new journal without --initial"),
    C("serve", "--fleet {fleet_good} --initial {dir}", 2, "initial without safetensors"),
    # a fleet file's [control] store: its URL is checked with the file, before any store
    *(C(f"fleet {cmd}", f"--fleet {{fleet_bad_store}} {extra}", 2, "bad store URL")
      for cmd, extra in (("status", ""), ("update", "--checkpoint {dir} --label v2"),
                         ("readmit", "--engine a"), ("audit", ""))),
    C("serve", "--fleet {fleet_bad_store}", 2, "bad store URL"),
    C("fleet audit", "--fleet {fleet_good} --wait -1", 2, "wait negative"),
    C("fleet update", "--fleet {fleet_good} --checkpoint {dir} --label v2 --wait x", 2,
      "wait not a number"),
    # journal export: the URL and the output are checked before the store is asked
    C("journal export", "", 2, "no source"),
    C("journal export", "etcd://127.0.0.1:1/p", 2, "no output"),
    C("journal export", "{journal} {new}", 2, "source not an etcd URL"),
    C("journal export", "etcd://127.0.0.1:99999/p {new}", 2, "port out of range"),
    C("journal export", "etcd:///p {new}", 2, "no endpoint"),
    C("journal export", "etcd://127.0.0.1:1/p {dir}", 2, "output a directory"),
    C("journal export", "etcd://127.0.0.1:1/p {missing}/out.jsonl", 2,
      "output's directory missing"),
    C("journal export", "etcd://127.0.0.1:1/p {dir} --json", 2, "output a directory json"),
    # a journal named by its store's URL: a bad URL is bad input too
    C(TRACE, "etcd://127.0.0.1:99999/p", 2, "bad store URL"),
    C(VERIFY, "etcd://h/p?x=1", 2, "store URL with a query"),
    C(RVERIFY, "{records} --journal etcd://:2379/p", 2, "store URL without a host"),
]


# ---------------------------------------------------------------------- the corpus


def _record_line(rollout: str, seq: int) -> str:
    rec = record_from(Binding(rollout, 1, None, seq), "v1", (1, 2, 3),
                      GenerationResult((1, 2, 3), (4, 5), "length", (-0.5, -0.25)),
                      Decoding(0.0), Timing(1.0, 0.5))
    return dumps(rec) + "\n"


def _make_corpus(root: Path) -> dict[str, str]:
    (root / "dir").mkdir()
    (root / "ckpt").mkdir()  # a checkpoint directory as far as a launch checks one
    (root / "ckpt" / "model.safetensors").write_bytes(b"")
    files: dict[str, bytes] = {
        "notjson": b"hello, this is not JSON\n",
        "empty": b"",
        "binary": bytes(range(255, -1, -1)) * 8,  # not UTF-8, NULs, newlines
        "deep": b"[" * 200_000 + b"\n",
        "long_line": b'{"seq": 0, "pad": "' + b"x" * (2 << 20) + b'"}\n',
        "fake_parquet": b"PAR1 this is not a parquet file",
    }
    journal = root / "journal.jsonl"
    with Journal(journal, fsync=False, clock=FixedClock()) as j:
        s_update_cycle(Controller(trace=j))
    good = journal.read_bytes()
    lines = good.splitlines(keepends=True)
    files["journal_torn"] = b"".join(lines[:4]) + lines[4][:30]
    _, recs = read_journal(journal)
    for name, i in (("journal_seq_list", 2), ("journal_header_seq_list", 0)):
        bad = [dict(r) for r in recs]
        bad[i]["seq"] = [i]  # valid JSON, the wrong type, a chain re-sealed over it
        files[name] = "".join(dumps_line(r) for r in rechain(bad)).encode()
    rec_lines = [_record_line(f"x{i}", 100 + i) for i in range(3)]
    files["records"] = "".join(rec_lines).encode()
    files["records_torn"] = (rec_lines[0] + rec_lines[1][: len(rec_lines[1]) // 2]).encode()
    d = json.loads(rec_lines[0])
    d["prompt_token_ids"] = "1 2 3"
    files["records_tokens_str"] = (json.dumps(d) + "\n").encode()
    files["records_then_garbage"] = (rec_lines[0] + "{not json\n").encode()
    files["fleet_dup"] = (b'[[engine]]\nname = "a"\nurl = "http://127.0.0.1:1"\n'
                          b'[[engine]]\nname = "a"\nurl = "http://127.0.0.1:2"\n')
    files["fleet_bad_k"] = (b'[fleet]\nmin_serving = 3\n'
                            b'[[engine]]\nname = "a"\nurl = "http://127.0.0.1:1"\n')
    files["fleet_bad_transfer"] = (b'[[engine]]\nname = "a"\nurl = "http://127.0.0.1:1"\n'
                                   b'transfer = "carrier-pigeon"\n')
    files["fleet_unknown_key"] = (b'[[engine]]\nname = "a"\nurl = "http://127.0.0.1:1"\n'
                                  b'colour = "blue"\n')
    files["fleet_bad_watchdog"] = (b'[fleet]\nwatchdog_s = -1\n'
                                   b'[[engine]]\nname = "a"\nurl = "http://127.0.0.1:1"\n')
    two = b'[[engine]]\nname = "a"\nurl = "http://127.0.0.1:1"\n' \
          b'[[engine]]\nname = "b"\nurl = "http://127.0.0.1:2"\n'
    files["fleet_c_without_k"] = b'[fleet]\nmin_admitting = 1\n' + two
    files["fleet_c_every_member"] = b'[fleet]\nmax_live = 2\nmin_admitting = 2\n' + two
    files["fleet_k_string"] = b'[fleet]\nmax_live = "2"\n' + two
    files["fleet_k_above_members"] = b'[fleet]\nmax_live = 3\nmin_admitting = 1\n' + two
    files["fleet_rolling"] = b'[fleet]\nmax_live = 2\nmin_admitting = 1\n' + two
    files["fleet_peers_unstaged"] = b'[fleet]\npeer_sources = true\n' + two
    files["fleet_staged_string"] = b'[fleet]\nstaged = "yes"\n' + two
    files["fleet_good"] = b'[[engine]]\nname = "a"\nurl = "http://127.0.0.1:1"\n'
    ray_engine = b'[[engine]]\nname = "a"\nurl = "http://127.0.0.1:1"\nray = "e-a"\n'
    files["fleet_ray_no_table"] = ray_engine
    files["fleet_ray_bad_address"] = b'[ray]\naddress = "nowhere"\n' + ray_engine
    files["fleet_ray_transfer"] = b'[ray]\naddress = "127.0.0.1:1"\n' + ray_engine + \
        b'transfer = "gloo"\n'
    files["fleet_peers_ray"] = b'[fleet]\nstaged = true\npeer_sources = true\n' \
        b'[ray]\naddress = "127.0.0.1:1"\n' + ray_engine
    files["fleet_bad_store"] = (b'[control]\nstore = "etcd://127.0.0.1:99999"\n'
                                b'[[engine]]\nname = "a"\nurl = "http://127.0.0.1:1"\n')
    out = {"journal": str(journal), "dir": str(root / "dir"), "ckpt": str(root / "ckpt"),
           "missing": str(root / "missing"), "new": str(root / "new.jsonl")}
    for name, data in files.items():
        (root / name).write_bytes(data)
        out[name] = str(root / name)
    return out


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    root = tmp_path_factory.mktemp("bad_input")
    paths = _make_corpus(root)
    # A port on loopback that is bound but not listening: connecting is refused at once.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        paths["engine"] = f"http://127.0.0.1:{s.getsockname()[1]}"
        paths["engine_opt"] = "--engine " + paths["engine"]
        paths["dead_gcs"] = f"127.0.0.1:{s.getsockname()[1]}"
        yield root, paths


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*"))}


def _argv(case: Case, paths: dict[str, str]) -> list[str]:
    return [*case.command, *" ".join(case.args).format(**paths).split()]


@pytest.fixture
def sandbox(corpus: tuple[Path, dict[str, str]],
            monkeypatch: pytest.MonkeyPatch) -> tuple[Path, dict[str, str]]:
    """Anything a command might write by default (temp files, artifacts) lands under the
    corpus root, where the snapshot sees it."""
    root, paths = corpus
    tmp = root / "tmp"
    tmp.mkdir(exist_ok=True)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.setenv("ROLLOUTCORE_ARTIFACTS", str(root / "artifacts"))
    return root, paths


def _check_streams(case: Case, rc: int, out: str, err: str) -> None:
    assert rc == case.rc, (case.id, rc, out, err)
    assert "Traceback" not in out + err, case.id
    err_lines = err.splitlines()
    if rc == 2:
        assert len(err_lines) == 1, (case.id, err)
        assert err_lines[0].startswith("error: "), (case.id, err)
    else:  # a verdict: reported on stdout, nothing on stderr
        assert err_lines == [] and out.strip(), (case.id, out, err)
    if "--json" in case.args:
        data = json.loads(out)  # still one valid JSON object
        assert (rc == 2) == ("error" in data), (case.id, data)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_bad_input(case: Case, sandbox: tuple[Path, dict[str, str]],
                   capsys: pytest.CaptureFixture[str]) -> None:
    root, paths = sandbox
    before = _snapshot(root)
    rc = cli.main(_argv(case, paths))
    out, err = capsys.readouterr()
    _check_streams(case, rc, out, err)
    assert _snapshot(root) == before, f"{case.id} wrote something"


#: The words for an input file that is missing or a directory: the same in every command
#: (rolloutcore.inputs), after the path. A checkpoint is a directory, with words of its own.
SAME_WORDS = {"missing": ": no such file", "dir": ": is a directory"}
FILE_OPTIONS = ("--fleet", "--journal", "--admin-token-file")  # inputs, not outputs


def _unreadable_file_arg(case: Case) -> str | None:
    """The corpus name of the missing file or directory this case passes as an input."""
    if case.command == ("simulate",):  # its --journal is the file it writes
        return None
    args = " ".join(case.args).split()
    for i, a in enumerate(args):
        name = a[1:-1] if a.startswith("{") and a.endswith("}") else None
        if name in SAME_WORDS and (i == 0 or args[i - 1] in FILE_OPTIONS):
            return name
    return None


@pytest.mark.parametrize("case", [c for c in CASES if _unreadable_file_arg(c)],
                         ids=lambda c: c.id)
def test_an_unreadable_input_is_named_in_the_same_words(
        case: Case, sandbox: tuple[Path, dict[str, str]],
        capsys: pytest.CaptureFixture[str]) -> None:
    """Where an input file is missing or a directory, the line starts with its path and
    says so in the same words whichever command met it."""
    _, paths = sandbox
    bad = _unreadable_file_arg(case)
    assert bad is not None
    assert cli.main(_argv(case, paths)) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {paths[bad]}{SAME_WORDS[bad]}"), (case.id, err)


def test_not_a_journal_names_its_line(sandbox: tuple[Path, dict[str, str]],
                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Each command that reads a journal says ``path:line: not a RolloutCore journal``."""
    _, p = sandbox
    for argv in (["trace", "check", p["binary"]], ["journal", "verify", p["binary"]],
                 ["records", "verify", p["records"], "--journal", p["binary"]]):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {p['binary']}:1: not a RolloutCore journal ("), err
        assert "(line 1" not in err, err  # the line is said once, where every command says it


def test_every_command_has_bad_input_cases() -> None:
    commands = set(cli.commands())
    assert ("records", "verify") in commands and ("spec", "tlc") in commands
    covered = {c.command for c in CASES}
    assert commands <= covered, f"commands without bad-input cases: {commands - covered}"
    assert covered <= commands, f"cases for unknown commands: {covered - commands}"


def test_fleet_launch_without_a_cluster_is_exit_3_and_writes_nothing(
        sandbox: tuple[Path, dict[str, str]], capsys: pytest.CaptureFixture[str]) -> None:
    root, paths = sandbox
    before = _snapshot(root)
    rc = cli.main(["fleet", "launch", "--ray", "--engines", "1", "--model", paths["ckpt"],
                   "--out", paths["new"], "--address", paths["dead_gcs"]])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 3 and len(err) == 1 and "no Ray cluster at" in err[0], err
    assert _snapshot(root) == before


def test_specific_messages(sandbox: tuple[Path, dict[str, str]],
                           capsys: pytest.CaptureFixture[str]) -> None:
    """The one line says what is wrong and where."""
    _, p = sandbox

    def err_of(*argv: str) -> str:
        cli.main(list(argv))
        return capsys.readouterr().err.strip()

    assert err_of("journal", "verify", p["binary"]).startswith(
        f"error: {p['binary']}:1: not a RolloutCore journal")
    assert "not a RolloutCore journal" in err_of("journal", "verify", p["empty"])
    assert err_of("records", "show", p["records_tokens_str"]).startswith(
        f"error: {p['records_tokens_str']}:1: prompt_token_ids: expected a list")
    assert err_of("records", "show", p["records_torn"]).startswith(
        f"error: {p['records_torn']}:2: not JSON")
    assert "not UTF-8" in err_of("records", "show", p["binary"])
    assert "refusing plain-http" in err_of("records", "replay", p["records"], "--engine",
                                           "http://10.0.0.1:8000")
    # fails fast: the first record's connection error, not the garbage on line 2
    err = err_of("records", "replay", p["records_then_garbage"], "--engine", p["engine"])
    assert "cannot connect" in err and "not JSON" not in err
    assert "must be >= 1, got 0" in err_of("spec", "check", "--rollouts", "0")


def test_journal_verify_names_the_broken_line(sandbox: tuple[Path, dict[str, str]],
                                             capsys: pytest.CaptureFixture[str]) -> None:
    _, p = sandbox
    assert cli.main(["journal", "verify", p["journal_seq_list"]]) == 1
    assert capsys.readouterr().out.startswith("broken at line 3: seq is not an integer")


# ------------------------------------------------------------- the last resort


def test_unexpected_errors_are_one_line(monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    def boom(_args: Any) -> int:
        raise RuntimeError("something\nunexpected")

    monkeypatch.setattr(cli.entry, "_spec_check", boom)
    assert cli.main(["spec", "check"]) == cli.CANNOT_RUN == 3
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("error: internal error") and "something unexpected" in err

    def interrupted(_args: Any) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.entry, "_spec_check", interrupted)
    assert cli.main(["spec", "check"]) == 130
    assert capsys.readouterr().err == "error: interrupted\n"


def test_tlc_missing_is_not_bad_input(monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    from rolloutcore.proof import modelcheck

    monkeypatch.setattr(modelcheck, "tlc_available", lambda: "java not found")
    assert cli.main(["spec", "tlc"]) == 3
    err = capsys.readouterr().err
    assert err == "error: cannot run TLC: java not found\n"


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    assert "exit" in capsys.readouterr().out


# ------------------------------------------------------- the real entry point


def _entry_point() -> list[str]:
    script = Path(sys.executable).parent / "rolloutcore"
    assert script.exists(), f"the console script is not installed next to {sys.executable}"
    return [str(script)]


def _env() -> dict[str, str]:
    # This checkout's package first, whatever the editable install points at.
    return {**os.environ, "PYTHONPATH": str(REPO)}


@pytest.mark.parametrize("case", [
    C(SHOW, "{binary}", 2, "binary"),
    C(VERIFY, "{dir}", 2, "dir"),
    C(REPLAY, "{records} --engine http://[::1", 2, "malformed IPv6 URL"),
    C(RVERIFY, "{records_tokens_str} --journal {journal}", 2, "wrong type"),
    C("spec check", "--rollouts 0", 2, "rollouts 0"),
], ids=lambda c: c.id)
def test_entry_point_has_no_traceback(case: Case, sandbox: tuple[Path, dict[str, str]]) -> None:
    root, paths = sandbox
    before = _snapshot(root)
    proc = subprocess.run([*_entry_point(), *_argv(case, paths)], capture_output=True,
                          text=True, env=_env(), timeout=120)
    _check_streams(case, proc.returncode, proc.stdout, proc.stderr)
    assert _snapshot(root) == before


def test_closed_stdout_is_quiet(tmp_path: Path) -> None:
    """`rolloutcore records show F | head -1`: no traceback, the SIGPIPE exit status."""
    p = tmp_path / "many.jsonl"
    line = _record_line("r", 1)
    p.write_text(line * 3000)  # far more output than a pipe buffers
    proc = subprocess.Popen([*_entry_point(), "records", "show", str(p)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env())
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().startswith(b"  r: version 1")
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == cli.BROKEN_PIPE
    assert err == b""
