"""One measured point: baseline vs speculative sampling on the same examples, one row.

`timing.time_point` times the point and returns its whole record (the target's step
costs when no earlier point of its batch size did, gamma = 'auto''s calibration, both
decoders interleaved over the same batches with the measured speedup per generated token
(at T > 0 every pass samples new texts, `timing.Draws`), the draft's cost per token, the
loops' own work, the encoders, and where it ran); this module says what was measured and
turns the record into the row (`record.PointRow`): alpha by both estimators, tokens per
call and c (`specdec_jax.stats`), the measured step costs, and the speedups predicted by
Theorem 3.8, by `theory.CostModel` on the model calls alone (steps only) and with the
loops' own work and the encoders.

Any target kind (`experiment.targets.interface`): the target is a `LoadedTarget` (its
`Scorer`, EOS id and token pieces), decoded by the generic loops on batches the runner
checked once against the vocabulary and cut to their length bucket.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable, Sequence
from typing import Any

import gin
import jax
import numpy as np

from specdec_jax import contention, stats, theory
from specdec_jax.costs import timing
from specdec_jax.decoding.drafts import Draft
from specdec_jax.decoding.sampling import Warp
from specdec_jax.experiment.record import Example, PointRow
from specdec_jax.experiment.settings import AUTO, Experiment, Point, draft_name
from specdec_jax.experiment.targets.interface import LoadedTarget

Array = jax.Array


@gin.configurable
@dataclasses.dataclass(frozen=True)
class GreedyCheck:
  """What a greedy point does when its speculative tokens differ from the baseline's (gin:
  `GreedyCheck.enforce`).

  Attributes:
    enforce: raise (the default: on a CPU both decoders give the same tokens, exactly);
      False: say so, record it (the row's `greedy_identical` is False) and go on: on an
      accelerator a k-token call may round differently from k one-token calls (bfloat16,
      TF32 dots) and flip a near-tie (`experiments.device_check`).
  """

  enforce: bool = True


def _identity(exp: Experiment, point: Point) -> dict[str, Any]:
  """The fields that say what was measured (but the gamma, which 'auto' chooses)."""
  return dict(experiment=exp.name, task=point.task, split=exp.split,
              draft=draft_name(point.draft), draft_spec=point.draft, target=exp.target,
              temperature=point.temperature, batch_size=point.batch_size,
              num_examples=exp.num_examples, input_len=exp.input_len,
              max_decode_len=exp.max_decode_len, repetitions=exp.repetitions, seed=exp.seed)


def _example(output: Any, pieces: Callable[[list[int]], list[str]]) -> Example:
  """The first row of a fetched speculative output."""
  length = int(output.lengths[0])
  tokens = np.asarray(output.sequences[0, :length]).tolist()
  return Example(tokens=tokens, pieces=pieces(tokens),
                 accepted_mask=np.asarray(output.accepted_mask[0, :length]).astype(bool).tolist())


def _acceptance_and_costs(timed: timing.PointTiming) -> dict[str, Any]:
  """alpha by both estimators and the speculative loop's counters (`stats.Pooled`), the
  measured step costs, and the three predictions from them (alpha = alpha_beta)."""
  pooled = stats.Pooled.of(timed.decoders.outputs["speculative"])
  counts = {name: int(pooled[name]) for name in (
      "accepted", "rejections", "beta_count", "iterations", "loop_iterations",
      "draft_forward_passes")}
  alpha, tokens_per_iteration = pooled.alpha_beta(), pooled.tokens_per_call()
  verify, loop_costs, gamma = timed.verify, timed.loop_costs, timed.gamma
  t_step, t_draft = verify.t_step, timed.draft_cost.seconds
  c = stats.draft_cost(t_draft, t_step)
  steps_only = theory.CostModel(t_step, t_draft, verify.t_chunk)
  cost_model = loop_costs.cost_model(verify.t_chunk, t_draft)
  return counts | dict(
      alpha_empirical=pooled.alpha_empirical(), alpha_beta=alpha,
      beta_sum=float(pooled["beta_sum"]), tokens_per_iteration=tokens_per_iteration,
      accepted_histogram=pooled["accepted_histogram"].astype(int).tolist(),
      t_target_step_s=t_step, t_verify_s=dict(verify.t_chunk),
      verify_ratio={k: t / t_step for k, t in verify.t_chunk.items()}, t_draft_token_s=t_draft,
      c=c, step_timing_compile_s=verify.compile_s + timed.draft_cost.compile_s,
      speedup_predicted_thm38=float(theory.walltime_improvement(alpha, gamma, c)),
      speedup_predicted_cost_model=cost_model.sequence_speedup(alpha, gamma,
                                                               loop_costs.loop_tokens),
      speedup_predicted_steps_only=float(steps_only.expected_speedup(alpha, gamma)),
      speedup_predicted_cost_model_measured_tokens=(
          tokens_per_iteration * (t_step + loop_costs.step_overhead_s)
          / cost_model.iteration_time(gamma)))


def measure_point(exp: Experiment, point: Point, target: LoadedTarget, draft: Draft,
                  batches: Sequence[Array], held_out: Sequence[Array], max_gamma: int,
                  shared: timing.SharedCosts, greedy: GreedyCheck,
                  loading: timing.Span = timing.Span()) -> PointRow:
  """Measures one (task, draft, temperature, gamma, batch size) point: one routine
  (`timing.time_point`) times it, the row is made of its record and the outputs.

  Args:
    exp: the experiment (max_decode_len, repetitions, seed, ...).
    point: the point; its gamma may be 'auto' (chosen on `held_out`).
    target: the loaded target (its scorer, EOS id, and pieces for the saved example).
    draft: the draft built from `point.draft`.
    batches: int32 `[point.batch_size, input_len]` input batches (all examples),
      checked against the vocabulary and cut to their length bucket.
    held_out: batches of the same shape outside the measured examples, on which gamma
      = 'auto' calibrates and the loops' overheads are timed for the cost model
      (`timing.measure_loop_costs`); empty: the first measured batch.
    max_gamma: the largest gamma of the run (sets the timing cache length).
    shared: what points of this batch size share (the target's step costs) and this
      point's gamma = 'auto' choice, filled in as measured (`timing.SharedCosts`).
    greedy: what a greedy point does when its tokens differ from the baseline's.
    loading: the runner's loading for this point (the row's `time_split_s["load"]`;
      what it compiled goes to "compile").

  Returns:
    The row.

  Raises:
    RuntimeError: at temperature 0, if the speculative tokens differ from the
      baseline's (they must be identical, unless `greedy.enforce` is False).
    contention.ContentionError: another process was busy during a timing.
  """
  auto = point.gamma == AUTO
  identity = _identity(exp, point)
  setup = timing.PointSetup(
      gamma=None if auto else point.gamma, warp=Warp(point.temperature),
      max_decode_len=exp.max_decode_len, max_gamma=max_gamma,
      auto_max_gamma=exp.auto_max_gamma, eos_id=target.eos_id, passes=exp.repetitions,
      timing_calls=exp.timing_calls, timing_repeats=exp.timing_repeats,
      timing_rounds=exp.timing_rounds, seed=exp.seed, enforce_greedy=greedy.enforce)
  timed = timing.time_point(target.scorer, draft, batches, held_out, setup, shared,
                            guard=contention.quiet, what=str(point))
  return PointRow(
      **identity, gamma=timed.gamma, **timed.decoders.per_token,
      example=_example(timed.decoders.outputs["speculative"][0], target.pieces),
      **_acceptance_and_costs(timed),
      cost_model_terms=timed.loop_costs, greedy_identical=timed.decoders.greedy_identical,
      idle_check=dict(timed.idle_check), idle_check_target_costs=dict(timed.verify_check),
      environment=timed.environment,
      date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      gamma_auto=auto, gamma_choice=None if timed.choice is None else timed.choice.to_json(),
      time_split_s={**timed.phases_s, "load": loading.rest_s,
                    "compile": timed.phases_s["compile"] + loading.compile_s})
