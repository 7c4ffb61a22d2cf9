"""Numpy batches for training: seqio Tasks through the T5X-style EncDecFeatureConverter.

Evaluation text pairs, which need no TensorFlow, are `corpora.read_text_pairs`.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import seqio

from specdec_jax.data import tasks

BATCH_FEATURES = (
    "encoder_input_tokens", "decoder_target_tokens", "decoder_input_tokens",
    "decoder_loss_weights")


def get_batches(name: str, split: str, batch_size: int, inputs_length: int,
                targets_length: int, *, data_dir: str | None = None, shuffle: bool = True,
                seed: int = 0, num_epochs: int | None = None) -> Iterator[dict[str, np.ndarray]]:
  """Fixed-shape batches of a Task or Mixture, as numpy arrays.

  Args:
    name: "specdec_ende", "specdec_mansum" or "specdec_mix".
    split: "train", "validation" or "test".
    batch_size: rows per batch (the last, partial batch is dropped).
    inputs_length: encoder length; longer inputs are cut (keeping EOS), shorter padded with 0.
    targets_length: decoder length, likewise.
    data_dir: a prepared data directory; default `layout.default_data_dir()`.
    shuffle: shuffle examples (deterministically, given `seed`).
    seed: shuffle and mixture-sampling seed.
    num_epochs: passes over the data; None repeats forever.

  Yields:
    {"encoder_input_tokens": [batch, inputs_length] int32,
     "decoder_target_tokens": [batch, targets_length] int32,
     "decoder_input_tokens": [batch, targets_length] int32 (targets shifted right, 0 first),
     "decoder_loss_weights": [batch, targets_length] int32 (1 on real target tokens)}.
  """
  tasks.register_tasks(data_dir)
  lengths = {"inputs": inputs_length, "targets": targets_length}
  dataset = seqio.get_mixture_or_task(name).get_dataset(
      sequence_length=lengths, split=split, shuffle=shuffle, seed=seed,
      num_epochs=num_epochs, use_cached=False)
  dataset = seqio.EncDecFeatureConverter(pack=False)(dataset, lengths)
  dataset = dataset.batch(batch_size, drop_remainder=True)
  for batch in dataset.as_numpy_iterator():
    yield {k: batch[k] for k in BATCH_FEATURES}

