"""The training driver: trains a T5 (or a shared-encoder draft) on the specdec mixture,
resumably; evaluates; exports (HuggingFace format; a shared-encoder draft in our format,
`checkpoints.load_model`). `python -m experiments.train` is its command.

`train(model_dir, config)` (gin: `train.config = @TrainConfig()`, `TrainConfig.X = ...`)
writes into `model_dir`: `checkpoints/` (Orbax, the last few), `hf/` (HF T5 format with
the vocabulary as `spiece.model`) and `train_summary.json`. Rerunning resumes from the
latest checkpoint (SIGTERM / Ctrl-C save one first); a finished run is not retrained.
The steps, losses and optimizer are `specdec_jax.training`.

Three sources of batches: the seqio mixture (`TrainConfig.source = "pipeline"`; a teacher
term runs the target in every step), the target's stored signals (`"signals"`:
`data.teacher_signals`, held in memory by `training.signals_source`; the step runs the
student alone, `training.sparse_distill`), or their inputs with the student's own samples
scored by the target in the step (`"on_policy"`, `training.on_policy`). With
`TrainConfig.alpha_every_steps` the draft's acceptance rate against the target is
measured during training (`training.alpha_tracking`: `alpha_curve.json`, `best/`), and the
best parameters by alpha, not the last ones, are exported to `hf/`.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import hashlib
import math
import os
import time
from collections.abc import Callable, Iterator

import gin
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import atomic_io
from specdec_jax.data import corpora, layout, pipeline, teacher_signals, vocab
from specdec_jax.distillation.teacher import teacher_sha256
from specdec_jax.models.t5 import SharedEncoderModel, T5Config, T5Model
from specdec_jax.models.t5.checkpoints import (
  load_hf_checkpoint,
  load_hf_config,
  load_model,
  save_hf_checkpoint,
  save_shared_encoder_checkpoint,
)
from specdec_jax.training import (
  batching,
  evaluation,
  loop,
  on_policy,
  optimizer,
  signals_source,
  sparse_distill,
  trainer,
)
from specdec_jax.training.alpha_tracking import (
  AlphaProbe,
  AlphaTracker,
  held_out_inputs,
)
from specdec_jax.training.checkpointing import Checkpointer

SUMMARY = "train_summary.json"
STUDENTS = ("t5", "shared_encoder")
SOURCES = ("pipeline", "signals", "on_policy")
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
  """Per-task and token-weighted overall validation loss ({} without tasks)."""
  if not val:
    return {}
  losses, total_loss, total_tokens = {}, 0.0, 0
  for task, batches in val.items():
    loss, tokens = evaluation.validation_loss(eval_step, params, batches)
    losses[task] = loss
    total_loss += loss * tokens
    total_tokens += tokens
  losses["all"] = total_loss / total_tokens
  return losses


@gin.configurable
@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
  """What a T5 run trains, on what, and how long (gin: `TrainConfig.X`).

  The model's shape, the loss, the learning rate and the optimizer are `train`'s
  arguments, each its own configurable that the command builds. Checked when made: a
  bad value raises ValueError naming the field and the fix, before anything loads.

  Attributes:
    total_steps: optimizer steps (one batch each).
    passes: with source "signals" or "on_policy", the length of the run in passes over
      the data instead: total_steps = ceil(passes * steps per pass), replacing
      `total_steps`.
    source: "pipeline": batches of `mixture` through seqio (the target runs in the step
      for a teacher term, or as a shared-encoder student's encoder); "signals": the
      target's stored signals along the distillation data of `signals_tasks`, held in
      memory (`training.signals_source`); the step runs the student alone
      (`training.sparse_distill`, LossConfig's terms on the stored top-k);
      "on_policy": the same batches' inputs and stored encoder outputs, with the
      student's own samples scored by the target's decoder in the step
      (`training.on_policy`: LossConfig's teacher term alone; a shared-encoder student).
    mixture: seqio Task or Mixture to train on (source "pipeline").
    signals_tasks: corpora whose distillation data and signals are read (sources
      "signals" and "on_policy"; `<data_dir>/distill/<corpus>/`).
    batch_size: rows per batch.
    inputs_length: encoder length (longer inputs are cut); also alpha's input length.
    targets_length: decoder length (longer targets are cut); also the test and alpha
      decode length.
    seed: parameter init, dropout, shuffle and bucketing seed; alpha's sampling seed.
    bucket_window: batches sorted together by length (see `batching`).
    log_every: steps between progress lines.
    eval_every: steps between validation losses.
    save_every_minutes: wall-clock minutes between checkpoints.
    save_every_steps: also save every this many steps (0: off).
    keep_checkpoints: checkpoints kept.
    teacher_dir: HF-format teacher (the target): for distillation in the step
      (`LossConfig.distill_weight > 0`, source "pipeline"), the encoder a shared-encoder
      student reads, and the target alpha is measured against.
    student: "t5" (a T5 of `train`'s `model_cfg`), or "shared_encoder": a decoder of
      `model_cfg`'s decoder settings that reads the teacher's encoder outputs
      (`models.shared_encoder`; needs `teacher_dir`).
    init_from: a model directory (`checkpoints.load_model`) of the same architecture to
      start from instead of a random init (e.g. a draft to fine-tune on distillation data).
    val_tasks: tasks whose validation loss is reported.
    test_examples: cap on test examples per task decoded (None: all).
    eval_batch_size: rows per validation / test-decoding batch.
    alpha_every_steps: measure the student's alpha against the teacher every this many
      steps, and at the first and last step (`training.alpha_tracking`); the export is
      then the best parameters by alpha. 0: off (the last parameters are exported).
    alpha_examples: held-out inputs per task, evenly spaced through its validation split.
    alpha_tasks: corpora alpha is measured on.
    alpha_temperatures: sampling temperatures alpha is measured at.
    alpha_gamma: draft tokens per target call when measuring alpha.
    alpha_batch_size: rows decoded together when measuring alpha.
    alpha_select_task: the task whose alpha, averaged over the temperatures, picks the
      best parameters.
  """

  total_steps: int | None = None
  passes: float | None = None
  source: str = "pipeline"
  mixture: str = "specdec_mix"
  signals_tasks: tuple[str, ...] = ("ende", "mansum")
  batch_size: int = 64
  inputs_length: int = 128
  targets_length: int = 64
  seed: int = 0
  bucket_window: int = 32
  log_every: int = 50
  eval_every: int = 1000
  save_every_minutes: float = 10.0
  save_every_steps: int = 0
  keep_checkpoints: int = 2
  teacher_dir: str | None = None
  student: str = "t5"
  init_from: str | None = None
  val_tasks: tuple[str, ...] = ("specdec_ende", "specdec_mansum")
  test_examples: int | None = None
  eval_batch_size: int = 64
  alpha_every_steps: int = 0
  alpha_examples: int = 128
  alpha_tasks: tuple[str, ...] = ("ende", "mansum")
  alpha_temperatures: tuple[float, ...] = (0.0, 1.0)
  alpha_gamma: int = 3
  alpha_batch_size: int = 32
  alpha_select_task: str = "ende"

  def __post_init__(self) -> None:
    _check_config(self)


@gin.configurable(allowlist=["config"])
def train(model_dir: str, config: TrainConfig = gin.REQUIRED, *, model_cfg: T5Config,
          loss_cfg: trainer.LossConfig, learning_rate: optimizer.LearningRate,
          optimizer_cfg: optimizer.Optimizer, eval_only: bool = False) -> dict:
  """Trains (resuming), then evaluates and exports; returns the summary.

  Args:
    model_dir: run directory.
    config: what to train and how (gin: `train.config = @TrainConfig()`).
    model_cfg: the student's architecture (`model_config()`, built by the command).
    loss_cfg: the loss (`trainer.LossConfig()`).
    learning_rate: the schedule's settings (`optimizer.LearningRate()`).
    optimizer_cfg: the optimizer (`optimizer.Optimizer()`).
    eval_only: skip training; evaluate and export the latest checkpoint (the best one by
      alpha, if alpha was measured).
  """
  os.makedirs(model_dir, exist_ok=True)
  total_steps = config.total_steps
  if config.source == "signals":
    sparse_distill.check_loss_config(loss_cfg)
  teacher_model, teacher_params = None, None
  if config.teacher_dir:
    teacher_cfg, teacher_params = load_hf_checkpoint(config.teacher_dir, dropout_rate=0.0)
    teacher_model = T5Model(teacher_cfg)
    teacher_params = jax.device_put(teacher_params)
  shared = config.student == "shared_encoder"
  model = (SharedEncoderModel(model_cfg, teacher_model.config.d_model) if shared
           else T5Model(model_cfg))
  signals = None
  if config.source in ("signals", "on_policy"):
    signals = _signals_batches(model, config.signals_tasks, config.teacher_dir,
                               batch_size=config.batch_size, seed=config.seed,
                               window=config.bucket_window)
    if config.passes is not None:
      total_steps = math.ceil(config.passes * signals.steps_per_pass)
      print(f"{config.passes:g} passes of {signals.steps_per_pass} steps: {total_steps} steps.",
            flush=True)
  schedule = learning_rate.schedule(total_steps)
  tx = optimizer_cfg.build(schedule)
  init_params = _initial_params(model, config.init_from, config.seed)

  state = trainer.TrainState.create(init_params, tx)
  counters = {"wall_time_s": 0.0, "input_tokens": 0, "target_tokens": 0}
  ckpt = Checkpointer(model_dir, keep=config.keep_checkpoints)
  restored = ckpt.restore({"state": state, "counters": _counter_arrays(counters)})
  if restored is not None:
    state = restored["state"]
    counters = {k: type(v)(restored["counters"][k]) for k, v in counters.items()}
    print(f"Resumed from step {int(state.step)} in {ckpt.directory}.", flush=True)
  elif eval_only:
    raise FileNotFoundError(f"--eval_only: no checkpoint in {ckpt.directory}; train first.")
  n_params = sum(int(x.size) for x in jax.tree.leaves(state.params))
  print(f"Model {model_cfg}\n{n_params / 1e6:.2f}M parameters.", flush=True)

  eval_step = trainer.make_eval_step(
      model, teacher_model if shared else None)
  if shared:
    eval_step = functools.partial(eval_step, teacher_params=teacher_params)
  val = _validation_batches(config.val_tasks, config.eval_batch_size, config.inputs_length,
                            config.targets_length)
  export = _exporter(model, config.teacher_dir)
  tracker = None
  if config.alpha_every_steps:
    probe = AlphaProbe(teacher_model, teacher_params,
                       held_out_inputs(config.alpha_tasks, config.alpha_examples,
                                       config.inputs_length),
                       tuple(config.alpha_temperatures), config.alpha_gamma,
                       config.targets_length, config.alpha_batch_size, config.seed)
    tracker = AlphaTracker(
        model_dir, probe, model=model, every_steps=config.alpha_every_steps,
        total_steps=total_steps,
        select_task=config.alpha_select_task, export=export,
        passes=signals.passes if signals else None,
        recipe=_recipe(model_dir, model, source=config.source, init_from=config.init_from,
                       batch_size=config.batch_size, loss_cfg=loss_cfg))
  if not eval_only and int(state.step) < total_steps:
    if config.source == "on_policy":
      train_step = functools.partial(
          on_policy.make_on_policy_train_step(model, teacher_model, tx, loss_cfg),
          teacher_params=teacher_params)
      batches = signals.batches(int(state.step))
    elif config.source == "signals":
      train_step = sparse_distill.make_signals_train_step(model, tx, loss_cfg)
      batches = signals.batches(int(state.step))
    else:
      # The teacher joins the step for its logits, or as a shared-encoder student's encoder.
      step_teacher = teacher_model if (loss_cfg.distill_weight > 0
                                       or shared) else None
      train_step = functools.partial(trainer.make_train_step(model, tx, loss_cfg, step_teacher),
                                     teacher_params=step_teacher and teacher_params)
      source_batches = pipeline.get_batches(config.mixture, "train", config.batch_size,
                                            config.inputs_length, config.targets_length,
                                            shuffle=True, seed=config.seed)
      batches = batching.bucketed_batches(source_batches, window=config.bucket_window,
                                          seed=config.seed,
                                          start_batch=int(state.step))
    state, counters = _train_loop(state, counters, batches, train_step, eval_step, val,
                                  ckpt, schedule, tracker, total_steps=total_steps,
                                  seed=config.seed, log_every=config.log_every,
                                  eval_every=config.eval_every,
                                  save_every_minutes=config.save_every_minutes,
                                  save_every_steps=config.save_every_steps)
    if int(state.step) < total_steps:
      ckpt.close()
      return {}
  ckpt.close()
  params, exported_step = state.params, int(state.step)
  if tracker is not None and tracker.best is not None:
    params, exported_step = jax.device_put(load_model(tracker.best_dir)[1]), tracker.best["step"]
    print(f"Exporting the best parameters by alpha: step {exported_step} (score "
          f"{tracker.best['score']:.4f}).", flush=True)
  return _finish(model_dir, model, params, exported_step, state, counters, eval_step, val,
                 n_params, export=export, alpha_best=tracker and tracker.best,
                 targets_length=config.targets_length, inputs_length=config.inputs_length,
                 total_steps=total_steps, test_examples=config.test_examples,
                 eval_batch_size=config.eval_batch_size, teacher_dir=config.teacher_dir,
                 loss_cfg=loss_cfg,
                 data={"source": config.source, "mixture": config.mixture,
                       "signals_tasks": config.signals_tasks,
                       "data_dir": layout.default_data_dir()},
                 init_from=config.init_from)


def _check_config(config: TrainConfig) -> None:
  """Raises ValueError, naming the setting and the fix, before anything loads."""
  c = config
  if c.student not in STUDENTS:
    raise ValueError(f"TrainConfig.student={c.student!r} is unknown; use one of {STUDENTS}.")
  if c.source not in SOURCES:
    raise ValueError(f"TrainConfig.source={c.source!r} is unknown; use one of {SOURCES}.")
  if c.source == "on_policy" and c.student != "shared_encoder":
    raise ValueError("TrainConfig.source='on_policy' trains a shared-encoder draft on the "
                     "stored encoder outputs: set TrainConfig.student='shared_encoder'.")
  if c.student == "shared_encoder" and not c.teacher_dir:
    raise ValueError("TrainConfig.student='shared_encoder' reads the target's encoder: set "
                     "TrainConfig.teacher_dir to the target's checkpoint directory.")
  if c.alpha_every_steps and not c.teacher_dir:
    raise ValueError("TrainConfig.alpha_every_steps measures alpha against the target: set "
                     "TrainConfig.teacher_dir to the target's checkpoint directory.")
  if c.alpha_every_steps < 0:
    raise ValueError(f"TrainConfig.alpha_every_steps must be >= 0 (0: off), got "
                     f"{c.alpha_every_steps}.")
  if c.alpha_every_steps and c.alpha_select_task not in c.alpha_tasks:
    raise ValueError(f"TrainConfig.alpha_select_task={c.alpha_select_task!r} is not measured: "
                     f"use one of TrainConfig.alpha_tasks {tuple(c.alpha_tasks)}.")
  if c.passes is not None and (c.source == "pipeline" or c.passes <= 0):
    raise ValueError(f"TrainConfig.passes={c.passes} counts passes over the stored signals: "
                     "use it with TrainConfig.source='signals' or 'on_policy' and a value > 0, "
                     "or set TrainConfig.total_steps.")
  if c.passes is None and (not isinstance(c.total_steps, int) or c.total_steps < 1):
    raise ValueError(f"TrainConfig.total_steps={c.total_steps!r}: set it to the steps to train "
                     "(>= 1), or TrainConfig.passes with TrainConfig.source='signals'.")


def _signals_batches(model: T5Model | SharedEncoderModel, tasks: tuple[str, ...],
                     teacher_dir: str | None, *, batch_size: int, seed: int,
                     window: int) -> signals_source.SignalsBatches:
  """The stored signals of `tasks`, in memory, as batches (a T5 student's without the
  encoder outputs, which it does not read), after checking that `teacher_dir` made them."""
  t0 = time.monotonic()
  if teacher_dir:
    sha = teacher_sha256(teacher_dir)
    for task in tasks:
      directory = teacher_signals.corpus_signals_dir(task)
      if teacher_signals.read_manifest(directory)["settings"]["teacher_sha256"] != sha:
        raise ValueError(f"{directory} holds the signals of another target than "
                         f"TrainConfig.teacher_dir={teacher_dir!r}: set TrainConfig.teacher_dir "
                         "to the target that made them, or recompute them with it (`python -m "
                         "experiments.teacher_signals`).")
  shared = isinstance(model, SharedEncoderModel)
  data = signals_source.read_packed(tasks, with_hidden=shared)
  if shared and data.hidden_width != model.encoder_d_model:
    raise ValueError(f"The stored encoder outputs are {data.hidden_width} wide, the student "
                     f"reads {model.encoder_d_model} (TrainConfig.teacher_dir's d_model): train "
                     "against the target that made the signals.")
  print(f"Read the stored signals of {', '.join(tasks)}: {data.num_examples} inputs, "
        f"{data.num_pairs} pairs, top-{data.top_k}, {data.nbytes / 2**30:.2f} GiB in memory "
        f"({time.monotonic() - t0:.0f} s).", flush=True)
  return signals_source.SignalsBatches(data, batch_size=batch_size, seed=seed, window=window)


def _exporter(model: T5Model | SharedEncoderModel, teacher_dir: str | None
              ) -> Callable[[str, dict], None]:
  """`(directory, params)` -> the model written there in its export format, with the
  vocabulary: HF T5, or a shared-encoder draft naming its target."""
  extra_files = {"spiece.model": vocab.default_vocab_path()}
  if isinstance(model, SharedEncoderModel):
    metadata = {"target": _target_identity(teacher_dir)}
    return lambda path, params: save_shared_encoder_checkpoint(
        path, model, params, extra_files=extra_files, metadata=metadata)
  return lambda path, params: save_hf_checkpoint(path, model.config, params,
                                                 extra_files=extra_files)


def _recipe(model_dir: str, model: T5Model | SharedEncoderModel, *, source: str,
            init_from: str | None, batch_size: int, loss_cfg: trainer.LossConfig) -> dict:
  """What a run trains, as its alpha curve records it."""
  cfg = model.config
  return {"name": os.path.basename(os.path.normpath(model_dir)), "source": source,
          "student": "shared_encoder" if isinstance(model, SharedEncoderModel) else "t5",
          "init_from": init_from, "d_model": cfg.d_model,
          "decoder_layers": cfg.num_decoder_layers,
          "batch_size": batch_size, "distill_weight": loss_cfg.distill_weight,
          "distill_divergence": loss_cfg.distill_divergence}


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
      raise ValueError(f"TrainConfig.init_from={init_from!r} holds a {type(source).__name__} of "
                       f"other shapes than the configured one ({model.config}); use a "
                       "checkpoint of the same architecture, or no init_from.")
    return jax.device_put(loaded)
  if not (isinstance(model, SharedEncoderModel) and isinstance(source, T5Model)):
    raise ValueError(f"TrainConfig.init_from={init_from!r} holds a {type(source).__name__}; a "
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
                schedule, tracker: AlphaTracker | None, *, total_steps: int, seed: int,
                log_every: int, eval_every: int, save_every_minutes: float,
                save_every_steps: int):
  """`loop.train_loop` with this driver's work between steps: progress lines (means since
  the last line), validation, alpha where `tracker` is due (the first step, every N-th, the
  last; each after a checkpoint at that step) and checkpoints every `save_every_minutes`
  or `save_every_steps`. The alpha measurements' time is not counted in the run's
  `wall_time_s`.

  `train_step(state, batch, rng)`.
  """
  start_step = int(state.step)
  wall0 = counters["wall_time_s"]
  t_start = time.monotonic()
  clock = {"log": t_start, "save": t_start, "alpha_s": 0.0}  # alpha_s: this session's.
  tokens_since_log, shapes_seen = [0], set()
  # (metric sums, steps) since the last progress line, and alpha measurement.
  sums = {"log": (None, 0), **({"alpha": (None, 0)} if tracker is not None else {})}

  def snapshot(st):
    counters["wall_time_s"] = wall0 + time.monotonic() - t_start - clock["alpha_s"]
    return {"state": st, "counters": _counter_arrays(counters)}

  def means(key: str) -> dict[str, float]:
    total, steps = sums[key]
    sums[key] = (None, 0)
    return {} if total is None else {k: float(v) / steps
                                     for k, v in jax.device_get(total).items()}

  def counted_step(st, batch, rng):
    shape = (batch["encoder_input_tokens"].shape, batch["decoder_target_tokens"].shape)
    if shape not in shapes_seen:
      shapes_seen.add(shape)
      print(f"step {int(st.step)}: first batch of shape inputs {shape[0]}, targets "
            f"{shape[1]} (compiling the train step for it).", flush=True)
    n_in = int(np.count_nonzero(batch["encoder_input_tokens"]))
    n_tgt = int(batch["decoder_loss_weights"].sum())
    st, metrics = train_step(st, batch, rng)
    for key, (total, steps) in sums.items():
      sums[key] = (metrics if total is None else jax.tree.map(jnp.add, total, metrics),
                   steps + 1)
    counters["input_tokens"] += n_in
    counters["target_tokens"] += n_tgt
    tokens_since_log[0] += n_in + n_tgt
    return st, metrics

  def measure_alpha(step: int, st) -> None:
    ckpt.save(step, snapshot(st))  # A restarted run re-measures only what the curve lacks.
    t0 = time.monotonic()
    entry = tracker.measure(step, st.params, wall_time_s=counters["wall_time_s"],
                            train=means("alpha"))
    clock["alpha_s"] += time.monotonic() - t0
    clock["log"] = time.monotonic()  # The measurement is no part of the next line's rate.
    print(f"step {step} alpha " + " ".join(f"{task} {k} {a:.4f}" for task, by_t in
                                           entry["alpha"].items() for k, a in by_t.items())
          + f" (score {entry['score']:.4f}, best {tracker.best['score']:.4f} at step "
          f"{tracker.best['step']}; {entry['alpha_eval_s']:.0f} s)", flush=True)

  def log(step: int, _st, _metrics) -> None:
    now = time.monotonic()
    rate = tokens_since_log[0] / (now - clock["log"])
    eta = (now - t_start - clock["alpha_s"]) / (step - start_step) * (total_steps - step)
    steps = sums["log"][1]
    m = means("log")
    print(f"step {step}/{total_steps} mean of {steps} steps: loss "
          f"{m['loss']:.4f} (label {m['label_loss']:.4f} distill "
          f"{m['distill_loss']:.4f}) acc {m['accuracy']:.3f} gnorm {m['grad_norm']:.2f} "
          f"| lr {float(schedule(step)):.2e} | "
          f"{rate:.0f} tok/s | elapsed "
          f"{_fmt_duration(wall0 + now - t_start - clock['alpha_s'])} "
          f"ETA {_fmt_duration(eta)}", flush=True)
    clock["log"], tokens_since_log[0] = now, 0

  def validate(step: int, st, _metrics) -> None:
    losses = _run_validation(eval_step, st.params, val)
    print(f"step {step} validation loss " + " ".join(
        f"{k} {v:.4f}" for k, v in losses.items()), flush=True)

  def save_due(step: int) -> bool:
    return (time.monotonic() - clock["save"] >= 60 * save_every_minutes
            or bool(save_every_steps and step % save_every_steps == 0))

  def save(step: int, st, _metrics=None) -> None:
    ckpt.save(step, snapshot(st))
    clock["save"] = time.monotonic()
    print(f"step {step} checkpoint saved.", flush=True)

  work = [loop.Due(loop.every(log_every, total_steps), log)]
  if val:
    work.append(loop.Due(lambda step: step % eval_every == 0, validate))
  if tracker is not None:
    if tracker.due(start_step):
      measure_alpha(start_step, state)
    work.append(loop.Due(tracker.due, lambda step, st, _: measure_alpha(step, st)))
  work.append(loop.Due(save_due, save))
  state, _ = loop.train_loop(state, batches, counted_step, total_steps=total_steps, seed=seed,
                             save=save, work=work)
  return state, counters


def _finish(model_dir: str, model: T5Model | SharedEncoderModel, params: dict,
            exported_step: int, state, counters, eval_step, val, n_params: int, *,
            export: Callable[[str, dict], None], alpha_best: dict | None,
            targets_length: int, inputs_length: int, total_steps: int,
            test_examples: int | None, eval_batch_size: int, teacher_dir: str | None,
            loss_cfg: trainer.LossConfig, data: dict, init_from: str | None) -> dict:
  """Validation loss, test BLEU / ROUGE-L, export of `params` (those of step
  `exported_step`) and `train_summary.json`.

  A shared-encoder draft decodes only beside its target, so it gets no BLEU / ROUGE-L
  (its acceptance rate, `experiments.measure_alpha`, is what it is for).
  """
  losses = _run_validation(eval_step, params, val)
  quality = {c: (None, 0, 0.0, []) for c in ("ende", "mansum")}
  if not isinstance(model, SharedEncoderModel):
    quality = _test_quality(model, params, inputs_length=inputs_length,
                            targets_length=targets_length, test_examples=test_examples,
                            eval_batch_size=eval_batch_size)
    print(f"test BLEU (ende) {quality['ende'][0]:.2f}  ROUGE-L (mansum) "
          f"{quality['mansum'][0]:.2f}", flush=True)
  export(os.path.join(model_dir, HF_DIR), params)
  summary = {
      "model_config": model.config.to_hf_dict(),
      "student": "shared_encoder" if isinstance(model, SharedEncoderModel) else "t5",
      "init_from": init_from,
      "params": n_params,
      "steps": int(state.step),
      "total_steps": total_steps,
      "exported_step": exported_step,
      "alpha_best": alpha_best,
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
      "data": data,
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
