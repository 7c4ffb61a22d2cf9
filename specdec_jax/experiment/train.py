"""The training driver: trains a T5 (or a shared-encoder draft) on the specdec mixture,
resumably; evaluates; exports (HuggingFace format; a shared-encoder draft in our format,
`checkpoints.load_model`). `python -m experiments.train` is its command.

`train` (gin-configurable) writes into its `model_dir`: `checkpoints/` (Orbax, the last
few), `hf/` (HF T5 format with the vocabulary as `spiece.model`) and `train_summary.json`.
Rerunning resumes from the latest checkpoint (SIGTERM / Ctrl-C save one first); a
finished run is not retrained. The steps, losses and optimizer are `specdec_jax.training`.
"""

from __future__ import annotations

import os

# One thread each for tf.data's op pools (the input pipeline); JAX takes the cores.
os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")
os.environ.setdefault("TF_NUM_INTEROP_THREADS", "1")

import datetime  # noqa: E402
import functools  # noqa: E402
import hashlib  # noqa: E402
import time  # noqa: E402
from collections.abc import Iterator  # noqa: E402

import gin  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from specdec_jax import atomic_io  # noqa: E402
from specdec_jax.checkpoints import (  # noqa: E402
    load_hf_checkpoint,
    load_hf_config,
    load_model,
    save_hf_checkpoint,
    save_shared_encoder_checkpoint,
)
from specdec_jax.data import corpora, layout, pipeline, vocab  # noqa: E402
from specdec_jax.models import T5Model  # noqa: E402
from specdec_jax.models.shared_encoder import SharedEncoderModel  # noqa: E402
from specdec_jax.training import batching, evaluation, optimizer, trainer  # noqa: E402
from specdec_jax.training.checkpointing import Checkpointer, StopFlag  # noqa: E402
from specdec_jax.training.model_config import model_config  # noqa: E402

SUMMARY = "train_summary.json"
STUDENTS = ("t5", "shared_encoder")
HF_DIR = "hf"


def _fmt_duration(seconds: float) -> str:
  return str(datetime.timedelta(seconds=int(max(seconds, 0))))


def _validation_batches(tasks: tuple[str, ...], batch_size: int, inputs_length: int,
                        targets_length: int) -> dict[str, list[dict]]:
  """Each task's validation split, length-trimmed, held in memory."""
  out = {}
  for task in tasks:
    full = list(pipeline.get_batches(task, "validation", batch_size, inputs_length,
                                     targets_length, shuffle=False, num_epochs=1))
    out[task] = list(batching.bucketed_batches(full, window=len(full), seed=0))
  return out


def _run_validation(eval_step, params: dict, val: dict[str, list[dict]]) -> dict[str, float]:
  """Per-task and token-weighted overall validation loss."""
  losses, total_loss, total_tokens = {}, 0.0, 0
  for task, batches in val.items():
    loss, tokens = evaluation.validation_loss(eval_step, params, batches)
    losses[task] = loss
    total_loss += loss * tokens
    total_tokens += tokens
  losses["all"] = total_loss / total_tokens
  return losses


@gin.configurable(denylist=["model_dir", "eval_only"])
def train(model_dir: str, eval_only: bool = False, *, total_steps: int = gin.REQUIRED,
          mixture: str = "specdec_mix", batch_size: int = 64, inputs_length: int = 128,
          targets_length: int = 64, seed: int = 0, bucket_window: int = 32,
          log_every: int = 50, eval_every: int = 1000, save_every_minutes: float = 10.0,
          save_every_steps: int = 0, keep_checkpoints: int = 2, teacher_dir: str | None = None,
          student: str = "t5", init_from: str | None = None,
          val_tasks: tuple[str, ...] = ("specdec_ende", "specdec_mansum"),
          test_examples: int | None = None, eval_batch_size: int = 64) -> dict:
  """Trains (resuming), then evaluates and exports; returns the summary.

  Args:
    model_dir: run directory.
    eval_only: skip training; evaluate and export the latest checkpoint.
    total_steps: optimizer steps (one batch each).
    mixture: seqio Task or Mixture to train on.
    batch_size: rows per batch.
    inputs_length: encoder length (longer inputs are cut).
    targets_length: decoder length (longer targets are cut); also the test decode length.
    seed: parameter init, dropout, shuffle and bucketing seed.
    bucket_window: pipeline batches sorted together by length (see `batching`).
    log_every: steps between progress lines.
    eval_every: steps between validation losses.
    save_every_minutes: wall-clock minutes between checkpoints.
    save_every_steps: also save every this many steps (0: off).
    keep_checkpoints: checkpoints kept.
    teacher_dir: HF-format teacher: for distillation (`LossConfig.distill_weight > 0`),
      and the target whose encoder a shared-encoder student reads.
    student: "t5" (a T5 of `model_config()`), or "shared_encoder": a decoder of
      `model_config()`'s decoder settings that reads the teacher's encoder outputs
      (`models.shared_encoder`; needs `teacher_dir`).
    init_from: a model directory (`checkpoints.load_model`) of the same architecture to
      start from instead of a random init (e.g. a draft to fine-tune on distillation data).
    val_tasks: tasks whose validation loss is reported.
    test_examples: cap on test examples per task decoded (None: all).
    eval_batch_size: rows per validation / test-decoding batch.
  """
  os.makedirs(model_dir, exist_ok=True)
  if student not in STUDENTS:
    raise ValueError(f"train.student={student!r} is unknown; use one of {STUDENTS}.")
  if student == "shared_encoder" and not teacher_dir:
    raise ValueError("train.student='shared_encoder' reads the target's encoder: set "
                     "train.teacher_dir to the target's checkpoint directory.")
  cfg = model_config()
  loss_cfg = trainer.LossConfig()
  schedule = optimizer.learning_rate_schedule(total_steps)
  tx = optimizer.make_optimizer(schedule)
  teacher_model, teacher_params = None, None
  if teacher_dir:
    teacher_cfg, teacher_params = load_hf_checkpoint(teacher_dir, dropout_rate=0.0)
    teacher_model = T5Model(teacher_cfg)
    teacher_params = jax.device_put(teacher_params)
  model = (SharedEncoderModel(cfg, teacher_model.config.d_model) if student == "shared_encoder"
           else T5Model(cfg))
  # The teacher joins the train step for its logits, or as a shared-encoder student's encoder.
  step_teacher = teacher_model if (loss_cfg.distill_weight > 0
                                   or student == "shared_encoder") else None
  init_params = _initial_params(model, init_from, seed)

  state = trainer.TrainState.create(init_params, tx)
  counters = {"wall_time_s": 0.0, "input_tokens": 0, "target_tokens": 0}
  ckpt = Checkpointer(model_dir, keep=keep_checkpoints)
  restored = ckpt.restore({"state": state, "counters": _counter_arrays(counters)})
  if restored is not None:
    state = restored["state"]
    counters = {k: type(v)(restored["counters"][k]) for k, v in counters.items()}
    print(f"Resumed from step {int(state.step)} in {ckpt.directory}.", flush=True)
  elif eval_only:
    raise FileNotFoundError(f"--eval_only: no checkpoint in {ckpt.directory}; train first.")
  n_params = sum(int(x.size) for x in jax.tree.leaves(state.params))
  print(f"Model {cfg}\n{n_params / 1e6:.2f}M parameters.", flush=True)

  eval_step = trainer.make_eval_step(
      model, teacher_model if student == "shared_encoder" else None)
  if student == "shared_encoder":
    eval_step = functools.partial(eval_step, teacher_params=teacher_params)
  val = _validation_batches(val_tasks, eval_batch_size, inputs_length, targets_length)
  if not eval_only and int(state.step) < total_steps:
    train_step = trainer.make_train_step(model, tx, loss_cfg, step_teacher)
    source = pipeline.get_batches(mixture, "train", batch_size, inputs_length, targets_length,
                                  shuffle=True, seed=seed)
    batches = batching.bucketed_batches(source, window=bucket_window, seed=seed,
                                        start_batch=int(state.step))
    state, counters = _train_loop(state, counters, batches, train_step, eval_step, val,
                                  ckpt, schedule, step_teacher and teacher_params,
                                  total_steps=total_steps,
                                  seed=seed, log_every=log_every, eval_every=eval_every,
                                  save_every_minutes=save_every_minutes,
                                  save_every_steps=save_every_steps)
    if int(state.step) < total_steps:
      ckpt.close()
      return {}
  ckpt.close()
  return _finish(model_dir, model, state, counters, eval_step, val, n_params,
                 targets_length=targets_length, inputs_length=inputs_length,
                 total_steps=total_steps, test_examples=test_examples,
                 eval_batch_size=eval_batch_size, teacher_dir=teacher_dir, loss_cfg=loss_cfg,
                 mixture=mixture, init_from=init_from)


def _initial_params(model: T5Model | SharedEncoderModel, init_from: str | None,
                    seed: int) -> dict:
  """A random init, or the parameters of `init_from`.

  A model of the same kind must match in every shape. A shared-encoder student may start
  from a T5 (e.g. a draft of the same decoder shape): it takes the T5's embedding and every
  decoder parameter of its own shape; the rest (the cross-attention key / value kernels,
  which read the target's wider encoder) keep their random init, and are listed.
  """
  params = model.init_params(jax.random.PRNGKey(seed))
  if not init_from:
    return params
  source, loaded = load_model(init_from, dropout_rate=0.0)
  want = jax.tree.map(lambda x: x.shape, params)
  if type(source) is type(model):
    if jax.tree.map(lambda x: x.shape, loaded) != want:
      raise ValueError(f"train.init_from={init_from!r} holds a {type(source).__name__} of "
                       f"other shapes than the configured one ({model.config}); use a "
                       "checkpoint of the same architecture, or no init_from.")
    return jax.device_put(loaded)
  if not (isinstance(model, SharedEncoderModel) and isinstance(source, T5Model)):
    raise ValueError(f"train.init_from={init_from!r} holds a {type(source).__name__}; a "
                     f"{type(model).__name__} starts only from its own kind"
                     + (" or a T5" if isinstance(model, SharedEncoderModel) else "") + ".")
  flat = {path: value for path, value in jax.tree_util.tree_flatten_with_path(loaded)[0]}
  kept_random = []

  def pick(path, init):
    value = flat.get(path)
    if value is None or value.shape != init.shape:
      kept_random.append(jax.tree_util.keystr(path))
      return init
    return jnp.asarray(value, init.dtype)

  params = jax.tree_util.tree_map_with_path(pick, params)
  print(f"Started from {init_from} except {len(kept_random)} parameters of other shapes "
        f"(random init): {', '.join(kept_random)}", flush=True)
  return params


def _counter_arrays(counters: dict) -> dict:
  """Python counters as 0-d arrays (what Orbax saves): float64 / int64."""
  return {k: np.asarray(v, np.float64 if isinstance(v, float) else np.int64)
          for k, v in counters.items()}


def _train_loop(state, counters, batches: Iterator[dict], train_step, eval_step, val, ckpt,
                schedule, teacher_params, *, total_steps: int, seed: int, log_every: int,
                eval_every: int, save_every_minutes: float, save_every_steps: int):
  """Steps until `total_steps` or a stop signal; saves periodically and on the way out."""
  rng = jax.random.PRNGKey(seed + 1)
  start_step = int(state.step)
  wall0 = counters["wall_time_s"]
  t_start = t_log = t_save = time.monotonic()
  tokens_since_log, shapes_seen = 0, set()
  metric_sums, steps_since_log = None, 0  # Progress lines report means since the last one.

  def snapshot():
    counters["wall_time_s"] = wall0 + time.monotonic() - t_start
    return {"state": state, "counters": _counter_arrays(counters)}

  with StopFlag() as stop:
    try:
      while int(state.step) < total_steps and not stop.requested:
        batch = next(batches)
        shape = (batch["encoder_input_tokens"].shape, batch["decoder_target_tokens"].shape)
        if shape not in shapes_seen:
          shapes_seen.add(shape)
          print(f"step {int(state.step)}: first batch of shape inputs {shape[0]}, targets "
                f"{shape[1]} (compiling the train step for it).", flush=True)
        n_in = int(np.count_nonzero(batch["encoder_input_tokens"]))
        n_tgt = int(batch["decoder_loss_weights"].sum())
        step_rng = jax.random.fold_in(rng, state.step)
        state, metrics = train_step(state, batch, step_rng, teacher_params)
        metric_sums = metrics if metric_sums is None else jax.tree.map(
            jnp.add, metric_sums, metrics)
        steps_since_log += 1
        counters["input_tokens"] += n_in
        counters["target_tokens"] += n_tgt
        tokens_since_log += n_in + n_tgt
        step = int(state.step)
        if step % log_every == 0 or step == total_steps:
          now = time.monotonic()
          rate = tokens_since_log / (now - t_log)
          eta = (now - t_start) / (step - start_step) * (total_steps - step)
          m = {k: float(v) / steps_since_log for k, v in jax.device_get(metric_sums).items()}
          print(f"step {step}/{total_steps} mean of {steps_since_log} steps: loss "
                f"{m['loss']:.4f} (label {m['label_loss']:.4f} distill "
                f"{m['distill_loss']:.4f}) acc {m['accuracy']:.3f} gnorm {m['grad_norm']:.2f} "
                f"| lr {float(schedule(step)):.2e} | "
                f"{rate:.0f} tok/s | elapsed {_fmt_duration(wall0 + now - t_start)} "
                f"ETA {_fmt_duration(eta)}", flush=True)
          t_log, tokens_since_log, metric_sums, steps_since_log = now, 0, None, 0
        if step % eval_every == 0:
          losses = _run_validation(eval_step, state.params, val)
          print(f"step {step} validation loss " + " ".join(
              f"{k} {v:.4f}" for k, v in losses.items()), flush=True)
        if (time.monotonic() - t_save >= 60 * save_every_minutes
            or (save_every_steps and step % save_every_steps == 0)):
          ckpt.save(step, snapshot())
          t_save = time.monotonic()
          print(f"step {step} checkpoint saved.", flush=True)
    finally:
      ckpt.save(int(state.step), snapshot())
      print(f"step {int(state.step)} checkpoint saved.", flush=True)
  return state, counters


def _finish(model_dir: str, model: T5Model, state, counters, eval_step, val, n_params: int,
            *, targets_length: int, inputs_length: int, total_steps: int,
            test_examples: int | None, eval_batch_size: int, teacher_dir: str | None,
            loss_cfg: trainer.LossConfig, mixture: str, init_from: str | None) -> dict:
  """Validation loss, test BLEU / ROUGE-L, export and `train_summary.json`.

  A shared-encoder draft decodes only beside its target, so it gets no BLEU / ROUGE-L
  (its acceptance rate, `experiments.measure_alpha`, is what it is for).
  """
  params = state.params
  losses = _run_validation(eval_step, params, val)
  quality = {c: (None, 0, 0.0, []) for c in ("ende", "mansum")}
  extra_files = {"spiece.model": vocab.default_vocab_path()}
  if isinstance(model, SharedEncoderModel):
    save_shared_encoder_checkpoint(os.path.join(model_dir, HF_DIR), model, params,
                                   extra_files=extra_files,
                                   metadata={"target": _target_identity(teacher_dir)})
  else:
    quality = _test_quality(model, params, inputs_length=inputs_length,
                            targets_length=targets_length, test_examples=test_examples,
                            eval_batch_size=eval_batch_size)
    print(f"test BLEU (ende) {quality['ende'][0]:.2f}  ROUGE-L (mansum) "
          f"{quality['mansum'][0]:.2f}", flush=True)
    save_hf_checkpoint(os.path.join(model_dir, HF_DIR), model.config, params,
                       extra_files=extra_files)
  summary = {
      "model_config": model.config.to_hf_dict(),
      "student": "shared_encoder" if isinstance(model, SharedEncoderModel) else "t5",
      "init_from": init_from,
      "params": n_params,
      "steps": int(state.step),
      "total_steps": total_steps,
      "input_tokens_seen": counters["input_tokens"],
      "target_tokens_seen": counters["target_tokens"],
      "train_wall_time_s": counters["wall_time_s"],
      "validation_loss": losses,
      "test_bleu_ende": quality["ende"][0],
      "test_rougeL_mansum": quality["mansum"][0],
      "test_examples": {c: q[1] for c, q in quality.items()},
      "test_decode": f"greedy, max_decode_len={targets_length}, inputs cut to {inputs_length}",
      "test_samples": {c: q[3] for c, q in quality.items()},
      "teacher_dir": teacher_dir,
      "loss": {"label_smoothing": loss_cfg.label_smoothing, "z_loss": loss_cfg.z_loss,
               "distill_weight": loss_cfg.distill_weight,
               "distill_temperature": loss_cfg.distill_temperature,
               "distill_divergence": loss_cfg.distill_divergence},
      "data": {"mixture": mixture, "data_dir": layout.default_data_dir()},
      "gin_config": gin.config_str(),
  }
  atomic_io.write_json(os.path.join(model_dir, SUMMARY), summary)
  print(f"Wrote {os.path.join(model_dir, HF_DIR)} and {SUMMARY}.", flush=True)
  return summary


def _test_quality(model: T5Model, params: dict, *, inputs_length: int, targets_length: int,
                  test_examples: int | None, eval_batch_size: int) -> dict[str, tuple]:
  """Per corpus: (BLEU or ROUGE-L of greedy test outputs, examples, seconds, 3 samples)."""
  processor = vocab.load_processor(vocab.default_vocab_path())
  quality = {}
  for corpus, metric in (("ende", evaluation.corpus_bleu), ("mansum", evaluation.mean_rouge_l)):
    pairs = corpora.read_text_pairs(corpus, "test", max_examples=test_examples)
    t0 = time.monotonic()
    hyps = evaluation.greedy_decode_texts(model, params, [p[0] for p in pairs], processor,
                                          inputs_length=inputs_length,
                                          max_decode_len=targets_length,
                                          batch_size=eval_batch_size)
    quality[corpus] = (metric(hyps, [p[1] for p in pairs]), len(pairs),
                       time.monotonic() - t0, hyps[:3])
  return quality


def _target_identity(teacher_dir: str) -> dict:
  """Which target a shared-encoder draft reads: its path and its weights' sha256."""
  with open(os.path.join(teacher_dir, "model.safetensors"), "rb") as f:
    digest = hashlib.sha256(f.read()).hexdigest()
  return {"path": teacher_dir, "model_safetensors_sha256": digest,
          "config": load_hf_config(teacher_dir).to_hf_dict()}
