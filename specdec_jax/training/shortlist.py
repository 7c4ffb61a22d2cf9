"""Signals batches restated over a draft's shortlist (numpy, in the input pipeline).

A draft whose output layer scores only `head` tokens (`models.llama.student`) gives
every other token probability 0. Its training compares it with the target on the
coarse-grained outcomes `sparse_distill` uses, restated in the shortlist's index
space: the target's top-k ids that are in the shortlist keep their log-probabilities
and move to their shortlist index; the ones outside it move to index `head` (a column
the loss appends to the student's logits, at probability 0) with log-probability
`sparse_distill.LOG_FLOOR`, and their mass joins the target's rest. So the loss asks
the draft for the target's distribution on the shortlist, and for the target's
remaining mass on the shortlist tokens outside its top-k; the mass it cannot place
(outside the shortlist) is what acceptance loses whatever the draft does.
"""

from __future__ import annotations

import numpy as np

from specdec_jax.training.sparse_distill import LOG_FLOOR

Batch = dict[str, np.ndarray]


def shortlist_index(head_tokens: np.ndarray, vocab_size: int) -> np.ndarray:
  """int32 `[vocab_size]`: each token's position in `head_tokens`, or `len(head_tokens)`.

  Raises:
    ValueError: `head_tokens` is not 1-D, holds duplicates or ids outside the vocabulary.
  """
  head = np.asarray(head_tokens)
  if head.ndim != 1 or len(np.unique(head)) != len(head) or head.min() < 0 or (
      head.max() >= vocab_size):
    raise ValueError(f"head_tokens must be distinct token ids in [0, {vocab_size}), 1-D.")
  index = np.full(vocab_size, len(head), np.int32)
  index[head] = np.arange(len(head), dtype=np.int32)
  return index


def to_shortlist(batch: Batch, index: np.ndarray) -> Batch:
  """A signals batch (`signals_source.SignalsBatches.batch`) over the shortlist.

  Args:
    batch: `teacher_topk_ids` `[b, T, k]`, `teacher_topk_logprobs` `[b, T, k]`,
      `teacher_rest_logprob` `[b, T]`, `decoder_target_tokens` `[b, T]`, and the rest.
    index: `shortlist_index`'s map; `index.max()` is the head size.

  Returns:
    The batch with those four restated: ids and targets as shortlist positions (the
    head size for a token outside it), outside ids at `LOG_FLOOR`, their probability
    added to the rest (float32). Other fields are passed on as they are.
  """
  head = int(index.max())
  ids = index[batch["teacher_topk_ids"]]                                  # [b, T, k]
  outside = ids == head
  logprobs = batch["teacher_topk_logprobs"].astype(np.float32)
  moved = np.where(outside, np.exp(logprobs), 0.0).sum(-1)                # [b, T]
  rest = np.exp(batch["teacher_rest_logprob"].astype(np.float64)) + moved
  return {**batch, "teacher_topk_ids": ids,
          "teacher_topk_logprobs": np.where(outside, LOG_FLOOR, logprobs).astype(np.float32),
          "teacher_rest_logprob": np.log(np.maximum(rest, np.exp(LOG_FLOOR))).astype(np.float32),
          "decoder_target_tokens": index[batch["decoder_target_tokens"]]}
