"""The results row of one measured point: a typed record that reads and writes results.jsonl.

`PointRow` is what `measure.measure_point` returns and `experiments.run` appends
(`to_json`, one JSON object per line, keys sorted); `PointRow.from_json` reads a
row back, every committed row included (the field names are the JSON keys, so
the JSON is the same both ways). Times are seconds unless a name says ms;
speedups are baseline over speculative. The readers (`results_io.read_points`,
then `tables`, `figures`, `settings.best_gammas`, `regime_predictions`) take these
records, never the JSON. `point_key` is a point's identity, planned or measured.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from specdec_jax import theory
from specdec_jax.theory import LoopCosts

AUTO = "auto"  # In Experiment.gammas: chosen per point by `gamma_choice` after a calibration.
_INT_KEYED = ("t_verify_s", "verify_ratio")  # {k: ...} with k as a string in JSON.


def point_key(task: str, draft: str, temperature: float, gamma: int | str,
              batch_size: int) -> tuple:
  """The identity of a point: (task, draft name, temperature, gamma or AUTO, batch size)."""
  return (task, draft, float(temperature), gamma if gamma == AUTO else int(gamma),
          int(batch_size))


@dataclasses.dataclass(frozen=True)
class Example:
  """The first speculative output of a point, for a Fig. 1-style picture.

  Attributes:
    tokens: its token ids, EOS included.
    pieces: the SentencePiece piece of each token.
    accepted_mask: per token, whether it was a draft proposal the target accepted.
  """

  tokens: list[int]
  pieces: list[str]
  accepted_mask: list[bool]


@dataclasses.dataclass(frozen=True, kw_only=True)
class PointRow:
  """One measured point: baseline against speculative sampling on the same examples.

  Attributes:
    experiment: the experiment's name.
    task: the corpus ("ende", "mansum").
    split: the split the examples come from.
    draft: the draft's name (a trivial kind or its checkpoint's basename).
    draft_spec: the draft as the experiment lists it.
    target: the target's checkpoint.
    temperature: the sampling temperature (0 = greedy).
    gamma: draft proposals per iteration (the chosen one for gamma = 'auto').
    batch_size: rows per decoder call.
    num_examples: examples decoded per pass.
    input_len: encoder tokens per example (padded).
    max_decode_len: most tokens per example.
    repetitions: timed passes per decoder.
    seed: seed of the sampling PRNG keys.
    baseline_s: the baseline's seconds per pass (all batches).
    speculative_s: the speculative decoder's seconds per pass.
    baseline_median_s: the median of `baseline_s`.
    speculative_median_s: the median of `speculative_s`.
    baseline_compile_s: the baseline's first call less a later one.
    speculative_compile_s: the same for the speculative decoder.
    baseline_tokens: tokens the baseline generated in the first pass.
    speculative_tokens: tokens the speculative decoder generated in the first pass.
    baseline_ms_per_token: the baseline's milliseconds per generated token, the median
      over passes (at T > 0 each pass samples new texts; rows measured on code
      before commit 6cbe6f8 divided by the first pass's tokens, one fixed draw per example).
    speculative_ms_per_token: the speculative decoder's.
    speedup_measured: baseline over speculative milliseconds per token.
    speedup_walltime_ratio: baseline over speculative seconds per pass.
    alpha_empirical: S / (S + R) (`stats.alpha_empirical`).
    alpha_beta: the mean beta (`stats.alpha_beta`, the paper's estimator).
    accepted: accepted proposals S.
    rejections: rejections R.
    beta_sum: the sum of beta over verified positions.
    beta_count: verified positions.
    iterations: target calls, summed over rows.
    loop_iterations: while-loop iterations, summed over batches.
    draft_forward_passes: the draft's forward passes, summed over rows.
    tokens_per_iteration: tokens per target call.
    accepted_histogram: `[gamma + 1]` counts of iterations by accepted proposals.
    t_target_step_s: T_step, the target's one-token cached call.
    t_verify_s: {k: T_verify(k)}, the target's call scoring k tokens, k = 1 being T_step.
    verify_ratio: {k: T_verify(k) / T_step}.
    t_draft_token_s: T_draft, the draft's seconds per proposed token.
    c: T_draft / T_step.
    step_timing_compile_s: compile time of the step-timing loops.
    speedup_predicted_thm38: Theorem 3.8 with alpha_beta, gamma and c.
    speedup_predicted_cost_model: `CostModel.sequence_speedup`: the model calls,
      the loops' own work and the encoders, over `cost_model_terms.loop_tokens`.
    speedup_predicted_steps_only: `CostModel.expected_speedup` of the model calls alone.
    speedup_predicted_cost_model_measured_tokens: the whole model's loops with the
      measured tokens per call in place of E[tokens].
    cost_model_terms: the loops' own work and the encoders, timed apart
      (`timing.measure_loop_costs`), with the measured examples' loop tokens and
      encoders (older rows: the held-out examples' encoders).
    greedy_identical: at T = 0, True (the speculative tokens equal the
      baseline's, checked); None at T > 0.
    idle_check: the `contention.Guard` record of the decoders' timing.
    idle_check_target_costs: the same for T_verify(k).
    example: the first speculative output.
    environment: `timing.environment()`: the machine and versions.
    date: when the point was measured (UTC, ISO 8601).
    gamma_auto: whether gamma was chosen by gamma = 'auto'.
    gamma_choice: `gamma_choice.GammaChoice.to_json()` of that choice (the gamma
      and why), None for a fixed gamma. Rows measured before the whole cost
      model decided hold that older record's fields.
    speedup_spread: the 10th, 50th and 90th percentiles over batches of each
      batch's speedup (its median over passes of seconds per generated token, of
      the baseline over the speculative decoder): how much the measured
      speedup varies between examples. None in rows measured before it was
      recorded (the key is then absent).
    time_split_s: the point's wall-clock seconds, apart: "load" (the target, on
      the run's first point; a draft, on its first point; the examples),
      "compile" (every program JAX compiled for the point, its loading's too),
      "calibration" (every timing of the cost model) and
      "measurement" (the decoders' timed passes) (`timing.PointTiming.phases_s`).
      None in rows measured before it was recorded (the key is then absent).
  """

  experiment: str
  task: str
  split: str
  draft: str
  draft_spec: str
  target: str
  temperature: float
  gamma: int
  batch_size: int
  num_examples: int
  input_len: int
  max_decode_len: int
  repetitions: int
  seed: int
  # Times.
  baseline_s: list[float]
  speculative_s: list[float]
  baseline_median_s: float
  speculative_median_s: float
  baseline_compile_s: float
  speculative_compile_s: float
  baseline_tokens: int
  speculative_tokens: int
  baseline_ms_per_token: float
  speculative_ms_per_token: float
  speedup_measured: float
  speedup_walltime_ratio: float
  # Acceptance.
  alpha_empirical: float
  alpha_beta: float
  accepted: int
  rejections: int
  beta_sum: float
  beta_count: int
  iterations: int
  loop_iterations: int
  draft_forward_passes: int
  tokens_per_iteration: float
  accepted_histogram: list[int]
  # Costs.
  t_target_step_s: float
  t_verify_s: dict[int, float]
  verify_ratio: dict[int, float]
  t_draft_token_s: float
  c: float
  step_timing_compile_s: float
  # Predictions (alpha = alpha_beta).
  speedup_predicted_thm38: float
  speedup_predicted_cost_model: float
  speedup_predicted_steps_only: float
  speedup_predicted_cost_model_measured_tokens: float
  cost_model_terms: LoopCosts
  # Checks, context.
  greedy_identical: bool | None
  idle_check: dict[str, Any]
  idle_check_target_costs: dict[str, Any]
  example: Example
  environment: dict[str, Any]
  date: str
  gamma_auto: bool
  gamma_choice: dict[str, Any] | None
  speedup_spread: list[float] | None = None
  time_split_s: dict[str, float] | None = None

  @property
  def cost_model_error(self) -> float:
    """The cost model's error on this point: (predicted - measured) / measured speedup, the
    prediction `speedup_predicted_cost_model` (> 0: it promised more than was measured)."""
    return self.speedup_predicted_cost_model / self.speedup_measured - 1

  @property
  def cost_model_time_errors(self) -> tuple[float, float]:
    """Where `cost_model_error` comes from: the cost model's seconds per token of the
    baseline and of the speculative decoder over the measured ones, each less 1 (> 0: the
    model priced that decoder slower than it ran, which raises the predicted speedup for the
    baseline and lowers it for the speculative decoder).

    Priced from the row's terms (`cost_model_terms`, `t_verify_s`, `t_draft_token_s`) at
    alpha_beta and gamma over `loop_tokens` tokens a sequence, encoders included, as
    `speedup_predicted_cost_model` is: (1 + baseline) / (1 + speculative) is then
    1 + `cost_model_error`.

    Raises:
      ValueError: at batch > 1 (the loops run to the longest row, while every row's tokens
        count per token), or a row without `loop_tokens` (recorded before the term).
    """
    tokens = self.cost_model_terms.loop_tokens
    if self.batch_size != 1 or not tokens > 0:
      raise ValueError(f"the cost model prices a token at batch 1 with loop_tokens > 0; this "
                       f"row has batch_size={self.batch_size}, loop_tokens={tokens}.")
    model = self.cost_model_terms.cost_model(self.t_verify_s, self.t_draft_token_s)
    per_iteration = float(theory.expected_tokens_per_iteration(self.alpha_beta, self.gamma))
    baseline, speculative = model.sequence_seconds(tokens, per_iteration,
                                                   model.iteration_time(self.gamma))
    return (baseline / tokens / (self.baseline_ms_per_token / 1e3) - 1,
            speculative / tokens / (self.speculative_ms_per_token / 1e3) - 1)

  @property
  def efficiency(self) -> float:
    """The measured speedup over Theorem 3.8's with the row's own alpha, c and gamma."""
    return self.speedup_measured / self.speedup_predicted_thm38

  @classmethod
  def from_json(cls, row: Mapping[str, Any]) -> PointRow:
    """The record of a row read from results.jsonl.

    Raises:
      TypeError: the row lacks a field or has one the record does not know.
    """
    values = dict(row)
    for name in _INT_KEYED:
      values[name] = {int(k): v for k, v in row[name].items()}
    values["cost_model_terms"] = LoopCosts(**row["cost_model_terms"])
    values["example"] = Example(**row["example"])
    return cls(**values)

  def to_json(self) -> dict[str, Any]:
    """The row as results.jsonl holds it (`results_io.append_row` writes it)."""
    row = dataclasses.asdict(self)
    for name in _INT_KEYED:
      row[name] = {str(k): v for k, v in row[name].items()}
    for name in ("speedup_spread", "time_split_s"):
      if row[name] is None:  # Rows from before it was recorded stay as they were.
        del row[name]
    row["cost_model_terms"] = self.cost_model_terms.to_json()
    if row["cost_model_terms"]["proposal_overhead_s"] == 0.0:
      # A row that times its loop at its own gamma alone has no per-proposal term (one
      # priced by gamma = 'auto''s calibration, at two gammas, has), and rows from before
      # the term existed stay as they were.
      del row["cost_model_terms"]["proposal_overhead_s"]
    return row

  @property
  def key(self) -> tuple:
    """The point measured (`point_key`): gamma is 'auto' for a chosen gamma."""
    return point_key(self.task, self.draft, self.temperature,
                     AUTO if self.gamma_auto else self.gamma, self.batch_size)

  @property
  def gamma_label(self) -> str:
    """The gamma as tables print it: "3", or "3 (auto)" when gamma = 'auto' chose it."""
    return f"{self.gamma} (auto)" if self.gamma_auto else str(self.gamma)
