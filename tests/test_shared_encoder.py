"""Shared-encoder drafts: parity, greedy equality, the exact distribution, checkpoints,
training with the target frozen, and the divergences of the distillation term."""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import make_model
from test_speculative import LENGTH, SAMPLES, VOCAB, _chi_square_p_value, _exact_distribution
from test_training import _batch

from specdec_jax.models.t5 import (
  SharedEncoderDraft,
  SharedEncoderModel,
  T5Draft,
  checkpoints,
  make_draft,
  speculative_sample,
  temperature_sample,
)
from specdec_jax.training import optimizer, trainer
from specdec_jax.training.checkpointing import Checkpointer

MAX_LEN = 20


def _draft_model(target, num_decoder_layers: int = 1, **overrides) -> SharedEncoderModel:
  """A decoder narrower than the target (d_model 16 vs 32) that reads its encoder."""
  cfg = dataclasses.replace(target.config, d_model=16, num_heads=2, d_ff=32,
                            num_decoder_layers=num_decoder_layers, **overrides)
  return SharedEncoderModel(cfg, target.config.d_model)


@pytest.fixture(scope="module")
def setup():
  target, target_params = make_model("test-v1_1", seed=0, num_decoder_layers=2)
  model = _draft_model(target)
  params = model.init_params(jax.random.PRNGKey(5))
  inputs = np.random.RandomState(0).randint(2, 97, size=(3, 9))
  inputs[2, 5:] = 0
  return target, target_params, model, params, jnp.asarray(inputs, jnp.int32)


def test_cross_attention_reads_the_targets_width(setup):
  target, _, model, params, _ = setup
  cross = params["decoder"]["layers_0"]["encoder_decoder_attention"]
  assert cross["key"]["kernel"].shape == (target.config.d_model, 2 * target.config.d_kv)
  assert cross["query"]["kernel"].shape == (16, 2 * target.config.d_kv)
  assert "encoder" not in params


def test_cached_logits_equal_teacher_forced(setup):
  target, target_params, model, params, inputs = setup
  encoded = target.encode(target_params, inputs)
  tokens = jnp.asarray(np.random.RandomState(1).randint(2, 97, size=(3, 7)), jnp.int32)
  forced = model.logits(params, encoded.hidden, encoded.mask, tokens)
  draft_encoded = model.encode(params, encoded)
  first, cache = model.decode_chunk(params, draft_encoded, model.init_cache(3, 12), tokens[:, :4])
  rest, _ = model.decode_chunk(params, draft_encoded, cache, tokens[:, 4:])
  np.testing.assert_allclose(np.concatenate([first, rest], 1), forced, atol=1e-5)


@pytest.mark.parametrize("gamma", [1, 3, 6])
def test_greedy_equals_baseline(setup, gamma):
  target, target_params, model, params, inputs = setup
  base = temperature_sample(target, target_params, inputs, max_decode_len=MAX_LEN, eos_id=96)
  draft = make_draft(model, params)
  assert isinstance(draft, SharedEncoderDraft) and draft.reads_target_encoder
  out = speculative_sample(target, target_params, draft, inputs, gamma=gamma,
                           max_decode_len=MAX_LEN, eos_id=96)
  np.testing.assert_array_equal(out.sequences, base.sequences)
  np.testing.assert_array_equal(out.lengths, base.lengths)
  # Rows finish at different lengths, and the statistics cover every emitted token.
  assert np.all(np.asarray(out.stats.iterations) >= -(-np.asarray(base.lengths) // (gamma + 1)))


def test_output_distribution_is_the_targets():
  """Chi-square against exact enumeration on a 5-token vocabulary (see test_speculative,
  whose negative control shows that this test catches a wrong acceptance rule)."""
  target, target_params = make_model("test-v1_1", seed=3, vocab_size=VOCAB,
                                     num_decoder_layers=2)
  model = _draft_model(target, num_decoder_layers=2)
  params = jax.tree.map(lambda x: 3.0 * x, model.init_params(jax.random.PRNGKey(6)))
  row = jnp.asarray(np.random.RandomState(1).randint(2, VOCAB, size=(1, 6)), jnp.int32)
  inputs = jnp.broadcast_to(row, (SAMPLES, 6))
  dist = _exact_distribution(target, target_params, inputs[0], dict(temperature=1.0), eos_id=1)
  out = speculative_sample(target, target_params, SharedEncoderDraft(model, params), inputs,
                           gamma=2, max_decode_len=LENGTH, temperature=1.0,
                           rng=jax.random.PRNGKey(0))
  alpha = float(np.mean(out.stats.alpha_empirical()))
  assert 0.2 < alpha < 0.95, alpha  # Both the accept and the reject path run.
  assert _chi_square_p_value(out.sequences, out.lengths, dist) > 1e-3


def test_draft_of_another_target_is_refused(setup):
  target, target_params, _, _, inputs = setup
  wide = SharedEncoderModel(dataclasses.replace(target.config, d_model=16), 48)
  draft = SharedEncoderDraft(wide, wide.init_params(jax.random.PRNGKey(0)))
  with pytest.raises(ValueError, match="encoder outputs 48 wide.*d_model is 32"):
    speculative_sample(target, target_params, draft, inputs, gamma=2, max_decode_len=4)
  with pytest.raises(ValueError, match="SharedEncoderModel"):
    SharedEncoderDraft(target, target_params)
  with pytest.raises(ValueError, match="target_encoded"):
    draft.init_state(inputs, 8)


def test_checkpoint_round_trip_and_errors(setup, tmp_path):
  target, target_params, model, params, inputs = setup
  path = str(tmp_path / "shared")
  checkpoints.save_shared_encoder_checkpoint(path, model, params,
                                             metadata={"target": {"name": "test"}})
  loaded_model, loaded = checkpoints.load_model(path)
  assert loaded_model == model
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(loaded), strict=True):
    np.testing.assert_array_equal(np.asarray(a), b)
  with open(os.path.join(path, "config.json")) as f:
    assert json.load(f)["target"] == {"name": "test"}
  # The loaded draft decodes as the original.
  a = speculative_sample(target, target_params, make_draft(model, params), inputs, gamma=3,
                         max_decode_len=8, temperature=1.0)
  b = speculative_sample(target, target_params, make_draft(loaded_model, loaded), inputs,
                         gamma=3, max_decode_len=8, temperature=1.0)
  np.testing.assert_array_equal(a.sequences, b.sequences)
  # A HF loader pointed at it says what it is; a T5 directory still loads as a T5Draft.
  with pytest.raises(checkpoints.CheckpointError, match="load_model"):
    checkpoints.load_hf_checkpoint(path)
  t5_path = str(tmp_path / "t5")
  checkpoints.save_hf_checkpoint(t5_path, target.config, target_params)
  t5_model, t5_params = checkpoints.load_model(t5_path)
  assert isinstance(make_draft(t5_model, t5_params), T5Draft)
  # A missing tensor and a wrong width are named.
  from safetensors.numpy import load_file, save_file
  weights = os.path.join(path, "model.safetensors")
  tensors = load_file(weights)
  del tensors["decoder/decoder_norm/scale"]
  save_file(tensors, weights)
  with pytest.raises(checkpoints.CheckpointError, match="decoder/decoder_norm/scale"):
    checkpoints.load_model(path)
  with open(os.path.join(path, "config.json")) as f:
    config = json.load(f)
  config["encoder_d_model"] = 0
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(config, f)
  with pytest.raises(checkpoints.CheckpointError, match="encoder_d_model"):
    checkpoints.load_model(path)


def test_training_with_the_target_frozen_resumes_exactly(setup, tmp_path):
  """The teacher term pulls the draft towards the frozen target, and a restored checkpoint
  continues bit for bit (forward KL; total variation trains in test_sparse_distill)."""
  target, target_params, model, params, _ = setup
  tx = optimizer.Optimizer().build(optimizer.LearningRate(
      peak_lr=1e-2, warmup_steps=2, kind="constant").schedule(20))
  # The teacher term alone (random labels would pull the other way).
  cfg = trainer.LossConfig(distill_weight=1.0, z_loss=0.0)
  step = trainer.make_train_step(model, tx, cfg, teacher_model=target)
  batch = _batch(np.random.default_rng(0))

  def run(state, start, stop):
    metrics = []
    for i in range(start, stop):
      state, m = step(state, batch, jax.random.PRNGKey(i), target_params)
      metrics.append(m)
    return state, metrics

  state, metrics = run(trainer.TrainState.create(jax.tree.map(jnp.copy, params), tx), 0, 6)
  ckpt = Checkpointer(str(tmp_path), keep=1)
  ckpt.save(6, {"state": state})
  ckpt.close()
  done, more = run(state, 6, 12)
  losses = [float(m["distill_loss"]) for m in metrics + more]
  # It moves towards the teacher, step by step.
  assert losses[-1] < losses[0] - 0.05 and sum(np.diff(losses) < 0) >= 9, losses
  like = {"state": trainer.TrainState.create(jax.tree.map(jnp.copy, params), tx)}
  ckpt = Checkpointer(str(tmp_path), keep=1)
  resumed, _ = run(ckpt.restore(like)["state"], 6, 12)
  ckpt.close()
  for a, b in zip(jax.tree.leaves(done), jax.tree.leaves(resumed), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # The target is frozen: only the draft's parameters are in the state.
  assert jax.tree.structure(done.params) == jax.tree.structure(params)


def test_shared_student_needs_its_teacher(setup):
  target, _, model, _, _ = setup
  tx = optimizer.Optimizer().build(optimizer.LearningRate(warmup_steps=1).schedule(10))
  with pytest.raises(ValueError, match="teacher"):
    trainer.make_train_step(model, tx, trainer.LossConfig())
  other = SharedEncoderModel(model.config, 48)
  with pytest.raises(ValueError, match="48 wide"):
    trainer.make_train_step(other, tx, trainer.LossConfig(), teacher_model=target)
  with pytest.raises(ValueError, match="distill_divergence"):
    trainer.LossConfig(distill_divergence="js")


def test_divergences():
  rng = np.random.default_rng(0)
  p_logits = jnp.asarray(rng.normal(size=(2, 3, 11)), jnp.float32)
  q_logits = jnp.asarray(rng.normal(size=(2, 3, 11)), jnp.float32)
  p, q = jax.nn.softmax(p_logits), jax.nn.softmax(q_logits)
  np.testing.assert_allclose(trainer.total_variation(q_logits, p_logits),
                             1.0 - jnp.sum(jnp.minimum(p, q), -1), atol=1e-6)  # 1 - beta.
  np.testing.assert_allclose(trainer.reverse_kl(q_logits, p_logits),
                             jnp.sum(q * (jnp.log(q) - jnp.log(p)), -1), atol=1e-5)
  for divergence in (trainer.total_variation, trainer.reverse_kl):
    np.testing.assert_allclose(divergence(p_logits, p_logits), 0.0, atol=1e-6)
