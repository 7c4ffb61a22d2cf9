"""Training: loss, distillation, optimizer, bucketing, checkpoint resume, gin configs."""

from __future__ import annotations

import glob
import os
import signal

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.models.t5 import T5Model, get_config
from specdec_jax.training import batching, optimizer, trainer
from specdec_jax.training.checkpointing import Checkpointer, StopFlag
from specdec_jax.training.model_config import model_config
from specdec_jax.training.train_student import StudentTrainConfig
from specdec_jax.training.train_t5 import TrainConfig

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB = 97


def _batch(rng: np.random.Generator, b: int = 4, li: int = 10, lt: int = 8) -> dict:
  """A synthetic batch in the pipeline's layout, with padding at the row ends."""
  inputs = rng.integers(2, VOCAB, (b, li)).astype(np.int32)
  targets = rng.integers(2, VOCAB, (b, lt)).astype(np.int32)
  for i in range(b):
    inputs[i, li - i:] = 0
    targets[i, lt - i:] = 0
  return {"encoder_input_tokens": inputs, "decoder_target_tokens": targets,
          "decoder_input_tokens": np.pad(targets[:, :-1], ((0, 0), (1, 0))),
          "decoder_loss_weights": (targets > 0).astype(np.int32)}


def _copy(params: dict) -> dict:
  """A copy: the train step donates (deletes) the state it is given."""
  return jax.tree.map(jnp.copy, params)


@pytest.fixture(scope="module")
def tiny():
  model = T5Model(get_config("test-v1_1", vocab_size=VOCAB))
  return model, model.init_params(jax.random.PRNGKey(0))


@pytest.fixture(scope="module")
def sgd_setup(tiny):
  """The optimizer and jitted train step (compiled once for the tests below)."""
  model, _ = tiny
  tx = optimizer.Optimizer().build(optimizer.LearningRate(
      peak_lr=1e-2, warmup_steps=2, kind="constant").schedule(20))
  return tx, trainer.make_train_step(model, tx, trainer.LossConfig())


def test_loss_decreases_on_a_repeated_batch(tiny, sgd_setup):
  _, params = tiny
  tx, step = sgd_setup
  state = trainer.TrainState.create(_copy(params), tx)
  batch = _batch(np.random.default_rng(0))
  losses = []
  for i in range(20):
    state, metrics = step(state, batch, jax.random.PRNGKey(i), None)
    losses.append(float(metrics["label_loss"]))
  assert int(state.step) == 20
  assert losses[-1] < 0.5 * losses[0], losses


def test_label_loss_ignores_padding_and_matches_reference(tiny):
  model, params = tiny
  batch = _batch(np.random.default_rng(1))
  logits = model.logits(params, batch["encoder_input_tokens"], batch["decoder_input_tokens"])
  _, metrics = trainer.loss_terms(logits, batch, trainer.LossConfig(z_loss=0.0))
  logp = jax.nn.log_softmax(np.asarray(logits), axis=-1)
  w = batch["decoder_loss_weights"] > 0
  nll = -np.take_along_axis(np.asarray(logp), batch["decoder_target_tokens"][..., None], -1)
  np.testing.assert_allclose(float(metrics["label_loss"]), nll[..., 0][w].mean(), rtol=1e-5)
  assert int(metrics["tokens"]) == w.sum()


def test_distillation_to_a_one_hot_teacher_is_the_label_loss(tiny):
  model, params = tiny
  batch = _batch(np.random.default_rng(2))
  logits = model.logits(params, batch["encoder_input_tokens"], batch["decoder_input_tokens"])
  one_hot_teacher = 1e4 * jax.nn.one_hot(batch["decoder_target_tokens"], VOCAB)
  label_only, _ = trainer.loss_terms(logits, batch, trainer.LossConfig(z_loss=0.0))
  for weight in (0.5, 1.0):
    cfg = trainer.LossConfig(z_loss=0.0, distill_weight=weight)
    mixed, _ = trainer.loss_terms(logits, batch, cfg, one_hot_teacher)
    np.testing.assert_allclose(float(mixed), float(label_only), rtol=1e-5)
  # A uniform teacher is not the labels.
  cfg = trainer.LossConfig(z_loss=0.0, distill_weight=1.0)
  uniform, _ = trainer.loss_terms(logits, batch, cfg, jnp.zeros_like(logits))
  assert abs(float(uniform) - float(label_only)) > 1e-3


def test_distillation_step_runs_the_teacher_in_the_step(tiny):
  model, params = tiny
  tx = optimizer.Optimizer().build(optimizer.LearningRate(warmup_steps=1).schedule(10))
  cfg = trainer.LossConfig(distill_weight=0.5)
  with pytest.raises(ValueError, match="teacher_model"):
    trainer.make_train_step(model, tx, cfg)
  step = trainer.make_train_step(model, tx, cfg, teacher_model=model)
  state = trainer.TrainState.create(_copy(params), tx)
  _, metrics = step(state, _batch(np.random.default_rng(3)), jax.random.PRNGKey(0), params)
  assert float(metrics["distill_loss"]) > 0


def test_schedules():
  rsqrt = optimizer.LearningRate(peak_lr=1.0, warmup_steps=100, kind="rsqrt").schedule(1000)
  np.testing.assert_allclose([float(rsqrt(s)) for s in (0, 99, 399)], [0.01, 1.0, 0.5],
                             rtol=1e-5)
  cos = optimizer.LearningRate(peak_lr=1.0, warmup_steps=100, final_fraction=0.1).schedule(1000)
  np.testing.assert_allclose([float(cos(100)), float(cos(1000))], [1.0, 0.1], rtol=1e-4)
  with pytest.raises(ValueError, match="kind"):
    optimizer.LearningRate(kind="linear")


def test_adafactor_steps_are_relative_to_each_parameters_scale():
  """T5's init mixes scales (embeddings ~1, query kernels ~0.006); updates must follow them."""
  tx = optimizer.Optimizer(kind="adafactor", clip_norm=0.0).build(lambda step: 1e-2)
  params = {"big": jnp.ones((256, 256)), "small": jnp.full((256, 256), 0.01)}
  grads = jax.tree.map(lambda p: jnp.full(p.shape, 0.5), params)
  updates, _ = tx.update(grads, tx.init(params), params)
  ratio = float(jnp.abs(updates["big"]).mean() / jnp.abs(updates["small"]).mean())
  np.testing.assert_allclose(ratio, 100.0, rtol=1e-3)
  adam = optimizer.Optimizer(kind="adamw", weight_decay=0.0).build(lambda step: 1e-2)
  updates, _ = adam.update(grads, adam.init(params), params)
  np.testing.assert_allclose(float(jnp.abs(updates["big"]).mean() /
                                   jnp.abs(updates["small"]).mean()), 1.0, rtol=1e-3)


def test_schedule_drops_multiply_from_their_step():
  dropped = optimizer.LearningRate(peak_lr=1.0, warmup_steps=100, kind="rsqrt",
                                   drop_steps=(500, 700), drop_factor=0.5).schedule(1000)
  plain = optimizer.LearningRate(peak_lr=1.0, warmup_steps=100, kind="rsqrt").schedule(1000)
  got = [float(dropped(s)) / float(plain(s)) for s in (499, 500, 699, 700, 999)]
  np.testing.assert_allclose(got, [1.0, 0.5, 0.5, 0.25, 0.25], rtol=1e-6)
  with pytest.raises(ValueError, match="drop_steps"):
    optimizer.LearningRate(drop_steps=(5, 3))
  with pytest.raises(ValueError, match="drop_factor"):
    optimizer.LearningRate(drop_steps=(5,), drop_factor=0.0)


def _source(n: int, seed: int = 0):
  rng = np.random.default_rng(seed)
  return [_batch(rng, b=4, li=128, lt=64) for _ in range(n)]


def test_bucketed_batches_keep_rows_trim_padding_and_resume():
  source = _source(12)
  full = list(batching.bucketed_batches(source, window=4, seed=7))
  assert len(full) == 12
  for b in full:
    assert b["encoder_input_tokens"].shape[1] in batching.bucket_lengths(128)
    assert b["decoder_target_tokens"].shape[1] in batching.bucket_lengths(64)
  rows = lambda bs: sorted(tuple(np.trim_zeros(r, "b")) for b in bs
                           for r in b["encoder_input_tokens"])
  assert rows(full) == rows(source)
  for start in (1, 4, 6):
    resumed = list(batching.bucketed_batches(source, window=4, seed=7, start_batch=start))
    assert len(resumed) == 12 - start
    for a, b in zip(resumed, full[start:], strict=True):
      for k in a:
        np.testing.assert_array_equal(a[k], b[k])


def test_checkpoint_resume_gives_identical_state(tiny, sgd_setup, tmp_path):
  _, params = tiny
  tx, step = sgd_setup
  batches = [_batch(np.random.default_rng(10 + i)) for i in range(5)]

  def run(state, start, stop):
    for i in range(start, stop):
      state, _ = step(state, batches[i], jax.random.PRNGKey(i), None)
    return state

  # The run is "killed" after saving at step 3, then resumed from disk.
  state = run(trainer.TrainState.create(_copy(params), tx), 0, 3)
  ckpt = Checkpointer(str(tmp_path), keep=1)
  ckpt.save(3, {"state": state, "counters": {"tokens": np.asarray(7, np.int64)}})
  ckpt.close()
  uninterrupted = run(state, 3, 5)

  like = {"state": trainer.TrainState.create(_copy(params), tx),
          "counters": {"tokens": np.asarray(0, np.int64)}}
  ckpt = Checkpointer(str(tmp_path), keep=1)
  assert ckpt.latest_step() == 3
  restored = ckpt.restore(like)
  ckpt.close()
  assert int(restored["counters"]["tokens"]) == 7
  resumed = run(restored["state"], int(restored["state"].step), 5)
  for a, b in zip(jax.tree.leaves(uninterrupted), jax.tree.leaves(resumed), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_stop_flag_catches_sigterm():
  with StopFlag() as stop:
    os.kill(os.getpid(), signal.SIGTERM)
    assert stop.requested
  assert signal.getsignal(signal.SIGTERM) is not stop._handle


def test_gin_configs_parse():
  files = sorted(glob.glob(os.path.join(REPO, "gin_configs", "train", "*.gin")))
  assert {"target", "draft_small", "draft_base", "draft_large", "draft_distilled"} <= {
      os.path.basename(f)[:-4] for f in files}
  cwd = os.getcwd()
  os.chdir(REPO)  # Configs include each other by repo-relative path.
  try:
    for path in files:
      if os.path.basename(path) == "base.gin":
        continue
      gin.clear_config()
      gin.parse_config_file(path)
      # What experiments.train builds from the file, for either driver.
      loss = trainer.LossConfig()
      optimizer.LearningRate(), optimizer.Optimizer()
      if os.path.basename(path).startswith("draft_smollm2"):  # A decoder-only student.
        student = StudentTrainConfig()
        assert student.target == "smollm2" and student.passes > 0, path
        # Its loss is the distillation term alone, on the stored top-k.
        assert (loss.distill_weight, loss.z_loss) == (1.0, 0.0), path
        continue
      cfg = model_config()
      assert cfg.vocab_size == 8192 and cfg.gated and not cfg.tie_word_embeddings, path
      assert TrainConfig().total_steps > 0, path
  finally:
    gin.clear_config()
    os.chdir(cwd)
