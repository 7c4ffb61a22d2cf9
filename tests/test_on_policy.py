"""On-policy distillation: the target's cross-attention from stored encoder outputs, the
student's samples (their layout and their distribution, with a negative control) and the
step that moves the student towards the target along them."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import make_shared_encoder_pair
from scipy import stats as scipy_stats

from specdec_jax.training import on_policy, optimizer, trainer

VOCAB = 97


@pytest.fixture(scope="module")
def setup():
  target, target_params, student, params = make_shared_encoder_pair()
  # A peaked student (random logits are near uniform), so that distributions differ.
  params = jax.tree_util.tree_map_with_path(
      lambda path, x: 6.0 * x if "logits_dense" in jax.tree_util.keystr(path) else x, params)
  return target, target_params, student, params


def _inputs(seed: int = 0, rows: int = 4, length: int = 12) -> np.ndarray:
  rng = np.random.default_rng(seed)
  inputs = rng.integers(2, VOCAB, (rows, length)).astype(np.int32)
  for i in range(rows):
    inputs[i, length - 2 * i:] = 0
  return inputs


def _batch(target, target_params, inputs: np.ndarray, length: int = 6) -> dict:
  """The fields of a signals batch the step reads: inputs, float16 encoder outputs and
  the decoder length (the stored outputs are not read)."""
  encoded = target.encode(target_params, jnp.asarray(inputs))
  hidden = np.asarray(encoded.hidden).astype(np.float16) * (inputs > 0)[..., None]
  return {"encoder_input_tokens": inputs, "encoder_hidden": hidden,
          "decoder_target_tokens": np.zeros((len(inputs), length), np.int32)}


def test_encoded_from_outputs_is_what_encode_gives(setup):
  target, target_params, _, _ = setup
  inputs = jnp.asarray(_inputs())
  encoded = target.encode(target_params, inputs)
  again = target.encoded_from_outputs(target_params, encoded.hidden, encoded.mask)
  tokens = jnp.asarray(np.random.default_rng(1).integers(2, VOCAB, (4, 5)), jnp.int32)
  np.testing.assert_allclose(np.asarray(target.decode_logits(target_params, again, tokens)),
                             np.asarray(target.decode_logits(target_params, encoded, tokens)),
                             rtol=1e-6, atol=1e-6)


def test_samples_are_laid_out_for_teacher_forcing(setup):
  target, target_params, student, params = setup
  batch = _batch(target, target_params, _inputs(rows=4), length=7)
  hidden = jnp.asarray(batch["encoder_hidden"], jnp.float32)
  mask = jnp.asarray(batch["encoder_input_tokens"] > 0)
  samples = jax.device_get(on_policy.student_samples(student, params, hidden, mask,
                                                     jax.random.PRNGKey(0), length=7))
  targets, weights = samples["decoder_target_tokens"], samples["decoder_loss_weights"]
  assert targets.shape == weights.shape == samples["decoder_input_tokens"].shape == (4, 7)
  np.testing.assert_array_equal(samples["decoder_input_tokens"][:, 0], 0)
  np.testing.assert_array_equal(samples["decoder_input_tokens"][:, 1:], targets[:, :-1])
  eos = student.config.eos_token_id
  for row, w in zip(targets, weights, strict=True):
    n = int(w.sum())
    np.testing.assert_array_equal(w, np.arange(7) < n)  # Weights: a prefix.
    assert np.all(row[n:] == 0) and np.all(row[:n] != 0)
    assert (eos not in row[:n - 1]) and (n == 7 or row[n - 1] == eos)


def test_samples_follow_the_students_distribution_and_a_wrong_one_fails(setup):
  """The first sampled token over 4000 rows of one input against the student's
  teacher-forced distribution (chi-square); the distribution of another input is the
  negative control and must be rejected."""
  target, target_params, student, params = setup
  rows = 4000
  two = _inputs(rows=2)
  batch = _batch(target, target_params, np.repeat(two[:1], rows, axis=0), length=1)
  hidden = jnp.asarray(batch["encoder_hidden"], jnp.float32)
  mask = jnp.asarray(batch["encoder_input_tokens"] > 0)
  first = np.asarray(on_policy.student_samples(student, params, hidden, mask,
                                               jax.random.PRNGKey(3), length=1)
                     ["decoder_target_tokens"][:, 0])
  counts = np.bincount(first, minlength=VOCAB)

  def probs(inputs: np.ndarray) -> np.ndarray:
    b = _batch(target, target_params, inputs, length=1)
    logits = student.logits(params, jnp.asarray(b["encoder_hidden"], jnp.float32),
                            jnp.asarray(inputs > 0), jnp.zeros((1, 1), jnp.int32))
    p = np.asarray(logits[0, 0], np.float64)
    p = np.exp(p - p.max())
    return p / p.sum()

  def p_value(p: np.ndarray) -> float:
    expected = rows * p
    keep = expected >= 5  # Chi-square's rule of thumb; the rest pooled into one cell.
    observed = np.append(counts[keep], counts[~keep].sum())
    expected = np.append(expected[keep], expected[~keep].sum())
    return scipy_stats.chisquare(observed, expected).pvalue

  right, wrong = probs(two[:1]), probs(two[1:])
  assert 0.5 * np.abs(right - wrong).sum() > 0.1  # The control is a different distribution.
  assert p_value(right) > 1e-3
  assert p_value(wrong) < 1e-6


def test_the_step_moves_the_student_towards_the_target_along_its_samples(setup):
  target, target_params, student, params = setup
  tx = optimizer.Optimizer().build(optimizer.LearningRate(
      peak_lr=1e-2, warmup_steps=2, kind="constant").schedule(40))
  cfg = trainer.LossConfig(distill_weight=0.5, distill_divergence="total_variation")
  with pytest.raises(ValueError, match="distill_temperature"):
    on_policy.make_on_policy_train_step(student, target, tx,
                                        dataclasses.replace(cfg, distill_temperature=2.0))
  with pytest.raises(ValueError, match="shared_encoder"):
    on_policy.make_on_policy_train_step(target, target, tx, cfg)
  step = on_policy.make_on_policy_train_step(student, target, tx, cfg)
  batch = _batch(target, target_params, _inputs(rows=8))
  state = trainer.TrainState.create(jax.tree.map(jnp.copy, params), tx)
  before = jax.tree.map(np.asarray, target_params)
  losses, tokens = [], []
  for i in range(40):
    state, metrics = step(state, batch, jax.random.PRNGKey(i), target_params)
    losses.append(float(metrics["distill_loss"]))
    tokens.append(int(metrics["tokens"]))
  assert int(state.step) == 40 and np.isfinite(float(metrics["grad_norm"]))
  # Total variation along fresh samples each step: the mean of the last steps is well
  # below the first's.
  assert np.mean(losses[-5:]) < 0.7 * np.mean(losses[:5]), losses
  assert all(1 <= t <= 8 * 6 for t in tokens) and len(set(tokens)) > 1  # New samples.
  jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, target_params), before)
