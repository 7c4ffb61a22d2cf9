"""The draft's output shortlist: token shares of the target's outputs, the most frequent."""

from __future__ import annotations

import numpy as np
import pytest

from specdec_jax.data.distill import DistilledData
from specdec_jax.distillation import head_tokens
from specdec_jax.draft_pricing.draft_heads import draft_name


def _data(outputs: list[list[list[int]]]) -> DistilledData:
  """Distillation data of the given outputs `[n][D][tokens]` (0-padded to one length)."""
  n, d = len(outputs), len(outputs[0])
  width = max(len(o) for row in outputs for o in row)
  padded = np.zeros((n, d, width), np.int32)
  lengths = np.zeros((n, d), np.int32)
  for i, row in enumerate(outputs):
    for j, o in enumerate(row):
      padded[i, j, :len(o)] = o
      lengths[i, j] = len(o)
  return DistilledData(ids=np.array([str(i) for i in range(n)]), index=np.arange(n),
                       inputs=np.zeros((n, 2), np.int32), input_lengths=np.ones(n, np.int32),
                       outputs=padded, output_lengths=lengths,
                       truncated=np.zeros((n, d), bool), temperatures=np.zeros(d, np.float32),
                       settings={})


def test_shares_count_every_decoding_up_to_its_length_and_weigh_corpora_alike():
  a = _data([[[5, 5, 1], [5, 1]], [[6, 1], [5, 6, 6, 1]]])  # 11 tokens: 5 x4, 6 x3, 1 x4.
  b = _data([[[7, 1]]])  # 2 tokens.
  shares = head_tokens.token_frequencies({"a": a, "b": b}, vocab_size=8)
  expected = np.zeros(8)
  expected[[1, 5, 6]] += np.array([4, 4, 3]) / 11 / 2
  expected[[1, 7]] += np.array([1, 1]) / 2 / 2
  np.testing.assert_allclose(shares, expected)
  assert shares[0] == 0  # Padding after EOS is not counted.


def test_token_ids_outside_the_vocabulary_raise():
  with pytest.raises(ValueError, match="vocabulary"):
    head_tokens.token_frequencies({"a": _data([[[9, 1]]])}, vocab_size=8)
  with pytest.raises(ValueError, match="at least one corpus"):
    head_tokens.token_frequencies({}, vocab_size=8)


def test_the_most_frequent_tokens_ascending_ties_to_the_lower_id_eos_always_kept():
  shares = np.array([0.0, 0.01, 0.3, 0.2, 0.2, 0.29, 0.0, 0.0])
  np.testing.assert_array_equal(head_tokens.frequent_tokens(shares, 3), [2, 3, 5])
  np.testing.assert_array_equal(head_tokens.frequent_tokens(shares, 3, always=[1]), [1, 2, 5])
  np.testing.assert_array_equal(head_tokens.frequent_tokens(shares, 4, always=[1, 2]),
                                [1, 2, 3, 5])
  assert head_tokens.frequent_tokens(shares, 8).tolist() == list(range(8))
  assert head_tokens.coverage(shares, np.array([2, 5])) == pytest.approx(0.59 / 1.0)


@pytest.mark.parametrize("size,always", [(9, ()), (1, (1, 2)), (3, (8,))])
def test_bad_sizes_raise(size, always):
  with pytest.raises(ValueError, match="size|always"):
    head_tokens.frequent_tokens(np.ones(8), size, always)


def test_a_runs_best_export_is_named_after_the_run():
  assert draft_name("checkpoints/shapes/d128_l2/best") == "d128_l2"
  assert draft_name("assets/models/draft_shared_enc_signals/") == "draft_shared_enc_signals"
