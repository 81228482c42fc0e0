"""Generated artefacts are current, and TLC's state graph equals the explorer's."""

from __future__ import annotations

import pytest
from conftest import require_tlc

from rolloutcore.cli import main
from rolloutcore.proof import modelcheck
from rolloutcore.proof.explore import Exploration
from rolloutcore.spec.lifecycle import SPEC


@pytest.mark.deep  # make check's lint runs `spec tla --check` and `spec doc --check`
def test_generated_files_are_current(exploration: Exploration) -> None:
    files = modelcheck.generated_files(SPEC, exploration)
    assert modelcheck.stale_files(files) == [], "run `rolloutcore spec tla` and `spec doc`"


def test_doc_states_counts(exploration: Exploration) -> None:
    text = modelcheck.DOC_FILE.read_text()
    assert f"{exploration.states} states, {exploration.edges} edges" in text
    assert "stateDiagram-v2" in text


@pytest.mark.tlc
def test_tlc_graph_equals_python_graph(exploration: Exploration) -> None:
    require_tlc()
    run = modelcheck.run_tlc(SPEC, exploration=exploration)
    assert run.result.exit_code == 0, run.result.stdout[-2000:]
    assert run.tlc_states == exploration.states
    assert run.tlc_edges == len(exploration.labelled_edges())
    assert run.graphs_equal, (run.only_python, run.only_tlc)


@pytest.mark.tlc
def test_tlc_reports_a_broken_spec() -> None:
    """A negative control for the comparison itself: a spec whose TLA+ text disagrees with
    its Python (publish forgets to clear the target in TLA+ only) is caught."""
    require_tlc()
    broken = SPEC.replace_action("publish", control_tla={"committed": "target"})
    run = modelcheck.run_tlc(broken)
    assert run.result.exit_code != 0 or run.graphs_equal is False


@pytest.mark.deep  # (the same: lint runs them)
def test_cli_check_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["spec", "check", "--rollouts", "1", "--generations", "2"]) == 0
    out = capsys.readouterr().out
    assert "holds    OneRolloutOnePolicy" in out and "states" in out
    assert main(["spec", "tla", "--check"]) == 0
    assert main(["spec", "doc", "--check"]) == 0
