"""gamma = 'auto': the draft length the whole cost model predicts to be fastest.

`theory.CostModel.sequence_speedup` prices a decoding as it runs: the target's
one-token step T_step and its k-token call T_verify(k), the draft's cost per
proposed token T_draft (c = T_draft / T_step), each loop's own work per
baseline step and per speculative iteration (sampling, the rejection rule,
writing tokens, rewinding caches), and the encoders, paid once per sequence:

  speedup(gamma) = (E_t + N (T_step + o_step))
                   / (E_t + E_d + N / E[tokens](alpha, gamma)
                      * (gamma T_draft + T_verify(gamma + 1) + o_iteration)).

One calibration (`calibrate`) measures every term on a few examples and
`make_choice` picks the gamma in 1..max_gamma of highest predicted speedup:

- T_verify(k), k = 1..max_gamma + 1 (`verify_times`): `rounds` rounds of
  timed loops over every k, the order of k reversed every other round so that
  drift hits all k alike; T_step is the median of its rounds and T_verify(k)
  is T_step times the ratio of k's fastest round to T_step's fastest round,
  then fitted non-decreasing in k (`stats.nondecreasing_fit`: a k-token call
  costs at least a (k-1)-token one). A single short timing once measured
  T_verify(7) below T_verify(4) and chose gamma = 6, slower than gamma = 3;
  the rounds' spread is recorded beside it.
- T_draft at `calibration_gamma` (taken to be the same per token at every gamma).
- Both decoders over the calibration batches, the speculative one at
  `calibration_gamma` and at a second gamma (`measure_loop_costs`): alpha by
  both estimators from the outputs at `calibration_gamma` (under the paper's
  i.i.d. model alpha does not depend on gamma), and the loops' own work: each
  decoding's time less its model calls and encoders, per baseline step, and
  per speculative iteration as a fixed part plus a part per proposal (the
  line through the two gammas' overheads, its slope at least 0), the
  encoders timed apart, and N, the tokens a batch runs for.

The encoders do not move the best gamma (they add the same seconds to every
gamma's speculative time), but they decide how much it gains and whether any
gamma beats the target alone. The loops' own work does move it: a fixed cost
per iteration favours longer gammas, a cost per proposal shorter ones (priced
as one constant from a single gamma, it made gamma = 2 look faster than 1
where 1 was). The choice records all of it and a
one-line reason:

  choice = choose_gamma(target, target_params, draft, inputs, max_decode_len=64,
                        temperature=1.0)
  print(choice.reason)   # gamma=3: cost model predicts 1.21X (gamma=2: 1.18X, ...
  out = speculative_sample(target, target_params, draft, inputs, gamma=choice.gamma, ...)

`experiments.run` calls `calibrate` for each 'auto' point with the
T_verify(k) it measures for its rows anyway (`verify`). On the 2-core CPU, for
the shipped family, a calibration takes seconds besides compilation.

Everything here but the T5 conveniences `choose_gamma` and `measure_alpha`
takes the target as a `scorer.Scorer` (any model: a T5, a decoder-only one)
and times what the decoding loops call: `Scorer.score` for T_verify(k),
`Draft.propose` for T_draft, and `baseline.decode` / `speculative_decode` for
the loops' own work.

Why here and not in `theory`: theory is plain NumPy formulas; choosing gamma
needs the models, the decoders and the timing loops. The decision itself is
`theory.CostModel.optimal_gamma`; this module measures its inputs and records
them.
"""

from __future__ import annotations

import dataclasses
import time
import types
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np
from jax.experimental import multihost_utils

from specdec_jax import benchmarking, contention, distributed, theory, validation
from specdec_jax.decoding import baseline, buckets, speculative
from specdec_jax.decoding.drafts import Draft
from specdec_jax.decoding.sampling import Warp
from specdec_jax.decoding.scorer import Scorer
from specdec_jax.models.t5 import T5Model, T5Scorer, speculative_sample
from specdec_jax.stats import Pooled, nondecreasing_fit

Array = jax.Array

DEFAULT_MAX_GAMMA = 8
DEFAULT_CALIBRATION_GAMMA = 3
DEFAULT_TIMING_ROUNDS = 11
NEAR_TIE = 0.01  # A runner-up predicted within this of the chosen gamma is named in the reason.


class AlphaEstimate(NamedTuple):
  """alpha measured by speculative sampling, pooled over all rows of its calls.

  Attributes:
    beta: the paper's estimator, the mean of beta = sum_x min(p(x), q(x)) over
      the verified positions of the output (the one the decision uses).
    empirical: S / (S + R), accepted proposals over accepted plus rejections
      (the maximum-likelihood estimate under the i.i.d. model).
    examples: rows decoded.
    gamma: the gamma of the calls.
    tokens: tokens generated in all.
    tokens_per_iteration: tokens per target call.
  """

  beta: float
  empirical: float
  examples: int
  gamma: int
  tokens: int
  tokens_per_iteration: float


def pooled_alpha(stats: Sequence[Any], gamma: int) -> AlphaEstimate:
  """Both alpha estimators over all rows of one or more `speculative_sample` calls.

  Args:
    stats: per call, its fetched `SpeculativeStats` (`[batch]` counters) or an
      output carrying them as `.stats`.
    gamma: the gamma of the calls.

  Raises:
    ValueError: the outputs hold no verified position (every row ended at once).
  """
  stats = [getattr(s, "stats", s) for s in stats]
  pooled = Pooled.of(stats)  # The estimators are `specdec_jax.stats`'.
  if int(pooled["beta_count"]) == 0:
    raise ValueError("The calibration generated no verified token (every row ended at its "
                     "first token); calibrate on other inputs or pass alpha.")
  return AlphaEstimate(
      beta=pooled.alpha_beta(), empirical=pooled.alpha_empirical(),
      examples=sum(int(s.tokens.shape[0]) for s in stats), gamma=gamma,
      tokens=int(pooled["tokens"]), tokens_per_iteration=pooled.tokens_per_call())


def measure_alpha(target: T5Model, target_params: dict, draft: Draft, batches: Sequence[Array],
                  *, gamma: int, max_decode_len: int, warp: Warp, rng: Array) -> AlphaEstimate:
  """alpha from speculative sampling over `batches` (int32 `[b, input_len]` each), no timing.

  Batch i samples with `fold_in(rng, i)`.
  """
  outputs = [distributed.fetch(speculative_sample(
      target, target_params, draft, batch, gamma=gamma, max_decode_len=max_decode_len,
      temperature=warp.temperature, top_k=warp.top_k, top_p=warp.top_p,
      rng=jax.random.fold_in(rng, i)).stats) for i, batch in enumerate(batches)]
  return pooled_alpha(outputs, gamma)


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
    idle_check: the `contention.Guard` record of the timing.
  """

  t_step: float
  fastest: Mapping[int, float]
  spread: Mapping[int, float]
  rounds: int
  compile_s: float
  idle_check: Mapping[str, Any]

  @property
  def t_chunk(self) -> dict[int, float]:
    """{k: seconds per call scoring k tokens}: T_step times fastest[k] / fastest[1]."""
    return {k: self.t_step * t / self.fastest[1] for k, t in self.fastest.items()}

  def fitted(self, max_gamma: int) -> dict[int, float]:
    """{k: T_verify(k)} for k = 1..max_gamma + 1 with the ratios to T_step fitted
    non-decreasing in k over those k alone (`fitted_ratios`), as `make_choice` fits them."""
    ratios = {k: self.fastest[k] / self.fastest[1] for k in range(1, max_gamma + 2)}
    return {k: self.t_step * r for k, r in fitted_ratios(ratios).items()}


def verify_times(target: Scorer, inputs: Array, *, max_gamma: int, max_decode_len: int,
                 calls: int, repeats: int, rounds: int = DEFAULT_TIMING_ROUNDS) -> VerifyTimes:
  """Times T_verify(k) (`target.score` of k tokens), k = 1..max_gamma + 1, at the batch
  size of `inputs`, in `rounds` rounds (k ascending, then descending, ...), inside
  `contention.quiet`.

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
  with contention.quiet("target step times") as guard:
    timed = [benchmarking.target_step_times(
        target, inputs, chunk_lengths=ks[::-1] if r % 2 else ks,
        cache_len=cache_len, position=position, calls=calls, repeats=repeats)
        for r in range(rounds)]
  seconds = {k: [t[k].seconds for t in timed] for k in ks}
  median = {k: float(np.median(s)) for k, s in seconds.items()}
  return VerifyTimes(
      t_step=median[1], fastest={k: float(min(s)) for k, s in seconds.items()},
      spread={k: (max(s) - min(s)) / median[k] for k, s in seconds.items()},
      rounds=rounds, compile_s=sum(t.compile_s for t in timed[0].values()),
      idle_check=guard.record())


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


@dataclasses.dataclass(frozen=True)
class LoopCosts:
  """What the decoders cost besides their model calls (`theory.CostModel`'s extra terms).

  Attributes:
    encode_target_s: the target's work once per sequence, seconds per batch:
      `Scorer.encode` (a T5's encoder) and `Scorer.init_state` (an empty
      cache; a decoder-only model's prefill of its prompt).
    encode_draft_s: the draft's `init_state`, seconds per batch (its encoder,
      a prefill; ~0 for a table look-up).
    step_overhead_s: seconds per baseline step beyond T_step.
    iteration_overhead_s: seconds per speculative iteration beyond gamma T_draft +
      T_verify(gamma + 1) + gamma proposal_overhead_s.
    batches: how many batches the decoders were timed on.
    held_out: whether those were examples outside the measured ones.
    loop_tokens: tokens per batch as the loops run them (until the batch's
      longest row ends), the mean over batches: N in the sequence speedup.
    proposal_overhead_s: seconds per proposed token of the loop's own work
      (0 when the speculative decoder was timed at one gamma, as rows before
      this term were).
  """

  encode_target_s: float
  encode_draft_s: float
  step_overhead_s: float
  iteration_overhead_s: float
  batches: int
  held_out: bool
  loop_tokens: float
  proposal_overhead_s: float = 0.0

  def cost_model(self, t_chunk: Mapping[int, float], t_draft: float) -> theory.CostModel:
    """The whole `theory.CostModel`: these terms with the model calls' times."""
    return theory.CostModel(
        t_chunk[1], t_draft, t_chunk, t_step_overhead=self.step_overhead_s,
        t_iteration_overhead=self.iteration_overhead_s,
        t_proposal_overhead=self.proposal_overhead_s, t_encode_target=self.encode_target_s,
        t_encode_draft=self.encode_draft_s)


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
  cache_len, _ = timing_geometry(max_decode_len, gammas[-1])
  init_draft = jax.jit(lambda d, x, encoded: d.init_state(x, cache_len, encoded))
  n = len(batches)
  encode_target = encode_draft = 0.0  # Means over the batches: their lengths differ.
  for x in batches:
    context = target.encode(x)
    encode_target += (
        benchmarking.time_calls(lambda x=x: target.encode(x), repeats).median_s
        + benchmarking.time_calls(lambda c=context: benchmarking.state_arrays(
            target, c, cache_len=cache_len), repeats).median_s) / n
    encoded = benchmarking.target_encoded_for(draft, target, x)
    encode_draft += benchmarking.time_calls(
        lambda x=x, e=encoded: init_draft(draft, x, e), repeats).median_s / n
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


@dataclasses.dataclass(frozen=True)
class GammaChoice:
  """The chosen gamma and everything the choice was made from.

  Attributes:
    gamma: the gamma in 1..max_gamma of highest `speedup_cost_model` (the
      smallest on ties). Check `helps`: when no gamma beats the target alone,
      this is merely the least slow.
    alpha: the acceptance rate decided with (`alpha_measured.beta`, or the
      caller's).
    alpha_measured: the calibration's estimates; None when alpha was given.
    t_step_s: T_step, the target's one-token step, in seconds.
    c: T_draft / T_step, the draft's cost per proposed token over the
      target's one-token step.
    verify_ratio: {k: T_verify(k) / T_step} for k = 1..max_gamma + 1, fitted
      non-decreasing in k: what the decision used.
    verify_ratio_measured: the same ratios as timed, before the fit.
    verify_spread: {k: the timing's spread over rounds / median} (empty if
      the caller's times came without one).
    loop_costs: the loops' own work and the encoders (None: the model calls
      alone were priced).
    speedup_cost_model: {gamma: predicted speedup}: `CostModel.sequence_speedup`
      over `loop_costs.loop_tokens` tokens, or, without loop costs, the model
      calls alone.
    speedup_steps_only: {gamma: `CostModel.expected_speedup` of the model calls
      alone}.
    speedup_thm38: {gamma: `theory.walltime_improvement`} (verification free).
    calibration_s: wall-clock seconds the calibration took (compilation included).
    idle_check: the `contention.Guard` record of the calibration's timings
      (None if the caller timed them elsewhere).
    reason: one line: the choice, its neighbours' predictions, the terms that
      decided it, where the simpler models would differ and any gamma
      predicted within `NEAR_TIE` of it.
  """

  gamma: int
  alpha: float
  alpha_measured: AlphaEstimate | None
  t_step_s: float
  c: float
  verify_ratio: Mapping[int, float]
  verify_ratio_measured: Mapping[int, float]
  verify_spread: Mapping[int, float]
  loop_costs: LoopCosts | None
  speedup_cost_model: Mapping[int, float]
  speedup_steps_only: Mapping[int, float]
  speedup_thm38: Mapping[int, float]
  calibration_s: float
  idle_check: Mapping[str, Any] | None
  reason: str

  @property
  def helps(self) -> bool:
    """Whether the chosen gamma is predicted to beat the target alone."""
    return self.speedup_cost_model[self.gamma] > 1

  def to_json(self) -> dict[str, Any]:
    """A JSON-serialisable dict (mapping keys as strings), e.g. for a results row."""
    measured = self.alpha_measured
    by_str = lambda mapping: {str(k): v for k, v in mapping.items()}  # noqa: E731
    return {
        "gamma": self.gamma,
        "alpha": self.alpha,
        "alpha_source": "given" if measured is None else "measured (beta)",
        "alpha_measured": None if measured is None else measured._asdict(),
        "t_step_s": self.t_step_s,
        "c": self.c,
        "verify_ratio": by_str(self.verify_ratio),
        "verify_ratio_measured": by_str(self.verify_ratio_measured),
        "verify_spread": by_str(self.verify_spread),
        "loop_costs": None if self.loop_costs is None else dataclasses.asdict(self.loop_costs),
        "speedup_cost_model": by_str(self.speedup_cost_model),
        "speedup_steps_only": by_str(self.speedup_steps_only),
        "speedup_thm38": by_str(self.speedup_thm38),
        "helps": self.helps,
        "calibration_s": self.calibration_s,
        "idle_check": None if self.idle_check is None else dict(self.idle_check),
        "reason": self.reason,
    }


def _check_alpha(alpha: Any) -> float:
  value = validation.as_real("alpha", alpha, what="an acceptance rate in [0, 1]")
  if not 0 <= value <= 1:
    raise ValueError(f"alpha must be an acceptance rate in [0, 1], got {value}; pass the "
                     "fraction of proposals the target accepts (e.g. 0.45), not a percentage.")
  return value


def _check_t_chunk(t_chunk: Any, max_gamma: Any) -> tuple[dict[int, float], int]:
  """`t_chunk` as {int k: seconds}, k = 1..max_gamma + 1 present, and max_gamma checked."""
  if not isinstance(t_chunk, Mapping) or 1 not in t_chunk:
    raise ValueError(f"t_chunk must map k = 1..max_gamma + 1 to seconds per call, k = 1 (T_step) "
                     f"included, got {t_chunk!r}.")
  times = {validation.as_int("a key of t_chunk", k, minimum=1, what="tokens scored in one call"):
           validation.as_real(f"t_chunk[{k}]", t, what="seconds") for k, t in t_chunk.items()}
  if min(times.values()) <= 0:
    raise ValueError(f"t_chunk must hold times > 0 s (t_chunk[1] is T_step), got {t_chunk!r}.")
  max_gamma = validation.as_int("max_gamma", max_gamma, minimum=1,
                                what="the largest gamma considered")
  missing = sorted(set(range(2, max_gamma + 2)) - set(times))
  if missing:
    raise ValueError(f"t_chunk lacks k={missing}: gamma = 1..max_gamma={max_gamma} needs "
                     f"T_verify(k) for every k = 2..{max_gamma + 1}; time those "
                     "(verify_times) or lower max_gamma.")
  return {k: times[k] for k in range(1, max_gamma + 2)}, max_gamma


def fitted_ratios(ratios: Mapping[int, float]) -> dict[int, float]:
  """{k: T_verify(k) / T_step} fitted non-decreasing in k (`stats.nondecreasing_fit`).

  Args:
    ratios: {k: T_verify(k) / T_step} as measured (int keys).
  """
  ks = sorted(ratios)
  return dict(zip(ks, map(float, nondecreasing_fit([ratios[k] for k in ks])),
                  strict=True))


def _fmt(gamma: int, speedups: Mapping[int, float]) -> str:
  return f"gamma={gamma}: {speedups[gamma]:.2f}X"


def _reason(choice: GammaChoice) -> str:
  """The one line of `GammaChoice.reason`."""
  gamma, predicted, loops = choice.gamma, choice.speedup_cost_model, choice.loop_costs
  neighbours = ", ".join(_fmt(g, predicted) for g in (gamma - 1, gamma + 1) if g in predicted)
  k = gamma + 1
  spread = f" (spread {choice.verify_spread[k]:.0%})" if k in choice.verify_spread else ""
  parts = [f"gamma={gamma}: cost model predicts {predicted[gamma]:.2f}X"
           + (f" ({neighbours})" if neighbours else ""),
           f"alpha={choice.alpha:.2f}, c={choice.c:.3f}, "
           f"T_verify({k})/T_step={choice.verify_ratio[k]:.2f}{spread}"]
  simpler = {"Thm 3.8 (free verification)": choice.speedup_thm38}
  if loops is not None:
    parts.append(f"loop work {loops.iteration_overhead_s / choice.t_step_s:.2f} T_step per "
                 f"iteration + {loops.proposal_overhead_s / choice.t_step_s:.2f} per proposal, "
                 f"{loops.step_overhead_s / choice.t_step_s:.2f} per step; encoders "
                 f"{1e3 * (loops.encode_target_s + loops.encode_draft_s):.1f} ms over "
                 f"{loops.loop_tokens:.0f} tokens")
    simpler = {"steps only": choice.speedup_steps_only, **simpler}
  for name, speedups in simpler.items():
    best = max(speedups, key=speedups.get)
    if best != gamma:
      parts.append(f"{name} would pick {_fmt(best, speedups)}")
  ties = [g for g in predicted if g != gamma and predicted[g] >= (1 - NEAR_TIE) * predicted[gamma]]
  if ties:
    parts.append(f"within {NEAR_TIE:.0%}: " + ", ".join(_fmt(g, predicted) for g in ties))
  if predicted[gamma] <= 1:
    parts.append("no gamma is predicted to beat the target alone")
  return "; ".join(parts)


def make_choice(alpha: float | AlphaEstimate, t_chunk: Mapping[int, float], t_draft: float, *,
                loop_costs: LoopCosts | None = None, spread: Mapping[int, float] | None = None,
                max_gamma: int = DEFAULT_MAX_GAMMA, calibration_s: float = 0.0,
                idle_check: Mapping[str, Any] | None = None) -> GammaChoice:
  """Decides gamma from measured times and records the decision.

  Args:
    alpha: an `AlphaEstimate` (its `beta` is used) or a given acceptance rate.
    t_chunk: {k: seconds per cached target call scoring k tokens} for
      k = 1..max_gamma + 1 (k = 1 is T_step), e.g. `VerifyTimes.t_chunk`;
      fitted non-decreasing in k before the decision.
    t_draft: the draft's seconds per proposed token.
    loop_costs: the loops' own work and the encoders (`measure_loop_costs`);
      None prices the model calls alone.
    spread: {k: the timing's relative spread}, for the record.
    max_gamma: the largest gamma considered.
    calibration_s: seconds the calibration took, for the record.
    idle_check: the `contention.Guard` record of the timings, for the record.

  Returns:
    The `GammaChoice`.

  Raises:
    ValueError: naming the bad argument.
  """
  measured = alpha if isinstance(alpha, AlphaEstimate) else None
  alpha = _check_alpha(measured.beta if measured else alpha)
  times, max_gamma = _check_t_chunk(t_chunk, max_gamma)
  t_step = times[1]
  c = validation.as_real("t_draft", t_draft, minimum=0.0,
                         what="seconds per draft token") / t_step
  measured_ratios = {k: t / t_step for k, t in times.items()}
  ratios = fitted_ratios(measured_ratios)
  steps_only = theory.CostModel.from_ratios(c, ratios, t_step)
  gammas = range(1, max_gamma + 1)
  if loop_costs is None:
    model, tokens = steps_only, None
  else:
    model, tokens = loop_costs.cost_model(steps_only.t_verify, t_draft), loop_costs.loop_tokens
  choice = GammaChoice(
      gamma=model.optimal_gamma(alpha, max_gamma, tokens=tokens).gamma, alpha=alpha,
      alpha_measured=measured, t_step_s=t_step, c=c,
      verify_ratio=types.MappingProxyType(ratios),
      verify_ratio_measured=types.MappingProxyType(measured_ratios),
      verify_spread=types.MappingProxyType({k: float(spread[k]) for k in times}
                                           if spread else {}),
      loop_costs=loop_costs,
      speedup_cost_model=types.MappingProxyType(
          {g: model.predicted_speedup(alpha, g, tokens) for g in gammas}),
      speedup_steps_only=types.MappingProxyType(
          {g: float(steps_only.expected_speedup(alpha, g)) for g in gammas}),
      speedup_thm38=types.MappingProxyType(
          {g: float(theory.walltime_improvement(alpha, g, c)) for g in gammas}),
      calibration_s=float(calibration_s),
      idle_check=None if idle_check is None else types.MappingProxyType(dict(idle_check)),
      reason="")
  return dataclasses.replace(choice, reason=_reason(choice))


def _agreed(t_chunk: Mapping[int, float], t_draft: float, loop_costs: LoopCosts
            ) -> tuple[dict[int, float], float, LoopCosts]:
  """Process 0's times on every process, so that all choose one gamma (a collective).

  Each process times the same global programs but reads its own clock; a
  choice that differed between processes would make them run different
  programs. In one process this returns the times unchanged.
  """
  ks = sorted(t_chunk)
  names = ("encode_target_s", "encode_draft_s", "step_overhead_s", "iteration_overhead_s",
           "loop_tokens", "proposal_overhead_s")
  values = multihost_utils.broadcast_one_to_all(np.array(
      [t_chunk[k] for k in ks] + [t_draft] + [getattr(loop_costs, n) for n in names]))
  values = list(map(float, values))
  loop_costs = dataclasses.replace(loop_costs, **dict(zip(names, values[len(ks) + 1:],
                                                          strict=True)))
  return dict(zip(ks, values[:len(ks)], strict=True)), values[len(ks)], loop_costs


def second_gamma(calibration_gamma: int, max_gamma: int) -> int | None:
  """The second gamma a calibration decodes at (`measure_loop_costs`' slope_gamma): 1,
  2 when calibrating at 1, or None when max_gamma leaves no other."""
  other = 1 if calibration_gamma > 1 else 2
  return other if other <= max_gamma else None


def calibrate(target: Scorer, draft: Draft, batches: Sequence[Array], *, warp: Warp,
              max_decode_len: int, max_gamma: int, eos_id: int, rng: Array,
              verify: VerifyTimes, calibration_gamma: int = DEFAULT_CALIBRATION_GAMMA,
              timing_calls: int = 8, timing_repeats: int = 3, alpha: float | None = None
              ) -> GammaChoice:
  """The one calibration: measures what the whole cost model needs and chooses gamma.

  Inside `contention.quiet`, times the draft's proposals at `calibration_gamma`
  and both decoders over `batches`, the speculative one at `calibration_gamma`
  and at `second_gamma`'s (`measure_loop_costs`: alpha, the loops' own work per
  step, per iteration and per proposal, the encoders); the
  target's T_verify(k) come from `verify`. Arguments are the checked ones of
  `choose_gamma` (or of `experiments.run`'s settings).

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
    The `GammaChoice`.
  """
  start = time.perf_counter()
  t_chunk = verify.fitted(max_gamma)
  with contention.quiet("gamma calibration") as guard:
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
                     calibration_s=time.perf_counter() - start, idle_check=guard.record())


def choose_gamma(target: T5Model, target_params: dict, draft: Draft, inputs: Array, *,
                 max_decode_len: int, temperature: float = 0.0, top_k: int = 0,
                 top_p: float = 1.0, max_gamma: int = DEFAULT_MAX_GAMMA,
                 alpha: float | None = None,
                 calibration_gamma: int = DEFAULT_CALIBRATION_GAMMA, timing_calls: int = 8,
                 timing_repeats: int = 3, timing_rounds: int = DEFAULT_TIMING_ROUNDS,
                 rng: Array | None = None) -> GammaChoice:
  """Calibrates on `inputs` and returns the gamma the whole cost model predicts to be fastest.

  The T5 convenience (`temperature_sample`'s arguments): times the target's
  T_verify(k) (`verify_times`), then runs `calibrate`, with the target's
  `T5Scorer` and the config's EOS id.
  Compilation dominates: on the 2-core CPU, for the shipped family, expect
  tens of seconds.

  Args:
    target: the target model.
    target_params: its parameters.
    draft: the draft, with the target's vocabulary.
    inputs: int32 `[batch, input_len]` calibration examples at the batch size
      you will decode with (step costs depend on it): a few suffice.
    max_decode_len: the most tokens per row, as you will decode.
    temperature: the sampling temperature (0 = greedy), as you will decode.
    top_k: as you will decode (0 = off).
    top_p: as you will decode (1.0 = off).
    max_gamma: candidates are gamma = 1..max_gamma.
    alpha: the acceptance rate to decide with, if known (e.g. from the draft's
      model card; the calibration still decodes, to time the loops).
    calibration_gamma: gamma of the calibration's decodings and of the draft
      timing, in 1..max_gamma.
    timing_calls: calls per timed loop.
    timing_repeats: timed runs per loop (the median is used).
    timing_rounds: rounds over every k of T_verify(k) (`verify_times`).
    rng: PRNG key of the calibration's decodings (default `PRNGKey(0)`).

  Returns:
    The `GammaChoice`; `choice.gamma` goes to `speculative_sample(gamma=...)`.

  Raises:
    ValueError: naming the bad argument, before any work.
    contention.ContentionError: the timings were taken beside another busy
      process (unless `SPECDEC_TIMING_GUARD=off`).
  """
  args = validation.check_decode_args(target, inputs, max_decode_len=max_decode_len, eos_id=None,
                                      temperature=temperature, top_k=top_k, top_p=top_p,
                                      rng=rng, model_name="target")
  max_gamma = validation.as_int("max_gamma", max_gamma, minimum=1,
                                what="candidates are gamma = 1..max_gamma")
  calibration_gamma = validation.as_int("calibration_gamma", calibration_gamma, minimum=1,
                                        what="gamma of the calibration pass")
  if calibration_gamma > max_gamma:
    raise ValueError(f"calibration_gamma={calibration_gamma} must lie in 1..max_gamma="
                     f"{max_gamma}; lower it or raise max_gamma.")
  if alpha is not None:
    alpha = _check_alpha(alpha)
  calls = validation.as_int("timing_calls", timing_calls, minimum=1, what="calls per timed loop")
  repeats = validation.as_int("timing_repeats", timing_repeats, minimum=1,
                              what="timed runs per loop")
  rounds = validation.as_int("timing_rounds", timing_rounds, minimum=1,
                             what="rounds over every k")
  validation.check_draft(draft, target.config.vocab_size, args.inputs, None,
                         target.config.d_model)

  start = time.perf_counter()
  scorer = T5Scorer(target, target.prepare(target_params))
  verify = verify_times(scorer, args.inputs, max_gamma=max_gamma,
                        max_decode_len=args.max_decode_len, calls=calls, repeats=repeats,
                        rounds=rounds)
  choice = calibrate(scorer, draft, [buckets.to_bucket(args.inputs)], warp=Warp.of(args),
                     max_decode_len=args.max_decode_len, max_gamma=max_gamma,
                     eos_id=args.eos_id, rng=args.rng, verify=verify,
                     calibration_gamma=calibration_gamma, timing_calls=calls,
                     timing_repeats=repeats, alpha=alpha)
  return dataclasses.replace(choice, calibration_s=time.perf_counter() - start)
