"""Length-bucketed training batches with a deterministic, resumable position.

The pipeline pads every row to the full `inputs_length` / `targets_length`, but most
En-De rows are short (median 20 input and 16 target tokens of 128 / 64), so a padded
batch is mostly padding. `bucketed_batches` takes a window of `window` pipeline
batches, sorts their rows by length, cuts them back into `window` batches, trims each
to the smallest bucket length that holds its longest row, and emits them in a seeded
random order. Few distinct shapes (so few compilations), far less padding.

Resuming at step s is deterministic: the pipeline is seeded, so skipping
`(s // window) * window` pipeline batches and dropping the first `s % window`
batches of the next window reproduces the batch the interrupted run would have used.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import numpy as np

Batch = dict[str, np.ndarray]
INPUT_KEYS = ("encoder_input_tokens",)
TARGET_KEYS = ("decoder_target_tokens", "decoder_input_tokens", "decoder_loss_weights")


def bucket_lengths(full_length: int, smallest: int = 32) -> tuple[int, ...]:
  """`smallest, 2*smallest, ...` below `full_length`, then `full_length` itself."""
  if full_length < 1 or smallest < 1:
    raise ValueError(f"lengths must be >= 1, got full_length={full_length}, "
                     f"smallest={smallest}.")
  out = []
  length = smallest
  while length < full_length:
    out.append(length)
    length *= 2
  return (*out, full_length)


def _fit(length: int, buckets: Sequence[int]) -> int:
  return next(b for b in buckets if b >= length)


def _row_lengths(tokens: np.ndarray) -> np.ndarray:
  """Index after the last non-pad token of each row of `[n, L]`."""
  nonpad = tokens != 0
  return np.where(nonpad.any(axis=1), tokens.shape[1] - np.argmax(nonpad[:, ::-1], axis=1), 0)


def bucketed_batches(source: Iterable[Batch], *, window: int, seed: int,
                     start_batch: int = 0) -> Iterator[Batch]:
  """Re-batches `source` by length; see the module docstring.

  Args:
    source: full-length pipeline batches (the same dict layout is emitted), seeded so
      that it is the same sequence on every call.
    window: pipeline batches sorted together.
    seed: seeds the order of the batches within each window.
    start_batch: batches to skip (the number a resumed run has already consumed).

  Yields:
    Batches with the rows of `source`, `encoder_input_tokens [b, Li]` and the decoder
    features `[b, Lt]`, `Li` and `Lt` bucket lengths.
  """
  if window < 1 or start_batch < 0:
    raise ValueError(f"need window >= 1 and start_batch >= 0, got {window}, {start_batch}.")
  it = iter(source)
  first_window, drop = divmod(start_batch, window)
  for _ in range(first_window * window):
    next(it)
  index = first_window
  while True:
    chunk = [b for _, b in zip(range(window), it, strict=False)]
    if len(chunk) < window:
      return
    rows = {k: np.concatenate([b[k] for b in chunk]) for k in chunk[0]}
    in_len = _row_lengths(rows[INPUT_KEYS[0]])
    tgt_len = _row_lengths(rows["decoder_loss_weights"])
    order = np.lexsort((tgt_len, in_len))
    in_buckets = bucket_lengths(rows[INPUT_KEYS[0]].shape[1])
    tgt_buckets = bucket_lengths(rows[TARGET_KEYS[0]].shape[1])
    batches = []
    for idx in np.array_split(order, window):
      li, lt = _fit(in_len[idx].max(), in_buckets), _fit(tgt_len[idx].max(), tgt_buckets)
      batches.append({k: v[idx][:, :li] if k in INPUT_KEYS else v[idx][:, :lt]
                      for k, v in rows.items()})
    perm = np.random.default_rng([seed, index]).permutation(window)
    for j in perm[drop:]:
      yield batches[j]
    drop = 0
    index += 1
