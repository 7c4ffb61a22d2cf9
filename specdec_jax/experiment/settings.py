"""The settings every command reads, and what one measurement run does.

`Settings` holds what the commands share (where the models are, how prompts are
cut, how long outputs are, gamma, the seed, dtypes), declared once and bound in
gin: `--gin.Settings.FIELD=VALUE` (or a `--gin_file`) sets it for any command.
`Experiment`, the run of `python -m experiments.run`, is a `Settings` plus the
grid it measures; `Experiment.FIELD` bindings (`gin_configs/*.gin`) set a run's
own values, and a shared field it leaves unbound takes the `Settings` binding
(`gin_flags.build_experiment`, where the commands assemble both: nothing here reads gin).
`validate` checks the fields; what depends on the kind of target
(`target_kind`: its checkpoint, tokenizer and drafts) is checked by
`experiment.targets.registry.check`. Together they read no weights, so a bad run fails in
seconds, before any measurement.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Sequence
from typing import NamedTuple

import gin

from specdec_jax import validation
from specdec_jax.data import chat_prompts, layout, prompts
from specdec_jax.experiment import record, results_io
from specdec_jax.experiment.targets.llama_options import NgramFit, PromptCache
from specdec_jax.models.config import check_dtype

AUTO = record.AUTO


@gin.configurable
@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
  """What every command shares (bound as `Settings.FIELD` in gin).

  Attributes:
    target_kind: the kind of target model (`experiment.targets.registry`): "t5" (an
      HF T5 checkpoint, the default) or "llama_gguf" (a decoder-only Llama
      read from a GGUF file); it decides what `target` and the draft specs
      name, and how examples become inputs.
    models_dir: directory that checkpoint names (`target`, drafts) are resolved
      in (absolute paths are used as they are).
    target: the target: for "t5" an HF-format checkpoint directory; for
      "llama_gguf" a .gguf file or "smollm2" (`experiment.targets.llama_target`).
    vocab_path: SentencePiece model the prompts are tokenised with (a T5
      target's; a GGUF file holds its own tokenizer).
    input_len: every input is cut / 0-padded to this many tokens (EOS
      included; a decoder-only target's whole chat prompt), then cut to its
      length bucket, so few programs compile.
    max_decode_len: most tokens generated per example.
    gamma: draft proposals per target call (a run lists its own in
      `Experiment.gammas`, by default this one).
    seed: seed of the sampling PRNG keys.
    dtype: compute dtype of the models ("float32" on CPU, "bfloat16" on TPU/GPU).
    param_dtype: dtype the parameters are held in.
    prompt_cache: how a "llama_gguf" target prefills its prompts (gin: `PromptCache.X`).
    ngram_fit: where a "llama_gguf" target's unigram / bigram drafts are fit (gin:
      `NgramFit.X`).

  Both are built with the settings, where a command assembles them
  (`experiment.gin_flags`); nothing below reads gin.
  """

  target_kind: str = "t5"
  models_dir: str = os.path.join("assets", "models")
  target: str = "target"
  vocab_path: str = prompts.VOCAB_PATH
  input_len: int = 128
  max_decode_len: int = 64
  gamma: int = 3
  seed: int = 0
  dtype: str = "float32"
  param_dtype: str = "float32"
  prompt_cache: PromptCache = dataclasses.field(default_factory=PromptCache)
  ngram_fit: NgramFit = dataclasses.field(default_factory=NgramFit)

  def checkpoint_dir(self, spec: str) -> str:
    """The path of a target or checkpoint-draft spec (`models_dir`-relative or absolute)."""
    return os.path.join(self.models_dir, spec)


def validate_settings(settings: Settings, owner: str = "Settings") -> None:
  """Raises ValueError, naming the field and the fix, for a bad shared setting.

  Args:
    settings: the settings (or an `Experiment`).
    owner: the configurable named in messages.
  """
  for field in ("target_kind", "models_dir", "target", "vocab_path", "dtype", "param_dtype"):
    _require(isinstance(getattr(settings, field), str),
             f"{owner}.{field} must be a string, got {getattr(settings, field)!r}.")
  for field in ("dtype", "param_dtype"):
    check_dtype(f"{owner}.{field}", getattr(settings, field))
  validation.as_int(f"{owner}.max_decode_len", settings.max_decode_len, minimum=1)
  validation.as_int(f"{owner}.input_len", settings.input_len, minimum=2,
                    what="a token and EOS")
  validation.as_int(f"{owner}.gamma", settings.gamma, minimum=1,
                    what="gamma: draft tokens per target call")
  validation.as_int(f"{owner}.seed", settings.seed)


@gin.configurable
@dataclasses.dataclass(frozen=True, kw_only=True)
class Experiment(Settings):
  """One measurement run: the cross product of tasks, batch sizes, drafts, T and gamma.

  The shared fields (`Settings`) say where the models are, how prompts are cut
  and how long outputs are; these say what is measured.

  Attributes:
    name: experiment name; the default output directory is `results/<name>`.
    drafts: draft specs, each of a draft kind of the target kind
      (`registry.TARGET_KINDS[target_kind].drafts`): for "t5" a checkpoint
      directory of a T5 draft, "unigram" / "bigram" (the corpus's n-gram
      statistics) or "prompt_lookup"; for "llama_gguf" "prompt_lookup",
      "layer_skip_<L>" or "unigram" / "bigram" (fit on the target's outputs).
    tasks: corpora, "ende" and/or "mansum".
    split: corpus split the examples come from.
    num_examples: examples per task (the first ones of the split); a multiple
      of every batch size.
    batch_sizes: decoder batch sizes.
    temperatures: sampling temperatures (0 = greedy).
    gammas: draft proposals per iteration, each an int >= 1 or 'auto': the
      gamma in 1..auto_max_gamma that `specdec_jax.costs.gamma_choice`
      predicts to be fastest, chosen per (task, batch size, draft,
      temperature) before that point is measured, from the whole cost model
      (`timing.calibrate`; its row says which and why).
      None (the default): `[gamma]`.
    best_gamma_from: a results.jsonl of an earlier run (e.g. the gamma sweep);
      when it exists, each (task, draft, temperature) runs only at its gamma of
      highest measured speedup at batch size 1 there, falling back to `gammas`
      for combinations it lacks.
    auto_max_gamma: gamma = 'auto' chooses among 1..auto_max_gamma.
    auto_calibration_examples: examples of the split after the measured ones
      (held out from timing) on which gamma = 'auto' calibrates, once per
      (task, batch size, draft, temperature), in batches of the point's batch
      size: alpha, the loops' own work and the encoders (4 examples gave
      alphas up to 0.16 off the measured examples' in the gamma sweep and the
      first command); a point at a fixed gamma also times its loops' own work on
      them for its row's cost model (`timing.measure_loop_costs`), and a point at
      'auto' prices with its calibration's.
    repetitions: timed passes over the examples per decoder.
    timing_calls: calls per jitted loop when timing step costs.
    timing_repeats: timed runs of each such loop (median used).
    timing_rounds: rounds over every k of the target's T_verify(k) (k ascending,
      then descending, ...; T_step's median and each k's fastest round are used:
      `timing.VerifyTimes`), so that noise and drift cannot make one k look
      cheaper than its neighbours.
    stand_ins_when_missing: if the target is missing from `models_dir` (the
      trained family is not shipped yet), measure random-init stand-ins of the
      family's shapes instead, written once to `<data_dir>/random_models`; a
      warning says that their acceptance rates mean nothing (target kinds
      with stand-ins only: "t5").
    tree: None, a token tree's shape "<k>x<depth>" or 'auto': the draft's top-k tokens
      after the root, each extended by its argmax to `depth` tokens (`trees.branches`;
      at T > 0 drawn from the draft instead: `proposers.branch_level`),
      measured beside the chain at the same draft, on the same examples, for the
      points of `tree_tasks` and `tree_temperatures` (target kinds whose scorers
      score trees only). "<k>x<depth>+lookup<n>" adds, after the draft's branches, a
      chain of the n tokens that followed the text's last n-gram in the prompt
      (`proposers.PromptLookup`); "lookup<n>+<k>x<depth>" tries that chain first (at
      T > 0 it is then accepted with the target's probability of its token, not the
      residual's after the draft's draws). Its candidates (k depth + n) must not exceed the
      run's largest gamma, so that T_verify(candidates + 1) is measured for its
      prediction. 'auto': the shape of
      highest predicted speedup among those (`tree_choice.make_choice`), from
      acceptance per depth and sibling rank measured on the held-out examples
      (`auto_calibration_examples`) and the chain point's measured costs; where none
      is predicted to beat the target alone, the target alone (`tree_point`).
    tree_tasks: the tasks a tree is measured on (None: every task).
    tree_temperatures: the temperatures a tree is measured at (None: every one).
  """

  name: str
  drafts: Sequence[str]
  tasks: Sequence[str] = ("ende",)
  split: str = "test"
  num_examples: int = 8
  batch_sizes: Sequence[int] = (1,)
  temperatures: Sequence[float] = (0.0, 1.0)
  gammas: Sequence[int | str] | None = None
  best_gamma_from: str | None = None
  auto_max_gamma: int = 8
  auto_calibration_examples: int = 16
  repetitions: int = 2
  timing_calls: int = 8
  timing_repeats: int = 3
  timing_rounds: int = 11
  stand_ins_when_missing: bool = False
  tree: str | None = None
  tree_tasks: Sequence[str] | None = None
  tree_temperatures: Sequence[float] | None = None

  def __post_init__(self):
    if self.gammas is None:
      object.__setattr__(self, "gammas", (self.gamma,))


_TREE = re.compile(r"(?:lookup([1-9][0-9]*)\+)?([1-9][0-9]*)x([1-9][0-9]*)"
                   r"(?:\+lookup([1-9][0-9]*))?")


class TreeShape(NamedTuple):
  """An `Experiment.tree` shape: the draft's top-`k` branches of `depth` tokens, and beside
  them a prompt look-up chain of `lookup` tokens (0: none), tried before the branches
  with `lookup_first`, else after them."""

  k: int
  depth: int
  lookup: int
  lookup_first: bool = False

  @property
  def candidates(self) -> int:
    return self.k * self.depth + self.lookup


def tree_shape(spec: str) -> TreeShape:
  """The shape of an `Experiment.tree` spec "<k>x<depth>", "<k>x<depth>+lookup<n>" or
  "lookup<n>+<k>x<depth>".

  Raises:
    ValueError: naming `Experiment.tree` and the form it takes.
  """
  match = _TREE.fullmatch(spec) if isinstance(spec, str) else None
  _require(match is not None and not (match.group(1) and match.group(4)),
           f"Experiment.tree={spec!r} is not a tree's shape: write '<k>x<depth>' (the "
           "draft's top-k branches, each <depth> tokens long; '1x<depth>' is the chain), "
           "'<k>x<depth>+lookup<n>' (and beside them the prompt's continuation, n tokens, "
           "tried after them), 'lookup<n>+<k>x<depth>' (the continuation tried first), "
           f"{AUTO!r} (chosen by the cost model), or None for no tree.")
  first, k, depth, last = match.groups()
  return TreeShape(int(k), int(depth), int(first or last or 0), lookup_first=first is not None)


def draft_name(spec: str) -> str:
  """The name a draft has in results: its spec ("bigram", "layer_skip_8"), or a
  checkpoint's basename."""
  return os.path.basename(os.path.normpath(spec))


@dataclasses.dataclass(frozen=True)
class Point:
  """One measured point; `key` identifies it in results.jsonl."""

  task: str
  batch_size: int
  draft: str  # The spec (see `Experiment.drafts`).
  temperature: float
  gamma: int | str  # An int, or AUTO until chosen.

  @property
  def key(self) -> tuple:
    return record.point_key(self.task, draft_name(self.draft), self.temperature, self.gamma,
                            self.batch_size)


def _require(ok: bool, message: str) -> None:
  if not ok:
    raise ValueError(message)


def validate(exp: Experiment) -> None:
  """Raises ValueError, naming the field and the fix, for a bad run's fields.

  Checks the type of every field (integers are never truncated: see
  `specdec_jax.validation`), numbers and lists. What depends on the kind of
  target is checked by `registry.check`.
  """
  validate_settings(exp, "Experiment")
  for field in ("name", "split"):
    _require(isinstance(getattr(exp, field), str),
             f"Experiment.{field} must be a string, got {getattr(exp, field)!r}.")
  _require(exp.best_gamma_from is None or isinstance(exp.best_gamma_from, str),
           f"Experiment.best_gamma_from must be a path or None, got {exp.best_gamma_from!r}.")
  _require(isinstance(exp.stand_ins_when_missing, bool),
           f"Experiment.stand_ins_when_missing must be True or False, got "
           f"{exp.stand_ins_when_missing!r}.")
  for field in ("num_examples", "repetitions", "timing_calls", "timing_repeats",
                "timing_rounds", "auto_max_gamma", "auto_calibration_examples"):
    validation.as_int(f"Experiment.{field}", getattr(exp, field), minimum=1)
  for field in ("drafts", "tasks", "batch_sizes", "temperatures", "gammas"):
    value = getattr(exp, field)
    _require(isinstance(value, (list, tuple)),
             f"Experiment.{field} must be a list, got {value!r}; write e.g. "
             f"Experiment.{field} = [...].")
    _require(len(value) > 0, f"Experiment.{field} is empty; list at least one.")
  for field in ("drafts", "tasks"):
    for i, value in enumerate(getattr(exp, field)):
      _require(isinstance(value, str), f"Experiment.{field}[{i}] must be a string, got "
                                       f"{value!r}.")
  known = sorted({*layout.CORPORA, *chat_prompts.TASKS})
  for task in exp.tasks:
    _require(task in known, f"Experiment.tasks has {task!r}; use any of {known}.")
  _require(exp.split in layout.SPLITS, f"Experiment.split={exp.split!r}; use one of "
                                       f"{layout.SPLITS}.")
  for i, gamma in enumerate(exp.gammas):
    _require(not isinstance(gamma, str) or gamma == AUTO,
             f"Experiment.gammas[{i}]={gamma!r} is not a gamma: use an int >= 1 (draft tokens "
             f"per target call) or {AUTO!r} (chosen by the cost model after a short "
             "calibration).")
    if gamma != AUTO:
      validation.as_int(f"Experiment.gammas[{i}]", gamma, minimum=1,
                        what=f"gamma: draft tokens per target call; or {AUTO!r}")
  for i, t in enumerate(exp.temperatures):
    validation.as_real(f"Experiment.temperatures[{i}]", t, minimum=0.0, what="0 = greedy")
  for i, b in enumerate(exp.batch_sizes):
    b = validation.as_int(f"Experiment.batch_sizes[{i}]", b, minimum=1)
    _require(exp.num_examples % b == 0,
             f"Experiment.batch_sizes has {b}; each must divide Experiment.num_examples="
             f"{exp.num_examples} (equal batches never recompile).")
  if exp.tree is not None and exp.tree != AUTO:
    candidates = tree_shape(exp.tree).candidates
    largest = tree_budget(exp)
    _require(candidates <= largest,
             f"Experiment.tree={exp.tree!r} has {candidates} candidates, but the run's largest "
             f"gamma is {largest}: T_verify(k) is timed up to k = {largest + 1}; choose a "
             f"smaller tree or a larger gamma.")
  if exp.tree is not None:
    for field, values, known in (("tree_tasks", exp.tree_tasks, exp.tasks),
                                 ("tree_temperatures", exp.tree_temperatures,
                                  exp.temperatures)):
      _require(values is None or (isinstance(values, (list, tuple))
                                  and set(values) <= set(known)),
               f"Experiment.{field}={values!r} must be None or a list of the run's "
               f"{field.removeprefix('tree_')} ({list(known)}).")
  _require(len(set(map(draft_name, exp.drafts))) == len(exp.drafts),
           f"Experiment.drafts {list(exp.drafts)} has two drafts of one name; results are "
           "keyed by the checkpoint's directory name.")


def best_gammas(path: str) -> dict[tuple[str, str, float], int]:
  """{(task, draft, temperature): gamma of highest measured speedup at batch size 1}
  among the fixed-gamma rows of a results file (`results_io.best_rows`)."""
  return {(r.task, r.draft, r.temperature): r.gamma
          for r in results_io.best_rows(results_io.read_points(path))}


def plan(exp: Experiment) -> list[Point]:
  """The points of the run, in measurement order (task, batch, draft, T, gamma)."""
  chosen = {}
  if exp.best_gamma_from and os.path.exists(exp.best_gamma_from):
    chosen = best_gammas(exp.best_gamma_from)
  points = []
  for task in exp.tasks:
    for batch_size in exp.batch_sizes:
      for spec in exp.drafts:
        for t in exp.temperatures:
          best = chosen.get((task, draft_name(spec), float(t)))
          for gamma in ([best] if best is not None else exp.gammas):
            points.append(Point(task, batch_size, spec, float(t),
                                gamma if gamma == AUTO else int(gamma)))
  return points


def tree_budget(exp: Experiment) -> int:
  """The most candidates a tree of the run may have: its largest gamma (T_verify(k) is
  timed up to k = that + 1)."""
  return max(exp.auto_max_gamma if g == AUTO else int(g) for g in exp.gammas)


def tree_points(exp: Experiment) -> list[Point]:
  """The points beside which `Experiment.tree` is measured: of `tree_tasks` and
  `tree_temperatures`, the first of each (task, batch size, draft, temperature) in
  `plan` order (none without a tree)."""
  if exp.tree is None:
    return []
  first = {}
  for p in plan(exp):
    if ((exp.tree_tasks is None or p.task in exp.tree_tasks)
        and (exp.tree_temperatures is None or p.temperature in exp.tree_temperatures)):
      first.setdefault((p.task, p.batch_size, p.draft, p.temperature), p)
  return list(first.values())


def largest_gamma(exp: Experiment, points: Sequence[Point]) -> int:
  """The largest gamma `points` may run at (`auto_max_gamma` for AUTO): sizes the caches."""
  return max(exp.auto_max_gamma if p.gamma == AUTO else p.gamma for p in points)
