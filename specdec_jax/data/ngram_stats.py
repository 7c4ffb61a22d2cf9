"""Unigram and bigram token counts of target sequences (numpy only: no TensorFlow).

The trivial drafts of the paper (Table 3: unigram and bigram models) sample from these.
Conventions: every target sequence is counted as it is decoded, i.e. followed by EOS, and
the first token's bigram context is the decoder start token (0, as in T5).
"""

from __future__ import annotations

import dataclasses
import io
import os
import zipfile
from collections.abc import Iterable, Sequence

import numpy as np

from specdec_jax import atomic_io
from specdec_jax.data import layout

DECODER_START_ID = 0
EOS_ID = 1


@dataclasses.dataclass(frozen=True)
class NgramStats:
  """Token counts over a vocabulary of size V.

  Attributes:
    unigram: [V] int64, count of each token id (EOS included, decoder start not).
    bigram_prev: [N] int32, context token of each observed bigram.
    bigram_next: [N] int32, following token; (prev, next) pairs are unique and sorted.
    bigram_count: [N] int64, how often `next` followed `prev`.
  """
  unigram: np.ndarray
  bigram_prev: np.ndarray
  bigram_next: np.ndarray
  bigram_count: np.ndarray

  @property
  def vocab_size(self) -> int:
    return int(self.unigram.shape[0])


def count_ngrams(sequences: Iterable[Sequence[int]], vocab_size: int, *,
                 decoder_start_id: int = DECODER_START_ID, eos_id: int = EOS_ID) -> NgramStats:
  """Counts unigrams and bigrams of token-id sequences (without EOS; it is appended here).

  Args:
    sequences: token ids of each target, e.g. [[37, 5, 9], [12]].
    vocab_size: V; every id must be in [0, V).
    decoder_start_id: context of each sequence's first token (it is not counted itself).
    eos_id: appended to every sequence.

  Returns:
    The counts. For [[5, 6]] with V=8: unigram[5] = unigram[6] = unigram[1] = 1 and bigrams
    (0, 5), (5, 6), (6, 1) once each.
  """
  unigram = np.zeros(vocab_size, dtype=np.int64)
  pair_keys = []
  for seq in sequences:
    ids = np.asarray(list(seq) + [eos_id], dtype=np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
      raise ValueError(f"token ids must lie in [0, vocab_size={vocab_size}): got "
                       f"{ids.min()}..{ids.max()}; pass the vocabulary's size as vocab_size.")
    np.add.at(unigram, ids, 1)
    prev = np.concatenate([[decoder_start_id], ids[:-1]])
    pair_keys.append(prev * vocab_size + ids)
  keys = np.concatenate(pair_keys) if pair_keys else np.zeros(0, dtype=np.int64)
  uniq, counts = np.unique(keys, return_counts=True)
  return NgramStats(
      unigram=unigram,
      bigram_prev=(uniq // vocab_size).astype(np.int32),
      bigram_next=(uniq % vocab_size).astype(np.int32),
      bigram_count=counts.astype(np.int64))


def save_ngram_stats(path: str, stats: NgramStats) -> None:
  """Writes `stats` as a byte-reproducible .npz (fixed zip timestamps), atomically."""
  buffer = io.BytesIO()
  with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as zf:
    for field in dataclasses.fields(stats):
      info = zipfile.ZipInfo(f"{field.name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
      info.compress_type = zipfile.ZIP_DEFLATED
      array = io.BytesIO()
      np.lib.format.write_array(array, getattr(stats, field.name), allow_pickle=False)
      zf.writestr(info, array.getvalue())
  atomic_io.atomic_write_bytes(path, buffer.getvalue())


def load_ngram_stats(corpus: str = "ende", path: str | None = None) -> NgramStats:
  """Loads the n-gram statistics of a corpus's training targets.

  Args:
    corpus: "ende" or "mansum"; selects the committed file under <repo>/assets/stats.
    path: an explicit .npz (e.g. <data_dir>/stats/ende_ngram.npz); overrides `corpus`.

  Returns:
    The statistics, over the vocabulary of `specdec_jax.data.vocab.get_vocabulary()`.
  """
  if path is None:
    if corpus not in layout.CORPORA:
      raise ValueError(f"corpus={corpus!r} is unknown: use one of {sorted(layout.CORPORA)}.")
    path = layout.stats_file(os.path.join(layout.ASSETS_DIR, "stats"), corpus)
  if not os.path.exists(path):
    raise FileNotFoundError(f"path={path!r} does not exist: run "
                            "`python -m specdec_jax.data.prepare` or pass an existing .npz.")
  with np.load(path, allow_pickle=False) as data:
    return NgramStats(**{f.name: data[f.name] for f in dataclasses.fields(NgramStats)})
