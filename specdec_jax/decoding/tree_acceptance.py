"""Exact acceptance over a token tree: recursive rejection sampling, batched.

The tree (`trees`): node 0 is the root, the last token of the text; every
other node i holds a candidate token x_i whose parent is `parents[i]` < i.
The target scored every node in one pass, so p_i, the target's (warped)
distribution after the path to node i, is known for every node.

The walk. Start at the root with r = p_0. Try the current node's children in
index order; child i, proposed from the distribution q_i, is accepted with
probability min(1, r(x_i) / q_i(x_i)) (one uniform u_i: accept iff
u_i * q_i(x_i) < r(x_i)). On acceptance x_i is emitted, the walk moves to
node i and r = p_i. On rejection r <- norm(max(0, r - q_i)) and the next
sibling is tried. When no child is left (or none exists), one token is drawn
from r and the walk ends: the accepted path's tokens and that token are
emitted, 1 to depth + 1 tokens per target call.

Why the emitted text is distributed exactly as the target's. Claim: at a node
whose untried children are i, i+1, ..., with current residual r, the next
emitted token is distributed as r. By induction on the number of untried
children. None left: the token is drawn from r. Otherwise x_i ~ q_i, where q_i
may depend on the siblings tried before it (their tokens, not their coins),
so given everything before it x_i is distributed as q_i. It is emitted with
probability

  q_i(y) min(1, r(y)/q_i(y)) = min(q_i(y), r(y))

and it is rejected with probability sum_y max(0, r(y) - q_i(y)) = 1 - beta,
after which (induction) the next token is distributed as norm(max(0, r - q_i)),
contributing max(0, r(y) - q_i(y)). The sum is min(q_i, r) + max(0, r - q_i)
= r. At the root r = p_0, the target's distribution: the first token is the
target's. Given that the first token is y and came from child i, the walk
continues at node i with r = p_i, the target's distribution after the path to
y, and the children of node i were proposed given that path alone; the same
argument gives the second token, and so on. (A rejected sibling's subtree is
never visited.) Each row walks its own tree with its own uniforms, so rows
are independent.

Candidates of each origin are one case of this rule, differing only in q_i:

  * Sampled from the draft, i.i.d. (SpecInfer's multi-step speculative
    sampling): q_i = q, the draft's distribution at the parent, for every
    sibling; the residual after each rejection is what the next sibling is
    tested against.
  * Sampled from the draft without replacement (Jeon et al.'s recursive
    rejection sampling; Sequoia): q_i = q with the siblings drawn before it
    zeroed, renormalised (`without_replacement`). A rejected x had
    r(x) < q_i(x), so r loses x entirely: x cannot be emitted twice.
  * Deterministic (prompt lookup, a datastore, the draft's top-k given its
    distribution: nothing random chose the token): q_i is the point mass on
    x_i. Accept with probability r(x_i); on rejection r <- norm(r with x_i
    zeroed), since max(0, r - delta_x) zeroes x and keeps the rest.
  * Duplicates among siblings: a deterministic token already rejected has
    r(x) = 0, so it is never accepted and r is unchanged (it is skipped).

Temperature 0: p_i is one-hot at the target's argmax and the draft's
proposals are its argmax (a point mass), so the walk accepts exactly the
child whose token equals the target's argmax (the first such in index order)
and draws the argmax at the end: the longest path of argmax tokens, token for
token the greedy decoding (`verify_tree_greedy`, without the probabilities).
Top-k and top-p: p and q are warped by the ONE `sampling.Warp` before they get
here; the rule is exact for any pair of distributions.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from specdec_jax.decoding import acceptance, sampling, trees

Array = jax.Array


@struct.dataclass
class TreeVerifyOutput:
  """Result of verifying one token tree per row.

  Attributes:
    node: int32 `[batch]`, the last accepted node (0: the root, none accepted).
    num_accepted: int32 `[batch]`, its depth: the accepted candidates.
    order: int32 `[batch, n + 1]`, the accepted path's nodes by depth, root
      first, then each index itself (`trees.path_order`): where the accepted
      keys and values are gathered from.
    next_token: int32 `[batch]`, the token drawn from the final residual.
  """

  node: Array
  num_accepted: Array
  order: Array
  next_token: Array


def _token_probs(probs: Array, tokens: Array) -> Array:
  """`probs[..., tokens]`: `[..., vocab]`, int `[...]` -> `[...]`."""
  return jnp.take_along_axis(probs, tokens[..., None], axis=-1)[..., 0]


def without_replacement(q: Array, earlier: Array) -> Array:
  """q with the tokens drawn before zeroed and the rest renormalised.

  Args:
    q: `[..., vocab]` the draft's distribution at the parent.
    earlier: bool `[..., vocab]`, the siblings' tokens drawn before this one.

  Returns:
    `[..., vocab]` float32; where nothing is left (every token drawn), zeros.
  """
  left = jnp.where(earlier, 0.0, q.astype(jnp.float32))
  mass = jnp.sum(left, axis=-1, keepdims=True)
  return left / jnp.where(mass > 0, mass, 1.0)


def _proposal_probs(tokens: Array, q_probs: Array | None, drawn: Array | None,
                    vocab: int) -> Array:
  """`[batch, n + 1, vocab]` q_i per node: the draft's row where drawn, else a point mass."""
  point = jax.nn.one_hot(tokens, vocab, dtype=jnp.float32)
  if q_probs is None:
    return point
  return jnp.where(drawn[..., None], q_probs.astype(jnp.float32), point)


def _check(tokens: Array, parents: Array, p_probs: Array, q_probs: Array | None,
           drawn: Array | None) -> None:
  """Raises ValueError when the shapes do not fit together."""
  if tokens.ndim != 2 or not jnp.issubdtype(tokens.dtype, jnp.integer):
    raise ValueError(f"tokens must be an int array [batch, n + 1] (node 0 the root), got shape "
                     f"{tokens.shape} dtype {tokens.dtype}.")
  batch, k = tokens.shape
  if parents.shape not in ((k,), (batch, k)):
    raise ValueError(f"parents must have shape [n + 1] = [{k}] or [batch, n + 1] = "
                     f"[{batch}, {k}], got {parents.shape}.")
  if p_probs.ndim != 3 or p_probs.shape[:2] != (batch, k):
    raise ValueError(f"p_probs must have shape [batch, n + 1, vocab] = [{batch}, {k}, V], got "
                     f"{p_probs.shape}.")
  if (q_probs is None) != (drawn is None):
    raise ValueError("pass q_probs and drawn together (drawn marks the nodes sampled from "
                     "q_probs), or neither (every candidate deterministic).")
  if q_probs is not None and (q_probs.shape != p_probs.shape or drawn.shape != (batch, k)):
    raise ValueError(f"q_probs must have p_probs' shape {p_probs.shape} and drawn shape "
                     f"{(batch, k)}, got {q_probs.shape} and {drawn.shape}.")


def walk(uniforms: Array, tokens: Array, parents: Array, p_probs: Array, q_probs: Array,
         valid: Array) -> tuple[Array, Array]:
  """The walk of the module docstring with given uniforms: the accepted node and final r.

  Args:
    uniforms: float32 `[batch, n + 1]` in [0, 1), node i's coin (column 0 unused).
    tokens: int32 `[batch, n + 1]`, node i's token (column 0: the root's, unused).
    parents: int `[n + 1]` or `[batch, n + 1]`, topological, -1 at the root.
    p_probs: float32 `[batch, n + 1, vocab]`, the target's distribution after node i.
    q_probs: float32 `[batch, n + 1, vocab]`, q_i: what node i was proposed from.
    valid: bool `[batch, n + 1]`, False for nodes a row does not hold (never tried).

  Returns:
    int32 `[batch]` the last accepted node and float32 `[batch, vocab]` the
    distribution the next token is drawn from.
  """
  batch, k = tokens.shape
  parents = jnp.broadcast_to(jnp.asarray(parents, jnp.int32), (batch, k))
  coin = uniforms * _token_probs(q_probs, tokens)  # [batch, n + 1]

  def try_node(carry, xs):
    node, r = carry  # [batch], [batch, vocab]
    i, parent, token, scaled_u, q_i, p_i, present = xs
    tried = present & (parent == node)
    accept = tried & (scaled_u < _token_probs(r, token))
    rejected = tried & ~accept
    r = jnp.where(accept[:, None], p_i,
                  jnp.where(rejected[:, None], acceptance.residual_distribution(r, q_i), r))
    return (jnp.where(accept, i, node), r), None

  def nodes_first(x: Array) -> Array:  # [batch, k, ...] -> [k - 1, batch, ...], root dropped.
    return jnp.moveaxis(x, 1, 0)[1:]

  xs = (jnp.arange(1, k, dtype=jnp.int32), nodes_first(parents), nodes_first(tokens),
        nodes_first(coin), nodes_first(q_probs), nodes_first(p_probs), nodes_first(valid))
  init = (jnp.zeros((batch,), jnp.int32), p_probs[:, 0].astype(jnp.float32))
  (node, r), _ = jax.lax.scan(try_node, init, xs)
  return node, r


def verify_tree(rng: Array, tokens: Array, parents: Array, p_probs: Array,
                q_probs: Array | None = None, drawn: Array | None = None,
                valid: Array | None = None) -> TreeVerifyOutput:
  """Recursive rejection sampling over one candidate tree per row (module docstring).

  `rng` is split once into the key of the per-node uniforms and the key of
  the next token, so the result is a deterministic function of `rng`.

  Args:
    rng: a PRNG key.
    tokens: int `[batch, n + 1]`, the root's token then each candidate's.
    parents: int `[n + 1]` or `[batch, n + 1]`: -1, then each candidate's
      parent (< its index; `trees.check_parents`).
    p_probs: `[batch, n + 1, vocab]` the target's warped distribution after
      each node's path.
    q_probs: None (every candidate deterministic), or `[batch, n + 1, vocab]`:
      row i is the warped distribution candidate i was drawn from, given the
      siblings drawn before it (`without_replacement` when drawn so).
    drawn: bool `[batch, n + 1]` with `q_probs`: True where candidate i was
      drawn from `q_probs[:, i]`; False: deterministic (a point mass).
    valid: bool `[batch, n + 1]`, None (all): False for nodes a row lacks.

  Returns:
    A `TreeVerifyOutput`.

  Raises:
    ValueError: if the shapes do not fit together.
  """
  tokens, p_probs = jnp.asarray(tokens), jnp.asarray(p_probs)
  _check(tokens, jnp.asarray(parents), p_probs, q_probs, drawn)
  batch, k = tokens.shape
  tokens = tokens.astype(jnp.int32)
  q = _proposal_probs(tokens, q_probs, drawn, p_probs.shape[-1])
  valid = jnp.ones((batch, k), bool) if valid is None else valid
  walk_rng, next_rng = jax.random.split(rng)
  uniforms = jax.random.uniform(walk_rng, (batch, k), dtype=jnp.float32)
  node, r = walk(uniforms, tokens, parents, p_probs.astype(jnp.float32), q, valid)
  order, depth = trees.path_order(parents, node)
  return TreeVerifyOutput(node=node, num_accepted=depth, order=order,
                          next_token=sampling.sample_from_probs(next_rng, r).astype(jnp.int32))


def verify_tree_greedy(tokens: Array, parents: Array, p_logits: Array,
                       valid: Array | None = None) -> TreeVerifyOutput:
  """`verify_tree` at temperature 0, from the target's logits alone.

  Candidate i is accepted iff its parent was and its token is the target's
  argmax after its parent (ties -> the lowest id, as `sampling.sample`; the
  first such sibling in index order); the next token is the argmax after the
  last accepted node.

  Args:
    tokens: int `[batch, n + 1]`.
    parents: int `[n + 1]` or `[batch, n + 1]`, topological, -1 at the root.
    p_logits: `[batch, n + 1, vocab]` the target's logits after each node.
    valid: bool `[batch, n + 1]`, None (all): False for nodes a row lacks.

  Returns:
    A `TreeVerifyOutput`.
  """
  tokens = jnp.asarray(tokens).astype(jnp.int32)
  batch, k = tokens.shape
  parents = jnp.broadcast_to(jnp.asarray(parents, jnp.int32), (batch, k))
  target = sampling.first_argmax(p_logits)  # [batch, n + 1]
  wanted = jnp.take_along_axis(target, jnp.maximum(parents, 0), axis=1)  # After the parent.
  match = tokens == wanted
  if valid is not None:
    match = match & valid

  def try_node(node, xs):
    i, parent, ok = xs
    return jnp.where(ok & (parent == node), i, node), None

  xs = (jnp.arange(1, k, dtype=jnp.int32), parents.T[1:], match.T[1:])
  node, _ = jax.lax.scan(try_node, jnp.zeros((batch,), jnp.int32), xs)
  order, depth = trees.path_order(parents, node)
  next_token = jnp.take_along_axis(target, node[:, None], axis=1)[:, 0]
  return TreeVerifyOutput(node=node, num_accepted=depth, order=order, next_token=next_token)
