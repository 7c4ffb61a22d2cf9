"""Speculative decoding over a token tree, as one jitted loop.

Each iteration of the `lax.while_loop`:

  propose: the proposer fills a tree of a fixed shape under the root (the last
           token): tokens [batch, n + 1], valid [batch, n + 1], and for drawn
           candidates the distributions they were drawn from (`proposers`)
  target:  ONE call scores every node (`Scorer.score_tree`): node i at position
           m + depth(i), attending to the cache and its ancestors -> p [batch, n + 1]
  accept:  the walk of `tree_acceptance` (argmax equality at T = 0): the last
           accepted node, its path and the token drawn after it
  write:   the path's tokens and the next token (cut at EOS and max_decode_len)
  keep:    the target's cache keeps the path's keys and values, in place
           (`Scorer.keep_path`), rewound to the accepted length; the proposer
           takes the accepted text (`Proposer.commit`)

A proposer that reads the target's features (`Proposer.reads_target_features`,
EAGLE-style) gets them where the target computes them anyway: the prompt's from
the target's prefill (`Scorer.init_state_with_features`), and the accepted
path's from the scoring call (`Scorer.score_tree_with_features`, gathered in
path order and passed to `Proposer.commit`).

The chain of `speculative.py` is the tree whose parents are i - 1. At
temperature 0 the output is token for token the target's greedy decoding; at
T > 0 it is distributed as the target's (`tree_acceptance`'s derivation).
The loop counts acceptance per depth and sibling rank (`TreeStats.rank_rates`):
measured on held-out prompts, what `tree_choice.make_choice` chooses a shape from.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specdec_jax import stats
from specdec_jax.decoding import programs, trees
from specdec_jax.decoding import tree_acceptance as ta
from specdec_jax.decoding.proposers import Proposer, tree_parents
from specdec_jax.decoding.sampling import Warp
from specdec_jax.decoding.scorer import Scorer

Array = jax.Array


@struct.dataclass
class TreeStats:
  """Per-row counters of one `tree_speculative_decode` call.

  Attributes:
    iterations: int32 `[batch]`, target calls while the row was unfinished.
    tokens: int32 `[batch]`, tokens emitted (the output lengths).
    accepted: int32 `[batch]`, accepted candidates that are part of the output.
    accepted_histogram: int32 `[batch, depth + 1]`, how often n accepted
      candidates were emitted in one iteration, n = 0..depth.
    rank_accepted: int32 `[batch, depth, ranks]`, how often the candidate of
      sibling rank r at depth d + 1 was accepted (rank: its place among its
      parent's children, 0 tried first).
    rank_offered: int32 `[batch, depth, ranks]`, how often the walk reached
      the parent of such a candidate (whether the row held it or not: a
      candidate a proposer could not fill counts as not accepted, so each
      depth's rates sum to at most 1).
    loop_iterations: int32 `[]`, iterations of the batched loop.
  """

  iterations: Array
  tokens: Array
  accepted: Array
  accepted_histogram: Array
  rank_accepted: Array
  rank_offered: Array
  loop_iterations: Array

  def tokens_per_iteration(self) -> np.ndarray:
    """`[batch]` tokens emitted per target call."""
    return stats.tokens_per_call(self.tokens, self.iterations)

  def rank_rates(self) -> np.ndarray:
    """float64 `[depth, ranks]` over all rows: the probability that the sibling of rank r
    at depth d + 1 is the child accepted, given the walk reached its parent
    (`theory_trees.rank_accept`'s rates, for `tree_choice.make_choice`); 0 where
    no such parent was reached."""
    accepted = np.asarray(self.rank_accepted, np.float64).sum(0)
    offered = np.asarray(self.rank_offered, np.float64).sum(0)
    return np.where(offered > 0, accepted / np.maximum(offered, 1), 0.0)


@struct.dataclass
class TreeOutput:
  """Result of `tree_speculative_decode`.

  Attributes:
    sequences: int32 `[batch, max_decode_len]`, generated tokens, EOS included, 0 after.
    lengths: int32 `[batch]`, generated tokens per row, EOS included.
    stats: the `TreeStats`.
  """

  sequences: Array
  lengths: Array
  stats: TreeStats


@struct.dataclass
class TreeLoopState:
  """State of the tree loop.

  Attributes:
    iteration: int32 `[]`, iterations run so far.
    tokens: int32 `[batch, max_decode_len + n + 2]`, the start token at index 0,
      then the generated tokens; beyond a row's length: scratch.
    lengths: int32 `[batch]`, m = tokens generated; `tokens[:, m]` is the root.
    done: bool `[batch]`, True once a row emitted EOS or reached max_decode_len.
    target_state: the target scorer's state; its cache holds exactly m positions.
    proposer_state: the proposer's state.
    rng: PRNG key for the remaining iterations (unused at temperature 0).
    accepted: int32 `[batch, max_decode_len]`, candidates accepted at iteration i.
    emitted: int32 `[batch, max_decode_len]`, tokens emitted at iteration i.
    rank_accepted: int32 `[batch, depth, ranks]`, `TreeStats.rank_accepted` so far.
    rank_offered: int32 `[batch, depth, ranks]`, `TreeStats.rank_offered` so far.
  """

  iteration: Array
  tokens: Array
  lengths: Array
  done: Array
  target_state: object
  proposer_state: object
  rng: Array
  accepted: Array
  emitted: Array
  rank_accepted: Array
  rank_offered: Array


def _rank_slots(parents: np.ndarray) -> np.ndarray:
  """int32 `[n, depth, ranks]`: candidate i's one-hot at (its depth - 1, its sibling rank)."""
  depth = trees.ancestors(parents).sum(-1)[1:] - 2  # [n], 0 for the root's children
  rank = np.array([np.sum(parents[1:i] == parents[i]) for i in range(1, parents.shape[0])],
                  np.int32)
  n = parents.shape[0] - 1
  slots = np.zeros((n, int(depth.max(initial=-1)) + 1, int(rank.max(initial=-1)) + 1), np.int32)
  slots[np.arange(n), depth, rank] = 1
  return slots


def tree_speculative_decode(target: Scorer, proposer: Proposer, inputs: Array, rng: Array, *,
                            max_decode_len: int, warp: Warp, eos_id: int) -> TreeOutput:
  """Samples from `target` with `proposer`'s tree verified in one target call per iteration.

  Args:
    target: the target's `Scorer` (one that scores trees: `Scorer.score_tree`).
    proposer: a `proposers.Proposer` (e.g. `proposers.Merged` of several).
    inputs: int32 `[batch, input_len]`, what `target.encode` and the proposer take.
    rng: one PRNG key.
    max_decode_len: the most tokens to generate per row.
    warp: the sampling settings.
    eos_id: the end-of-sequence id.

  Returns:
    A `TreeOutput`.

  Raises:
    ValueError: if the proposer's tree is not topologically ordered.
  """
  parents = trees.check_parents(tree_parents(proposer), "the proposer's parents")
  context = target.encode(inputs)
  return _tree_loop(target, context, proposer, inputs, rng, parents=tuple(parents.tolist()),
                    max_decode_len=max_decode_len, warp=warp, eos_id=eos_id)


@functools.partial(programs.loop_jit, static_argnames=(
    "parents", "max_decode_len", "warp", "eos_id"))
def _tree_loop(target: Scorer, context: object, proposer: Proposer, inputs: Array, rng: Array,
               *, parents: tuple[int, ...], max_decode_len: int, warp: Warp,
               eos_id: int) -> TreeOutput:
  """The loop, given the target's context (`target.encode(inputs)`)."""
  size = len(parents)  # n + 1
  cache_len = max_decode_len + size + 1
  if proposer.reads_target_features:
    target_state, target_encoded = target.init_state_with_features(context, cache_len)
  else:
    target_state = target.init_state(context, cache_len)
    target_encoded = target.encoder_outputs(context)
  batch = target.cached_lengths(target_state).shape[0]
  buffer = jnp.full((batch, max_decode_len + size + 1), target.pad_id, jnp.int32)
  records = jnp.zeros((batch, max_decode_len), jnp.int32)
  depth = int(trees.ancestors(np.asarray(parents)).sum(-1).max()) - 1
  by_rank = jnp.zeros((batch,) + _rank_slots(np.asarray(parents)).shape[1:], jnp.int32)
  init = TreeLoopState(
      iteration=jnp.array(0, jnp.int32),
      tokens=buffer.at[:, 0].set(target.start_token),
      lengths=jnp.zeros((batch,), jnp.int32),
      done=jnp.zeros((batch,), bool),
      target_state=target_state,
      proposer_state=proposer.init_state(inputs, cache_len, target_encoded),
      rng=rng, accepted=records, emitted=records, rank_accepted=by_rank, rank_offered=by_rank)

  def cond(state: TreeLoopState) -> Array:
    return ~jnp.all(state.done)

  def body(state: TreeLoopState) -> TreeLoopState:
    return _tree_step(target, proposer, state, parents=np.asarray(parents),
                      max_decode_len=max_decode_len, warp=warp, eos_id=eos_id)

  final = jax.lax.while_loop(cond, body, init)
  valid = jnp.arange(max_decode_len)[None] < final.lengths[:, None]
  sequences = jnp.where(valid, final.tokens[:, 1:max_decode_len + 1], 0)
  n, count = final.accepted, final.emitted
  ran = count > 0
  kept = jnp.minimum(n, count)
  histogram = jnp.sum((kept[..., None] == jnp.arange(depth + 1)) & ran[..., None], axis=1,
                      dtype=jnp.int32)
  return TreeOutput(sequences, final.lengths, TreeStats(
      iterations=jnp.sum(ran, axis=1, dtype=jnp.int32),
      tokens=jnp.sum(count, axis=1, dtype=jnp.int32),
      accepted=jnp.sum(kept, axis=1, dtype=jnp.int32),
      accepted_histogram=histogram,
      rank_accepted=final.rank_accepted, rank_offered=final.rank_offered,
      loop_iterations=final.iteration))


def _tree_step(target: Scorer, proposer: Proposer, state: TreeLoopState, *, parents: np.ndarray,
               max_decode_len: int, warp: Warp, eos_id: int) -> TreeLoopState:
  """One propose / score the tree / accept / keep the path iteration for every row."""
  if warp.temperature == 0:
    rng = verify_rng = state.rng
  else:
    rng, verify_rng = jax.random.split(state.rng)
  m = state.lengths  # [batch]
  size = parents.shape[0]

  with jax.named_scope("propose"):
    # The candidates' draws are independent of the acceptance's (verify_tree splits its key).
    proposer_state, proposal = proposer.propose(state.proposer_state, state.tokens, m, warp,
                                                jax.random.fold_in(verify_rng, 1))
    root = jnp.take_along_axis(state.tokens, m[:, None], axis=1)  # [batch, 1]
    tokens = jnp.concatenate([root, proposal.tokens], axis=1)  # [batch, n + 1]
    valid = jnp.concatenate([jnp.ones_like(root, bool), proposal.valid], axis=1)
    q_probs = drawn = None
    if proposal.q_probs is not None:  # The root's row: never tried.
      q_probs = jnp.pad(proposal.q_probs, ((0, 0), (1, 0), (0, 0)))
      drawn = jnp.pad(proposal.drawn, ((0, 0), (1, 0)))
  with jax.named_scope("verify"):
    features = None
    if proposer.reads_target_features:
      p_logits, features, target_state = target.score_tree_with_features(
          state.target_state, tokens, parents)
    else:
      p_logits, target_state = target.score_tree(state.target_state, tokens, parents)
  with jax.named_scope("accept"):
    if warp.temperature == 0:
      verdict = ta.verify_tree_greedy(tokens, parents, p_logits, valid)
    else:
      verdict = ta.verify_tree(verify_rng, tokens, parents, warp.probs(p_logits), q_probs,
                               drawn, valid)
    n = verdict.num_accepted  # [batch]
    # The path's tokens after the root, then the next token: n + 1 new tokens per row.
    j = jnp.arange(size)[None]  # [1, n + 1]
    path = jnp.take_along_axis(tokens, verdict.order, axis=1)  # [batch, n + 1], root first
    ahead = jnp.concatenate([path[:, 1:], path[:, :1]], axis=1)
    new = jnp.where(j < n[:, None], ahead, verdict.next_token[:, None])  # [batch, n + 1]
    is_eos = (new == eos_id) & (j <= n[:, None])
    first_eos = jnp.where(jnp.any(is_eos, 1), jnp.argmax(is_eos, 1), size)
    count = jnp.minimum(jnp.minimum(n + 1, first_eos + 1), max_decode_len - m)
    count = jnp.where(state.done, 0, count)
    new_lengths = m + count
    done = state.done | (first_eos < count) | (new_lengths >= max_decode_len)

  with jax.named_scope("write"):
    tokens_buffer = jax.vmap(lambda b, c, s: jax.lax.dynamic_update_slice(b, c, (s,)))(
        state.tokens, new, m + 1)
    at = (0, state.iteration)
    accepted = jax.lax.dynamic_update_slice(state.accepted, n[:, None], at)
    emitted = jax.lax.dynamic_update_slice(state.emitted, count[:, None], at)
    # Per depth and sibling rank: candidates on the accepted path, and those whose parent is.
    on_path = jnp.take(jnp.asarray(trees.ancestors(parents)), verdict.node, axis=0)  # [b, n+1]
    live = ~state.done[:, None]
    slots = _rank_slots(parents)  # [n, depth, ranks]
    shape = state.rank_accepted.shape
    slots = jnp.asarray(slots.reshape(slots.shape[0], -1))
    rank_accepted = state.rank_accepted + jnp.reshape(
        (on_path[:, 1:] & live).astype(jnp.int32) @ slots, shape)
    rank_offered = state.rank_offered + jnp.reshape(
        (on_path[:, parents[1:]] & live).astype(jnp.int32) @ slots, shape)

  with jax.named_scope("keep"):
    target_state = target.keep_path(target_state, verdict.order, new_lengths)
    if features is not None:  # Along the accepted path, root first: [batch, depth + 1, F].
      depth = int(trees.ancestors(parents).sum(-1).max()) - 1
      features = jnp.take_along_axis(features, verdict.order[:, :depth + 1, None], axis=1)
    proposer_state = proposer.commit(proposer_state, new_lengths, tokens_buffer, features)
  return TreeLoopState(
      iteration=state.iteration + 1, tokens=tokens_buffer, lengths=new_lengths, done=done,
      target_state=target_state, proposer_state=proposer_state, rng=rng,
      accepted=accepted, emitted=emitted, rank_accepted=rank_accepted,
      rank_offered=rank_offered)
