"""The T5X-style baseline `temperature_sample`: greedy exactness, EOS handling, sampling law."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import make_model
from scipy import stats

from specdec_jax.decoding import baseline, sampling
from specdec_jax.models.t5 import temperature_sample

MAX_LEN = 16
VOCAB = 97


def _inputs(batch: int = 3, length: int = 9, seed: int = 4) -> jax.Array:
  """Random encoder tokens in [2, VOCAB); the last row is 0-padded after its first half."""
  inputs = np.random.RandomState(seed).randint(2, VOCAB, size=(batch, length))
  inputs[-1, length // 2:] = 0
  return jnp.asarray(inputs, jnp.int32)


def _naive_greedy(model, params, inputs: jax.Array, max_len: int,
                  eos_id: int) -> tuple[np.ndarray, np.ndarray]:
  """Greedy decoding without a cache: full teacher-forced logits recomputed every step.

  The decoder input has a fixed width (positions beyond the current step are
  ignored by causal attention), so this compiles `model.logits` once.
  """
  batch = inputs.shape[0]
  decoder_inputs = np.zeros((batch, max_len), np.int32)  # Column 0: the start token (0).
  sequences = np.zeros((batch, max_len), np.int32)
  lengths = np.full((batch,), max_len, np.int32)
  done = np.zeros((batch,), bool)
  for t in range(max_len):
    logits = np.asarray(model.logits(params, inputs, jnp.asarray(decoder_inputs)))
    token = logits[:, t].argmax(-1)
    for b in np.flatnonzero(~done):
      sequences[b, t] = token[b]
      if token[b] == eos_id:
        done[b], lengths[b] = True, t + 1
    if t + 1 < max_len:
      decoder_inputs[:, t + 1] = sequences[:, t]
  return sequences, lengths


def _mid_sequence_eos(sequences: np.ndarray) -> int:
  """A token that some row first emits at step 3..10 and some other row never emits."""
  for step in range(3, 11):
    for row, tokens in enumerate(sequences):
      token = int(tokens[step])
      never = ~(np.delete(sequences, row, axis=0) == token).any(axis=1)
      if token != 0 and token not in tokens[:step] and never.any():
        return token
  raise AssertionError(f"no token qualifies as a mid-sequence EOS in {sequences}")


@pytest.fixture(scope="module", params=["test-v1_0", "test-v1_1"])
def greedy_case(request):
  """(model, params, inputs, eos_id, naive sequences, naive lengths) per family."""
  model, params = make_model(request.param)
  inputs = _inputs()
  # EOS id 96 is never emitted here, so the first naive run shows the free sequences.
  free, free_lengths = _naive_greedy(model, params, inputs, MAX_LEN, eos_id=96)
  assert (free_lengths == MAX_LEN).all()
  eos_id = _mid_sequence_eos(free)
  sequences, lengths = _naive_greedy(model, params, inputs, MAX_LEN, eos_id=eos_id)
  return model, params, inputs, eos_id, sequences, lengths


def test_greedy_equals_naive_uncached_decoding(greedy_case):
  model, params, inputs, eos_id, want_sequences, want_lengths = greedy_case
  out = temperature_sample(model, params, inputs, max_decode_len=MAX_LEN,
                                    eos_id=eos_id)
  sequences, lengths = np.asarray(out.sequences), np.asarray(out.lengths)
  assert sequences.shape == (3, MAX_LEN)
  np.testing.assert_array_equal(sequences, want_sequences)
  np.testing.assert_array_equal(lengths, want_lengths)
  # Rows finish at different times: one at an EOS mid-sequence, one at max_decode_len.
  assert lengths.min() < MAX_LEN // 2 and lengths.max() == MAX_LEN
  for row, n in zip(sequences, lengths, strict=True):
    if n < MAX_LEN or row[-1] == eos_id:
      assert row[n - 1] == eos_id and eos_id not in row[:n - 1]  # EOS included, once.
    assert not row[n:].any()  # Padding after EOS.
  assert len(np.unique(sequences)) >= 6  # Non-degenerate.


def test_top_k_1_equals_greedy_and_second_call_does_not_recompile(greedy_case):
  model, params, inputs, eos_id, want_sequences, want_lengths = greedy_case
  kwargs = dict(max_decode_len=MAX_LEN, eos_id=eos_id, temperature=1.0, top_k=1)
  out = temperature_sample(model, params, inputs, rng=jax.random.PRNGKey(3), **kwargs)
  np.testing.assert_array_equal(out.sequences, want_sequences)
  np.testing.assert_array_equal(out.lengths, want_lengths)
  compiled = baseline.decode_context._cache_size()
  other_inputs = _inputs(seed=5)
  temperature_sample(model, params, other_inputs, rng=jax.random.PRNGKey(4), **kwargs)
  assert baseline.decode_context._cache_size() == compiled


def test_rng_determines_the_samples():
  model, params = make_model("test-v1_1")
  inputs = _inputs()
  sample = lambda seed: np.asarray(temperature_sample(
      model, params, inputs, max_decode_len=MAX_LEN, temperature=1.0, eos_id=96,
      rng=jax.random.PRNGKey(seed)).sequences)
  a, b, c = sample(0), sample(0), sample(1)
  np.testing.assert_array_equal(a, b)
  assert (a != c).mean() > 0.3


def test_first_token_follows_the_sampling_distribution():
  """4000 first tokens from one input vs `probs_from_logits` (chi-square, fixed seed)."""
  model, params = make_model("test-v1_1")
  n = 4000
  inputs = jnp.tile(_inputs()[:1], (n, 1))
  out = temperature_sample(model, params, inputs, max_decode_len=1, temperature=1.0,
                                    eos_id=96, rng=jax.random.PRNGKey(0))
  counts = np.bincount(np.asarray(out.sequences[:, 0]), minlength=VOCAB)
  logits = model.logits(params, inputs[:1], jnp.zeros((1, 1), jnp.int32))[0, 0]

  def p_value(temperature: float) -> float:
    probs = np.asarray(sampling.probs_from_logits(logits, temperature=temperature), np.float64)
    expected = n * probs / probs.sum()
    # Pool the rare tokens into one bin so every expected count is >= 5.
    rare = expected < 5
    observed = np.append(counts[~rare], counts[rare].sum())
    expected = np.append(expected[~rare], expected[rare].sum())
    return stats.chisquare(observed, expected).pvalue

  assert p_value(1.0) > 1e-3
  assert p_value(0.7) < 1e-6  # Negative control: the wrong temperature is rejected.
  assert p_value(1.4) < 1e-6


@pytest.mark.parametrize("kwargs, name", [
    (dict(max_decode_len=0), "max_decode_len"),
    (dict(eos_id=VOCAB), "eos_id"),
    (dict(eos_id=-1), "eos_id"),
    (dict(inputs=jnp.ones((9,), jnp.int32)), "inputs"),
])
def test_bad_arguments_name_the_parameter(kwargs, name):
  model, params = make_model("test-v1_1")
  args = dict(inputs=_inputs(), max_decode_len=4) | kwargs
  with pytest.raises(ValueError, match=name):
    temperature_sample(model, params, args.pop("inputs"), **args)
