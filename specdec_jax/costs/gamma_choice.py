"""gamma = 'auto', the decision: the draft length the whole cost model predicts to be fastest.

A pure function of measured times (no model, no timing; `specdec_jax.costs.timing`
measures them). `theory.CostModel.sequence_speedup` prices a decoding as it
runs: the target's one-token step T_step and its k-token call T_verify(k), the
draft's cost per proposed token T_draft (c = T_draft / T_step), each loop's own
work per baseline step and per speculative iteration (sampling, the rejection
rule, writing tokens, rewinding caches), and the encoders, paid once per
sequence:

  speedup(gamma) = (E_t + N (T_step + o_step))
                   / (E_t + E_d + N / E[tokens](alpha, gamma)
                      * (gamma T_draft + T_verify(gamma + 1) + o_iteration)).

`make_choice` fits T_verify(k) / T_step non-decreasing in k (`fitted_ratios`: a
k-token call costs at least a (k-1)-token one; a single short timing once
measured T_verify(7) below T_verify(4) and chose gamma = 6, slower than
gamma = 3) and picks the gamma in 1..max_gamma of highest predicted speedup.
It decides with the measured alpha and states its uncertainty: the Wilson
interval over the verified positions it was measured on (`alpha_interval`),
and the other gammas the cost model prices best somewhere in that interval
(`GammaChoice.gamma_tie`: the measurement cannot tell them from the choice).

The encoders do not move the best gamma (they add the same seconds to every
gamma's speculative time), but they decide how much it gains and whether any
gamma beats the target alone. The loops' own work does move it: a fixed cost
per iteration favours longer gammas, a cost per proposal shorter ones (priced
as one constant from a single gamma, it made gamma = 2 look faster than 1
where 1 was). The choice (`GammaChoice`) records all of it and a one-line
reason.

Why beside `theory` and not in it: theory is the paper's formulas; this module
adds what a decision from measured times needs (the fit, the record, the
checks). The results schema (`experiment.record`) and the figures import this
module only, not the measurement.
"""

from __future__ import annotations

import dataclasses
import math
import types
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from specdec_jax import theory, validation
from specdec_jax.stats import Pooled, nondecreasing_fit
from specdec_jax.theory import LoopCosts

DEFAULT_MAX_GAMMA = 8
NEAR_TIE = 0.01  # A runner-up predicted within this of the chosen gamma is named in the reason.
ALPHA_Z = 1.96  # alpha's interval: the Wilson score interval at 95%.
TIE_GRID = 17  # Alphas across the interval at which every gamma is priced (both ends included).


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
    positions: the verified positions `beta` is the mean over (`beta_count`).
  """

  beta: float
  empirical: float
  examples: int
  gamma: int
  tokens: int
  tokens_per_iteration: float
  positions: int

  def interval(self, z: float = ALPHA_Z) -> tuple[float, float]:
    """`beta`'s uncertainty: the Wilson score interval over `positions` (`alpha_interval`)."""
    return alpha_interval(self.beta, self.positions, z)


def alpha_interval(alpha: float, positions: int, z: float = ALPHA_Z) -> tuple[float, float]:
  """The Wilson score interval of an acceptance rate measured over `positions` positions.

  Each position's beta lies in [0, 1] with mean alpha, so its variance is at most a coin's,
  alpha (1 - alpha): the interval of a proportion bounds the mean beta's. It takes the
  positions as independent; those of one sequence are not quite (an easy text is easy
  throughout), so it is the narrowest honest interval, not a wide one.

  Args:
    alpha: the measured rate in [0, 1].
    positions: the positions measured, >= 0 (0: the whole of [0, 1]).
    z: the normal quantile of the interval's level (1.96: 95%).

  Returns:
    (low, high), 0 <= low <= alpha <= high <= 1.
  """
  alpha = check_alpha(alpha)
  n = validation.as_int("positions", positions, minimum=0, what="verified positions measured")
  if n == 0:
    return 0.0, 1.0
  shrink = 1 + z * z / n
  center = (alpha + z * z / (2 * n)) / shrink
  half = z / shrink * math.sqrt(alpha * (1 - alpha) / n + z * z / (4 * n * n))
  return max(0.0, min(alpha, center - half)), min(1.0, max(alpha, center + half))


def pooled_alpha(stats: Sequence[Any], gamma: int) -> AlphaEstimate:
  """Both alpha estimators over all rows of one or more speculative decodings.

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
      tokens=int(pooled["tokens"]), tokens_per_iteration=pooled.tokens_per_call(),
      positions=int(pooled["beta_count"]))


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
    idle_check: the `contention.Guard` record of the calibration's timings, set
      by whoever guarded them (`experiment.measure.calibrate`); None when
      unguarded.
    reason: one line: the choice, its neighbours' predictions, the terms that
      decided it, alpha's interval and the gammas it cannot tell from the
      choice, where the simpler models would differ and any gamma predicted
      within `NEAR_TIE` of it.
    alpha_interval: (low, high), the measured alpha's 95% interval
      (`AlphaEstimate.interval`); None when alpha was given.
    gamma_tie: the other gammas that the cost model prices best at some alpha
      in `alpha_interval` (ascending): the measurement cannot tell them from
      `gamma`. () when it can, or alpha was given.
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
  alpha_interval: tuple[float, float] | None = None
  gamma_tie: tuple[int, ...] = ()

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
        "alpha_interval": None if self.alpha_interval is None else list(self.alpha_interval),
        "gamma_tie": list(self.gamma_tie),
    }


def check_alpha(alpha: Any) -> float:
  """`alpha` as a float in [0, 1].

  Raises:
    ValueError: naming alpha, e.g. for a percentage.
  """
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
  if choice.alpha_interval is not None:
    low, high = choice.alpha_interval
    parts.append(f"alpha 95% interval {low:.2f}-{high:.2f} over "
                 f"{choice.alpha_measured.positions} positions: "
                 + (f"gamma_tie {list(choice.gamma_tie)} (best somewhere in it)"
                    if choice.gamma_tie else f"gamma={gamma} best throughout"))
  simpler = {"Thm 3.8 (free verification)": choice.speedup_thm38}
  if loops is not None:
    parts.append(f"loop work {loops.iteration_overhead_s / choice.t_step_s:.2f} T_step per "
                 f"iteration + {loops.proposal_overhead_s / choice.t_step_s:.2f} per proposal, "
                 f"{loops.step_overhead_s / choice.t_step_s:.2f} per step; encoders "
                 f"{1e3 * (loops.encode_target_s + loops.encode_draft_s):.1f} ms over "
                 f"{loops.loop_tokens:.0f} tokens")
    if loops.misfit:
      parts.append("misfit: the loop work's unconstrained fit wanted "
                   + ", ".join(f"{v:.2f} T_step per {k}" for k, v in loops.misfit.items())
                   + f", clamped to 0 (residual {loops.misfit_residual:.2f} T_step)")
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
                max_gamma: int = DEFAULT_MAX_GAMMA, calibration_s: float = 0.0) -> GammaChoice:
  """Decides gamma from measured times and records the decision (its `idle_check`
  None: whoever timed sets it, `dataclasses.replace`).

  Args:
    alpha: an `AlphaEstimate` (its `beta` is decided with, its interval names the
      gammas it cannot tell apart) or a given acceptance rate (taken as exact).
    t_chunk: {k: seconds per cached target call scoring k tokens} for
      k = 1..max_gamma + 1 (k = 1 is T_step), e.g. `timing.VerifyTimes.t_chunk`;
      fitted non-decreasing in k before the decision.
    t_draft: the draft's seconds per proposed token.
    loop_costs: the loops' own work and the encoders (`timing.measure_loop_costs`);
      None prices the model calls alone.
    spread: {k: the timing's relative spread}, for the record.
    max_gamma: the largest gamma considered.
    calibration_s: seconds the calibration took, for the record.

  Returns:
    The `GammaChoice`.

  Raises:
    ValueError: naming the bad argument.
  """
  measured = alpha if isinstance(alpha, AlphaEstimate) else None
  alpha = check_alpha(measured.beta if measured else alpha)
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
  gamma = model.optimal_gamma(alpha, max_gamma, tokens=tokens).gamma
  interval = measured.interval() if measured else None
  ties = () if interval is None else tuple(sorted(
      {model.optimal_gamma(a, max_gamma, tokens=tokens).gamma
       for a in np.linspace(*interval, TIE_GRID)} - {gamma}))
  choice = GammaChoice(
      gamma=gamma, alpha=alpha,
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
      idle_check=None,
      reason="",
      alpha_interval=interval,
      gamma_tie=ties)
  return dataclasses.replace(choice, reason=_reason(choice))
