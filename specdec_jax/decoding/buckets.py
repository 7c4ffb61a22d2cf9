"""Encoder inputs cut to a length bucket, as T5X / seqio feed them.

Inputs arrive 0-padded to a fixed length (128 in our experiments) while most
prompts are far shorter (En-De test prompts: 32 tokens on average). The
encoder's cost grows with the padded length, so the decoders cut the padding
to the smallest bucket that holds every row's tokens: a power of two from
`MIN_BUCKET` up, never longer than the inputs were. One program is compiled
per bucket (a handful), instead of one per length. A T5 encoder's outputs at
the real tokens do not depend on the padding after them (attention masks it and
the position bias is relative), so cutting it changes no result beyond float
rounding.
"""

from __future__ import annotations

from typing import TypeVar

import jax
import numpy as np

MIN_BUCKET = 16

ArrayT = TypeVar("ArrayT", np.ndarray, jax.Array)


def bucket_length(length: int, input_len: int) -> int:
  """The bucket of a longest row of `length` tokens in inputs of `input_len` positions.

  Args:
    length: tokens before the padding in the longest row (>= 0).
    input_len: the inputs' padded length.

  Returns:
    The smallest power of two >= max(length, MIN_BUCKET), or `input_len` if that
    is smaller.
  """
  bucket = MIN_BUCKET
  while bucket < length:
    bucket *= 2
  return min(bucket, input_len)


def to_bucket(inputs: ArrayT, pad_id: int = 0) -> ArrayT:
  """`inputs [batch, input_len]` cut to `bucket_length` of its longest row.

  A row's length runs to its last token that is not `pad_id`. Inputs whose values
  this process cannot read are returned as they are: traced ones (under `jit`), and
  a global array with rows on other processes (cut the host batch before sharding
  it, as `experiment.runner` does).
  """
  if (isinstance(inputs, jax.core.Tracer) or inputs.ndim != 2
      or (isinstance(inputs, jax.Array) and not inputs.is_fully_addressable)):
    return inputs
  real = np.asarray(inputs) != pad_id  # [batch, input_len]
  lengths = np.where(real.any(axis=1), real.shape[1] - np.argmax(real[:, ::-1], axis=1), 0)
  return inputs[:, :bucket_length(int(lengths.max(initial=0)), inputs.shape[1])]
