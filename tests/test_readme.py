"""The README is a contract: every command it shows exists with the options it shows,
every benchmark it lists exists (and every benchmark is listed), its two set-up-and-run
commands are the Makefile's, and CI runs the test one."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from rolloutcore.cli.entry import build_parser

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def _code_lines() -> list[str]:
    out, inside = [], False
    for ln in README.splitlines():
        if ln.startswith("```"):
            inside = not inside
        elif inside:
            out.append(ln.strip())
    return out


def _commands() -> list[str]:
    return [ln for ln in _code_lines() if ln.startswith("rolloutcore ")]


def _subparser(parser: argparse.ArgumentParser, path: list[str]) -> argparse.ArgumentParser:
    for word in path:
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = action.choices[word]
    return parser


def test_the_readme_shows_commands() -> None:
    assert len(_commands()) >= 10


@pytest.mark.parametrize("line", _commands())
def test_every_readme_command_exists_with_its_options(line: str) -> None:
    words = line.split("#")[0].split()[1:]
    path = []
    for w in words:
        if w.startswith(("-", "[")) or not w.islower() or "." in w or "/" in w:
            break
        path.append(w)
    parser = _subparser(build_parser(), path)
    known = {opt for a in parser._actions for opt in a.option_strings}
    shown = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", line.split("#")[0]))
    assert shown <= known, f"{' '.join(path)}: {sorted(shown - known)} not options"


def test_benchmarks_listed_are_the_benchmarks() -> None:
    listed = set(re.findall(r"`(bench_\w+\.py)`", README))
    present = {p.name for p in (ROOT / "benchmarks").glob("bench_*.py")}
    assert listed == present


def test_the_two_entry_points() -> None:
    make = (ROOT / "Makefile").read_text()
    assert "make demo" in README and "make test" in README
    assert re.search(r"^demo:", make, re.M) and re.search(r"^test:", make, re.M)
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    # the fast tier for users' CI is named beside them and is make test without vLLM
    # and without the deeper runs of its own checks
    assert "make check" in README and re.search(
        r'^check: .*\n.* lint fast-tests .*\n\s*MARKS="not vllm and not deep"', make, re.M)
    assert re.search(r'^test: .*\n.* lint fast-tests vllm-tests \\\n\s*MARKS="not vllm"', make,
                     re.M)
    assert re.search(r'^vllm-tests: .*\n.*-m vllm', make, re.M)
    assert re.search(r'^fast-tests: .*\n.*-m "\$\(MARKS\)"', make, re.M)
