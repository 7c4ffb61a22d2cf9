"""Training by alpha: the draft's acceptance rate, measured during training.

An `AlphaTracker` measures the student against the target with the real speculative
loop (`measure_alpha`: alpha as the mean of beta over verified positions,
and S / (S + R)) on held-out inputs: `examples` evenly spaced inputs of each task's
validation split, at one gamma and each temperature, with the same PRNG key every
time (the curve's points share their random numbers). The training driver calls it at
the run's first step, every `every_steps` steps and at the last one, each time after
saving a checkpoint at that step, so a restarted run re-measures only a step the curve
lacks.

Each measurement is appended to `<model_dir>/alpha_curve.json` (rewritten atomically):

  {"format": FORMAT, "settings": {how alpha is measured}, "recipe": {what is trained},
   "entries": [{"step", "passes", "wall_time_s", "alpha_eval_s", "train": {mean train
                metrics since the previous entry}, "alpha": {task: {"T=0": .., ..}},
                "alpha_empirical": {...}, "score"}, ...],          (by step)
   "best": {"step", "score"} or null}

`wall_time_s` is training time: the measurements' own time is left out (it is each
entry's `alpha_eval_s`). `score` is the mean over temperatures of `select_task`'s
alpha; when it beats the best so far, the parameters are exported to
`<model_dir>/best/` (by the driver's export function) before the curve names them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable, Sequence

import jax
import numpy as np
import sentencepiece as spm

from specdec_jax import atomic_io, distributed
from specdec_jax.costs import gamma_choice
from specdec_jax.data import prompts
from specdec_jax.decoding import buckets, speculative
from specdec_jax.decoding.drafts import Draft
from specdec_jax.decoding.sampling import Warp
from specdec_jax.decoding.scorer import Scorer
from specdec_jax.models.t5 import (
  PreparedParams,
  SharedEncoderModel,
  T5Model,
  T5Scorer,
  make_draft,
)

CURVE_FILE = "alpha_curve.json"
BEST_DIR = "best"
FORMAT = "specdec_alpha_curve/1"
SPLIT = "validation"
ESTIMATOR = "mean beta over verified positions (paper, section 3.1)"


def measure_alpha(target: Scorer, draft: Draft, batches: Sequence[jax.Array], *, gamma: int,
                  max_decode_len: int, warp: Warp, eos_id: int, rng: jax.Array
                  ) -> gamma_choice.AlphaEstimate:
  """alpha from speculative sampling over `batches`, no timing.

  Args:
    target: the target's scorer.
    draft: the draft, with the target's vocabulary.
    batches: int32 `[b, input_len]` input batches, every id in the vocabulary.
    gamma: the speculative decoder's gamma.
    max_decode_len: the most tokens per row.
    warp: the sampling settings.
    eos_id: the end-of-sequence id.
    rng: PRNG key; batch i samples with `fold_in(rng, i)`.

  Returns:
    alpha pooled over every row of every batch (`gamma_choice.pooled_alpha`).
  """
  outputs = []
  for i, batch in enumerate(batches):
    batch = buckets.to_bucket(batch)
    out = speculative.speculative_decode(target, draft, batch, jax.random.fold_in(rng, i),
                                         gamma=gamma, max_decode_len=max_decode_len, warp=warp,
                                         eos_id=eos_id, draft_inputs=batch)
    outputs.append(distributed.fetch(out.stats))
  return gamma_choice.pooled_alpha(outputs, gamma)


def temperature_key(temperature: float) -> str:
  return f"T={temperature:g}"


def evenly_spaced(count: int, total: int) -> np.ndarray:
  """`min(count, total)` indices evenly spaced through `range(total)`, int64."""
  if count >= total:
    return np.arange(total)
  return np.linspace(0, total - 1, count).round().astype(np.int64)


def held_out_inputs(tasks: Sequence[str], examples: int, input_len: int,
                    vocab_path: str = prompts.VOCAB_PATH) -> dict[str, np.ndarray]:
  """Per task, `examples` evenly spaced validation inputs, int32 `[e, input_len]`.

  Raises:
    FileNotFoundError: the prepared corpora are missing (the message says how to make
      them).
  """
  processor = spm.SentencePieceProcessor(model_file=vocab_path)
  out = {}
  for task in tasks:
    pairs = prompts.load_examples(task, SPLIT, None)[0]
    picked = [pairs[i][0] for i in evenly_spaced(examples, len(pairs))]
    out[task] = prompts.tokenize(processor, picked, input_len)
  return out


@dataclasses.dataclass(frozen=True)
class AlphaProbe:
  """What alpha is measured with.

  Attributes:
    target: the target model.
    target_params: its parameters, prepared for generation once, here (a
      tree is replaced by `target.prepare(tree)`; prepared ones are kept).
    inputs: per task, int32 `[e, input_len]` held-out encoder inputs.
    temperatures: sampling temperatures (0 = greedy).
    gamma: draft tokens per target call.
    max_decode_len: most tokens generated per example.
    batch_size: rows decoded together.
    seed: the sampling PRNG seed (the same key at every measurement).
  """

  target: T5Model
  target_params: dict | PreparedParams
  inputs: dict[str, np.ndarray]
  temperatures: tuple[float, ...]
  gamma: int
  max_decode_len: int
  batch_size: int
  seed: int

  def __post_init__(self):
    object.__setattr__(self, "target_params", self.target.prepare(self.target_params))

  def settings(self) -> dict:
    """How alpha is measured, as recorded in the curve file."""
    return {"split": SPLIT, "examples": {t: len(x) for t, x in self.inputs.items()},
            "input_len": int(next(iter(self.inputs.values())).shape[1]),
            "temperatures": list(self.temperatures), "gamma": self.gamma,
            "max_decode_len": self.max_decode_len, "batch_size": self.batch_size,
            "seed": self.seed, "estimator": ESTIMATOR}

  def measure(self, model: T5Model | SharedEncoderModel, params: dict
              ) -> dict[str, dict[str, gamma_choice.AlphaEstimate]]:
    """`{task: {"T=<t>": AlphaEstimate}}` of the draft `(model, params)`."""
    return self.measure_draft(make_draft(model, params))

  def measure_draft(self, draft: Draft) -> dict[str, dict[str, gamma_choice.AlphaEstimate]]:
    """`{task: {"T=<t>": AlphaEstimate}}` of any draft of the target's vocabulary."""
    out = {}
    scorer = T5Scorer(self.target, self.target_params)
    for task, inputs in self.inputs.items():
      batches = [inputs[i:i + self.batch_size] for i in range(0, len(inputs), self.batch_size)]
      out[task] = {temperature_key(t): measure_alpha(
          scorer, draft, batches, gamma=self.gamma, max_decode_len=self.max_decode_len,
          warp=Warp(t), eos_id=self.target.config.eos_token_id,
          rng=jax.random.PRNGKey(self.seed))
          for t in self.temperatures}
    return out


def read_curve(model_dir: str) -> dict:
  """A run's `alpha_curve.json`.

  Raises:
    FileNotFoundError: the run has none (it was trained without `TrainConfig.alpha_every_steps`).
    ValueError: the file is not of this format.
  """
  path = os.path.join(model_dir, CURVE_FILE)
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path} does not exist: train with TrainConfig.alpha_every_steps > 0 "
                            "to measure alpha during training.")
  with open(path, encoding="utf-8") as f:
    curve = json.load(f)
  if curve.get("format") != FORMAT:
    raise ValueError(f"{path} has format {curve.get('format')!r}, not {FORMAT!r}.")
  return curve


class AlphaTracker:
  """Measures alpha during training, keeps the curve and the best parameters.

  Args:
    model_dir: the run's directory.
    probe: how alpha is measured.
    model: the student (a draft of the target's vocabulary).
    every_steps: steps between measurements (>= 1).
    total_steps: the run's last step (always measured).
    select_task: the task whose alpha, averaged over temperatures, picks the best.
    export: `(directory, params)` writes the student in its export format.
    passes: `step -> passes over the training data` (None: not recorded).
    recipe: what is trained (recorded in the curve, labels the figures).

  Raises:
    ValueError: a bad argument, or a curve in `model_dir` measured with other settings.
  """

  def __init__(self, model_dir: str, probe: AlphaProbe, *,
               model: T5Model | SharedEncoderModel, every_steps: int, total_steps: int,
               select_task: str, export: Callable[[str, dict], None],
               passes: Callable[[int], float] | None, recipe: dict):
    if every_steps < 1:
      raise ValueError(f"TrainConfig.alpha_every_steps must be >= 1, got {every_steps}.")
    if select_task not in probe.inputs:
      raise ValueError(f"TrainConfig.alpha_select_task={select_task!r} is not measured: use one of "
                       f"TrainConfig.alpha_tasks {sorted(probe.inputs)}.")
    self.model_dir = model_dir
    self.probe = probe
    self.model = model
    self._passes = passes
    self.every_steps = every_steps
    self.total_steps = total_steps
    self.select_task = select_task
    self._export = export
    self.path = os.path.join(model_dir, CURVE_FILE)
    settings = {**probe.settings(), "select": {"task": select_task,
                                               "score": "mean alpha over temperatures"}}
    if os.path.exists(self.path):
      self.curve = read_curve(model_dir)
      if self.curve["settings"] != settings:
        raise ValueError(f"{self.path} was measured with other settings "
                         f"({self.curve['settings']}, now {settings}): measure as before, or "
                         "train in another model_dir.")
    else:
      self.curve = {"format": FORMAT, "settings": settings, "recipe": recipe, "entries": [],
                    "best": None}

  @property
  def best_dir(self) -> str:
    return os.path.join(self.model_dir, BEST_DIR)

  @property
  def best(self) -> dict | None:
    """{"step", "score"} of the best parameters so far (in `best_dir`), or None."""
    return self.curve["best"]

  def due(self, step: int) -> bool:
    """Whether alpha is measured at `step` (the first, every N-th and the last step, each
    once)."""
    scheduled = step % self.every_steps == 0 or step == self.total_steps
    return scheduled and all(e["step"] != step for e in self.curve["entries"])

  def measure(self, step: int, params: dict, *, wall_time_s: float,
              train: dict[str, float]) -> dict:
    """Measures, exports the parameters if they are the best so far, writes the curve.

    Args:
      step: the training step of `params`.
      params: the student's parameters.
      wall_time_s: training time so far (measurements excluded).
      train: mean training metrics since the previous measurement.

    Returns:
      The curve entry.
    """
    t0 = time.monotonic()
    got = self.probe.measure(self.model, params)
    passes = None if self._passes is None else round(self._passes(step), 4)
    entry = {
        "step": step, "passes": passes, "wall_time_s": round(wall_time_s, 1),
        "alpha_eval_s": round(time.monotonic() - t0, 1),
        "train": {k: round(v, 5) for k, v in train.items()},
        "alpha": {task: {k: round(a.beta, 4) for k, a in by_t.items()}
                  for task, by_t in got.items()},
        "alpha_empirical": {task: {k: round(a.empirical, 4) for k, a in by_t.items()}
                            for task, by_t in got.items()},
        "score": round(float(np.mean([a.beta for a in got[self.select_task].values()])), 4),
    }
    if self.best is None or entry["score"] > self.best["score"]:
      self._export(self.best_dir, params)
      self.curve["best"] = {"step": step, "score": entry["score"]}
    entries = [e for e in self.curve["entries"] if e["step"] != step] + [entry]
    self.curve["entries"] = sorted(entries, key=lambda e: e["step"])
    atomic_io.write_json(self.path, self.curve)
    return entry
