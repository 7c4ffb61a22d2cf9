"""The T5 scorers score a token tree in one pass (`Scorer.score_tree`, `Scorer.keep_path`).

For a `T5Scorer` (both architecture families) and a `SharedEncoderScorer`:
each node's logits are those of its root-to-node path scored as a chain (T5's
relative positions taken from depths, not node indices); the chain (parents
i - 1) is the chunk scoring of before; after `keep_path` the cache is the one
the accepted path leaves when decoded as a chain, with both cache layouts;
parents out of topological order are refused by name. The tree loop with a T5
target and T5 drafts (with their own encoder, or reading the target's) gives
the target's greedy tokens.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import greedy_with_mid_run_eos, make_model, make_shared_encoder_pair

from specdec_jax.decoding import proposers, trees
from specdec_jax.decoding.sampling import Warp
from specdec_jax.decoding.tree_speculative import tree_speculative_decode
from specdec_jax.models.options import DecodeOptions
from specdec_jax.models.t5 import SharedEncoderModel, SharedEncoderScorer, T5Scorer, make_draft

VOCAB = 97
INPUTS = np.array([[5, 6, 7, 8, 9, 5], [11, 12, 13, 0, 0, 0]], np.int32)
HISTORY = 6  # Decoder tokens before the tree: node-to-cache distances reach the log buckets.
# 0 -> 1 -> 4 -> 6, 0 -> 2 -> 5, 0 -> 3, 1 -> 7: node 7 stands at depth 2, index 7.
PARENTS = np.array([-1, 0, 0, 0, 1, 2, 4, 1])
DEPTHS = np.array([0, 1, 1, 1, 2, 2, 3, 2])
SCORERS = ["test-v1_0", "test-v1_1", "shared"]

# One program per scorer kind and shape, whichever test calls it (the scorer is an argument).
score = jax.jit(lambda scorer, state, tokens: scorer.score(state, tokens))
score_tree = jax.jit(lambda scorer, state, tokens, parents: scorer.score_tree(state, tokens,
                                                                              parents))
keep_path = jax.jit(lambda scorer, state, order, lengths: scorer.keep_path(state, order, lengths))


@functools.cache
def _scorer(name: str, split_heads: bool = False) -> tuple[T5Scorer, object]:
  """A scorer and its context on INPUTS: a T5 of config `name`, or "shared" (a
  shared-encoder decoder over a T5.1.1 target's encoder)."""
  options = DecodeOptions.for_backend().replace(split_heads=split_heads)
  inputs = jnp.asarray(INPUTS)
  if name == "shared":
    target, target_params, model, params = make_shared_encoder_pair()
    model = dataclasses.replace(model, options=options)
    scorer = SharedEncoderScorer(model, model.prepare(params))
    return scorer, scorer.encode(inputs, target.encode(target_params, inputs))
  model, params = make_model(name)
  model = dataclasses.replace(model, options=options)
  scorer = T5Scorer(model, model.prepare(params))
  return scorer, scorer.encode(inputs)


def _start(name: str, split_heads: bool = False):
  """The scorer and its state after HISTORY random decoder tokens."""
  scorer, context = _scorer(name, split_heads)
  _, state = score(scorer, scorer.init_state(context, 24), jnp.asarray(_random(0, 2, HISTORY)))
  return scorer, state


def _random(seed: int, *shape: int) -> np.ndarray:
  return np.random.default_rng(seed).integers(1, VOCAB, shape).astype(np.int32)


def _paths(tokens: np.ndarray, nodes: list[int]) -> np.ndarray:
  """int32 `[batch, 4]`: row b's root-to-`nodes[b]` path, then any tokens (a chain of
  4 scores its first d + 1 positions as the path alone: attention is causal)."""
  out = _random(9, len(nodes), 4)
  for b, node in enumerate(nodes):
    while node >= 0:
      out[b, DEPTHS[node]] = tokens[b, node]
      node = int(PARENTS[node])
  return out


@pytest.mark.parametrize("name", SCORERS)
def test_tree_logits_are_each_paths_chain_logits(name):
  scorer, state = _start(name)
  tokens = _random(1, 2, len(PARENTS))
  logits, after = score_tree(scorer, state, jnp.asarray(tokens), PARENTS)
  np.testing.assert_array_equal(scorer.cached_lengths(after), [HISTORY + len(PARENTS)] * 2)
  for node in range(len(PARENTS)):
    want, _ = score(scorer, state, jnp.asarray(_paths(tokens, [node, node])))
    np.testing.assert_allclose(logits[:, node], want[:, DEPTHS[node]], atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", SCORERS)
def test_a_chain_tree_is_the_chunk(name):
  scorer, state = _start(name)
  tokens = jnp.asarray(_random(3, 2, 4))
  as_tree, tree_state = score_tree(scorer, state, tokens, trees.chain(3))
  # The model's chunk call without a tree: the chain's mask and positions.
  as_chunk, cache = scorer.model.decode_chunk(state.context.weights, state.context.encoded,
                                              state.cache, tokens)
  np.testing.assert_array_equal(as_tree, as_chunk)
  for got, want in zip(tree_state.cache.keys + tree_state.cache.values,
                       cache.keys + cache.values, strict=True):
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name, split_heads", [("test-v1_1", False), ("test-v1_1", True),
                                               ("shared", False)])
def test_cache_after_keep_path_is_the_decoded_paths(name, split_heads):
  scorer, state = _start(name, split_heads)
  tokens = _random(5, 2, len(PARENTS))
  _, tree_state = score_tree(scorer, state, jnp.asarray(tokens), PARENTS)
  nodes = [6, 7]  # Depth 3 in row 0; depth 2 in row 1, off the chunk's front.
  order, depth = trees.path_order(PARENTS, jnp.asarray(nodes))
  lengths = scorer.cached_lengths(state) + depth + 1
  kept = keep_path(scorer, tree_state, order, lengths)
  np.testing.assert_array_equal(scorer.cached_lengths(kept), [HISTORY + 4, HISTORY + 3])
  # The same paths decoded as chains.
  _, chain_state = score(scorer, state, jnp.asarray(_paths(tokens, nodes)))
  chain_state = scorer.rewind(chain_state, lengths)
  for b, valid in enumerate(np.asarray(lengths)):
    for got, want in zip(kept.cache.keys, chain_state.cache.keys, strict=True):
      got, want = _row(scorer, got, b), _row(scorer, want, b)
      np.testing.assert_allclose(got[..., :valid], want[..., :valid], atol=1e-5, rtol=0)
    for got, want in zip(kept.cache.values, chain_state.cache.values, strict=True):
      got, want = _row(scorer, got, b), _row(scorer, want, b)
      np.testing.assert_allclose(got[..., :valid, :], want[..., :valid, :], atol=1e-5, rtol=0)
  # And what comes next is scored the same.
  probe = jnp.asarray(_random(6, 2, 4))
  after_tree, _ = score(scorer, kept, probe)
  after_chain, _ = score(scorer, chain_state, probe)
  np.testing.assert_allclose(after_tree, after_chain, atol=1e-5, rtol=0)


def _row(scorer: T5Scorer, cache: jax.Array, b: int) -> np.ndarray:
  """Row b's `[heads, ...]` entries of a cache array of either layout."""
  if scorer.model.options.split_heads:
    return np.asarray(cache[b])
  heads = scorer.model.config.num_heads
  return np.asarray(cache[b * heads:(b + 1) * heads])


@pytest.mark.parametrize("parents, match", [
    (np.array([-1, 0, 2, 1]), "node 2 has parent"),
    (np.array([-1, 0, -2, 1]), "node 2 has parent"),
    (np.array([-1.0, 0.0, 1.0, 2.0]), "must be an int array"),
])
def test_parents_out_of_order_are_refused(parents, match):
  scorer, context = _scorer("test-v1_0")
  state = scorer.init_state(context, 8)
  with pytest.raises(ValueError, match=match):
    scorer.score_tree(state, jnp.asarray(_random(7, 2, 4)), parents)


MAX_LEN = 12
LOOP_INPUTS = np.array([[5, 6, 7, 8, 9, 5, 6], [11, 12, 0, 0, 0, 0, 0],
                        [40, 41, 40, 0, 0, 0, 0]], np.int32)


@functools.cache
def _loop_setup():
  """The target (a T5.1.1), its greedy output with an EOS that ends rows at different
  lengths, and the proposers: T5 drafts with their own encoder or over the target's."""
  model, params = make_model("test-v1_1")
  target = T5Scorer(model, model.prepare(params))
  inputs = jnp.asarray(LOOP_INPUTS)
  greedy, eos, want = greedy_with_mid_run_eos(target, inputs, MAX_LEN)
  store = proposers.Datastore.from_sequences(list(np.asarray(greedy.sequences)[1:]),
                                             split="train", depth=3)
  shared = SharedEncoderModel(model.config.replace(num_decoder_layers=1), model.config.d_model)
  return target, inputs, eos, want, {
      # A T5 draft with its own encoder that agrees often, not always (the target's
      # weights perturbed): its top-2 branches of 2.
      "branches": proposers.DraftBranches(
          make_draft(model, jax.tree.map(lambda x: x * 1.05, params)), k=2, depth=2),
      # A random draft over the target's encoder (it rarely agrees): its top-2 branches of
      # 2, then the datastore's chain (the target's own outputs for rows 1 and 2), which
      # the walk accepts off the tree's first branch.
      "merged": proposers.Merged((proposers.DraftBranches(
          make_draft(shared, shared.init_params(jax.random.PRNGKey(5))), k=2, depth=2),
          store)),
  }


@pytest.mark.parametrize("name", ["branches", "merged"])
def test_greedy_tree_loop_gives_the_targets_tokens(name):
  target, inputs, eos, want, proposer = _loop_setup()
  out = tree_speculative_decode(target, proposer[name], inputs, jax.random.PRNGKey(1),
                                max_decode_len=MAX_LEN, warp=Warp(), eos_id=eos)
  np.testing.assert_array_equal(out.sequences, want.sequences)
  np.testing.assert_array_equal(out.lengths, want.lengths)
  np.testing.assert_array_equal(out.stats.tokens, want.lengths)
  assert np.sum(out.stats.accepted) > 0  # The tree's candidates make the output.
  # Paths off the tree's first branch are kept (`keep_path` moves them to the front).
  assert np.sum(np.asarray(out.stats.rank_accepted)[:, 0, 1:]) > 0
