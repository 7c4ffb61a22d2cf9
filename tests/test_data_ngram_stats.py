"""Tests of unigram/bigram counting, its file format and its TF-free import."""

import subprocess
import sys

import numpy as np
import pytest

from specdec_jax.data import ngram_stats


def test_counts_on_a_toy_sequence():
  stats = ngram_stats.count_ngrams([[5, 6, 5], [6]], vocab_size=8)
  np.testing.assert_array_equal(stats.unigram, [0, 2, 0, 0, 0, 2, 2, 0])
  keys = zip(stats.bigram_prev.tolist(), stats.bigram_next.tolist(), strict=True)
  pairs = dict(zip(keys, stats.bigram_count.tolist(), strict=True))
  assert pairs == {(0, 5): 1, (5, 6): 1, (6, 5): 1, (5, 1): 1, (0, 6): 1, (6, 1): 1}


def test_out_of_range_ids_are_refused():
  with pytest.raises(ValueError, match="vocab_size=4"):
    ngram_stats.count_ngrams([[7]], vocab_size=4)


def test_save_load_round_trip_is_byte_identical(tmp_path):
  stats = ngram_stats.count_ngrams([[3, 4, 3, 4]], vocab_size=6)
  a, b = tmp_path / "a.npz", tmp_path / "b.npz"
  ngram_stats.save_ngram_stats(str(a), stats)
  ngram_stats.save_ngram_stats(str(b), ngram_stats.load_ngram_stats(path=str(a)))
  assert a.read_bytes() == b.read_bytes()
  loaded = ngram_stats.load_ngram_stats(path=str(a))
  np.testing.assert_array_equal(loaded.bigram_count, stats.bigram_count)


def test_committed_stats_load_without_tensorflow():
  code = ("import sys; from specdec_jax.data import ngram_stats as n;"
          "s = n.load_ngram_stats('ende');"
          "assert 'tensorflow' not in sys.modules and 'seqio' not in sys.modules;"
          "assert s.vocab_size == 8192 and s.unigram[1] > 0 and s.unigram[0] == 0;"
          "assert (s.bigram_prev == 0).any()")
  subprocess.run([sys.executable, "-c", code], check=True)
