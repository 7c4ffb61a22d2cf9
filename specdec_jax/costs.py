"""Cost measurement: the times gamma = 'auto' and every row's cost model are made of.

What `gamma_choice.make_choice` needs, measured on the models themselves:

- T_verify(k), k = 1..max_gamma + 1 (`verify_times`): `rounds` rounds of
  timed loops over every k, the order of k reversed every other round so that
  drift hits all k alike; T_step is the median of its rounds and T_verify(k)
  is T_step times the ratio of k's fastest round to T_step's fastest round
  (`VerifyTimes`), fitted non-decreasing in k before a decision; the rounds'
  spread is recorded beside it.
- T_draft, seconds per proposed token at one gamma (`draft_time`; taken to be
  the same per token at every gamma).
- Both decoders over a few batches, the speculative one at two gammas
  (`measure_loop_costs`): alpha by both estimators from the outputs at the
  first (under the paper's i.i.d. model alpha does not depend on gamma), and
  the loops' own work: each decoding's time less its model calls and encoders,
  per baseline step, and per speculative iteration as a fixed part plus a part
  per proposal (the line through the two gammas' overheads, its slope at least
  0), the encoders timed apart, and N, the tokens a batch runs for.

`calibrate` is the one calibration: it measures the draft and the loops with
the T_verify(k) it is given and decides (`make_choice`). `experiments.run`
calls it for each 'auto' point with the T_verify(k) it measures for its rows
anyway; on the 2-core CPU, for the shipped family, a calibration takes seconds
besides compilation.

Everything here takes the target as a `scorer.Scorer` (any model: a T5, a
decoder-only one) and times what the decoding loops call: `Scorer.score` for
T_verify(k), `Draft.propose` for T_draft, and `baseline.decode` /
`speculative_decode` for the loops' own work. Nothing here checks that the
machine is quiet: whoever times applies the guard (`contention.quiet`) around
these calls and records its check beside the numbers (the runner,
`experiment.measure`; the commands).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence

import jax
import numpy as np

from specdec_jax import benchmarking, distributed
from specdec_jax.decoding import baseline, speculative
from specdec_jax.decoding.drafts import Draft
from specdec_jax.decoding.sampling import Warp
from specdec_jax.decoding.scorer import Scorer
from specdec_jax.gamma_choice import (
    DEFAULT_CALIBRATION_GAMMA,
    AlphaEstimate,
    GammaChoice,
    LoopCosts,
    fitted_ratios,
    make_choice,
    pooled_alpha,
    second_gamma,
)

Array = jax.Array

DEFAULT_TIMING_ROUNDS = 11


def timing_geometry(max_decode_len: int, max_gamma: int) -> tuple[int, int]:
  """(cache_len, position) of step timings: the speculative decoder's cache, scored halfway."""
  return max_decode_len + max_gamma + 1, max_decode_len // 2


@dataclasses.dataclass(frozen=True)
class VerifyTimes:
  """The target's cached calls of k = 1..max_gamma + 1 tokens, timed in rounds.

  Other tenants of a shared CPU slow every call by a factor that changes from
  one loop of a few milliseconds to the next: on the 2-core cloud CPU one
  k's rounds spread by up to 70%. A median per k then mixes different moments'
  factors into the ratios between k (T_verify(2) once read 0.71 T_step, and
  gamma = 'auto' chose 3 where 1 was fastest). So the shape is read from each
  k's fastest round, the one least slowed, and the level from T_step's median,
  which is what the decoders pay on average.

  Attributes:
    t_step: T_step, seconds per one-token call, the median over rounds.
    fastest: {k: seconds per call in k's fastest round}.
    spread: {k: (slowest - fastest round) / median}: the timing's noise.
    rounds: the rounds timed.
    compile_s: compile time of the timing loops.
  """

  t_step: float
  fastest: Mapping[int, float]
  spread: Mapping[int, float]
  rounds: int
  compile_s: float

  @property
  def t_chunk(self) -> dict[int, float]:
    """{k: seconds per call scoring k tokens}: T_step times fastest[k] / fastest[1]."""
    return {k: self.t_step * t / self.fastest[1] for k, t in self.fastest.items()}

  def fitted(self, max_gamma: int) -> dict[int, float]:
    """{k: T_verify(k)} for k = 1..max_gamma + 1 with the ratios to T_step fitted
    non-decreasing in k over those k alone (`gamma_choice.fitted_ratios`), as
    `make_choice` fits them."""
    ratios = {k: self.fastest[k] / self.fastest[1] for k in range(1, max_gamma + 2)}
    return {k: self.t_step * r for k, r in fitted_ratios(ratios).items()}


def verify_times(target: Scorer, inputs: Array, *, max_gamma: int, max_decode_len: int,
                 calls: int, repeats: int, rounds: int = DEFAULT_TIMING_ROUNDS) -> VerifyTimes:
  """Times T_verify(k) (`target.score` of k tokens), k = 1..max_gamma + 1, at the batch
  size of `inputs`, in `rounds` rounds (k ascending, then descending, ...).

  Args:
    target: the target's scorer.
    inputs: int32 `[batch, input_len]`, what `target.encode` takes.
    max_gamma: the largest gamma to price (sets the cache length too).
    max_decode_len: the decoders' output length (sets the cache length).
    calls: calls per timed loop.
    repeats: timed runs per loop and round (the median is used).
    rounds: rounds over every k (T_step's median and each k's fastest are used).
  """
  cache_len, position = timing_geometry(max_decode_len, max_gamma)
  ks = list(range(1, max_gamma + 2))
  timed = [benchmarking.target_step_times(
      target, inputs, chunk_lengths=ks[::-1] if r % 2 else ks,
      cache_len=cache_len, position=position, calls=calls, repeats=repeats)
      for r in range(rounds)]
  seconds = {k: [t[k].seconds for t in timed] for k in ks}
  median = {k: float(np.median(s)) for k, s in seconds.items()}
  return VerifyTimes(
      t_step=median[1], fastest={k: float(min(s)) for k, s in seconds.items()},
      spread={k: (max(s) - min(s)) / median[k] for k, s in seconds.items()},
      rounds=rounds, compile_s=sum(t.compile_s for t in timed[0].values()))


def draft_time(draft: Draft, inputs: Array, *, gamma: int, warp: Warp, max_decode_len: int,
               max_gamma: int, calls: int, repeats: int, seed: int, target: Scorer
               ) -> benchmarking.StepTimes:
  """T_draft: seconds per proposed token at this gamma and sampling setting (the target
  encodes `inputs` first, outside the timing, for a draft that reads its encoder)."""
  cache_len, position = timing_geometry(max_decode_len, max_gamma)
  return benchmarking.draft_token_time(
      draft, inputs, gamma=gamma, warp=warp, cache_len=cache_len, position=position,
      calls=calls, repeats=repeats, seed=seed,
      target_encoded=benchmarking.target_encoded_for(draft, target, inputs))


def time_sequence_work(target: Scorer, draft: Draft, batches: Sequence[Array], *,
                       cache_len: int, repeats: int) -> tuple[float, float]:
  """Both models' work once per sequence: `LoopCosts.encode_target_s` and `encode_draft_s`.

  The target's `encode` and the arrays its `init_state` makes
  (`benchmarking.state_arrays`: an empty cache; a decoder-only target's prefill),
  the draft's `init_state`, each timed `repeats` times per batch (the median).

  Args:
    target: the target's scorer.
    draft: the draft.
    batches: int32 `[batch, input_len]` checked batches, cut to their length bucket.
    cache_len: the decoders' cache length.
    repeats: timed calls of each.

  Returns:
    Seconds per batch of the target's work and of the draft's, the means over
    `batches` (their lengths differ, and the encoders' cost with them).
  """
  init_draft = jax.jit(lambda d, x, encoded: d.init_state(x, cache_len, encoded))
  encode_target = encode_draft = 0.0
  for x in batches:
    context = target.encode(x)
    encode_target += (
        benchmarking.time_calls(lambda x=x: target.encode(x), repeats).median_s
        + benchmarking.time_calls(lambda c=context: benchmarking.state_arrays(
            target, c, cache_len=cache_len), repeats).median_s) / len(batches)
    encoded = benchmarking.target_encoded_for(draft, target, x)
    encode_draft += benchmarking.time_calls(
        lambda x=x, e=encoded: init_draft(draft, x, e), repeats).median_s / len(batches)
  return encode_target, encode_draft


def measure_loop_costs(target: Scorer, draft: Draft, batches: Sequence[Array], *, gamma: int,
                       warp: Warp, max_decode_len: int, eos_id: int,
                       t_chunk: Mapping[int, float], t_draft: float, rng: Array, repeats: int,
                       held_out: bool, slope_gamma: int | None = None
                       ) -> tuple[LoopCosts, AlphaEstimate]:
  """Times both models' work once per sequence and one decoding of each batch by each
  decoder (after one untimed call per batch shape), and attributes to overhead what the
  model calls leave.

  With `slope_gamma`, the speculative decoder also decodes at that gamma, and
  its iteration overhead is split into a fixed part and a part per proposal:
  the line through the two gammas' overheads, its slope at least 0 (flat at
  their mean otherwise). Without, the whole overhead is per iteration.

  The target's work once per sequence is `encode` and the arrays `init_state`
  makes (`benchmarking.state_arrays`: an empty cache; a decoder-only target's
  prefill), the draft's its `init_state`.

  Args:
    target: the target's scorer.
    draft: the draft.
    batches: int32 `[batch, input_len]` batches to decode, checked against the
      vocabulary (`validation.check_token_ids`) and cut to their length bucket:
      the decoders here (`baseline.decode`, `speculative.speculative_decode`)
      take them as they are.
    gamma: the speculative decoder's gamma.
    warp: the sampling settings.
    max_decode_len: the most tokens per row.
    eos_id: the end-of-sequence id.
    t_chunk: {k: T_verify(k)}, k = 1 being T_step.
    t_draft: the draft's seconds per proposed token.
    rng: PRNG key of the decodings.
    repeats: timed calls of each model's once-per-sequence work (the median is used).
    held_out: recorded: whether `batches` lie outside the measured examples.
    slope_gamma: a second gamma to decode at (with `t_chunk[slope_gamma + 1]`),
      or None.

  Returns:
    The `LoopCosts`, and alpha pooled over the speculative decodings at `gamma`.
  """
  kwargs = dict(max_decode_len=max_decode_len, warp=warp, eos_id=eos_id)
  gammas = sorted({gamma} if slope_gamma is None else {gamma, slope_gamma})
  decoders = {"baseline": lambda i: baseline.decode(target, batches[i], rng, **kwargs)}
  for g in gammas:
    decoders[f"gamma={g}"] = lambda i, g=g: speculative.speculative_decode(
        target, draft, batches[i], rng, gamma=g, draft_inputs=batches[i], **kwargs)
  timings, outputs = benchmarking.time_interleaved(
      decoders, len(batches), 1, fetch=distributed.fetch,
      warmup=benchmarking.first_of_each_shape(batches))
  n = len(batches)
  encode_target, encode_draft = time_sequence_work(
      target, draft, batches, cache_len=timing_geometry(max_decode_len, gammas[-1])[0],
      repeats=repeats)
  steps = sum(int(np.max(o.lengths)) for o in outputs["baseline"])
  overhead = {}  # {gamma: seconds per iteration beyond the model calls}
  for g in gammas:
    iterations = sum(int(o.stats.loop_iterations) for o in outputs[f"gamma={g}"])
    overhead[g] = ((timings[f"gamma={g}"].median_s - n * (encode_target + encode_draft))
                   / max(iterations, 1) - (g * t_draft + t_chunk[g + 1]))
  per_proposal = (0.0 if len(gammas) == 1 else max(
      0.0, (overhead[gammas[-1]] - overhead[gammas[0]]) / (gammas[-1] - gammas[0])))
  costs = LoopCosts(
      encode_target_s=encode_target, encode_draft_s=encode_draft,
      step_overhead_s=(timings["baseline"].median_s - n * encode_target) / max(steps, 1)
      - t_chunk[1],
      iteration_overhead_s=float(np.mean([o - g * per_proposal for g, o in overhead.items()])),
      batches=n, held_out=held_out, loop_tokens=steps / n, proposal_overhead_s=per_proposal)
  return costs, pooled_alpha(outputs[f"gamma={gamma}"], gamma)


def _agreed(t_chunk: Mapping[int, float], t_draft: float, loop_costs: LoopCosts
            ) -> tuple[dict[int, float], float, LoopCosts]:
  """Process 0's times on every process, so that all choose one gamma (a collective,
  `distributed.agreed`). In one process this returns the times unchanged."""
  ks = sorted(t_chunk)
  names = ("encode_target_s", "encode_draft_s", "step_overhead_s", "iteration_overhead_s",
           "loop_tokens", "proposal_overhead_s")
  values = distributed.agreed(
      [t_chunk[k] for k in ks] + [t_draft] + [getattr(loop_costs, n) for n in names])
  loop_costs = dataclasses.replace(loop_costs, **dict(zip(names, values[len(ks) + 1:],
                                                          strict=True)))
  return dict(zip(ks, values[:len(ks)], strict=True)), values[len(ks)], loop_costs


def calibrate(target: Scorer, draft: Draft, batches: Sequence[Array], *, warp: Warp,
              max_decode_len: int, max_gamma: int, eos_id: int, rng: Array,
              verify: VerifyTimes, calibration_gamma: int = DEFAULT_CALIBRATION_GAMMA,
              timing_calls: int = 8, timing_repeats: int = 3, alpha: float | None = None
              ) -> GammaChoice:
  """The one calibration: measures what the whole cost model needs and chooses gamma.

  Times the draft's proposals at `calibration_gamma` and both decoders over
  `batches`, the speculative one at `calibration_gamma` and at `second_gamma`'s
  (`measure_loop_costs`: alpha, the loops' own work per step, per iteration and
  per proposal, the encoders); the target's T_verify(k) come from `verify`.
  Every process decides from process 0's times (`distributed.agreed`).
  Arguments are the checked ones of `models.t5.choose_gamma` (or of
  `experiments.run`'s settings). No timing guard runs here: the caller wraps
  the call in `contention.quiet` and records its check in the choice
  (`GammaChoice.idle_check`, None here).

  Args:
    target: the target's scorer.
    draft: the draft.
    batches: int32 `[batch, input_len]` calibration batches at the batch size
      that will be decoded (step costs depend on it), checked and bucketed as
      `measure_loop_costs` takes them.
    warp: the sampling settings that will be decoded with.
    max_decode_len: the most tokens per row, as will be decoded.
    max_gamma: candidates are gamma = 1..max_gamma.
    eos_id: the end-of-sequence id.
    rng: PRNG key of the calibration's decodings.
    verify: the target's T_verify(k) for k = 1..max_gamma + 1 at this batch size.
    calibration_gamma: gamma of the calibration's decodings and draft timing.
    timing_calls: calls per timed loop.
    timing_repeats: timed runs per loop (the median is used).
    alpha: the acceptance rate to decide with, if known (the measured one is
      otherwise used).

  Returns:
    The `GammaChoice`, its `idle_check` None.
  """
  start = time.perf_counter()
  t_chunk = verify.fitted(max_gamma)
  t_draft = draft_time(draft, batches[0], gamma=calibration_gamma, warp=warp,
                       max_decode_len=max_decode_len, max_gamma=max_gamma, calls=timing_calls,
                       repeats=timing_repeats, seed=0, target=target).seconds
  loop_costs, estimate = measure_loop_costs(
      target, draft, batches, gamma=calibration_gamma, warp=warp,
      max_decode_len=max_decode_len, eos_id=eos_id, t_chunk=t_chunk, t_draft=t_draft,
      rng=rng, repeats=timing_repeats, held_out=True,
      slope_gamma=second_gamma(calibration_gamma, max_gamma))
  t_chunk, t_draft, loop_costs = _agreed(verify.t_chunk, t_draft, loop_costs)
  return make_choice(estimate if alpha is None else alpha, t_chunk, t_draft,
                     loop_costs=loop_costs, spread=verify.spread, max_gamma=max_gamma,
                     calibration_s=time.perf_counter() - start)


