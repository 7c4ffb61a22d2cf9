"""A scorer scores a token tree in one pass (`Scorer.score_tree`, `Scorer.keep_path`).

Each node's logits are those of its root-to-node path scored as a chain; the
chain (parents i - 1) is the chunk scoring of before; after `keep_path` the
cache is the one the accepted path leaves when decoded as a chain, with both
cache layouts (batch and heads merged or apart).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.decoding import trees
from specdec_jax.models.llama import LlamaModel, LlamaScorer
from specdec_jax.models.llama.model import TEST_CONFIG
from specdec_jax.models.llama.scorer import pad_prompts
from specdec_jax.models.options import DecodeOptions

PROMPTS = [[5, 6, 7, 8, 9], [11, 12]]
# 0 -> 1 -> 4 -> 6, 0 -> 2 -> 5, 0 -> 3, 1 -> 7
PARENTS = np.array([-1, 0, 0, 0, 1, 2, 4, 1])


@functools.cache
def _scorer(split_heads: bool = False) -> LlamaScorer:
  options = DecodeOptions.for_backend().replace(split_heads=split_heads)
  model = LlamaModel(TEST_CONFIG, options=options)
  params = model.init_params(jax.random.PRNGKey(0))
  return LlamaScorer(model, model.prepare(params))


def _start(scorer: LlamaScorer, history: np.ndarray):
  """A state after the prompts and `history [batch, h]` generated tokens (h >= 1)."""
  state = scorer.init_state(scorer.encode(jnp.asarray(pad_prompts(PROMPTS))), 24)
  _, state = jax.jit(scorer.score)(state, jnp.asarray(history))
  return state


def _path(tokens: np.ndarray, node: int) -> list[int]:
  path = []
  while node >= 0:
    path.append(int(tokens[node]))
    node = int(PARENTS[node])
  return path[::-1]


def test_tree_logits_are_each_paths_chain_logits():
  scorer = _scorer()
  rng = np.random.default_rng(0)
  history = rng.integers(1, 97, (2, 3)).astype(np.int32)
  tokens = rng.integers(1, 97, (2, len(PARENTS))).astype(np.int32)
  state = _start(scorer, history)
  logits, after = jax.jit(scorer.score_tree)(state, jnp.asarray(tokens), PARENTS)
  np.testing.assert_array_equal(scorer.cached_lengths(after), [3 + len(PARENTS)] * 2)
  chain = jax.jit(scorer.score)
  for node in range(len(PARENTS)):
    path = np.array([_path(tokens[b], node) for b in range(2)], np.int32)
    want, _ = chain(state, jnp.asarray(path))
    np.testing.assert_allclose(logits[:, node], want[:, -1], atol=1e-5, rtol=0)


def test_a_chain_tree_is_the_chunk():
  scorer = _scorer()
  rng = np.random.default_rng(1)
  state = _start(scorer, rng.integers(1, 97, (2, 2)).astype(np.int32))
  tokens = jnp.asarray(rng.integers(1, 97, (2, 5)).astype(np.int32))
  as_tree, tree_state = jax.jit(scorer.score_tree)(state, tokens, trees.chain(4))
  model = scorer.model
  # The model's chunk call without a tree: the causal mask and positions of before.
  as_chunk, cache = model.decode_features(state.context.weights, state.cache, tokens)[::2]
  np.testing.assert_array_equal(as_tree, as_chunk)
  for got, want in zip(tree_state.cache.keys + tree_state.cache.values,
                       cache.keys + cache.values, strict=True):
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("split_heads", [False, True])
def test_cache_after_keep_path_is_the_decoded_paths(split_heads):
  scorer = _scorer(split_heads)
  rng = np.random.default_rng(2)
  history = rng.integers(1, 97, (2, 3)).astype(np.int32)
  tokens = rng.integers(1, 97, (2, len(PARENTS))).astype(np.int32)
  state = _start(scorer, history)
  _, tree_state = jax.jit(scorer.score_tree)(state, jnp.asarray(tokens), PARENTS)
  node = jnp.array([6, 5])  # Depth 3 in row 0, 2 in row 1.
  order, depth = trees.path_order(PARENTS, node)
  m = scorer.cached_lengths(state)
  kept = jax.jit(scorer.keep_path)(tree_state, order, m + depth + 1)
  np.testing.assert_array_equal(scorer.cached_lengths(kept), [7, 6])
  # The same paths decoded as chains, row by row (they differ in length).
  probe = rng.integers(1, 97, (2, 2)).astype(np.int32)
  for b in range(2):
    path = np.array(_path(tokens[b], int(node[b])), np.int32)
    chain_state = _start(scorer, history)
    _, chain_state = jax.jit(scorer.score)(chain_state, jnp.asarray(np.stack([path, path])))
    valid = int(kept.cache.lengths[b])
    assert valid == int(chain_state.cache.lengths[b])
    for got, want in zip(kept.cache.keys, chain_state.cache.keys, strict=True):
      rows = _row(got, b, split_heads), _row(want, b, split_heads)
      np.testing.assert_allclose(rows[0][..., :valid], rows[1][..., :valid], atol=1e-5)
    for got, want in zip(kept.cache.values, chain_state.cache.values, strict=True):
      rows = _row(got, b, split_heads), _row(want, b, split_heads)
      np.testing.assert_allclose(rows[0][..., :valid, :], rows[1][..., :valid, :], atol=1e-5)
    # And what comes next is scored the same.
    after_tree, _ = jax.jit(scorer.score)(kept, jnp.asarray(probe))
    after_chain, _ = jax.jit(scorer.score)(chain_state, jnp.asarray(probe))
    np.testing.assert_allclose(after_tree[b], after_chain[b], atol=1e-5, rtol=0)


def _row(cache: jax.Array, b: int, split_heads: bool) -> np.ndarray:
  """Row b's `[heads, ...]` entries of a cache array of either layout."""
  heads = TEST_CONFIG.num_kv_heads
  return np.asarray(cache[b] if split_heads else cache[b * heads:(b + 1) * heads])
