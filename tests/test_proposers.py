"""Proposers on synthetic token arrays: what each offers, and the merged tree's shape."""

import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.decoding import proposers, trees
from specdec_jax.decoding.sampling import Warp


def _text(rows: list[list[int]], width: int = 12) -> tuple[jnp.ndarray, jnp.ndarray]:
  """A token buffer (start token 1 at index 0) and m = tokens generated per row."""
  buffer = np.zeros((len(rows), width), np.int32)
  for b, row in enumerate(rows):
    buffer[b, 0] = 1
    buffer[b, 1:1 + len(row)] = row
  return jnp.asarray(buffer), jnp.asarray([len(r) for r in rows], jnp.int32)


def test_prompt_lookup_copies_after_the_longest_match():
  prompts = jnp.asarray([[7, 8, 9, 4, 8, 9, 5, 6, 0], [3, 4, 5, 6, 0, 0, 0, 0, 0],
                         [3, 4, 5, 6, 0, 0, 0, 0, 0]])
  tokens, lengths = _text([[2, 8, 9], [20, 21], [5]])
  _, out = proposers.PromptLookup(depth=3).propose(prompts, tokens, lengths, Warp())
  # Row 0: "8 9" first matches at 1 -> 4 8 9; row 1: no match; row 2: "5" -> 6, then padding.
  np.testing.assert_array_equal(out.tokens[0], [4, 8, 9])
  np.testing.assert_array_equal(out.valid, [[True] * 3, [False] * 3, [True, False, False]])
  assert out.tokens[2, 0] == 6


def test_datastore_proposes_what_followed_in_training_outputs():
  outputs = [np.array([10, 11, 12, 13, 14, 0, 0]), np.array([20, 11, 12, 30, 31])]
  store = proposers.Datastore.from_sequences(outputs, split="train", depth=2, max_ngram=2)
  tokens, lengths = _text([[5, 10, 11], [20, 11, 12], [99], [13]])
  _, out = store.propose(None, tokens, lengths, Warp())
  # "10 11" -> 12 13; "11 12" first seen in the first output -> 13 14; 99: nothing;
  # "13" -> 14 then the end of that output.
  np.testing.assert_array_equal(out.tokens[:2], [[12, 13], [13, 14]])
  np.testing.assert_array_equal(out.valid, [[True, True], [True, True], [False, False],
                                            [True, False]])


@pytest.mark.parametrize("split", ["test", "validation", "dev"])
def test_datastore_refuses_held_out_outputs(split):
  with pytest.raises(ValueError, match="training split only"):
    proposers.Datastore.from_sequences([np.array([1, 2, 3])], split=split, depth=2)


def test_merged_tree_puts_each_subtree_under_the_root():
  store = proposers.Datastore.from_sequences([np.array([1, 2, 3])], split="train", depth=2)
  merged = proposers.Merged((proposers.PromptLookup(depth=3), store))
  parents = proposers.tree_parents(merged)
  np.testing.assert_array_equal(parents, [-1, 0, 1, 2, 0, 4])
  trees.check_parents(parents)
  prompts = jnp.asarray([[4, 1, 2, 6, 0]])
  tokens, lengths = _text([[1, 2]])
  _, out = merged.propose(merged.init_state(prompts, 8), tokens, lengths, Warp())
  np.testing.assert_array_equal(out.tokens, [[6, 0, 0, 3, 0]])
  np.testing.assert_array_equal(out.valid, [[True, False, False, True, False]])
