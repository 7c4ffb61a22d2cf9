"""One measured point: baseline vs speculative sampling on the same examples, one row.

`timing.time_point` times the point (the target's step costs when no earlier point of
its batch size did, gamma = 'auto''s calibration, both decoders interleaved over the
same batches, the draft's cost per token, the loops' own work and the encoders); this
module turns its record and the outputs into the row (`record.PointRow`): the measured
speedup per generated token (at T > 0 every pass samples new texts, `Draws`), alpha by
both estimators, tokens per call and c (`specdec_jax.stats`), the measured step costs,
and the speedups predicted by Theorem 3.8, by `theory.CostModel` on the model calls
alone (steps only) and with the loops' own work and the encoders.

Any target kind (`experiment.targets.interface`): the target is a `LoadedTarget` (its
`Scorer`, EOS id and token pieces), decoded by the generic loops on batches the runner
checked once against the vocabulary and cut to their length bucket.
"""

from __future__ import annotations

import dataclasses
import datetime
import statistics
from collections.abc import Callable, Sequence
from typing import Any

import gin
import jax
import numpy as np
from absl import logging

from specdec_jax import contention, stats, theory, timing
from specdec_jax.decoding.drafts import Draft
from specdec_jax.decoding.sampling import Warp
from specdec_jax.experiment.record import Example, PointRow
from specdec_jax.experiment.settings import AUTO, Experiment, Point, draft_name
from specdec_jax.experiment.targets.interface import LoadedTarget

Array = jax.Array


def _first_difference(base: Any, spec: Any) -> str:
  a, b = np.asarray(base.sequences), np.asarray(spec.sequences)
  if np.array_equal(a, b):
    return (f"lengths: baseline {np.asarray(base.lengths).tolist()}, speculative "
            f"{np.asarray(spec.lengths).tolist()}")
  row, col = np.argwhere(a != b)[0]
  return (f"row {row}, token {col}: baseline {a[row, col:col + 5].tolist()}, speculative "
          f"{b[row, col:col + 5].tolist()}")


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


def _same_greedy(point: Point, i: int, outputs: dict[str, Any], enforce: bool) -> bool:
  """At temperature 0: whether the speculative tokens of batch i equal the baseline's.

  Raises:
    RuntimeError: they differ and `enforce`.
  """
  base, spec = outputs["baseline"], outputs["speculative"]
  if (np.array_equal(base.sequences, spec.sequences)
      and np.array_equal(base.lengths, spec.lengths)):
    return True
  message = (f"Greedy speculative output differs from the baseline ({point}, batch {i}, "
             f"{_first_difference(base, spec)})")
  if enforce:
    raise RuntimeError(f"{message}; speculative sampling at temperature 0 must reproduce the "
                       "target's greedy tokens.")
  logging.warning("%s; recorded (GreedyCheck.enforce = False).", message)
  return False


class Draws:
  """The PRNG key of every decoder call, and the tokens each call generated.

  Each call of a decoder on a batch samples with a key of its own (the seed, the
  batch, the call's number), so at T > 0 every pass draws new texts for both
  decoders: with one fixed draw per example, every pass would compare the same
  two samples of different lengths, and a per-token speedup would carry their
  difference (a sequence's fixed costs spread over more or fewer tokens).
  Decoders' j-th calls on a batch share a key.

  Attributes:
    tokens: decoder name -> `[pass][batch]` generated tokens (`record`).
    greedy_identical: at temperature 0, whether every greedy output equaled the baseline's
      (`GreedyCheck`); None at T > 0.
  """

  def __init__(self, seed: int, names: Sequence[str], num_batches: int,
               point: Point, enforce_greedy: bool = True) -> None:
    self._base = jax.random.PRNGKey(seed)
    self._calls = {name: [0] * num_batches for name in names}
    self._num_batches = num_batches
    self._point = point
    self._enforce_greedy = enforce_greedy
    self.tokens: dict[str, list[list[int]]] = {name: [] for name in names}
    self.greedy_identical: bool | None = True if point.temperature == 0 else None

  def key(self, name: str, i: int) -> Array:
    """The key of decoder `name`'s next call on batch `i`."""
    n = self._calls[name][i]
    self._calls[name][i] += 1
    return jax.random.fold_in(jax.random.fold_in(self._base, i), n)

  def record(self, i: int, outputs: dict[str, Any]) -> None:
    """`time_interleaved`'s check: keeps each output's token count (called pass by pass,
    batch by batch) and, at temperature 0, checks greedy equality."""
    if self._point.temperature == 0 and not _same_greedy(self._point, i, outputs,
                                                         self._enforce_greedy):
      self.greedy_identical = False
    for name, out in outputs.items():
      if i == 0:
        self.tokens[name].append([0] * self._num_batches)
      self.tokens[name][-1][i] = int(np.sum(out.lengths))


def _identity(exp: Experiment, point: Point) -> dict[str, Any]:
  """The fields that say what was measured."""
  return dict(experiment=exp.name, task=point.task, split=exp.split,
              draft=draft_name(point.draft), draft_spec=point.draft, target=exp.target,
              temperature=point.temperature, gamma=point.gamma, batch_size=point.batch_size,
              num_examples=exp.num_examples, input_len=exp.input_len,
              max_decode_len=exp.max_decode_len, repetitions=exp.repetitions, seed=exp.seed)


def decoder_times(timings: dict[str, timing.DecoderTiming],
                  tokens: dict[str, list[list[int]]]) -> dict[str, Any]:
  """The decoders' times, tokens and the measured speedup, per generated token (at T > 0
  the decoders sample texts of different lengths; each pass draws anew, `Draws`)."""
  fields: dict[str, Any] = {}
  per_batch = {}
  for name, decoder in timings.items():
    per_pass = [1e3 * seconds / max(sum(n), 1)
                for seconds, n in zip(decoder.totals_s, tokens[name], strict=True)]
    fields.update({f"{name}_s": list(decoder.totals_s), f"{name}_median_s": decoder.median_s,
                   f"{name}_compile_s": decoder.compile_s,
                   f"{name}_tokens": sum(tokens[name][0]),
                   f"{name}_ms_per_token": statistics.median(per_pass)})
    passes = list(zip(decoder.calls_s, tokens[name], strict=True))
    per_batch[name] = [statistics.median(calls[i] / max(n[i], 1) for calls, n in passes)
                       for i in range(len(tokens[name][0]))]
  speedups = np.divide(per_batch["baseline"], per_batch["speculative"])
  return fields | dict(
      speedup_measured=fields["baseline_ms_per_token"] / fields["speculative_ms_per_token"],
      speedup_walltime_ratio=fields["baseline_median_s"] / fields["speculative_median_s"],
      speedup_spread=[float(q) for q in np.percentile(speedups, [10, 50, 90])])


def _acceptance(pooled: stats.Pooled) -> dict[str, Any]:
  """alpha by both estimators and the speculative loop's counters."""
  counts = {name: int(pooled[name]) for name in (
      "accepted", "rejections", "beta_count", "iterations", "loop_iterations",
      "draft_forward_passes")}
  return counts | dict(
      alpha_empirical=pooled.alpha_empirical(), alpha_beta=pooled.alpha_beta(),
      beta_sum=float(pooled["beta_sum"]), tokens_per_iteration=pooled.tokens_per_call(),
      accepted_histogram=pooled["accepted_histogram"].astype(int).tolist())


def _costs_and_predictions(point: Point, verify: timing.VerifyTimes,
                           draft_cost: timing.StepTimes, loop_costs: theory.LoopCosts,
                           alpha: float, tokens_per_iteration: float) -> dict[str, Any]:
  """The measured step costs and the three predictions from them (alpha = alpha_beta)."""
  t_step, t_draft = verify.t_step, draft_cost.seconds
  c = stats.draft_cost(t_draft, t_step)
  steps_only = theory.CostModel(t_step, t_draft, verify.t_chunk)
  cost_model = loop_costs.cost_model(verify.t_chunk, t_draft)
  return dict(
      t_target_step_s=t_step, t_verify_s=dict(verify.t_chunk),
      verify_ratio={k: t / t_step for k, t in verify.t_chunk.items()}, t_draft_token_s=t_draft,
      c=c, step_timing_compile_s=verify.compile_s + draft_cost.compile_s,
      speedup_predicted_thm38=float(theory.walltime_improvement(alpha, point.gamma, c)),
      speedup_predicted_cost_model=cost_model.sequence_speedup(alpha, point.gamma,
                                                               loop_costs.loop_tokens),
      speedup_predicted_steps_only=float(steps_only.expected_speedup(alpha, point.gamma)),
      speedup_predicted_cost_model_measured_tokens=(
          tokens_per_iteration * (t_step + loop_costs.step_overhead_s)
          / cost_model.iteration_time(point.gamma)))


def _example(output: Any, pieces: Callable[[list[int]], list[str]]) -> Example:
  """The first row of a fetched speculative output."""
  length = int(output.lengths[0])
  tokens = np.asarray(output.sequences[0, :length]).tolist()
  return Example(tokens=tokens, pieces=pieces(tokens),
                 accepted_mask=np.asarray(output.accepted_mask[0, :length]).astype(bool).tolist())


def measure_point(exp: Experiment, point: Point, target: LoadedTarget, draft: Draft,
                  batches: Sequence[Array], held_out: Sequence[Array], max_gamma: int,
                  shared: timing.SharedCosts, greedy: GreedyCheck, load_s: float = 0.0
                  ) -> PointRow:
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
    load_s: the seconds the runner spent loading for this point (the row's
      `time_split_s["load"]`).

  Returns:
    The row.

  Raises:
    RuntimeError: at temperature 0, if the speculative tokens differ from the
      baseline's (they must be identical, unless `greedy.enforce` is False).
    contention.ContentionError: another process was busy during a timing.
  """
  auto = point.gamma == AUTO
  setup = timing.PointSetup(
      gamma=None if auto else point.gamma, warp=Warp(point.temperature),
      max_decode_len=exp.max_decode_len, max_gamma=max_gamma,
      auto_max_gamma=exp.auto_max_gamma, eos_id=target.eos_id, passes=exp.repetitions,
      timing_calls=exp.timing_calls, timing_repeats=exp.timing_repeats,
      timing_rounds=exp.timing_rounds, seed=exp.seed)
  draws = Draws(exp.seed, ("baseline", "speculative"), len(batches), point, greedy.enforce)
  timed = timing.time_point(target.scorer, draft, batches, held_out, setup, shared,
                            guard=contention.quiet, key=draws.key, check=draws.record,
                            what=str(point))
  point = dataclasses.replace(point, gamma=timed.gamma)
  pooled = stats.Pooled.of(timed.outputs["speculative"])
  return PointRow(
      **_identity(exp, point), **decoder_times(timed.timings, draws.tokens),
      **_acceptance(pooled),
      **_costs_and_predictions(point, timed.verify, timed.draft_cost, timed.loop_costs,
                               pooled.alpha_beta(), pooled.tokens_per_call()),
      cost_model_terms=timed.loop_costs, greedy_identical=draws.greedy_identical,
      idle_check=dict(timed.idle_check), idle_check_target_costs=dict(timed.verify_check),
      example=_example(timed.outputs["speculative"][0], target.pieces),
      environment=timing.environment(target.scorer.decode_options.provenance()),
      date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      gamma_auto=auto, gamma_choice=None if timed.choice is None else timed.choice.to_json(),
      time_split_s={"load": load_s, **timed.phases_s})
