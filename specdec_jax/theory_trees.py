"""Theorem 3.8's counterpart for a token tree: expected tokens per target call, and speedup.

A tree (`decoding.trees`: parents, node 0 the root) is verified by the walk of
`decoding.tree_acceptance`: from the root, the children are tried in index
order and at most one is accepted; the walk then goes on from it. Let a_i be
the probability that node i is the child accepted, given that the walk
reached its parent (its acceptance rate at its depth and sibling rank: the
siblings of one parent are exclusive, so their a_i sum to at most 1). Node i's
path is accepted with probability P_i = a_i * P_parent(i) (P_root = 1), and
each iteration emits the accepted path plus one token, so

  E[tokens per call] = 1 + sum_{i >= 1} P_i.

For the chain with a_i = alpha this is 1 + alpha + ... + alpha^gamma =
(1 - alpha^(gamma+1)) / (1 - alpha), the paper's Eq. 1. With a call costing
`cost` target steps (draft and verification of n + 1 tokens: the measured
T_verify(n + 1) / T_step plus the draft's share), the walltime improvement is
E / cost (Theorem 3.8 when cost = gamma c + 1).

Plain NumPy, as `theory`.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from specdec_jax.decoding import trees


def _check_accept(parents: np.ndarray, accept: ArrayLike) -> np.ndarray:
  a = np.broadcast_to(np.asarray(accept, np.float64), parents.shape)
  if not np.all((a[1:] >= 0) & (a[1:] <= 1)):
    raise ValueError(f"accept must lie in [0, 1] (a child's acceptance given its parent), got "
                     f"{np.asarray(accept).tolist()}.")
  for parent in np.unique(parents[1:]):
    total = a[1:][parents[1:] == parent].sum()
    if total > 1 + 1e-9:
      raise ValueError(f"accept of node {parent}'s children sums to {total:.4f} > 1: siblings "
                       "are exclusive (at most one is accepted), so give each child the "
                       "probability that it is the one accepted.")
  return a


def path_probabilities(parents: ArrayLike, accept: ArrayLike) -> np.ndarray:
  """float64 `[n + 1]`: P_i, the probability that node i's path is accepted (P_0 = 1).

  Args:
    parents: int `[n + 1]`, topological, -1 at the root (`trees.check_parents`).
    accept: `[n + 1]` or a scalar: a_i, node i is the child accepted given its
      parent was (entry 0 unused).
  """
  parents = trees.check_parents(parents)
  a = _check_accept(parents, accept)
  p = np.ones(parents.shape, np.float64)
  for i in range(1, parents.shape[0]):
    p[i] = a[i] * p[parents[i]]
  return p


def expected_tokens_per_call(parents: ArrayLike, accept: ArrayLike) -> float:
  """E[tokens emitted per target call] = 1 + sum of P_i over the candidates."""
  return float(path_probabilities(parents, accept).sum())


def rank_accept(parents: ArrayLike, rates: ArrayLike) -> np.ndarray:
  """Each node's a_i from rates measured per depth and sibling rank.

  Args:
    parents: int `[n + 1]`, topological, -1 at the root.
    rates: `[depths, ranks]`: at depth d (1-based row d - 1), the probability
      that the sibling of rank r (0: tried first) is the one accepted.

  Returns:
    float64 `[n + 1]` (entry 0: 1.0).

  Raises:
    ValueError: if the tree is deeper or wider than `rates`.
  """
  parents = trees.check_parents(parents)
  rates = np.asarray(rates, np.float64)
  depth = trees.ancestors(parents).sum(-1) - 1
  rank = np.array([np.sum(parents[1:i] == parents[i]) for i in range(parents.shape[0])])
  if depth.max() > rates.shape[0] or rank[1:].max(initial=0) >= rates.shape[1]:
    raise ValueError(f"rates of shape {rates.shape} (depths, ranks) do not cover a tree of "
                     f"depth {depth.max()} and {rank[1:].max(initial=0) + 1} siblings; "
                     "measure more depths or ranks, or choose a smaller tree.")
  out = np.ones(parents.shape, np.float64)
  out[1:] = rates[depth[1:] - 1, rank[1:]]
  return out


def walltime_improvement(parents: ArrayLike, accept: ArrayLike, cost: float) -> float:
  """E[tokens per call] / cost, cost = one iteration's time in target steps (> 0)."""
  if not cost > 0:
    raise ValueError(f"cost must be > 0 (an iteration's time in target steps), got {cost!r}.")
  return expected_tokens_per_call(parents, accept) / cost
