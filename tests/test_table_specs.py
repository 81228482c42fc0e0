"""What every table spec (spec/graph.py: episodes, staged updates, gateways) owes, in one
place: each of its mutants breaks the invariant its spec's tests name (the explorer's
shortest counterexample); TLC's graph of the generated module equals the explorer's edge
for edge; TLC catches every mutant too (deep: once per mutant)."""

from __future__ import annotations

import pytest
from conftest import require_tlc
from test_episode_spec import BREAKS as EPISODE_BREAKS
from test_gateway_spec import BREAKS as GATEWAY_BREAKS
from test_staged_spec import BREAKS as STAGED_BREAKS

from rolloutcore.proof import modelcheck

#: Per table model, the invariant (or step property) each of its mutants breaks first.
BREAKS = {modelcheck.EPISODE_MODEL.key: EPISODE_BREAKS,
          modelcheck.STAGED_MODEL.key: STAGED_BREAKS,
          modelcheck.GATEWAY_MODEL.key: GATEWAY_BREAKS}
MODELS = {m.key: m for m in modelcheck.TABLE_MODELS}
assert set(BREAKS) == set(MODELS)
MUTANTS = [(k, mu.name) for k, m in MODELS.items() for mu in m.mutants]


def test_every_mutant_has_the_invariant_it_breaks_named() -> None:
    for key, model in MODELS.items():
        assert {mu.name for mu in model.mutants} == set(BREAKS[key]), key


@pytest.mark.parametrize(("key", "name"), MUTANTS)
def test_each_mutant_breaks_its_invariant(key: str, name: str) -> None:
    model = MODELS[key]
    mutant = next(mu for mu in model.mutants if mu.name == name)
    ex = model.explore(mutant.apply(model.spec))
    want = BREAKS[key][name]
    assert want in ex.violations, (name, ex.violations)
    shortest = min(len(trace) for trace in ex.violations.values())
    assert len(ex.violations[want]) == shortest, (name, ex.violations)


@pytest.mark.parametrize("key", sorted(MODELS))
def test_tlc_graph_equals_the_explorers(key: str) -> None:
    require_tlc()
    run = MODELS[key].run_tlc()
    assert run.result.exit_code == 0, run.result.error_message
    assert run.graphs_equal, (run.only_python[:3], run.only_tlc[:3])
    assert (run.tlc_states, run.tlc_edges) == (run.python_states, run.python_edges)


@pytest.mark.deep  # make test: TLC once per mutant
@pytest.mark.parametrize("key", sorted(MODELS))
def test_tlc_catches_every_mutant(key: str) -> None:
    require_tlc()
    verdicts = MODELS[key].check_mutants(with_tlc=True)
    assert {v.mutant.name for v in verdicts} == set(BREAKS[key])
    for v in verdicts:
        assert v.caught and v.tlc_violated in v.explorer, v.as_json()
