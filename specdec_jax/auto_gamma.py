"""gamma = 'auto': the draft length the cost model predicts to be fastest, from a calibration.

Speculative decoding's speedup at gamma draft tokens per target call is, under
the paper's i.i.d. model (Leviathan et al. 2023, section 3) and with measured
step costs (`theory.CostModel`),

  speedup(gamma) = E[tokens](alpha, gamma) * T_step / (gamma T_draft + T_verify(gamma + 1)),

so three things decide gamma: alpha (how often the target accepts a proposal),
c = T_draft / T_step, and T_verify(k) / T_step, the cost of scoring k tokens in
one call (1 on the paper's accelerators; 1.1-2.2 on a CPU). `choose_gamma`
measures them in a short calibration and returns the gamma in 1..max_gamma of
highest predicted speedup, with everything the decision used and a one-line
reason. The measured T_verify(k) / T_step are first fitted non-decreasing in k
(`stats.nondecreasing_fit`): a k-token call costs at least a (k-1)-token one,
and a short timing that dips at large k would otherwise pick a long gamma on
noise (a quickstart calibration measured T_verify(7) / T_step = 1.33 below
T_verify(4) / T_step = 1.90 and chose gamma = 6, slower than gamma = 3):

  choice = choose_gamma(target, target_params, draft, inputs, max_decode_len=64,
                        temperature=1.0)
  print(choice.reason)   # gamma=2: cost model predicts 1.21X (gamma=1: 1.18X, ...)
  out = speculative_sample(target, target_params, draft, inputs, gamma=choice.gamma, ...)

The calibration is one `speculative_sample` call over `inputs` (alpha by both
estimators; alpha does not depend on gamma under the i.i.d. model, so one gamma
serves all; skipped if the caller passes `alpha`, e.g. from a draft's model
card) and the step timings of `specdec_jax.benchmarking` (the target's cached
calls of k = 1..max_gamma + 1 tokens, the draft's cost per proposed token),
taken inside `contention.quiet`. The pure decision, `decide`, and the record,
`make_choice`, take those numbers from any source (`experiments.run` passes
the step costs it measures for its rows anyway).

Why here and not in `theory`: theory is plain NumPy formulas; choosing gamma
needs the models, the decoder and the timing loops. The decision itself is
`theory.CostModel.optimal_gamma`; this module measures its inputs and records
them.
"""

from __future__ import annotations

import dataclasses
import time
import types
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import numpy as np
from jax.experimental import multihost_utils

from specdec_jax import benchmarking, contention, distributed, theory, validation
from specdec_jax.decoding.drafts import Draft
from specdec_jax.decoding.sampling import Warp
from specdec_jax.decoding.speculative import SpeculativeStats, speculative_sample
from specdec_jax.models import T5Model
from specdec_jax.stats import Pooled, nondecreasing_fit

Array = jax.Array

DEFAULT_MAX_GAMMA = 8
DEFAULT_CALIBRATION_GAMMA = 3


class AlphaEstimate(NamedTuple):
  """alpha measured by one speculative pass, pooled over its rows.

  Attributes:
    beta: the paper's estimator, the mean of beta = sum_x min(p(x), q(x)) over
      the verified positions of the output (the one the decision uses).
    empirical: S / (S + R), accepted proposals over accepted plus rejections
      (the maximum-likelihood estimate under the i.i.d. model).
    examples: rows decoded.
    gamma: the gamma of the pass.
    tokens: tokens generated in all.
  """

  beta: float
  empirical: float
  examples: int
  gamma: int
  tokens: int


@dataclasses.dataclass(frozen=True)
class GammaChoice:
  """The chosen gamma and everything the choice was made from.

  Attributes:
    gamma: the gamma in 1..max_gamma of highest cost-model speedup (the
      smallest on ties). Check `helps`: when no gamma beats the target alone,
      this is merely the least slow.
    alpha: the acceptance rate decided with (`alpha_measured.beta`, or the
      caller's).
    alpha_measured: the calibration's estimates; None when alpha was given.
    c: T_draft / T_step, the draft's cost per proposed token over the
      target's one-token step.
    verify_ratio: {k: T_verify(k) / T_step} for k = 1..max_gamma + 1, fitted
      non-decreasing in k: what the decision used.
    verify_ratio_measured: the same ratios as timed, before the fit.
    speedup_cost_model: {gamma: speedup predicted by `theory.CostModel`}.
    speedup_thm38: {gamma: `theory.walltime_improvement`} (verification free).
    calibration_s: wall-clock seconds the calibration took (compilation included).
    idle_check: the `contention.Guard` record of the step timings (None if
      the caller timed them elsewhere).
    reason: one line: the choice, its neighbours' predictions, alpha and c.
  """

  gamma: int
  alpha: float
  alpha_measured: AlphaEstimate | None
  c: float
  verify_ratio: Mapping[int, float]
  verify_ratio_measured: Mapping[int, float]
  speedup_cost_model: Mapping[int, float]
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
    return {
        "gamma": self.gamma,
        "alpha": self.alpha,
        "alpha_source": "given" if measured is None else "measured (beta)",
        "alpha_measured": None if measured is None else measured._asdict(),
        "c": self.c,
        "verify_ratio": {str(k): v for k, v in self.verify_ratio.items()},
        "verify_ratio_measured": {str(k): v for k, v in self.verify_ratio_measured.items()},
        "speedup_cost_model": {str(g): s for g, s in self.speedup_cost_model.items()},
        "speedup_thm38": {str(g): s for g, s in self.speedup_thm38.items()},
        "helps": self.helps,
        "calibration_s": self.calibration_s,
        "idle_check": None if self.idle_check is None else dict(self.idle_check),
        "reason": self.reason,
    }


def _check_verify_ratio(verify_ratio: Any, max_gamma: Any, name: str = "verify_ratio"
                        ) -> tuple[dict[int, float], int]:
  """`verify_ratio` as {int k: float}, and max_gamma (default: its largest k - 1) checked.

  Args:
    verify_ratio: {k: T_verify(k) / T_step}.
    max_gamma: the largest gamma considered, or None.
    name: the caller's argument the ratios come from, for the messages.
  """
  if not isinstance(verify_ratio, Mapping) or not verify_ratio:
    raise ValueError(f"{name} must map chunk lengths k to T_verify(k) / T_step, e.g. "
                     f"{{2: 1.1, 3: 1.2}}, got {verify_ratio!r}.")
  ratios = {validation.as_int(f"a key of {name}", k, minimum=1, what="tokens scored in one "
                              "call"): validation.as_real(f"{name}[{k}]", r) for k, r in
            verify_ratio.items()}
  if min(ratios.values()) <= 0:
    raise ValueError(f"{name} must hold times > 0, got {verify_ratio!r}.")
  if max_gamma is None:
    if max(ratios) < 2:
      raise ValueError(f"{name} holds no k >= 2 (k = gamma + 1); time T_verify(2) at least.")
    max_gamma = max(ratios) - 1
  max_gamma = validation.as_int("max_gamma", max_gamma, minimum=1,
                                what="the largest gamma considered")
  missing = sorted(set(range(2, max_gamma + 2)) - set(ratios))
  if missing:
    raise ValueError(f"{name} lacks k={missing}: gamma = 1..max_gamma={max_gamma} needs "
                     f"T_verify(k) for every k = 2..{max_gamma + 1}; time those "
                     "(benchmarking.target_step_times) or lower max_gamma.")
  return ratios, max_gamma


def _check_alpha(alpha: Any) -> float:
  value = validation.as_real("alpha", alpha, what="an acceptance rate in [0, 1]")
  if not 0 <= value <= 1:
    raise ValueError(f"alpha must be an acceptance rate in [0, 1], got {value}; pass the "
                     "fraction of proposals the target accepts (e.g. 0.45), not a percentage.")
  return value


def fitted_ratios(ratios: Mapping[int, float]) -> dict[int, float]:
  """{k: T_verify(k) / T_step} fitted non-decreasing in k (`stats.nondecreasing_fit`).

  Args:
    ratios: {k: T_verify(k) / T_step} as measured (checked, int keys).
  """
  ks = sorted(ratios)
  return dict(zip(ks, map(float, nondecreasing_fit([ratios[k] for k in ks])),
                  strict=True))


def _cost_model(c: Any, ratios: Mapping[int, float]) -> theory.CostModel:
  c = validation.as_real("c", c, minimum=0.0, what="T_draft / T_step")
  return theory.CostModel.from_ratios(c, ratios)


def decide(alpha: float, c: float, verify_ratio: Mapping[int, float],
           max_gamma: int | None = None) -> int:
  """The gamma in 1..max_gamma of highest `theory.CostModel` speedup (smallest on ties).

  Args:
    alpha: acceptance rate in [0, 1].
    c: T_draft / T_step, >= 0.
    verify_ratio: {k: T_verify(k) / T_step}, every k = 2..max_gamma + 1 present
      (1.0 everywhere is the paper's Theorem 3.8); fitted non-decreasing in k
      (`fitted_ratios`) before the decision.
    max_gamma: the largest gamma considered (default: the largest k - 1).

  Returns:
    gamma >= 1.

  Raises:
    ValueError: naming the bad argument.
  """
  ratios, max_gamma = _check_verify_ratio(verify_ratio, max_gamma)
  return _cost_model(c, fitted_ratios(ratios)).optimal_gamma(_check_alpha(alpha),
                                                             max_gamma).gamma


def _fmt(gamma: int, speedups: Mapping[int, float]) -> str:
  return f"gamma={gamma}: {speedups[gamma]:.2f}X"


def _reason(gamma: int, alpha: float, c: float, ratios: Mapping[int, float],
            cost_model: Mapping[int, float], thm38: Mapping[int, float]) -> str:
  neighbours = ", ".join(_fmt(g, cost_model) for g in (gamma - 1, gamma + 1) if g in cost_model)
  line = (f"gamma={gamma}: cost model predicts {cost_model[gamma]:.2f}X"
          + (f" ({neighbours})" if neighbours else "")
          + f"; alpha={alpha:.2f}, c={c:.3f}, T_verify({gamma + 1})/T_step="
          f"{ratios[gamma + 1]:.2f}")
  thm38_gamma = max(thm38, key=thm38.get)
  if thm38_gamma != gamma:
    line += f"; Thm 3.8 (free verification) would pick {_fmt(thm38_gamma, thm38)}"
  if cost_model[gamma] <= 1:
    line += "; no gamma is predicted to beat the target alone"
  return line


def make_choice(alpha: float | AlphaEstimate, t_chunk: Mapping[int, float], t_draft: float, *,
                max_gamma: int = DEFAULT_MAX_GAMMA, calibration_s: float = 0.0,
                idle_check: Mapping[str, Any] | None = None) -> GammaChoice:
  """Decides gamma from measured times and records the decision.

  Args:
    alpha: an `AlphaEstimate` (its `beta` is used) or a given acceptance rate.
    t_chunk: {k: seconds per cached target call scoring k tokens} for
      k = 1..max_gamma + 1 (k = 1 is T_step), e.g. from
      `benchmarking.target_step_times`.
    t_draft: the draft's seconds per proposed token.
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
  if not isinstance(t_chunk, Mapping) or 1 not in t_chunk:
    raise ValueError(f"t_chunk must map k = 1..max_gamma + 1 to seconds per call, k = 1 (T_step) "
                     f"included, got {t_chunk!r}.")
  t_step = validation.as_real("t_chunk[1]", t_chunk[1], what="T_step in seconds")
  if t_step <= 0:
    raise ValueError(f"t_chunk[1] (T_step) must be a time > 0 s, got {t_step}.")
  t_draft = validation.as_real("t_draft", t_draft, minimum=0.0, what="seconds per draft token")
  measured_ratios, max_gamma = _check_verify_ratio(
      {k: validation.as_real(f"t_chunk[{k}]", t, what="seconds") / t_step
       for k, t in t_chunk.items()}, max_gamma, name="t_chunk")
  ratios = fitted_ratios(measured_ratios)
  c = t_draft / t_step
  model = _cost_model(c, ratios)
  gammas = range(1, max_gamma + 1)
  cost_model = {g: float(model.expected_speedup(alpha, g)) for g in gammas}
  thm38 = {g: float(theory.walltime_improvement(alpha, g, c)) for g in gammas}
  gamma = model.optimal_gamma(alpha, max_gamma).gamma
  used = [k for k in sorted(ratios) if k <= max_gamma + 1]
  return GammaChoice(
      gamma=gamma, alpha=alpha, alpha_measured=measured, c=c,
      verify_ratio=types.MappingProxyType({k: ratios[k] for k in used}),
      verify_ratio_measured=types.MappingProxyType({k: measured_ratios[k] for k in used}),
      speedup_cost_model=types.MappingProxyType(cost_model),
      speedup_thm38=types.MappingProxyType(thm38), calibration_s=float(calibration_s),
      idle_check=None if idle_check is None else types.MappingProxyType(dict(idle_check)),
      reason=_reason(gamma, alpha, c, ratios, cost_model, thm38))


def pooled_alpha(stats: SpeculativeStats, gamma: int) -> AlphaEstimate:
  """Both alpha estimators over all rows of one `speculative_sample` call.

  Args:
    stats: the call's `SpeculativeStats` (`[batch]` counters).
    gamma: the gamma of the call.

  Raises:
    ValueError: the output holds no verified position (every row ended at once).
  """
  stats = distributed.fetch(stats)
  pooled = Pooled.of([stats])  # The estimators are `specdec_jax.stats`'.
  if int(pooled["beta_count"]) == 0:
    raise ValueError("The calibration generated no verified token (every row ended at its "
                     "first token); calibrate on other inputs or pass alpha.")
  return AlphaEstimate(
      beta=pooled.alpha_beta(), empirical=pooled.alpha_empirical(),
      examples=int(stats.tokens.shape[0]), gamma=gamma, tokens=int(pooled["tokens"]))


def measure_alpha(target: T5Model, target_params: dict, draft: Draft, inputs: Array, *,
                  gamma: int = DEFAULT_CALIBRATION_GAMMA, max_decode_len: int,
                  temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                  rng: Array | None = None, draft_inputs: Array | None = None) -> AlphaEstimate:
  """alpha from one `speculative_sample` call over `inputs` (its arguments, checked by it).

  Returns:
    The `AlphaEstimate`, pooled over the rows of `inputs` `[batch, input_len]`.
  """
  out = speculative_sample(target, target_params, draft, inputs, gamma=gamma,
                           max_decode_len=max_decode_len, temperature=temperature, top_k=top_k,
                           top_p=top_p, rng=rng, draft_inputs=draft_inputs)
  return pooled_alpha(out.stats, gamma)


def agreed_times(t_chunk: Mapping[int, float], t_draft: float
                 ) -> tuple[dict[int, float], float]:
  """Process 0's step times on every process, so that all choose one gamma (a collective).

  Each process times the same global programs but reads its own clock; a
  choice that differed between processes would make them run different
  programs. In one process this returns the times unchanged.
  """
  ks = sorted(t_chunk)
  times = multihost_utils.broadcast_one_to_all(np.array([t_chunk[k] for k in ks] + [t_draft]))
  return dict(zip(ks, map(float, times[:-1]), strict=True)), float(times[-1])


def timing_geometry(max_decode_len: int, max_gamma: int) -> tuple[int, int]:
  """(cache_len, position) of step timings: the speculative decoder's cache, scored halfway."""
  return max_decode_len + max_gamma + 1, max_decode_len // 2


def choose_gamma(target: T5Model, target_params: dict, draft: Draft, inputs: Array, *,
                 max_decode_len: int, temperature: float = 0.0, top_k: int = 0,
                 top_p: float = 1.0, max_gamma: int = DEFAULT_MAX_GAMMA,
                 alpha: float | None = None,
                 calibration_gamma: int = DEFAULT_CALIBRATION_GAMMA, timing_calls: int = 8,
                 timing_repeats: int = 3, rng: Array | None = None,
                 draft_inputs: Array | None = None) -> GammaChoice:
  """Calibrates on `inputs` and returns the gamma the cost model predicts to be fastest.

  The calibration runs one `speculative_sample` call over `inputs` at
  `calibration_gamma` (unless `alpha` is given), then times, inside
  `contention.quiet`, the target's cached calls of k = 1..max_gamma + 1 tokens
  (`max_gamma + 1` compiled loops of `timing_calls` calls, `timing_repeats`
  + 1 runs each) and the draft's proposals at `calibration_gamma` (its cost per
  token is taken to be the same at every gamma). Compilation dominates: on the
  2-core CPU, for the shipped family, expect tens of seconds.

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
    alpha: the acceptance rate, if known (e.g. from the draft's model card):
      skips the speculative pass.
    calibration_gamma: gamma of the speculative pass and of the draft timing,
      in 1..max_gamma.
    timing_calls: calls per timed loop.
    timing_repeats: timed runs per loop (the median is used).
    rng: PRNG key of the speculative pass (default `PRNGKey(0)`).
    draft_inputs: the draft's own encoder tokens, if they differ from `inputs`.

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
  draft_inputs = validation.check_draft(draft, target.config, args.inputs, draft_inputs)

  start = time.perf_counter()
  if alpha is None:
    alpha = measure_alpha(target, target_params, draft, args.inputs, gamma=calibration_gamma,
                          max_decode_len=args.max_decode_len, temperature=args.temperature,
                          top_k=args.top_k, top_p=args.top_p, rng=args.rng,
                          draft_inputs=draft_inputs)
  cache_len, position = timing_geometry(args.max_decode_len, max_gamma)
  with contention.quiet("gamma calibration") as guard:
    t_chunk = benchmarking.target_step_times(
        target, target_params, args.inputs, chunk_lengths=range(1, max_gamma + 2),
        cache_len=cache_len, position=position, calls=calls, repeats=repeats)
    t_draft = benchmarking.draft_token_time(
        draft, draft_inputs, gamma=calibration_gamma,
        warp=Warp.of(args), cache_len=cache_len,
        position=position, calls=calls, repeats=repeats,
        target_encoded=benchmarking.target_encoded_for(draft, target, target_params,
                                                      args.inputs))
  t_chunk, t_draft = agreed_times({k: t.seconds for k, t in t_chunk.items()}, t_draft.seconds)
  return make_choice(alpha, t_chunk, t_draft, max_gamma=max_gamma,
                     calibration_s=time.perf_counter() - start, idle_check=guard.record())
