"""Encoder inputs cut to length buckets (`decoding.buckets`) and the decoders that cut them."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import make_model

from specdec_jax.decoding import baseline, buckets
from specdec_jax.decoding.sampling import Warp
from specdec_jax.models.t5 import T5Scorer, temperature_sample


@pytest.mark.parametrize("length,input_len,bucket", [
    (0, 128, 16), (1, 128, 16), (16, 128, 16), (17, 128, 32), (33, 128, 64), (64, 128, 64),
    (65, 128, 128), (128, 128, 128), (20, 24, 24), (300, 512, 512), (129, 512, 256)])
def test_bucket_length(length, input_len, bucket):
  assert buckets.bucket_length(length, input_len) == bucket


def test_the_longest_row_sets_the_bucket_and_padding_rows_count_as_empty():
  x = np.zeros((3, 128), np.int32)
  x[0, :20] = 5
  assert buckets.to_bucket(x).shape == (3, 32)
  x[2, 40] = 7  # A token after padding still counts: the row runs to its last token.
  assert buckets.to_bucket(x).shape == (3, 64)
  assert buckets.to_bucket(np.zeros((2, 128), np.int32)).shape == (2, 16)
  np.testing.assert_array_equal(buckets.to_bucket(jnp.asarray(x)), x[:, :64])


def test_traced_inputs_keep_their_length():
  x = jnp.zeros((1, 128), jnp.int32).at[0, :5].set(3)
  assert jax.jit(lambda v: buckets.to_bucket(v))(x).shape == (1, 128)


def test_cutting_the_padding_leaves_the_encoder_and_the_tokens_unchanged():
  model, params = make_model("test-v1_1")
  x = np.zeros((2, 64), np.int32)
  x[0, :9], x[1, :5] = np.arange(3, 12), np.arange(20, 25)
  cut = buckets.to_bucket(x)
  assert cut.shape == (2, 16)
  prepared = model.prepare(params)
  full, short = model.encode(prepared, jnp.asarray(x)), model.encode(prepared, jnp.asarray(cut))
  # Equal up to float32 rounding: XLA may sum in another order at another length (a
  # 2e-6 difference on one of 1,024 values on an AVX-512 Xeon).
  for a, b in zip(full.cross_keys, short.cross_keys, strict=True):
    np.testing.assert_allclose(a[..., :16], b, rtol=1e-5, atol=1e-5)
  # The loop on the whole padding (no cut) and temperature_sample (cut): the same tokens.
  padded = baseline.decode(T5Scorer(model, prepared), jnp.asarray(x), jax.random.PRNGKey(0),
                           max_decode_len=12, warp=Warp(), eos_id=model.config.eos_token_id)
  np.testing.assert_array_equal(
      padded.sequences, temperature_sample(model, params, jnp.asarray(x), max_decode_len=12)
      .sequences)
