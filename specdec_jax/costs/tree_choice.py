"""The tree's shape, chosen by the cost model: gamma = 'auto''s counterpart for a token tree.

A pure function of measured numbers (no model, no timing): the acceptance
rates per depth and sibling rank (`theory_trees.rank_accept`'s `rates`,
measured on held-out examples) and the costs of one iteration
(`theory.CostModel`: T_step, T_verify(k) for a call that scores k nodes, the
draft's seconds per call, the loops' own work). For a tree of n candidates
and depth D (`decoding.trees` parents, node 0 the root):

  E[tokens per call] = 1 + sum_i P_i                     (theory_trees)
  iteration          = T_verify(n + 1) + D T_draft + n o_proposal + o_iteration
  speedup            = E[tokens per call] (T_step + o_step) / iteration

A draft that expands the tree level by level (`proposers.DraftBranches`)
makes one call per level, D in all; prompt lookup and a datastore cost no
draft call (give `t_draft_step` 0). For the chain (parents i - 1) this is
`CostModel.expected_speedup(alpha, gamma)` exactly.

The candidates are either the shapes a caller can build (`shapes`, e.g.
`trees.branches(k, depth)` for a draft's top-k branches), or by default the
best tree of each size n = 1..max_nodes (`best_tree`: the n nodes of highest
P_i, as Sequoia and EAGLE-2 build theirs; a proposer must then expand any
node, and `proposers.DraftBranches` builds `trees.branches` only, so pass
those as `shapes` to choose among what it runs). The shape of highest predicted
speedup wins (the fewest nodes on ties); where none beats the target alone,
the choice says to decode with the target alone.

Plain NumPy, as `theory` and `gamma_choice`.
"""

from __future__ import annotations

import dataclasses
import heapq
import types
from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from specdec_jax import theory, theory_trees, validation
from specdec_jax.decoding import trees

DEFAULT_MAX_NODES = 8


def check_rates(rates: ArrayLike) -> np.ndarray:
  """`rates` as float64 `[depths, ranks]`, checked.

  Args:
    rates: at depth d (row d - 1), the probability that the sibling of rank r
      (0: tried first) is the child accepted, given the walk reached its parent.

  Raises:
    ValueError: naming `rates`, unless it is a 2-D array of values in [0, 1]
      whose rows sum to at most 1 (siblings are exclusive).
  """
  a = np.asarray(rates, np.float64)
  if a.ndim != 2 or a.size == 0:
    raise ValueError(f"rates must be a 2-D array [depths, ranks] of acceptance rates, got "
                     f"shape {a.shape}; a chain's alpha is rates=[[alpha]] * depth.")
  if not np.all((a >= 0) & (a <= 1)):
    raise ValueError(f"rates must lie in [0, 1] (a sibling's probability of being the child "
                     f"accepted), got {a.tolist()}.")
  total = a.sum(axis=1)
  if np.any(total > 1 + 1e-9):
    depth = int(np.argmax(total)) + 1
    raise ValueError(f"rates at depth {depth} sum to {total[depth - 1]:.4f} > 1: siblings are "
                     "exclusive, so give each rank the probability that it is the one accepted "
                     "(acceptances at that rank over visits of its parent), not its acceptance "
                     "when tried.")
  return a


def best_tree(rates: ArrayLike, num_candidates: int) -> np.ndarray:
  """int32 `[num_candidates + 1]`: the tree of that many candidates of highest E[tokens per call].

  Best first from the root: the frontier holds, for each node, its next child
  (depth + 1, rank = children it has), worth P(node) * rates[depth, rank], and
  the most valuable is added (the earlier-added parent on ties). A child is
  worth no more than its parent, so when rates do not grow with rank the n
  nodes of highest P_i close under parents and earlier siblings, and the
  greedy tree is the best of its size. Children beyond `rates`' depths or
  ranks are never offered; if those run out first, the tree is smaller.

  Args:
    rates: `[depths, ranks]` (`check_rates`).
    num_candidates: the node budget n >= 1 (besides the root).

  Returns:
    The parents, topological (`trees.check_parents`), siblings in rank order.
  """
  rates = check_rates(rates)
  n = validation.as_int("num_candidates", num_candidates, minimum=1,
                        what="candidate tokens in the tree")
  parents, depth, value, children = [-1], [0], [1.0], [0]
  frontier: list[tuple[float, int]] = []  # (-worth, parent)

  def offer(node: int) -> None:
    d, r = depth[node], children[node]
    if d < rates.shape[0] and r < rates.shape[1]:
      heapq.heappush(frontier, (-value[node] * rates[d, r], node))

  offer(0)
  while len(parents) <= n and frontier:
    worth, parent = heapq.heappop(frontier)
    parents.append(parent)
    depth.append(depth[parent] + 1)
    value.append(-worth)
    children.append(0)
    children[parent] += 1
    offer(parent)
    offer(len(parents) - 1)
  return np.asarray(parents, np.int32)


def _depth(parents: np.ndarray) -> int:
  return int(trees.ancestors(parents).sum(-1).max()) - 1


def iteration_time(parents: np.ndarray, costs: theory.CostModel,
                   draft_calls: int | None = None) -> float:
  """Seconds of one tree iteration: T_verify(n + 1) + D T_draft + n o_proposal + o_iteration,
  D the draft's calls (default the tree's depth: every level comes from the draft)."""
  n = parents.shape[0] - 1
  calls = _depth(parents) if draft_calls is None else draft_calls
  return (costs.verify_time(n + 1) + calls * costs.t_draft_step
          + n * costs.t_proposal_overhead + costs.t_iteration_overhead)


def predicted_speedup(parents: ArrayLike, rates: ArrayLike, costs: theory.CostModel,
                      draft_calls: int | None = None, tokens: float | None = None) -> float:
  """Without `tokens`, E[tokens per call] (T_step + o_step) / `iteration_time`: the loops'
  speedup, encoders left out. With `tokens` output tokens a sequence, the encoders in,
  priced as the chain is (`theory.CostModel.sequence_ratio`).

  Args:
    parents: int `[n + 1]`, topological, -1 at the root.
    rates: `[depths, ranks]` (`check_rates`).
    costs: the measured costs; `costs.t_verify` must cover k = n + 1.
    draft_calls: the draft's calls per iteration (default the tree's depth; fewer where
      a table look-up proposes the deepest nodes).
    tokens: output tokens a sequence (> 0), or None.
  """
  parents = trees.check_parents(parents)
  accept = theory_trees.rank_accept(parents, check_rates(rates))
  per_call = theory_trees.expected_tokens_per_call(parents, accept)
  iteration = iteration_time(parents, costs, draft_calls)
  if tokens is None:
    return per_call * (costs.t_target_step + costs.t_step_overhead) / iteration
  return costs.sequence_ratio(tokens, per_call, iteration)


@dataclasses.dataclass(frozen=True)
class TreeChoice:
  """The chosen shape and everything the choice was made from.

  Attributes:
    name: the chosen candidate's name (`shapes`' key, or "best n=<n>").
    parents: the chosen tree's parents, `(n + 1,)` ints, -1 at the root.
    widths: nodes per depth 1..D of the chosen tree (a chain: all 1).
    expected_tokens: its E[tokens per call].
    speedup: its predicted speedup.
    speedups: {name: predicted speedup} of every candidate.
    rates: the `[depths, ranks]` acceptance rates decided with.
    verify_ratio: {k: T_verify(k) / T_step} for the k the candidates needed.
    reason: one line: the choice, its prediction and terms, the runner-up,
      and whether to decode with the target alone.
  """

  name: str
  parents: tuple[int, ...]
  widths: tuple[int, ...]
  expected_tokens: float
  speedup: float
  speedups: Mapping[str, float]
  rates: tuple[tuple[float, ...], ...]
  verify_ratio: Mapping[int, float]
  reason: str

  @property
  def helps(self) -> bool:
    """Whether the chosen tree is predicted to beat the target alone; if not, decode with
    the target alone."""
    return self.speedup > 1

  def to_json(self) -> dict[str, Any]:
    """A JSON-serialisable dict (mapping keys as strings), e.g. for a results row."""
    return {
        "name": self.name,
        "parents": list(self.parents),
        "widths": list(self.widths),
        "expected_tokens": self.expected_tokens,
        "speedup": self.speedup,
        "speedups": dict(self.speedups),
        "rates": [list(row) for row in self.rates],
        "verify_ratio": {str(k): v for k, v in self.verify_ratio.items()},
        "helps": self.helps,
        "reason": self.reason,
    }


def _candidates(rates: np.ndarray, shapes: Mapping[str, ArrayLike] | None,
                max_nodes: int) -> dict[str, np.ndarray]:
  if shapes is None:
    out = {}
    for n in range(1, max_nodes + 1):
      tree = best_tree(rates, n)
      if tree.shape[0] == n + 1:  # Else rates' depths and ranks hold fewer nodes.
        out[f"best n={n}"] = tree
    return out
  if not isinstance(shapes, Mapping) or not shapes:
    raise ValueError(f"shapes must map names to trees' parents (e.g. {{'branches 2x3': "
                     f"trees.branches(2, 3)}}), or be None for the best tree of each size; "
                     f"got {shapes!r}.")
  return {str(name): trees.check_parents(tree, f"shapes[{name!r}]")
          for name, tree in shapes.items()}


def make_choice(rates: ArrayLike, costs: theory.CostModel, *,
                shapes: Mapping[str, ArrayLike] | None = None,
                max_nodes: int = DEFAULT_MAX_NODES) -> TreeChoice:
  """Chooses the tree of highest predicted speedup from measured acceptance and costs.

  Args:
    rates: `[depths, ranks]` acceptance per depth and sibling rank (`check_rates`).
    costs: a `theory.CostModel` of measured times; `t_draft_step` is the
      proposer's seconds per draft call (0 for look-ups); `t_verify` must
      cover every candidate's n + 1.
    shapes: {name: parents} the caller can build; None: the best tree of each
      size 1..max_nodes (`best_tree`).
    max_nodes: the largest node budget when `shapes` is None.

  Returns:
    The `TreeChoice` (check `helps`).

  Raises:
    ValueError: naming the bad argument: rates outside [0, 1] or summing over
      1 at a depth, a shape deeper or wider than `rates`, a shape that is not
      a tree, or verification times that do not reach a candidate's size.
  """
  rates = check_rates(rates)
  if not isinstance(costs, theory.CostModel):
    raise ValueError(f"costs must be a theory.CostModel of measured times (e.g. "
                     f"CostModel.from_ratios(c, verify_ratio)), got {type(costs).__name__}.")
  max_nodes = validation.as_int("max_nodes", max_nodes, minimum=1,
                                what="the largest tree considered (candidates)")
  candidates = _candidates(rates, shapes, max_nodes)
  sizes = sorted({tree.shape[0] for tree in candidates.values()})
  low, high = min(costs.t_verify), max(costs.t_verify)
  if sizes[0] < low or sizes[-1] > high:
    raise ValueError(f"costs.t_verify covers k={low}..{high}, but the candidate trees score "
                     f"k={sizes[0]}..{sizes[-1]} nodes (candidates + root) per call; time "
                     "calls of those sizes, or lower max_nodes / pass other shapes.")
  speedups = {name: predicted_speedup(tree, rates, costs) for name, tree in candidates.items()}
  name = max(candidates, key=lambda s: (speedups[s], -candidates[s].shape[0]))
  tree = candidates[name]
  depths = trees.ancestors(tree).sum(-1) - 1
  choice = TreeChoice(
      name=name, parents=tuple(int(p) for p in tree),
      widths=tuple(int(w) for w in np.bincount(depths)[1:]),
      expected_tokens=theory_trees.expected_tokens_per_call(
          tree, theory_trees.rank_accept(tree, rates)),
      speedup=speedups[name], speedups=types.MappingProxyType(speedups),
      rates=tuple(tuple(float(x) for x in row) for row in rates),
      verify_ratio=types.MappingProxyType(
          {k: costs.verify_time(k) / costs.t_target_step for k in sizes}),
      reason="")
  return dataclasses.replace(choice, reason=_reason(choice, costs))


def _reason(choice: TreeChoice, costs: theory.CostModel) -> str:
  """The one line of `TreeChoice.reason`."""
  n = len(choice.parents) - 1
  parts = [f"{choice.name} (widths {list(choice.widths)}): cost model predicts "
           f"{choice.speedup:.2f}X, {choice.expected_tokens:.2f} tokens per call for "
           f"T_verify({n + 1})/T_step={choice.verify_ratio[n + 1]:.2f}, "
           f"{len(choice.widths)} draft calls of {costs.t_draft_step / costs.t_target_step:.3f} "
           "T_step"]
  others = sorted((s for s in choice.speedups if s != choice.name),
                  key=lambda s: -choice.speedups[s])
  if others:
    parts.append(f"runner-up {others[0]}: {choice.speedups[others[0]]:.2f}X")
  if not choice.helps:
    parts.append("no tree is predicted to beat the target alone: decode with the target alone")
  return "; ".join(parts)
