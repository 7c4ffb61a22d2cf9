"""Expected tokens per call for a tree: the chain's Eq. 1, a hand count, and the walk itself."""

import jax
import numpy as np
import pytest

from specdec_jax import theory, theory_trees
from specdec_jax.decoding import tree_acceptance, trees


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.75, 1.0])
@pytest.mark.parametrize("gamma", [1, 3, 6])
def test_chain_is_equation_one(alpha, gamma):
  got = theory_trees.expected_tokens_per_call(trees.chain(gamma), alpha)
  assert got == pytest.approx(theory.expected_tokens_per_iteration(alpha, gamma))
  assert theory_trees.walltime_improvement(trees.chain(gamma), alpha, gamma * 0.1 + 1) == (
      pytest.approx(theory.walltime_improvement(alpha, gamma, 0.1)))


def test_a_tree_by_hand():
  # 0 -> 1 -> 3, 0 -> 2: 1 + a1 + a2 + a1 a3.
  parents, accept = [-1, 0, 0, 1], [1.0, 0.5, 0.25, 0.6]
  assert theory_trees.expected_tokens_per_call(parents, accept) == pytest.approx(
      1 + 0.5 + 0.25 + 0.5 * 0.6)
  rates = [[0.5, 0.25], [0.6, 0.1]]  # Per depth, per sibling rank.
  np.testing.assert_allclose(theory_trees.rank_accept(parents, rates), accept)


def test_bad_acceptance_is_named():
  with pytest.raises(ValueError, match="siblings are exclusive"):
    theory_trees.expected_tokens_per_call([-1, 0, 0], [1.0, 0.7, 0.6])
  with pytest.raises(ValueError, match="must lie in"):
    theory_trees.expected_tokens_per_call([-1, 0], [1.0, 1.5])
  with pytest.raises(ValueError, match="do not cover"):
    theory_trees.rank_accept([-1, 0, 0, 0], [[0.5, 0.2]])


def test_the_walk_emits_what_the_formula_expects():
  """Deterministic distinct siblings: child x of a node whose target is p is the one
  accepted with probability p(x); the walk's mean tokens per call is 1 + sum P_i."""
  rng = np.random.default_rng(0)
  batch, vocab = 20000, 6
  parents = np.array([-1, 0, 0, 0, 1, 1, 4])
  tokens = np.array([0, 1, 2, 3, 1, 4, 5])
  p = rng.dirichlet(np.ones(vocab), len(parents)).astype(np.float32)
  accept = np.array([1.0] + [p[parents[i], tokens[i]] for i in range(1, len(parents))])
  want = theory_trees.expected_tokens_per_call(parents, accept)
  out = jax.jit(tree_acceptance.verify_tree)(
      jax.random.key(0), np.broadcast_to(tokens, (batch, len(parents))), parents,
      np.broadcast_to(p, (batch,) + p.shape))
  emitted = np.asarray(out.num_accepted) + 1.0
  assert abs(emitted.mean() - want) < 4 * emitted.std() / np.sqrt(batch)
