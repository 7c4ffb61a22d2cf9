"""A draft's output shortlist: the tokens the target emits most often.

A draft whose output layer scores only a shortlist of the vocabulary (`make_draft`'s
`head_tokens`) streams that fraction of its logits matrix per proposal; speculative
sampling stays exact, since a token the draft cannot propose is still reached through
the target's residual distribution, and acceptance loses at most the target's mass
outside the shortlist. The shortlist is ranked by how often the target emits each
token in its stored distillation outputs (`data.distill`), the frequency-ranked head of
FR-Spec (Zhao et al., 2025).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

from specdec_jax.data.distill import DistilledData


def token_frequencies(data: Mapping[str, DistilledData], vocab_size: int) -> np.ndarray:
  """Each token's share of the target's output tokens, float64 `[vocab_size]`.

  Every decoding of every example counts, EOS included (padding after it does not).
  Corpora weigh the same whatever their size: the shares are per corpus, then averaged.

  Raises:
    ValueError: no corpus, a corpus without output tokens, or a token id outside
      `[0, vocab_size)`.
  """
  if not data:
    raise ValueError("token_frequencies needs at least one corpus's distillation data.")
  shares = []
  for corpus, d in data.items():
    positions = np.arange(d.outputs.shape[-1])
    tokens = d.outputs[positions < d.output_lengths[..., None]]
    if tokens.size == 0:
      raise ValueError(f"corpus {corpus!r} has no output tokens to count.")
    if tokens.min() < 0 or tokens.max() >= vocab_size:
      raise ValueError(f"corpus {corpus!r} has token ids outside [0, {vocab_size}): "
                       "its data was made with another vocabulary.")
    shares.append(np.bincount(tokens, minlength=vocab_size) / tokens.size)
  return np.mean(shares, axis=0)


def frequent_tokens(frequencies: np.ndarray, size: int, always: Iterable[int] = ()) -> np.ndarray:
  """The `size` most frequent token ids, ascending, int32 `[size]`.

  Ties go to the lower id. Ids in `always` (EOS, so that a draft can end its
  proposal) are kept whatever their frequency, in place of the least frequent others.

  Raises:
    ValueError: `size` outside `[len(always), vocab]`, or an id of `always` outside the
      vocabulary.
  """
  vocab = frequencies.shape[0]
  always = sorted(set(int(i) for i in always))
  if any(i < 0 or i >= vocab for i in always):
    raise ValueError(f"always={always} must hold token ids in [0, {vocab}).")
  if not len(always) <= size <= vocab:
    raise ValueError(f"size must be in [{len(always)}, {vocab}] (the vocabulary), got {size}.")
  order = np.argsort(-frequencies, kind="stable")
  rest = order[~np.isin(order, always)][:size - len(always)]
  return np.sort(np.concatenate([rest, always]).astype(np.int32))


def coverage(frequencies: np.ndarray, tokens: np.ndarray) -> float:
  """The share of the target's output tokens that `tokens` cover (0..1)."""
  return float(frequencies[tokens].sum() / frequencies.sum())
