"""The tree loop on a tiny random Llama: greedy tokens equal the target's greedy decoding.

Trees from each proposer alone and from all three merged (prompt lookup, a
datastore over the target's own outputs, the draft's top-k branches), with an
EOS that ends rows at different lengths; the chain (one branch) is a tree too.
At T > 0 exactness is `tree_acceptance`'s (tested there); here the sampled loop
runs, is a function of its key, and its counters add up.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.decoding import baseline, proposers
from specdec_jax.decoding.sampling import Warp
from specdec_jax.decoding.tree_speculative import tree_speculative_decode
from specdec_jax.models.llama import TEST_CONFIG, LayerSkipDraft, LlamaModel, LlamaScorer
from specdec_jax.models.llama.scorer import pad_prompts

MAX_LEN = 14
PROMPTS = [[5, 6, 7, 8, 9, 5, 6], [11, 12], [40, 41, 40]]


@functools.cache
def _setup():
  model = LlamaModel(TEST_CONFIG)
  params = jax.tree_util.tree_map_with_path(
      lambda path, x: x * (2.0 if "kernel" in jax.tree_util.keystr(path) else 1.0),
      model.init_params(jax.random.PRNGKey(0)))
  weights = model.prepare(params)
  target = LlamaScorer(model, weights)
  prompts = jnp.asarray(pad_prompts(PROMPTS))
  greedy = baseline.decode(target, prompts, jax.random.PRNGKey(0), max_decode_len=MAX_LEN,
                           warp=Warp(), eos_id=-1)
  # EOS: a token row 0 first emits mid-run, so rows end at different lengths.
  row = [int(t) for t in greedy.sequences[0]]
  eos = next(t for i, t in enumerate(row) if i >= 3 and t not in row[:i])
  want = baseline.decode(target, prompts, jax.random.PRNGKey(0), max_decode_len=MAX_LEN,
                         warp=Warp(), eos_id=eos)
  assert len(set(np.asarray(want.lengths).tolist())) > 1
  # The datastore holds the target's outputs on other "training" prompts: here its own.
  store = proposers.Datastore.from_sequences(list(np.asarray(greedy.sequences)[1:]),
                                             split="train", depth=3)
  return model, weights, target, prompts, eos, want, store


def _proposer(name: str):
  model, weights, *_, store = _setup()
  draft = LayerSkipDraft(model, weights, 1)
  return {
      "lookup": proposers.PromptLookup(depth=3),
      "datastore": store,
      "chain": proposers.DraftBranches(draft, k=1, depth=3),
      "merged": proposers.Merged((proposers.PromptLookup(depth=2), store,
                                  proposers.DraftBranches(draft, k=2, depth=2))),
  }[name]


@pytest.mark.parametrize("name", ["chain", "merged"])
def test_greedy_tokens_are_the_targets(name):
  _, _, target, prompts, eos, want, _ = _setup()
  out = tree_speculative_decode(target, _proposer(name), prompts, jax.random.PRNGKey(1),
                                max_decode_len=MAX_LEN, warp=Warp(), eos_id=eos)
  np.testing.assert_array_equal(out.sequences, want.sequences)
  np.testing.assert_array_equal(out.lengths, want.lengths)
  np.testing.assert_array_equal(out.stats.tokens, want.lengths)
  if name == "merged":  # Rows 1 and 2 are in the datastore: several tokens per call.
    assert np.all(out.stats.tokens_per_iteration()[1:] > 2)


def test_sampled_loop_is_a_function_of_its_key():
  _, _, target, prompts, eos, _, _ = _setup()
  run = functools.partial(tree_speculative_decode, target, _proposer("merged"), prompts,
                          max_decode_len=MAX_LEN, warp=Warp(1.0, top_k=20), eos_id=eos)
  a, b = run(jax.random.PRNGKey(3)), run(jax.random.PRNGKey(3))
  np.testing.assert_array_equal(a.sequences, b.sequences)
  np.testing.assert_array_equal(a.stats.tokens, a.lengths)
  np.testing.assert_array_equal(a.stats.accepted_histogram.sum(1), a.stats.iterations)
  assert np.all(a.stats.accepted <= a.lengths)
