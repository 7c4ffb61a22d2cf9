"""Training a decoder-only draft for a GGUF target on its stored signals, resumably.

  python -m experiments.train --gin_file=gin_configs/train/draft_smollm2.gin \
      --model_dir=checkpoints/draft_smollm2

The target's outputs and signals come from `experiments.distill_data` and
`experiments.teacher_signals` (`--teacher=smollm2`): the training split's under
`StudentTrainConfig.signals_root`, held-out validation prompts' under
`validation_root`. The draft (`models.llama.student`) scores a shortlist of the
`head_size` tokens the target emits most often in the training outputs (EOS always
kept; written once to `<model_dir>/head_tokens.npy`, so a resumed run keeps it). Every
`eval_every` steps the acceptance rate on the validation outputs is estimated
(`student_distill.make_eval_step`: alpha at T = 0 and a lower bound at T = 1) and
appended to `<model_dir>/alpha_curve.json`; checkpoints every `checkpoint_every`
steps and on SIGTERM / Ctrl-C (`training.checkpointing`). At the end the draft is
saved (float16) to `<model_dir>/export/` (`student_io`), with the curve.

With `reads_features` the draft also reads the target's features (EAGLE-style:
`models.llama.feature_draft`), stored along the prompts and outputs by
`experiments.teacher_signals`; its held-out alpha is then that of the first proposal
of each iteration (teacher-forced: every input feature is the target's own), and
`alpha_t0_second` that of the second, reading its own predicted features.

Two stages (issue 58's recipe): a first run on the in-domain corpus's signals
(`tasks=("docs",)`, validated on the chat tasks' held-out outputs through
`validation_tasks`), then a second that starts from the first's export (`init_from`: its
shape and shortlist are kept) and trains on the target's own outputs, optionally with the
training-time test (`test_steps`). Each curve point records the training tokens seen.

With `decoded_examples` > 0 each evaluation also decodes that many validation prompts per
held-out task with the real speculative loop against the target (`alpha_tracking.
measure_alpha`, gamma `decoded_gamma`, T = 0 and 1, the same key every time): the decoded
alpha, "decoded" in the curve: what the loop gets where later proposals read the draft's
own tokens and features, not the target's.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable

import gin
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import atomic_io
from specdec_jax.data import chat_prompts, layout
from specdec_jax.decoding.sampling import Warp
from specdec_jax.decoding.scorer import Scorer
from specdec_jax.distillation.head_tokens import frequent_tokens
from specdec_jax.distillation.teacher import default_root, gguf_file, teacher_sha256
from specdec_jax.models.llama import LlamaModel, LlamaScorer, gguf_loader, pad_prompts
from specdec_jax.models.llama.student import Student, student_config
from specdec_jax.models.llama.student_io import TargetId, check_target, load_student, save_student
from specdec_jax.training import alpha_tracking, loop, shortlist, student_distill
from specdec_jax.training import optimizer as optimizers
from specdec_jax.training.checkpointing import Checkpointer
from specdec_jax.training.model_card import ModelCard
from specdec_jax.training.signals_source import PackedSignals, SignalsBatches, read_packed
from specdec_jax.training.trainer import LossConfig, TrainState

CURVE = "alpha_curve.json"
DECODED_PROMPT_LEN = 128
HEAD = "head_tokens.npy"
EXPORT = "export"


@gin.configurable
@dataclasses.dataclass(frozen=True)
class StudentTrainConfig:
  """A draft's shape, its data and its training (gin: `StudentTrainConfig.X`).

  Attributes:
    target: the GGUF target ("smollm2" or a .gguf path).
    tasks: the chat tasks (or text corpora, e.g. "docs") whose signals it trains on.
    validation_tasks: the tasks its held-out alpha is measured on (None: `tasks`).
    signals_root: the training split's distill root (None: `teacher.default_root`).
    validation_root: the validation split's (None: `<signals_root>_validation`).
    init_from: an exported draft to start from (a first stage's `<model_dir>/export`):
      its shape, shortlist and parameters are kept, and this config's shape fields must
      match them.
    d_model: the draft's width.
    num_layers: its blocks.
    head_dim: per attention head.
    kv_groups: query heads per key/value head.
    head_size: the shortlist's length.
    reads_features: read the target's features (`StudentConfig.feature_size`).
    tied_io: the target's own embedding rows in and tied head rows out, no projections
      (`StudentConfig.tied_io`; d_model must be the target's).
    test_steps: passes per step that feed the draft its own predicted features
      (EAGLE-3's training-time test, `student_distill.make_train_step`); 1: none.
    decoded_examples: validation prompts per held-out task decoded at each evaluation
      (the decoded alpha); 0: none.
    decoded_gamma: their gamma.
    decoded_max_len: their most new tokens.
    feature_weight: the weight of the feature loss (`student_distill.student_outputs`).
    batch_size: (example, decoding) pairs per step.
    passes: passes over the training pairs.
    train_fraction: the share of the training examples it trains on (each kept with
      this probability, drawn from `seed`; for a data-scaling curve); validation is
      always whole.
    train_shards: train on each training task's first this many signals shards, which
      may be read while the rest still compute (None: every shard of finished signals).
    eval_every: steps between alpha estimates.
    checkpoint_every: steps between checkpoints.
    seed: initialisation and data order.
  """

  target: str = "smollm2"
  tasks: tuple[str, ...] = ("mansum", "explain")
  validation_tasks: tuple[str, ...] | None = None
  signals_root: str | None = None
  validation_root: str | None = None
  init_from: str | None = None
  d_model: int = 256
  num_layers: int = 2
  head_dim: int = 64
  kv_groups: int = 2
  head_size: int = 8192
  reads_features: bool = False
  tied_io: bool = False
  test_steps: int = 1
  decoded_examples: int = 0
  decoded_gamma: int = 3
  decoded_max_len: int = 48
  feature_weight: float = 1.0
  batch_size: int = 32
  passes: float = 5.0
  train_fraction: float = 1.0
  train_shards: int | None = None
  eval_every: int = 200
  checkpoint_every: int = 200
  seed: int = 0

  @property
  def train_root(self) -> str:
    return self.signals_root or default_root(layout.default_data_dir(), self.target)

  @property
  def held_out_root(self) -> str:
    return self.validation_root or self.train_root.rstrip("/") + "_validation"

  @property
  def held_out_tasks(self) -> tuple[str, ...]:
    return self.validation_tasks or self.tasks


@dataclasses.dataclass(frozen=True)
class _Target:
  embedding: np.ndarray  # float32 [vocab, embed_dim]
  id: TargetId
  eos_id: int
  config: object
  scorer: Scorer | None = None  # The target itself, for the decoded alpha.
  vocabulary: object = None  # Its chat template and tokenizer, for the decoded prompts.


def _load_target(name: str) -> _Target:
  path = gguf_file(name)
  checkpoint = gguf_loader.load_gguf(path)
  embedding = np.asarray(checkpoint.params["token_embedder"]["embedding"], np.float32)
  target_id = TargetId(teacher_sha256(name), embedding.shape[0], embedding.shape[1],
                       os.path.basename(path))
  model = LlamaModel(checkpoint.config)
  return _Target(embedding, target_id, checkpoint.vocabulary.eos_id, checkpoint.config,
                 LlamaScorer(model, model.prepare(checkpoint.params)), checkpoint.vocabulary)


def _decoded_prompts(target: _Target, task: str, count: int) -> np.ndarray:
  """int32 `[count, width]`: `count` validation chat prompts of `task`, evenly spaced."""
  return pad_prompts(chat_prompts.build_prompts(target.vocabulary, task, "validation", count,
                                                DECODED_PROMPT_LEN))


def _decoded_alpha(config: StudentTrainConfig, student: Student, target: _Target,
                   embedding: jax.Array, head_tokens: jax.Array
                   ) -> Callable[[dict], dict[str, dict[str, float]]]:
  """`params -> {task: {"T=0" | "T=1": alpha}}`: the draft decoding against the target
  (`decoded_examples` prompts per held-out task, batch 1, the same key every time)."""
  prompts = {task: _decoded_prompts(target, task, config.decoded_examples)
             for task in config.held_out_tasks}

  def measure(params: dict) -> dict[str, dict[str, float]]:
    draft = student.draft(params, embedding, head_tokens)
    return {task: {f"T={t:g}": alpha_tracking.measure_alpha(
        target.scorer, draft, [jnp.asarray(row[None]) for row in rows],
        gamma=config.decoded_gamma, max_decode_len=config.decoded_max_len, warp=Warp(t),
        eos_id=target.eos_id, rng=jax.random.PRNGKey(config.seed)).beta for t in (0.0, 1.0)}
        for task, rows in prompts.items()}

  return measure


def choose_head(data: PackedSignals, vocab_size: int, size: int, eos_id: int) -> np.ndarray:
  """The shortlist: the `size` tokens the target's outputs hold most often (EOS kept)."""
  counts = np.bincount(data.output_tokens, minlength=vocab_size).astype(np.float64)
  return frequent_tokens(counts, size, always=[eos_id])


def _estimate_alpha(eval_step, params, data: PackedSignals, batches: SignalsBatches,
                    index: np.ndarray, embedding, head_tokens) -> dict[str, float]:
  """Alpha at T = 0 and its T = 1 lower bound over every validation pair (and, for a
  draft that reads features, both for its second proposal: "alpha_t0_second",
  "alpha_t1_lower_second")."""
  sums: dict[str, float] = {}
  for pairs in batches.plan(0):
    batch = shortlist.to_shortlist(batches.batch(pairs), index)
    greedy = data.pair_decoding[np.resize(pairs, batches.batch_size)] == 0
    out = eval_step(params, batch, greedy, embedding, head_tokens)
    for key, value in out.items():
      sums[key] = sums.get(key, 0.0) + float(value)
  greedy_tokens, sampled_tokens = (max(sums[k], 1.0) for k in ("tokens_greedy",
                                                               "tokens_sampled"))
  alphas = {"alpha_t0": sums["beta_greedy"] / greedy_tokens,
            "alpha_t1_lower": sums["beta_sampled"] / sampled_tokens}
  if "beta_greedy_second" in sums:
    alphas |= {"alpha_t0_second": sums["beta_greedy_second"] / greedy_tokens,
               "alpha_t1_lower_second": sums["beta_sampled_second"] / sampled_tokens}
  return alphas


def _first_stage(directory: str, student: Student, target: _Target):
  """The exported draft a second stage starts from (`StudentTrainConfig.init_from`).

  Raises:
    ValueError: a draft of another target, or of another shape than `student`'s.
  """
  saved = load_student(directory)
  check_target(saved, directory, target.id.sha256, target.id.vocab_size, target.id.embed_dim,
               target.id.file)
  if saved.config.to_dict() != student.config.to_dict():
    raise ValueError(f"StudentTrainConfig.init_from={directory} holds a draft of another "
                     f"shape ({saved.config.to_dict()}) than this config's "
                     f"({student.config.to_dict()}): give both stages the same d_model, "
                     "num_layers, head_dim, kv_groups, head_size, reads_features and tied_io.")
  return saved


def _read_curve(model_dir: str) -> list[dict]:
  path = os.path.join(model_dir, CURVE)
  if not os.path.exists(path):
    return []
  with open(path, encoding="utf-8") as f:
    return json.load(f)["points"]


@gin.configurable(allowlist=["config"])
def train_student(model_dir: str, config: StudentTrainConfig = gin.REQUIRED, *,
                  learning_rate: optimizers.LearningRate, optimizer_cfg: optimizers.Optimizer,
                  loss_cfg: LossConfig) -> dict:
  """Trains (or resumes) the draft in `model_dir`; exports it when done.

  Args:
    model_dir: the run directory.
    config: what to train and on what (gin: `train_student.config = @StudentTrainConfig()`).
    learning_rate: the schedule's settings (`optimizer.LearningRate()`, built by the
      command), over the run's `passes`.
    optimizer_cfg: the optimizer (`optimizer.Optimizer()`).
    loss_cfg: the distillation loss on the stored top-k (`trainer.LossConfig()`).

  Returns:
    A summary: steps, passes, the shortlist's coverage, the last alpha estimates,
    parameters, seconds.

  Raises:
    FileNotFoundError, teacher_signals.SignalError: the signals are missing or unfinished
      (the message names the command that makes them).
  """
  t0 = time.time()
  target = _load_target(config.target)
  train = read_packed(config.tasks, root=config.train_root, with_hidden=config.reads_features,
                      fraction=config.train_fraction, seed=config.seed,
                      shards=config.train_shards)
  held_out = read_packed(config.held_out_tasks, root=config.held_out_root,
                         with_hidden=config.reads_features)
  if config.reads_features and train.output_hidden is None:
    raise ValueError(f"StudentTrainConfig.reads_features: {config.train_root} holds no "
                     "features along the outputs; recompute its signals (python -m "
                     "experiments.teacher_signals, format specdec_signals/3).")
  student = Student(student_config(target.config, d_model=config.d_model,
                                   num_layers=config.num_layers, head_size=config.head_size,
                                   head_dim=config.head_dim, kv_groups=config.kv_groups,
                                   reads_features=config.reads_features,
                                   tied_io=config.tied_io))
  start = _first_stage(config.init_from, student, target) if config.init_from else None
  head_path = os.path.join(model_dir, HEAD)
  if os.path.exists(head_path):
    head = np.load(head_path)
  else:
    head = (start.head_tokens if start is not None else
            choose_head(train, target.id.vocab_size, config.head_size, target.eos_id))
    os.makedirs(model_dir, exist_ok=True)
    np.save(head_path, head)
  coverage = float(np.isin(train.output_tokens, head).mean())
  index = shortlist.shortlist_index(head, target.id.vocab_size)
  batches = SignalsBatches(train, batch_size=config.batch_size, seed=config.seed)
  eval_batches = SignalsBatches(held_out, batch_size=config.batch_size, seed=0)
  total = int(round(config.passes * batches.steps_per_pass))
  optimizer = optimizer_cfg.build(learning_rate.schedule(total))
  step_fn = student_distill.make_train_step(student, optimizer, loss_cfg,
                                            feature_weight=config.feature_weight,
                                            test_steps=config.test_steps)
  eval_step = student_distill.make_eval_step(student)
  embedding = jax.device_put(target.embedding)
  head_tokens = jax.device_put(head)
  params = (start.params if start is not None
            else student.init_params(jax.random.PRNGKey(config.seed)))
  state = TrainState.create(params, optimizer)
  checkpointer = Checkpointer(model_dir)
  restored = checkpointer.restore(state)
  state = restored if restored is not None else state
  curve = _read_curve(model_dir)

  decoded = (_decoded_alpha(config, student, target, embedding, head_tokens)
             if config.decoded_examples else None)

  def evaluate(step: int, params: dict) -> None:
    point = {"step": step, "passes": round(batches.passes(step), 3),
             "tokens": int(round(batches.passes(step) * len(train.output_tokens))),
             **_estimate_alpha(eval_step, params, held_out, eval_batches, index, embedding,
                               head_tokens)}
    if decoded is not None:
      point["decoded"] = decoded(params)
    curve[:] = [p for p in curve if p["step"] != step] + [point]
    atomic_io.write_json(os.path.join(model_dir, CURVE), {
        "config": dataclasses.asdict(config), "learning_rate": dataclasses.asdict(learning_rate),
        "optimizer": dataclasses.asdict(optimizer_cfg), "loss": dataclasses.asdict(loss_cfg),
        "head_coverage": coverage,
        "validation_pairs": held_out.num_pairs, "train_pairs": train.num_pairs,
        "train_tokens": len(train.output_tokens),
        "points": curve})
    print(f"step {step} ({point['passes']} passes): alpha T=0 {point['alpha_t0']:.3f}, "
          f"T=1 >= {point['alpha_t1_lower']:.3f}" + "".join(
              f"; decoded {task} " + ", ".join(f"{k} {v:.3f}" for k, v in by_t.items())
              for task, by_t in point.get("decoded", {}).items()), flush=True)

  if int(state.step) == 0 or not curve:
    evaluate(int(state.step), state.params)
  state, metrics = loop.train_loop(
      state, batches.batches(int(state.step)),
      lambda st, batch, rng: step_fn(st, shortlist.to_shortlist(batch, index), rng, embedding,
                                     head_tokens),
      total_steps=total, seed=config.seed, save=checkpointer.save,
      work=[loop.Due(loop.every(config.eval_every, total),
                     lambda step, st, _: evaluate(step, st.params)),
            loop.Due(loop.every(config.checkpoint_every, total),
                     lambda step, st, _: checkpointer.save(step, st))])
  checkpointer.close()
  step = int(state.step)
  summary = {"steps": step, "total_steps": total, "passes": round(batches.passes(step), 3),
             "head_coverage": round(coverage, 4),
             "parameters": student.param_count(state.params), "train_pairs": train.num_pairs,
             "train_tokens": len(train.output_tokens),
             "target_file": target.id.file,
             "last": curve[-1] if curve else None,
             "loss": float(metrics["loss"]) if metrics is not None else None,
             "seconds": round(time.time() - t0, 1)}
  if step >= total:
    export = os.path.join(model_dir, EXPORT)
    save_student(export, student.config, jax.tree.map(np.asarray, state.params), head,
                 target.id)
    atomic_io.atomic_write_text(os.path.join(export, "README.md"),
                                model_card(config, student, summary, learning_rate=learning_rate,
                                           optimizer_cfg=optimizer_cfg, loss_cfg=loss_cfg))
  return summary


def teacher_forced_alpha(directory: str, config: StudentTrainConfig) -> dict:
  """A trained draft's alpha estimates (as its training tracks them) along its own
  training pairs and along the held-out validation pairs: a draft that fits its training
  outputs far better than held-out ones is short of data; one that fits both alike is
  short of capacity or steps.

  Args:
    directory: the exported draft (`save_student`'s).
    config: its recipe (the target, tasks and signals roots, `train_shards`;
      `train_fraction` ignored: every training pair is scored).

  Returns:
    {"train" | "validation": {"alpha_t0", "alpha_t1_lower", "pairs"}}.

  Raises:
    As `student_io.check_target` (a draft of another target) and `read_packed`.
  """
  target = _load_target(config.target)
  saved = load_student(directory)
  check_target(saved, directory, target.id.sha256, target.id.vocab_size, target.id.embed_dim,
               target.id.file)
  student = Student(saved.config)
  eval_step = student_distill.make_eval_step(student)
  index = shortlist.shortlist_index(saved.head_tokens, target.id.vocab_size)
  embedding, head_tokens = jax.device_put(target.embedding), jax.device_put(saved.head_tokens)
  params = jax.device_put(saved.params)
  out = {}
  for split, root, tasks in (("train", config.train_root, config.tasks),
                             ("validation", config.held_out_root, config.held_out_tasks)):
    data = read_packed(tasks, root=root, with_hidden=saved.config.feature_size > 0,
                       shards=config.train_shards if split == "train" else None)
    out[split] = {**_estimate_alpha(eval_step, params, data,
                                    SignalsBatches(data, batch_size=config.batch_size, seed=0),
                                    index, embedding, head_tokens),
                  "pairs": data.num_pairs}
  return out


def model_card(config: StudentTrainConfig, student: Student, summary: dict, *,
               learning_rate: optimizers.LearningRate, optimizer_cfg: optimizers.Optimizer,
               loss_cfg: LossConfig) -> str:
  """The README.md of an exported draft: its shape, data, training (`train_student`'s
  arguments) and held-out alpha."""
  blocks = student.config.blocks
  last = summary["last"] or {}
  intro = (
      "A small Llama-architecture draft for speculative decoding (Leviathan et al., 2023), "
      "trained on its target's own outputs and top-k log-probabilities "
      "(`specdec_jax/models/llama/student.py`). It owns no vocabulary-wide matrix: "
      + ("its blocks run at the target's width on the target's own embedding rows, and its "
         "output layer is the target's tied head rows (both frozen, read from the target's "
         "file)" if student.config.tied_io else
         "it reads the target's token embedding through a learned projection, and so does "
         "its output layer")
      + f"; the output layer scores the {student.config.head_size} tokens of its shortlist "
      "(probability 0 elsewhere, which keeps speculative sampling exact)."
      + (" It also reads the target's features, as EAGLE (Li et al. 2024) does: each "
         "position's input adds the projected final-normed hidden state the target computed "
         "one position earlier, and it predicts the target's next one (smooth-L1, weight "
         f"{config.feature_weight}), which it reads while it proposes beyond the verified "
         "text (`specdec_jax/models/llama/feature_draft.py`). Its held-out alpha below is "
         "teacher-forced with the target's own features: that of each iteration's first "
         "proposal, and of its second, which reads the feature the draft predicted itself."
         if config.reads_features else ""))
  facts = [
      ("parameters (own)", f"{summary['parameters'] / 1e6:.2f}M"),
      ("layers / d_model / heads / kv heads / d_ff", f"{blocks.num_layers} / {blocks.d_model} / "
       f"{blocks.num_heads} / {blocks.num_kv_heads} / {blocks.d_ff}"),
      ("shortlist", f"{student.config.head_size} tokens, "
       f"{summary['head_coverage']:.1%} of the target's training outputs"),
      ("data", f"{summary['train_pairs']:,} (prompt, output) pairs of "
       f"{', '.join(config.tasks)}, {summary['train_tokens']:,} output tokens, with the "
       "target's signals along them (`python -m experiments.distill_data` or "
       "`experiments.text_corpus`, then `experiments.teacher_signals`)"),
      ("training", f"{summary['steps']} steps ({summary['passes']} passes), batch "
       f"{config.batch_size}, {optimizer_cfg.kind} peak lr {learning_rate.peak_lr}, "
       f"{loss_cfg.distill_divergence} to the "
       "target's top-k"
       + (f", from the draft in {config.init_from}" if config.init_from else "")
       + (f", training-time test over {config.test_steps} passes" if config.test_steps > 1
          else "")),
      ("held-out alpha (validation outputs)",
       f"T=0: {last.get('alpha_t0', float('nan')):.3f}, "
       f"T=1: >= {last.get('alpha_t1_lower', float('nan')):.3f}"),
  ]
  if "alpha_t0_second" in last:  # Estimated for a draft that reads features.
    facts.append(("held-out alpha, second proposal",
                  f"T=0: {last['alpha_t0_second']:.3f}, "
                  f"T=1: >= {last['alpha_t1_lower_second']:.3f}"))
  sections = [
      "Held-out alpha is estimated along the target's own validation outputs "
      "(`training/student_distill.py`); the speedup and alpha measured by decoding are in "
      "results/README.md.",
      "It works only with the target it was trained for: config.json names that file by "
      "its sha256, and loading it for another is refused (`student_io.check_target`). In "
      "Python: `student_io.load_draft('<this directory>', target_scorer, gguf_path)`; in a "
      "`llama_gguf` experiment, by name (`Experiment.drafts = ['<this directory>']`)."]
  return ModelCard(f"A decoder-only draft for `{summary['target_file']}`", [intro], facts,
                   sections).markdown()
