"""The paper's analysis: expected tokens, speedup, operations, optimal gamma.

Leviathan, Kalman & Matias (2023), Section 3. Notation:
  alpha: expected acceptance rate, E[beta] with beta = sum_x min(p(x), q(x)).
  gamma: number of draft proposals per iteration (>= 1).
  c: draft step time / target step time (walltime).
  c_hat: draft arithmetic operations per token / target's (operations).

Plain NumPy; every formula takes floats or broadcastable arrays and returns a
float for scalar inputs, an array otherwise. `CostModel` replaces the paper's
assumption that scoring gamma + 1 tokens costs one target step by measured
verification times.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import ArrayLike

_DEFAULT_MAX_GAMMA = 64


def _as_float_or_array(x: np.ndarray) -> float | np.ndarray:
  return float(x) if x.ndim == 0 else x


def _check_alpha(alpha: ArrayLike) -> np.ndarray:
  a = np.asarray(alpha, dtype=np.float64)
  if not np.all((a >= 0) & (a <= 1)):
    raise ValueError(f"alpha must lie in [0, 1] (an acceptance rate), got {alpha!r}.")
  return a


def _check_gamma(gamma: ArrayLike) -> np.ndarray:
  g = np.asarray(gamma, dtype=np.float64)
  if not np.all((g >= 1) & (g == np.floor(g))):
    raise ValueError(f"gamma must be an integer >= 1 (draft tokens per iteration), got "
                     f"{gamma!r}.")
  return g


def _check_nonnegative(name: str, value: ArrayLike) -> np.ndarray:
  v = np.asarray(value, dtype=np.float64)
  if not np.all(np.isfinite(v) & (v >= 0)):
    raise ValueError(f"{name} must be a finite cost ratio >= 0, got {value!r}.")
  return v


def _expected_tokens(a: np.ndarray, g: np.ndarray) -> np.ndarray:
  """(1 - a^(g+1)) / (1 - a), computed without cancellation; g + 1 at a = 1."""
  below_one = a < 1
  with np.errstate(divide="ignore"):  # log(0) = -inf at a = 0, giving 1 token.
    log_a = np.log1p(a - 1)
  ratio = -np.expm1((g + 1) * log_a) / np.where(below_one, 1 - a, 1.0)
  return np.where(below_one, ratio, g + 1)


def expected_tokens_per_iteration(alpha: ArrayLike, gamma: ArrayLike) -> float | np.ndarray:
  """E[tokens emitted per iteration] = (1 - alpha^(gamma+1)) / (1 - alpha) (Eq. 1).

  Args:
    alpha: acceptance rate(s) in [0, 1]; alpha = 1 gives the limit gamma + 1.
    gamma: draft proposals per iteration, integer(s) >= 1.

  Returns:
    A float, or an array of the broadcast shape of `alpha` and `gamma`.
  """
  return _as_float_or_array(_expected_tokens(_check_alpha(alpha), _check_gamma(gamma)))


def walltime_improvement(alpha: ArrayLike, gamma: ArrayLike, c: ArrayLike) -> float | np.ndarray:
  """Expected walltime improvement factor (Theorem 3.8).

  (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1)), assuming the target scores
  gamma + 1 tokens in the time of one step (see `CostModel` when it does not).

  Args:
    alpha: acceptance rate(s) in [0, 1].
    gamma: draft proposals per iteration, integer(s) >= 1.
    c: draft step time / target step time, >= 0.

  Returns:
    A float, or an array of the broadcast shape.
  """
  a, g, c = _check_alpha(alpha), _check_gamma(gamma), _check_nonnegative("c", c)
  return _as_float_or_array(_expected_tokens(a, g) / (g * c + 1))


def operations_factor(alpha: ArrayLike, gamma: ArrayLike, c_hat: ArrayLike) -> float | np.ndarray:
  """Expected factor of arithmetic operations (Theorem 3.11).

  (1 - alpha)(gamma c_hat + gamma + 1) / (1 - alpha^(gamma+1)); > 1 means more
  operations than the target alone.

  Args:
    alpha: acceptance rate(s) in [0, 1].
    gamma: draft proposals per iteration, integer(s) >= 1.
    c_hat: draft operations per token / target operations per token, >= 0.

  Returns:
    A float, or an array of the broadcast shape.
  """
  a, g = _check_alpha(alpha), _check_gamma(gamma)
  c_hat = _check_nonnegative("c_hat", c_hat)
  return _as_float_or_array((g * c_hat + g + 1) / _expected_tokens(a, g))


class OptimalGamma(NamedTuple):
  """The best gamma and its expected improvement factor.

  Attributes:
    gamma: the integer gamma >= 1 with the largest improvement (smallest on ties).
    improvement: the expected walltime improvement factor at that gamma; <= 1
      means speculative decoding does not help at any gamma considered.
  """

  gamma: int
  improvement: float

  @property
  def helps(self) -> bool:
    """Whether any gamma beats the target alone (improvement > 1)."""
    return self.improvement > 1


def _best(gammas: np.ndarray, improvements: np.ndarray) -> OptimalGamma:
  best = int(np.argmax(improvements))
  return OptimalGamma(gamma=int(gammas[best]), improvement=float(improvements[best]))


def _check_max_gamma(max_gamma: int) -> None:
  if not isinstance(max_gamma, (int, np.integer)) or max_gamma < 1:
    raise ValueError(f"max_gamma must be an int >= 1, got {max_gamma!r}.")


def optimal_gamma(alpha: float, c: float, max_gamma: int = _DEFAULT_MAX_GAMMA) -> OptimalGamma:
  """The gamma in 1..max_gamma maximising `walltime_improvement` (Fig. 3).

  With c = 0 the improvement grows with gamma for every alpha > 0, so the answer
  is max_gamma; with c > 0 it has an interior maximum.

  Args:
    alpha: acceptance rate in [0, 1].
    c: draft step time / target step time, >= 0.
    max_gamma: largest gamma considered.

  Returns:
    An `OptimalGamma`; check `.helps` (equivalently improvement > 1): when
    alpha <= c no gamma helps.
  """
  _check_max_gamma(max_gamma)
  gammas = np.arange(1, max_gamma + 1)
  return _best(gammas, np.asarray(walltime_improvement(float(alpha), gammas, float(c))))


def min_improvement_bound(alpha: ArrayLike, c: ArrayLike) -> float | np.ndarray:
  """Lower bound (1 + alpha) / (1 + c) on the best improvement, valid for alpha > c.

  It is the improvement at gamma = 1 (Corollary 3.9).

  Args:
    alpha: acceptance rate(s) in [0, 1].
    c: cost ratio(s) >= 0, each below its alpha.

  Returns:
    A float, or an array of the broadcast shape.
  """
  a, c_arr = _check_alpha(alpha), _check_nonnegative("c", c)
  if not np.all(a > c_arr):
    raise ValueError(f"the bound holds only for alpha > c, got alpha={alpha!r}, c={c!r}; "
                     "for alpha <= c speculative decoding is not guaranteed to help.")
  return _as_float_or_array((1 + a) / (1 + c_arr))


@dataclasses.dataclass(frozen=True)
class CostModel:
  """Iteration-time model from measured step times.

  The paper assumes that the target scores gamma + 1 tokens in the time of one
  step; on memory-light hardware (CPUs) it costs more, and `t_verify` records
  that. It also leaves out what a decoding costs besides the model calls:
  each loop's own work per step or iteration (sampling, the rejection rule,
  writing tokens, rewinding caches; on a CPU the draft's weights evicted from
  cache by the target's) and the encoders, run once per sequence. Those are
  the optional `t_*_overhead` and `t_encode_*` terms (0: the paper's model
  with measured step costs).

  Attributes:
    t_target_step: seconds per one-token target decoding step.
    t_draft_step: seconds per draft token.
    t_verify: seconds to score k tokens in one cached target call, keyed by k
      (k = gamma + 1 in an iteration); missing k inside the measured range are
      interpolated linearly. Stored as a read-only mapping sorted by k.
    t_step_overhead: seconds per baseline step besides its model call.
    t_iteration_overhead: seconds per speculative iteration besides the
      draft's gamma steps, the verification and `t_proposal_overhead`.
    t_proposal_overhead: seconds per proposed token besides the draft's step:
      the loop's own work that grows with gamma (each proposal's sampling,
      acceptance test and cache writes), so an iteration's overhead is
      t_iteration_overhead + gamma t_proposal_overhead.
    t_encode_target: seconds of the target's encoder per sequence (both
      decoders pay it).
    t_encode_draft: seconds of the draft's encoder per sequence (speculative
      decoding only; 0 for a draft without one).
  """

  t_target_step: float
  t_draft_step: float
  t_verify: Mapping[int, float]
  t_step_overhead: float = 0.0
  t_iteration_overhead: float = 0.0
  t_proposal_overhead: float = 0.0
  t_encode_target: float = 0.0
  t_encode_draft: float = 0.0

  def __post_init__(self):
    if not (np.isfinite(self.t_target_step) and self.t_target_step > 0):
      raise ValueError(f"t_target_step must be a time > 0 s, got {self.t_target_step!r}.")
    if not (np.isfinite(self.t_draft_step) and self.t_draft_step >= 0):
      raise ValueError(f"t_draft_step must be a time >= 0 s, got {self.t_draft_step!r}.")
    if not self.t_verify:
      raise ValueError("t_verify must map at least one chunk length k >= 1 to seconds.")
    for k, t in self.t_verify.items():
      if not isinstance(k, (int, np.integer)) or k < 1 or not (np.isfinite(t) and t > 0):
        raise ValueError(f"t_verify must map ints k >= 1 to times > 0 s, got {k!r}: {t!r}.")
    for name in ("t_step_overhead", "t_iteration_overhead", "t_proposal_overhead",
                 "t_encode_target", "t_encode_draft"):
      value = getattr(self, name)
      if not np.isfinite(value):
        raise ValueError(f"{name} must be a finite time in seconds, got {value!r}.")
    if self.t_encode_target < 0 or self.t_encode_draft < 0:
      raise ValueError(f"encoder times must be >= 0 s, got t_encode_target="
                       f"{self.t_encode_target!r}, t_encode_draft={self.t_encode_draft!r}.")
    object.__setattr__(self, "t_verify", types.MappingProxyType(
        {int(k): float(self.t_verify[k]) for k in sorted(self.t_verify)}))

  @classmethod
  def from_ratios(cls, c: float, verify_ratio: Mapping[int, float],
                  t_target_step: float = 1.0) -> CostModel:
    """Builds a model from ratios to the target step time.

    Args:
      c: draft step time / target step time.
      verify_ratio: k -> (time to score k tokens) / (target step time).
      t_target_step: the unit, seconds per target step.

    Returns:
      The `CostModel`.
    """
    c = float(_check_nonnegative("c", c))
    return cls(t_target_step=t_target_step, t_draft_step=c * t_target_step,
               t_verify={k: r * t_target_step for k, r in verify_ratio.items()})

  def verify_time(self, k: int) -> float:
    """Seconds to score k tokens in one target call (linear interpolation).

    Raises:
      ValueError: if k lies outside the measured range of `t_verify`.
    """
    ks = list(self.t_verify)
    if not ks[0] <= k <= ks[-1]:
      raise ValueError(f"verification of k={k} tokens is outside the measured range "
                       f"{ks[0]}..{ks[-1]}; measure t_verify[{k}] or use a smaller gamma.")
    return float(np.interp(k, ks, list(self.t_verify.values())))

  def iteration_time(self, gamma: int) -> float:
    """Seconds per iteration: gamma draft steps and proposals' overhead, one verification
    of gamma+1 tokens and the iteration's overhead."""
    g = int(_check_gamma(gamma))
    return (g * (self.t_draft_step + self.t_proposal_overhead) + self.verify_time(g + 1)
            + self.t_iteration_overhead)

  def expected_speedup(self, alpha: ArrayLike, gamma: int) -> float | np.ndarray:
    """E[tokens](alpha, gamma) * (t_target_step + t_step_overhead) / iteration_time(gamma):
    the decoding loops' speedup, encoders left out.

    Equals `walltime_improvement` when every `t_verify[k]` is `t_target_step`
    and there is no overhead.
    """
    g = _check_gamma(gamma)
    tokens = _expected_tokens(_check_alpha(alpha), g)
    step = self.t_target_step + self.t_step_overhead
    return _as_float_or_array(tokens * step / self.iteration_time(int(g)))

  def sequence_speedup(self, alpha: float, gamma: int, tokens: float) -> float:
    """Baseline over speculative seconds for a sequence of `tokens` output tokens,
    encoders included: (E_t + tokens * step) / (E_t + E_d + tokens / E[tokens] * iteration).

    Args:
      alpha: acceptance rate in [0, 1].
      gamma: draft proposals per iteration.
      tokens: output tokens of the sequence (> 0), e.g. the mean over a task.
    """
    g = int(_check_gamma(gamma))
    per_iteration = float(_expected_tokens(_check_alpha(alpha), g))
    return self.sequence_ratio(tokens, per_iteration, self.iteration_time(g))

  def sequence_ratio(self, tokens: float, per_iteration: float, iteration_s: float) -> float:
    """(E_t + tokens * step) / (E_t + E_d + tokens / per_iteration * iteration_s): a
    sequence's baseline over speculative seconds, encoders included, for any loop that
    emits `per_iteration` tokens per `iteration_s` seconds (a chain, a tree).

    Raises:
      ValueError: unless `tokens` (output tokens of the sequence) is a number > 0.
    """
    baseline, speculative = self.sequence_seconds(tokens, per_iteration, iteration_s)
    return baseline / speculative

  def sequence_seconds(self, tokens: float, per_iteration: float, iteration_s: float
                       ) -> tuple[float, float]:
    """A sequence's seconds, encoders included: the baseline's, E_t + tokens * step, and
    the speculative loop's, E_t + E_d + tokens / per_iteration * iteration_s.

    Raises:
      ValueError: unless `tokens` (output tokens of the sequence) is a number > 0.
    """
    if not (np.isfinite(tokens) and tokens > 0):
      raise ValueError(f"tokens must be a number of output tokens > 0, got {tokens!r}.")
    baseline = self.t_encode_target + tokens * (self.t_target_step + self.t_step_overhead)
    return baseline, (self.t_encode_target + self.t_encode_draft
                      + tokens / per_iteration * iteration_s)

  def predicted_speedup(self, alpha: float, gamma: int, tokens: float | None = None) -> float:
    """`sequence_speedup` over `tokens` output tokens (encoders included), or without
    `tokens` `expected_speedup` (the decoding loops alone)."""
    if tokens is None:
      return float(self.expected_speedup(alpha, gamma))
    return self.sequence_speedup(alpha, gamma, tokens)

  def alpha_needed(self, speedup: float, gamma: int, tol: float = 1e-9) -> float | None:
    """The smallest alpha at which `expected_speedup(alpha, gamma)` reaches `speedup`.

    E[tokens] grows monotonically with alpha, so bisection finds it. A perfect
    draft (alpha = 1) yields gamma + 1 tokens per iteration, so no alpha reaches
    a speedup above (gamma + 1) * t_target_step / iteration_time(gamma).

    Args:
      speedup: the wall-time improvement asked for, > 0.
      gamma: draft proposals per iteration.
      tol: bisection tolerance on alpha.

    Returns:
      alpha in [0, 1], or None if even alpha = 1 falls short.
    """
    if not (np.isfinite(speedup) and speedup > 0):
      raise ValueError(f"speedup must be a number > 0, got {speedup!r}.")
    g = int(_check_gamma(gamma))
    if self.expected_speedup(1.0, g) < speedup:
      return None
    lo, hi = 0.0, 1.0
    if self.expected_speedup(lo, g) >= speedup:
      return lo
    while hi - lo > tol:
      mid = 0.5 * (lo + hi)
      lo, hi = (lo, mid) if self.expected_speedup(mid, g) >= speedup else (mid, hi)
    return hi

  def optimal_gamma(self, alpha: float, max_gamma: int | None = None,
                    tokens: float | None = None) -> OptimalGamma:
    """The gamma maximising `predicted_speedup` among those with measured range.

    The encoders add the same seconds at every gamma, so `tokens` changes the
    improvement reported (and whether any gamma helps), not which gamma wins.

    Args:
      alpha: acceptance rate in [0, 1].
      max_gamma: largest gamma considered; default: the largest k in
        `t_verify` minus 1.
      tokens: output tokens per sequence: improvements are `sequence_speedup`
        (encoders included); None: `expected_speedup` (the loops alone).

    Returns:
      An `OptimalGamma` (check `.helps`).
    """
    ks = list(self.t_verify)
    if max_gamma is None:
      max_gamma = ks[-1] - 1
    _check_max_gamma(max_gamma)
    gammas = np.arange(max(1, ks[0] - 1), max_gamma + 1)
    if gammas.size == 0:
      raise ValueError(f"t_verify covers k={ks[0]}..{ks[-1]}, which holds no gamma + 1 "
                       f"with 1 <= gamma <= max_gamma={max_gamma}; measure t_verify[2].")
    return _best(gammas, np.array([self.predicted_speedup(alpha, int(g), tokens)
                                   for g in gammas]))


@dataclasses.dataclass(frozen=True)
class LoopCosts:
  """What the decoders cost besides their model calls: `CostModel`'s extra terms, as
  `timing.measure_loop_costs` measures them.

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
    misfit: {term ("step", "iteration", "proposal"): the value in T_step units
      that the unconstrained fit wanted} for each term it made negative; the
      terms above are fitted >= 0 (`loop_work.fit_loop_work`). {} when the
      measurements fit; None in rows from before the constraint.
    misfit_residual: the constrained fit's largest |measured - fitted| loop
      work over the timed configurations, in T_step per step or iteration;
      None in rows from before the constraint.
  """

  encode_target_s: float
  encode_draft_s: float
  step_overhead_s: float
  iteration_overhead_s: float
  batches: int
  held_out: bool
  loop_tokens: float
  proposal_overhead_s: float = 0.0
  misfit: dict[str, float] | None = None
  misfit_residual: float | None = None

  def to_json(self) -> dict[str, Any]:
    """The terms as a row holds them: the misfit fields are left out where None, so that
    rows from before the constraint read back and write the same."""
    terms = dataclasses.asdict(self)
    for name in ("misfit", "misfit_residual"):
      if terms[name] is None:
        del terms[name]
    return terms

  def cost_model(self, t_chunk: Mapping[int, float], t_draft: float) -> CostModel:
    """The whole `CostModel`: these terms with the model calls' times."""
    return CostModel(
        t_chunk[1], t_draft, t_chunk, t_step_overhead=self.step_overhead_s,
        t_iteration_overhead=self.iteration_overhead_s,
        t_proposal_overhead=self.proposal_overhead_s, t_encode_target=self.encode_target_s,
        t_encode_draft=self.encode_draft_s)
