"""Token trees: the shape a target verifies in one pass, as arrays.

A tree of n + 1 nodes is its `parents` array: node 0 is the root, the last
token of the text so far (the one neither model has processed, as a chain's
chunk starts with it), and every other node i is a candidate token whose
parent is `parents[i]` < i (topological order: a parent comes before its
children, and siblings are tried in index order). `parents[0]` is -1. The
chain of the paper is the tree whose parents are i - 1 (`chain`).

What a scorer needs of a tree (`layout`): each node's depth (its position is
the cached length + depth) and which nodes each node attends to (its
ancestors and itself). What the loop needs after acceptance (`path_order`):
the accepted path's nodes in depth order, so their keys and values can be
moved to the front of the chunk. `branches` is the shape of a draft's top-k
branches.

Parents may be NumPy (a static shape: the functions then give constants)
or traced per row (`[batch, n + 1]`, a shape chosen per row).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

Array = jax.Array


def chain(num_candidates: int) -> np.ndarray:
  """int32 `[num_candidates + 1]`: the chain's parents, -1 then 0 .. num_candidates - 1."""
  return np.arange(-1, num_candidates, dtype=np.int32)


def branches(k: int, depth: int) -> np.ndarray:
  """int32 `[k depth + 1]`: k chains of `depth` under the root (`proposers.DraftBranches`).

  Nodes 1..k are the root's children (rank order); level d's node i has the
  parent i - k, the same branch one level up. `branches(1, depth)` is
  `chain(depth)`.
  """
  return np.asarray([-1] + [0] * k + list(range(1, k * (depth - 1) + 1)), np.int32)


def check_parents(parents: np.ndarray | list[int], name: str = "parents") -> np.ndarray:
  """`parents` as int32 NumPy `[..., n + 1]`, checked to be a tree in topological order.

  Raises:
    ValueError: unless the last axis starts with -1 (the root) and every later
      node i has a parent in 0 .. i - 1.
  """
  parents = _int_array(parents, name, "[..., n + 1] (node 0 the root)")
  if np.any(parents[..., 0] != -1):
    raise ValueError(f"{name}[..., 0] must be -1 (node 0 is the root), got "
                     f"{parents[..., 0].tolist()}.")
  index = np.arange(parents.shape[-1])
  _refuse_bad_parents(parents, ((parents < 0) & (index > 0)) | (parents >= index),
                      "0 <= parents[i] < i for i >= 1", name)
  return parents.astype(np.int32)


def check_forest(parents: np.ndarray | list[int], name: str = "parents") -> np.ndarray:
  """`parents` as int32 NumPy `[..., k]`, checked to be a forest in topological order.

  What a scorer's chunk may be (`Scorer.score_tree`): a tree (`check_parents`),
  or several under a root the scorer has cached already, each of whose roots
  has the parent -1 (a draft's branches: `proposers.DraftBranches`).

  Raises:
    ValueError: unless every node i has a parent in -1 .. i - 1.
  """
  parents = _int_array(parents, name, "[..., k]")
  index = np.arange(parents.shape[-1])
  _refuse_bad_parents(parents, (parents < -1) | (parents >= index),
                      "-1 <= parents[i] < i: a root or an earlier node", name)
  return parents.astype(np.int32)


def _int_array(parents: np.ndarray | list[int], name: str, shape: str) -> np.ndarray:
  """`parents` as NumPy; ValueError unless it is an int array of at least one node."""
  parents = np.asarray(parents)
  if parents.ndim < 1 or parents.shape[-1] < 1 or not np.issubdtype(parents.dtype, np.integer):
    raise ValueError(f"{name} must be an int array {shape}, got shape {parents.shape} dtype "
                     f"{parents.dtype}.")
  return parents


def _refuse_bad_parents(parents: np.ndarray, bad: np.ndarray, rule: str, name: str) -> None:
  """ValueError naming the first node whose parent breaks `rule` (bool `bad [..., k]`)."""
  if np.any(bad):
    node = int(np.argmax(np.any(bad.reshape(-1, bad.shape[-1]), axis=0)))
    raise ValueError(f"{name} must be in topological order ({rule}); node {node} has parent "
                     f"{parents[..., node].tolist()}. Number the nodes so that every parent "
                     "comes before its children.")


@struct.dataclass
class TreeLayout:
  """What attention needs of a tree chunk.

  Attributes:
    depths: int32 `[batch, k]`, each node's depth (root 0); position = cached
      length + depth.
    ancestors: bool `[batch, k, k]`, `ancestors[b, i, j]`: node j is node i
      or one of its ancestors (what node i attends to within the chunk).
  """

  depths: Array
  ancestors: Array


def ancestors(parents: Array) -> Array:
  """bool `[..., k, k]`: `[..., i, j]` is True iff j is i or an ancestor of i.

  Args:
    parents: int `[..., k]` in topological order, -1 at the root.
  """
  k = parents.shape[-1]
  xp = np if isinstance(parents, np.ndarray) else jnp
  eye = xp.eye(k, dtype=bool)
  reach = eye | (parents[..., :, None] == xp.arange(k))  # Self or parent.
  for _ in range(max(0, math.ceil(math.log2(max(k - 1, 1))))):  # Paths double each round.
    reach = reach | (xp.matmul(reach.astype(xp.int32), reach.astype(xp.int32)) > 0)
  return reach


def layout(parents: Array | np.ndarray, batch: int) -> TreeLayout:
  """The `TreeLayout` of `parents` (int `[k]` or `[batch, k]`), broadcast to `batch` rows.

  NumPy parents (a shape fixed when the program is traced) are checked
  (`check_forest`: a tree, or several under a cached root); a jax array may be
  traced, so its caller keeps it topological.

  Raises:
    ValueError: NumPy parents that are not in topological order.
  """
  if not isinstance(parents, jax.Array):
    parents = check_forest(parents)
  anc = ancestors(parents)
  depths = anc.sum(-1) - 1
  xp = np if isinstance(parents, np.ndarray) else jnp
  k = parents.shape[-1]
  return TreeLayout(depths=jnp.broadcast_to(xp.asarray(depths, dtype=np.int32), (batch, k)),
                    ancestors=jnp.broadcast_to(anc, (batch, k, k)))


def path_order(parents: Array, node: Array) -> tuple[Array, Array]:
  """The root-to-`node` path as a gather order over the chunk.

  Args:
    parents: int `[k]` or `[batch, k]`, topological, -1 at the root.
    node: int32 `[batch]`, the last accepted node of each row.

  Returns:
    `order`, int32 `[batch, k]`: `order[b, d]` is the path's node at depth d
    for d <= depth(node) (`order[b, 0] = 0`, the root), and d itself beyond
    (so for a chain it is the identity); and `depth`, int32 `[batch]`, the
    depth of `node` (how many candidates were accepted).
  """
  batch = node.shape[0]
  tree = layout(parents, batch)
  on_path = jnp.take_along_axis(tree.ancestors, node[:, None, None], axis=1)[:, 0]  # [b, k]
  depth = jnp.take_along_axis(tree.depths, node[:, None], axis=1)[:, 0]  # [batch]
  k = tree.depths.shape[1]
  slot = jnp.where(on_path, tree.depths, k)  # Off-path nodes go to column k, cut off.
  nodes = jnp.broadcast_to(jnp.arange(k, dtype=jnp.int32), (batch, k))
  index = jnp.arange(batch)[:, None]
  order = jnp.broadcast_to(jnp.arange(k + 1, dtype=jnp.int32), (batch, k + 1))
  order = order.at[index, slot].set(nodes)[:, :k]
  return order, depth.astype(jnp.int32)
