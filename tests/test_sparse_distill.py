"""Divergences on the target's stored top-k + rest signals, and the train step on them."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import make_shared_encoder_pair

from specdec_jax.training import optimizer, sparse_distill, trainer

VOCAB = 97
DENSE = {"forward_kl": trainer.soft_cross_entropy, "reverse_kl": trainer.reverse_kl,
         "total_variation": trainer.total_variation}


def _signals(teacher_logits: np.ndarray, k: int, dtype=np.float32):
  """The target's top-k ids, their log-probs (in `dtype`) and the rest's log-mass."""
  x = np.asarray(teacher_logits, np.float64)
  logp = x - np.logaddexp.reduce(x, axis=-1, keepdims=True)
  order = np.argsort(-logp, axis=-1)
  ids = order[..., :k]
  rest = np.logaddexp.reduce(np.take_along_axis(logp, order[..., k:], -1), axis=-1)
  return (ids.astype(np.int16), np.take_along_axis(logp, ids, -1).astype(dtype),
          rest.astype(np.float32))


@pytest.fixture(scope="module")
def logits():
  rng = np.random.default_rng(0)
  # Peaked teachers (as the target is) and flatter students, 2 x 5 positions.
  teacher = 4.0 * rng.standard_normal((2, 5, VOCAB)).astype(np.float32)
  student = 2.0 * rng.standard_normal((2, 5, VOCAB)).astype(np.float32)
  return jnp.asarray(student), teacher


def _sparse(name, student, signals):
  return np.asarray(sparse_distill.SPARSE_DIVERGENCES[name](student, *map(jnp.asarray, signals)))


@pytest.mark.parametrize("name", sorted(DENSE))
def test_with_every_id_in_the_topk_the_sparse_divergence_is_the_dense_one(logits, name):
  student, teacher = logits
  dense = np.asarray(DENSE[name](student, jnp.asarray(teacher)))
  # float32 log-probs: equal to float32 rounding.
  np.testing.assert_allclose(_sparse(name, student, _signals(teacher, VOCAB)), dense,
                             rtol=1e-5, atol=1e-5)
  # float16 log-probs, as stored: within what float16 costs (3 significant digits).
  np.testing.assert_allclose(_sparse(name, student, _signals(teacher, VOCAB, np.float16)),
                             dense, rtol=2e-3, atol=2e-3)


def test_with_a_small_topk_each_divergence_is_a_lower_bound_of_the_dense_one(logits):
  student, teacher = logits
  logp = np.asarray(jax.nn.log_softmax(jnp.asarray(teacher), -1))
  dense_entropy = -np.sum(np.exp(logp) * logp, -1)
  for k in (1, 4, 16):
    signals = _signals(teacher, k)
    p_coarse = np.concatenate([np.exp(signals[1]), np.exp(signals[2])[..., None]], -1)
    coarse_entropy = -np.sum(p_coarse * np.log(p_coarse), -1)
    dense_kl = np.asarray(DENSE["forward_kl"](student, jnp.asarray(teacher))) - dense_entropy
    sparse_kl = _sparse("forward_kl", student, signals) - coarse_entropy
    assert np.all(sparse_kl >= -1e-5) and np.all(sparse_kl <= dense_kl + 1e-5), k
    for name in ("reverse_kl", "total_variation"):
      sparse = _sparse(name, student, signals)
      dense = np.asarray(DENSE[name](student, jnp.asarray(teacher)))
      assert np.all(sparse >= -1e-6) and np.all(sparse <= dense + 1e-5), (name, k)
    # The bound is not an equality: the rest hides where the mass outside the top-k is.
    assert np.mean(sparse_kl) < np.mean(dense_kl) - 1e-3


def test_negative_control_ids_out_of_step_with_their_logprobs_fail_the_equality(logits):
  student, teacher = logits
  ids, logprobs, rest = _signals(teacher, VOCAB)
  shifted = (np.roll(ids, 1, axis=-1), logprobs, rest)
  with pytest.raises(AssertionError):
    np.testing.assert_allclose(_sparse("forward_kl", student, shifted),
                               np.asarray(trainer.soft_cross_entropy(student,
                                                                     jnp.asarray(teacher))),
                               rtol=1e-3, atol=1e-3)


def test_gradients_are_finite_when_the_rest_is_empty_and_on_padding(logits):
  student, teacher = logits
  full = tuple(map(jnp.asarray, _signals(teacher, VOCAB)))
  k = 8
  padding = (jnp.zeros((2, 5, k), jnp.int16), jnp.zeros((2, 5, k), jnp.float16),
             jnp.zeros((2, 5), jnp.float32))  # What the stored arrays hold past a length.
  for name, fn in sparse_distill.SPARSE_DIVERGENCES.items():
    for signals in (full, padding):
      value, grad = jax.value_and_grad(lambda x, fn=fn, s=signals: jnp.sum(fn(x, *s)))(student)
      assert np.isfinite(float(value)) and np.all(np.isfinite(np.asarray(grad))), name


def test_every_dense_divergence_has_a_sparse_one():
  assert set(sparse_distill.SPARSE_DIVERGENCES) == set(trainer.DIVERGENCES)


@pytest.fixture(scope="module")
def shared_setup():
  return make_shared_encoder_pair()


def _signals_batch(target, target_params, k: int, seed: int = 0) -> dict:
  """A signals batch made by the target, as `signals_source` yields them."""
  rng = np.random.default_rng(seed)
  inputs = rng.integers(2, VOCAB, (4, 12)).astype(np.int32)
  outputs = rng.integers(2, VOCAB, (4, 6)).astype(np.int32)
  for i in range(4):
    inputs[i, 12 - 2 * i:] = 0
    outputs[i, 6 - i:] = 0
  decoder_inputs = np.pad(outputs[:, :-1], ((0, 0), (1, 0)))
  encoded = target.encode(target_params, jnp.asarray(inputs))
  teacher = np.asarray(target.decode_logits(target_params, encoded, jnp.asarray(decoder_inputs)))
  ids, logprobs, rest = _signals(teacher, k, np.float16)
  valid = outputs > 0
  hidden = np.asarray(encoded.hidden).astype(np.float16) * (inputs > 0)[..., None]
  return {"encoder_input_tokens": inputs, "encoder_hidden": hidden,
          "decoder_input_tokens": decoder_inputs, "decoder_target_tokens": outputs,
          "decoder_loss_weights": valid.astype(np.int32),
          "teacher_topk_ids": ids * valid[..., None],
          "teacher_topk_logprobs": logprobs * valid[..., None],
          "teacher_rest_logprob": np.where(valid, rest, 0.0)}, teacher


def test_loss_on_full_signals_is_the_loss_with_the_target_in_the_step(shared_setup):
  target, target_params, student, params = shared_setup
  batch, teacher = _signals_batch(target, target_params, VOCAB)
  encoded = target.encode(target_params, jnp.asarray(batch["encoder_input_tokens"]))
  in_step = student.logits(params, encoded.hidden, encoded.mask, batch["decoder_input_tokens"])
  stored = sparse_distill.student_logits(student, params, batch)
  # The stored encoder outputs are float16.
  np.testing.assert_allclose(np.asarray(stored), np.asarray(in_step), atol=2e-2, rtol=1e-2)
  for name in sorted(DENSE):
    cfg = trainer.LossConfig(distill_weight=0.5, distill_divergence=name)
    want, _ = trainer.loss_terms(in_step, batch, cfg, jnp.asarray(teacher))
    got, metrics = sparse_distill.signals_loss_terms(stored, batch, cfg)
    np.testing.assert_allclose(float(got), float(want), rtol=3e-3, err_msg=name)
    assert int(metrics["tokens"]) == int(batch["decoder_loss_weights"].sum())


def test_signals_step_trains_the_student_alone(shared_setup):
  target, target_params, student, params = shared_setup
  tx = optimizer.Optimizer().build(optimizer.LearningRate(
      peak_lr=1e-2, warmup_steps=2, kind="constant").schedule(30))
  cfg = trainer.LossConfig(distill_weight=1.0, distill_divergence="total_variation")
  with pytest.raises(ValueError, match="distill_temperature"):
    sparse_distill.make_signals_train_step(student, tx, dataclasses.replace(
        cfg, distill_temperature=2.0))
  step = sparse_distill.make_signals_train_step(student, tx, cfg)
  batch, _ = _signals_batch(target, target_params, 8)
  state = trainer.TrainState.create(jax.tree.map(jnp.copy, params), tx)
  losses = []
  for i in range(30):
    state, metrics = step(state, batch, jax.random.PRNGKey(i))
    losses.append(float(metrics["distill_loss"]))
  assert int(state.step) == 30 and np.isfinite(float(metrics["grad_norm"]))
  assert losses[-1] < 0.7 * losses[0], losses
