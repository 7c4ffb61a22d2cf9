"""One measured point: baseline vs speculative sampling on the same examples, one row.

The two decoders run interleaved over the same fixed-length batches
(`benchmarking.time_interleaved`: the order alternates per batch and repetition,
so background load hits both alike; the first call of each compiles and is
reported apart; times are medians over repetitions of the total over all
batches). The row holds the measured speedup, alpha by both estimators, tokens
per call and c (`specdec_jax.stats`), the measured step costs, and the speedups
predicted by Theorem 3.8, by `CostModel` on the model calls alone (steps only), and
by `CostModel` with the loops' overheads and the encoders, timed apart on held-out
examples (`measure_loop_costs`). `pooled_alpha` measures
acceptance alone (no timing) for `experiments.measure_alpha`.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable, Sequence

import jax
import numpy as np

from specdec_jax import auto_gamma, benchmarking, contention, distributed, stats, theory
from specdec_jax.decoding.baseline import temperature_sample
from specdec_jax.decoding.drafts import Draft
from specdec_jax.decoding.sampling import Warp
from specdec_jax.decoding.speculative import speculative_sample
from specdec_jax.experiment.settings import Experiment, Point, draft_name
from specdec_jax.models import T5Model

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class TargetCosts:
  """Measured target step costs at one batch size.

  Attributes:
    t_chunk: {k: seconds per cached call scoring k tokens}; k = 1 is T_step.
    compile_s: compile time of all timing loops together.
    idle_check: the `contention.Guard` record of the measurement.
  """

  t_chunk: dict[int, float]
  compile_s: float
  idle_check: dict

  @property
  def t_step(self) -> float:
    return self.t_chunk[1]


def timing_geometry(exp: Experiment, max_gamma: int) -> tuple[int, int]:
  """(cache_len, position) used by every step-time measurement of a run.

  The cache is as long as the speculative decoder's; chunks are scored halfway
  into the generation (`auto_gamma.timing_geometry`, so gamma='auto' times alike).
  """
  return auto_gamma.timing_geometry(exp.max_decode_len, max_gamma)


def measure_target_costs(exp: Experiment, target: T5Model, params: dict, inputs: Array,
                         max_gamma: int) -> TargetCosts:
  """T_step and T_verify(k), k = 1..max_gamma + 1, at the batch size of `inputs`."""
  cache_len, position = timing_geometry(exp, max_gamma)
  with contention.quiet("target step times") as guard:
    times = benchmarking.target_step_times(
        target, params, inputs, chunk_lengths=range(1, max_gamma + 2), cache_len=cache_len,
        position=position, calls=exp.timing_calls, repeats=exp.timing_repeats)
  return TargetCosts({k: t.seconds for k, t in times.items()},
                     sum(t.compile_s for t in times.values()), guard.record())


def measure_draft_cost(exp: Experiment, draft: Draft, inputs: Array, gamma: int, warp: Warp,
                       max_gamma: int, *, target: T5Model, target_params: dict
                       ) -> benchmarking.StepTimes:
  """T_draft: seconds per proposed token at this gamma and sampling setting (the target
  encodes `inputs` first, outside the timing, for a draft that reads its encoder)."""
  cache_len, position = timing_geometry(exp, max_gamma)
  return benchmarking.draft_token_time(
      draft, inputs, gamma=gamma, warp=warp, cache_len=cache_len, position=position,
      calls=exp.timing_calls, repeats=exp.timing_repeats, seed=exp.seed,
      target_encoded=benchmarking.target_encoded_for(draft, target, target_params, inputs))


@dataclasses.dataclass(frozen=True)
class LoopCosts:
  """What the decoders cost besides their model calls (`theory.CostModel`'s extra terms).

  Attributes:
    encode_target_s: the target's encoder, seconds per batch.
    encode_draft_s: the draft's encoder, seconds per batch (0 without one).
    step_overhead_s: seconds per baseline step beyond T_step.
    iteration_overhead_s: seconds per speculative iteration beyond gamma T_draft +
      T_verify(gamma + 1).
    batches: how many batches the decoders were timed on.
    held_out: whether those were examples outside the measured ones.
  """

  encode_target_s: float
  encode_draft_s: float
  step_overhead_s: float
  iteration_overhead_s: float
  batches: int
  held_out: bool


def measure_loop_costs(exp: Experiment, point: Point, target: T5Model, target_params: dict,
                       draft: Draft, batches: Sequence[Array], t_chunk: dict[int, float],
                       t_draft: float, *, held_out: bool) -> LoopCosts:
  """Times both encoders and one decoding of each batch by each decoder (compiled already),
  and attributes to overhead what the model calls (`t_chunk`, `t_draft`) leave.

  Args:
    exp: the experiment (max_decode_len, timing_repeats, seed).
    point: the point (temperature, gamma).
    target: the target model.
    target_params: its parameters.
    draft: the point's draft.
    batches: int32 `[point.batch_size, input_len]` batches to decode.
    t_chunk: {k: T_verify(k)}, k = 1 being T_step.
    t_draft: the draft's seconds per proposed token.
    held_out: recorded: whether `batches` lie outside the measured examples.
  """
  kwargs = dict(max_decode_len=exp.max_decode_len, temperature=point.temperature,
                rng=jax.random.PRNGKey(exp.seed))
  prepared = target.prepare(target_params)
  cache_len, _ = timing_geometry(exp, point.gamma)
  encode_target = benchmarking.time_calls(
      lambda: target.encode(prepared, batches[0]), exp.timing_repeats).median_s
  target_encoded = benchmarking.target_encoded_for(draft, target, target_params, batches[0])
  init_draft = jax.jit(lambda d, x, encoded: d.init_state(x, cache_len, encoded))
  encode_draft = benchmarking.time_calls(
      lambda: init_draft(draft, batches[0], target_encoded), exp.timing_repeats).median_s
  base_s = spec_s = 0.0
  steps = iterations = 0
  for batch in batches:
    seconds, out = benchmarking.timed(lambda b=batch: temperature_sample(
        target, target_params, b, **kwargs))
    base_s += seconds
    steps += int(np.max(distributed.fetch(out.lengths)))
    seconds, out = benchmarking.timed(lambda b=batch: speculative_sample(
        target, target_params, draft, b, gamma=point.gamma, **kwargs))
    spec_s += seconds
    iterations += int(distributed.fetch(out.stats.loop_iterations))
  n = len(batches)
  iteration = point.gamma * t_draft + t_chunk[point.gamma + 1]
  return LoopCosts(
      encode_target_s=encode_target, encode_draft_s=encode_draft,
      step_overhead_s=(base_s - n * encode_target) / max(steps, 1) - t_chunk[1],
      iteration_overhead_s=((spec_s - n * (encode_target + encode_draft)) / max(iterations, 1)
                            - iteration),
      batches=n, held_out=held_out)


def _first_difference(a: np.ndarray, b: np.ndarray) -> str:
  row, col = np.argwhere(a != b)[0]
  return (f"row {row}, token {col}: baseline {a[row, col:col + 5].tolist()}, speculative "
          f"{b[row, col:col + 5].tolist()}")


def _greedy_check(point: Point) -> Callable[[int, dict], None]:
  """`time_interleaved`'s check at temperature 0: speculative tokens equal the baseline's."""

  def check(i: int, outputs: dict) -> None:
    base, spec = outputs["baseline"], outputs["speculative"]
    if not (np.array_equal(base.sequences, spec.sequences)
            and np.array_equal(base.lengths, spec.lengths)):
      raise RuntimeError(
          f"Greedy speculative output differs from the baseline ({point}, batch {i}, "
          f"{_first_difference(np.asarray(base.sequences), np.asarray(spec.sequences))}); "
          "speculative sampling at temperature 0 must reproduce the target's greedy tokens.")

  return check


def pooled_alpha(target: T5Model, target_params: dict, draft: Draft, batches: list[np.ndarray],
                 *, temperature: float, gamma: int, max_decode_len: int, seed: int
                 ) -> dict[str, float]:
  """Speculative sampling over `batches` (int32 `[b, input_len]` each), no timing; the
  counters pooled over all of them (`stats.Pooled`).

  Returns:
    {"alpha_beta", "alpha_empirical", "tokens_per_iteration", "tokens"}.
  """
  pooled = stats.Pooled.of([jax.device_get(speculative_sample(
      target, target_params, draft, batch, gamma=gamma, max_decode_len=max_decode_len,
      temperature=temperature, rng=jax.random.fold_in(jax.random.PRNGKey(seed), i)))
      for i, batch in enumerate(batches)])
  return {"alpha_beta": pooled.alpha_beta(), "alpha_empirical": pooled.alpha_empirical(),
          "tokens_per_iteration": pooled.tokens_per_call(), "tokens": int(pooled["tokens"])}


def measure_point(exp: Experiment, point: Point, target: T5Model, target_params: dict,
                  draft: Draft, batches: Sequence[Array], target_costs: TargetCosts,
                  max_gamma: int, pieces: Callable[[list[int]], list[str]],
                  held_out: Sequence[Array] = ()) -> dict:
  """Measures one (task, draft, temperature, gamma, batch size) point.

  Args:
    exp: the experiment (max_decode_len, repetitions, seed, ...).
    point: the point.
    target: the target model.
    target_params: its parameters.
    draft: the draft built from `point.draft`.
    batches: int32 `[point.batch_size, exp.input_len]` input batches (all examples).
    target_costs: the target's step costs at this batch size.
    max_gamma: the largest gamma of the run (sets the timing cache length).
    pieces: token ids -> SentencePiece pieces (for the saved example).
    held_out: batches of the same shape outside the measured examples, on which
      the loops' overheads and the encoders are timed for the cost model
      (`measure_loop_costs`); empty: the first measured batch.

  Returns:
    The results row (JSON-serialisable).

  Raises:
    RuntimeError: at temperature 0, if the speculative tokens differ from the
      baseline's (they must be identical).
  """
  greedy = point.temperature == 0
  base_key = jax.random.PRNGKey(exp.seed)
  rngs = [jax.random.fold_in(base_key, i) for i in range(len(batches))]
  kwargs = dict(max_decode_len=exp.max_decode_len, temperature=point.temperature)

  def baseline(i: int):
    return temperature_sample(target, target_params, batches[i], rng=rngs[i], **kwargs)

  def speculative(i: int):
    return speculative_sample(target, target_params, draft, batches[i], gamma=point.gamma,
                              rng=rngs[i], **kwargs)

  decoders = {"baseline": baseline, "speculative": speculative}
  warp = Warp(point.temperature)
  with contention.quiet(str(point)) as guard:
    timings, outputs = benchmarking.time_interleaved(
        decoders, len(batches), exp.repetitions, fetch=distributed.fetch,
        check=_greedy_check(point) if greedy else None)
    draft_cost = measure_draft_cost(exp, draft, batches[0], point.gamma, warp, max_gamma,
                                    target=target, target_params=target_params)
    loop_costs = measure_loop_costs(
        exp, point, target, target_params, draft, list(held_out) or list(batches[:1]),
        target_costs.t_chunk, draft_cost.seconds, held_out=bool(held_out))

  median = {name: t.median_s for name, t in timings.items()}
  tokens = {name: int(sum(int(np.sum(o.lengths)) for o in outs)) for name, outs in outputs.items()}
  pooled = stats.Pooled.of(outputs["speculative"])
  alpha_beta = pooled.alpha_beta()
  tokens_per_iteration = pooled.tokens_per_call()

  t_step = target_costs.t_step
  c = stats.draft_cost(draft_cost.seconds, t_step)
  steps_only = theory.CostModel(t_step, draft_cost.seconds, target_costs.t_chunk)
  cost_model = theory.CostModel(
      t_step, draft_cost.seconds, target_costs.t_chunk,
      t_step_overhead=loop_costs.step_overhead_s,
      t_iteration_overhead=loop_costs.iteration_overhead_s,
      t_encode_target=loop_costs.encode_target_s, t_encode_draft=loop_costs.encode_draft_s)
  iteration_s = cost_model.iteration_time(point.gamma)
  # Tokens per batch as the loops run them: until the batch's longest row ends.
  loop_tokens = float(np.mean([int(np.max(o.lengths)) for o in outputs["baseline"]]))

  # Per generated token: at T > 0 the two decoders sample texts of different lengths.
  ms_per_token = {name: 1e3 * median[name] / max(tokens[name], 1) for name in decoders}
  spec_out = outputs["speculative"][0]
  length = int(spec_out.lengths[0])
  example_tokens = np.asarray(spec_out.sequences[0, :length]).tolist()

  return {
      "experiment": exp.name,
      "task": point.task,
      "split": exp.split,
      "draft": draft_name(point.draft),
      "draft_spec": point.draft,
      "target": exp.target,
      "temperature": point.temperature,
      "gamma": point.gamma,
      "batch_size": point.batch_size,
      "num_examples": exp.num_examples,
      "input_len": exp.input_len,
      "max_decode_len": exp.max_decode_len,
      "repetitions": exp.repetitions,
      "seed": exp.seed,
      # Times.
      "baseline_s": list(timings["baseline"].totals_s),
      "speculative_s": list(timings["speculative"].totals_s),
      "baseline_median_s": median["baseline"],
      "speculative_median_s": median["speculative"],
      "baseline_compile_s": timings["baseline"].compile_s,
      "speculative_compile_s": timings["speculative"].compile_s,
      "baseline_tokens": tokens["baseline"],
      "speculative_tokens": tokens["speculative"],
      "baseline_ms_per_token": ms_per_token["baseline"],
      "speculative_ms_per_token": ms_per_token["speculative"],
      "speedup_measured": ms_per_token["baseline"] / ms_per_token["speculative"],
      "speedup_walltime_ratio": median["baseline"] / median["speculative"],
      # Acceptance.
      "alpha_empirical": pooled.alpha_empirical(),
      "alpha_beta": alpha_beta,
      "accepted": int(pooled["accepted"]),
      "rejections": int(pooled["rejections"]),
      "beta_sum": float(pooled["beta_sum"]),
      "beta_count": int(pooled["beta_count"]),
      "iterations": int(pooled["iterations"]),
      "loop_iterations": int(pooled["loop_iterations"]),
      "draft_forward_passes": int(pooled["draft_forward_passes"]),
      "tokens_per_iteration": tokens_per_iteration,
      "accepted_histogram": pooled["accepted_histogram"].astype(int).tolist(),
      # Costs.
      "t_target_step_s": t_step,
      "t_verify_s": {str(k): t for k, t in target_costs.t_chunk.items()},
      "verify_ratio": {str(k): t / t_step for k, t in target_costs.t_chunk.items()},
      "t_draft_token_s": draft_cost.seconds,
      "c": c,
      "step_timing_compile_s": target_costs.compile_s + draft_cost.compile_s,
      # Predictions (alpha = alpha_beta, the paper's estimator).
      "speedup_predicted_thm38": float(theory.walltime_improvement(alpha_beta, point.gamma, c)),
      "speedup_predicted_cost_model": cost_model.sequence_speedup(alpha_beta, point.gamma,
                                                                  loop_tokens),
      "speedup_predicted_steps_only": float(steps_only.expected_speedup(alpha_beta, point.gamma)),
      "speedup_predicted_cost_model_measured_tokens": (
          tokens_per_iteration * (t_step + loop_costs.step_overhead_s) / iteration_s),
      "cost_model_terms": {**dataclasses.asdict(loop_costs), "loop_tokens": loop_tokens},
      "greedy_identical": True if greedy else None,
      "idle_check": guard.record(),
      "idle_check_target_costs": target_costs.idle_check,
      "example": {
          "tokens": example_tokens,
          "pieces": pieces(example_tokens),
          "accepted_mask": np.asarray(spec_out.accepted_mask[0, :length]).astype(bool).tolist(),
      },
      "environment": benchmarking.environment(),
      "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
  }
