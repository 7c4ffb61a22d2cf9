"""The tree's shape chosen from acceptance per depth and rank and the cost of a call:
synthetic numbers whose best shape is known by hand, the best tree of each size against
every tree of that size, the chain against gamma's cost model, and named errors."""

import itertools

import numpy as np
import pytest

from specdec_jax import theory, theory_trees
from specdec_jax.costs import tree_choice
from specdec_jax.decoding import trees


def _costs(ratios: dict[int, float], c: float = 0.0, **overheads: float) -> theory.CostModel:
  return theory.CostModel(t_target_step=1.0, t_draft_step=c, t_verify=ratios, **overheads)


FLAT = {k: 1.0 for k in range(1, 10)}


def test_a_chain_when_siblings_are_never_accepted():
  """Rank 1 never accepted: siblings add nothing, so the chain, as long as verification
  stays one step: k <= 4 costs 1, k >= 5 costs 2. By hand at alpha 0.6: the chain of 3
  gives 1 + .6 + .36 + .216 = 2.176 tokens per step; of 4, 2.3056 / 2."""
  rates = [[0.6, 0.0, 0.0]] * 6
  ratios = {k: 1.0 if k <= 4 else 2.0 for k in range(1, 10)}
  choice = tree_choice.make_choice(rates, _costs(ratios))
  assert choice.parents == tuple(trees.chain(3)) and choice.widths == (1, 1, 1)
  assert choice.speedup == pytest.approx(2.176) and choice.helps
  assert choice.speedups["best n=4"] == pytest.approx(2.3056 / 2)
  # Among a draft's top-k branches too: k = 1 at depth 3.
  shapes = {f"{k}x{d}": trees.branches(k, d) for k in (1, 2, 3) for d in (1, 2, 3, 4)
            if k * d <= 8}
  assert tree_choice.make_choice(rates, _costs(ratios), shapes=shapes).name == "1x3"


def test_a_wide_first_level_by_hand():
  """Depth 1: ranks accepted .5, .3, .1; depth 2: .25. Best first: .5, .3, then the child
  of the first (.125) before the third sibling (.1): parents [-1, 0, 0, 1], 1.925 tokens."""
  rates = [[0.5, 0.3, 0.1], [0.25, 0.0, 0.0]]
  np.testing.assert_array_equal(tree_choice.best_tree(rates, 3), [-1, 0, 0, 1])
  np.testing.assert_array_equal(tree_choice.best_tree(rates, 4), [-1, 0, 0, 1, 0])
  # Verification doubles past 4 nodes: the 3-candidate tree wins.
  ratios = {k: 1.0 if k <= 4 else 2.0 for k in range(1, 10)}
  choice = tree_choice.make_choice(rates, _costs(ratios), max_nodes=6)
  assert choice.parents == (-1, 0, 0, 1) and choice.widths == (2, 1)
  assert choice.expected_tokens == pytest.approx(1.925)
  assert choice.speedup == pytest.approx(1.925)
  assert set(choice.speedups) == {f"best n={n}" for n in range(1, 7)}
  # One rank and one depth hold a single node: no larger budget is a candidate.
  assert set(tree_choice.make_choice([[0.5]], _costs(FLAT)).speedups) == {"best n=1"}


def test_draft_calls_cost_depth():
  """A draft call per level: with c = 0.5 a second level (+.125 tokens) costs more than it
  gives, so the two siblings of depth 1 win: 1.8 / 1.5 = 1.2X against 1.925 / 2."""
  rates = [[0.5, 0.3, 0.1], [0.25, 0.0, 0.0]]
  choice = tree_choice.make_choice(rates, _costs(FLAT, c=0.5), max_nodes=3)
  assert choice.parents == (-1, 0, 0) and choice.speedup == pytest.approx(1.8 / 1.5)
  assert choice.speedups["best n=3"] == pytest.approx(1.925 / 2)
  # Where a look-up proposes the second level, the draft runs once: 1.925 / 1.5.
  assert tree_choice.predicted_speedup([-1, 0, 0, 1], rates, _costs(FLAT, c=0.5),
                                       draft_calls=1) == pytest.approx(1.925 / 1.5)


def test_the_target_alone_when_no_tree_pays():
  choice = tree_choice.make_choice([[0.2, 0.1]] * 2, _costs({k: 1.5 for k in range(1, 6)},
                                                                  c=0.1), max_nodes=4)
  assert not choice.helps and choice.speedup < 1
  assert "decode with the target alone" in choice.reason
  assert choice.to_json()["helps"] is False


@pytest.mark.parametrize("seed", range(4))
def test_best_tree_is_the_best_of_its_size(seed):
  """Every topological tree of n = 1..5 candidates, by enumeration: none expects more
  tokens per call than `best_tree` (rates falling with rank, as a draft's are)."""
  rng = np.random.default_rng(seed)
  rates = np.sort(rng.dirichlet(np.ones(4), size=5)[:, :3], axis=1)[:, ::-1]
  for n in range(1, 6):
    best = theory_trees.expected_tokens_per_call(
        tree_choice.best_tree(rates, n), theory_trees.rank_accept(
            tree_choice.best_tree(rates, n), rates))
    most = 0.0
    for tail in itertools.product(*[range(i) for i in range(1, n + 1)]):
      parents = np.array((-1,) + tail)
      ranks = np.array([np.sum(parents[1:i] == parents[i]) for i in range(n + 1)])
      if ranks[1:].max() >= rates.shape[1]:
        continue
      most = max(most, theory_trees.expected_tokens_per_call(
          parents, theory_trees.rank_accept(parents, rates)))
    assert best == pytest.approx(most, abs=1e-12), n


def test_the_chain_is_gammas_cost_model():
  """A chain's predicted speedup is `CostModel.expected_speedup` at gamma = its depth."""
  costs = _costs({1: 1.0, 2: 1.05, 3: 1.1, 4: 1.2, 5: 1.3}, c=0.1, t_step_overhead=0.05,
                 t_iteration_overhead=0.2, t_proposal_overhead=0.03)
  for gamma in range(1, 5):
    got = tree_choice.predicted_speedup(trees.chain(gamma), [[0.7]] * gamma, costs)
    assert got == pytest.approx(costs.expected_speedup(0.7, gamma))


@pytest.mark.parametrize("rates,kwargs,match", [
    ([[0.5, 1.2]], {}, "rates must lie in"),
    ([[0.7, 0.6]], {}, "siblings are exclusive"),
    ([0.5, 0.2], {}, "2-D array"),
    ([[0.5]] * 3, dict(shapes={"wide": [-1, 0, 0]}), "do not cover"),
    ([[0.5]] * 3, dict(shapes={"loop": [-1, 1]}), r"shapes\['loop'\]"),
    ([[0.5]] * 3, dict(shapes={}), "shapes must map"),
    ([[0.5]] * 3, dict(max_nodes=0), "max_nodes"),
    ([[0.5]] * 12, dict(max_nodes=12), r"covers k=1..9.*k=2..13"),
])
def test_bad_arguments_are_named(rates, kwargs, match):
  with pytest.raises(ValueError, match=match):
    tree_choice.make_choice(rates, _costs(FLAT), **kwargs)


def test_costs_must_be_a_cost_model():
  with pytest.raises(ValueError, match="costs must be a theory.CostModel"):
    tree_choice.make_choice([[0.5]], {1: 1.0, 2: 1.0})


def test_a_sequences_encoders_count_as_the_chains_do():
  """With the tokens of a sequence, the encoders join both sides, as
  `CostModel.sequence_speedup` prices the chain. By hand: one child accepted half the time
  (1.5 tokens a call for one step), E_t = 2, E_d = 1, 10 tokens: 12 / (3 + 10 / 1.5)."""
  costs = theory.CostModel(t_target_step=1.0, t_draft_step=0.0, t_verify=FLAT,
                           t_encode_target=2.0, t_encode_draft=1.0)
  rates = [[0.5]]
  assert tree_choice.predicted_speedup([-1, 0], rates, costs) == pytest.approx(1.5)
  assert tree_choice.predicted_speedup([-1, 0], rates, costs, tokens=10) == pytest.approx(
      12 / (3 + 10 / 1.5))
  # The chain's own pricing of the same point agrees.
  assert costs.sequence_speedup(0.5, 1, 10) == pytest.approx(12 / (3 + 10 / 1.5))
  with pytest.raises(ValueError, match="tokens must be a number of output tokens > 0"):
    tree_choice.predicted_speedup([-1, 0], rates, costs, tokens=0)
