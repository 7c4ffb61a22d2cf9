"""The loops' own work, fitted with every term >= 0 from measured decodings.

A decoding's time less its model calls and encoders is the loop's own work:
per baseline step (o_step), and per speculative iteration at gamma, a fixed
part and a part per proposal (o_iteration + gamma o_proposal). None of them can
be negative: a loop does not run faster than its model calls. Timing noise
(the model calls timed in loops of their own, the decoders on a few batches)
can make the unconstrained fit want a negative term; the issue that found
them read -0.12 T_step per iteration and -0.18 per step. `fit_loop_work` fits
by non-negative least squares instead, and reports each term the unconstrained
fit wanted negative (a misfit) with the constrained fit's largest residual.

Plain NumPy; no timing (`timing.measure_loop_costs` measures the inputs).
"""

from __future__ import annotations

import dataclasses
import itertools
import types
from collections.abc import Mapping

import numpy as np

STEP, ITERATION, PROPOSAL = "step", "iteration", "proposal"
ROUNDING_S = 1e-12  # Far below any clock's resolution: a value above -ROUNDING_S is 0.


@dataclasses.dataclass(frozen=True)
class LoopWork:
  """The fitted loop work, in seconds.

  Attributes:
    step_s: per baseline step, >= 0.
    iteration_s: per speculative iteration, >= 0.
    proposal_s: per proposed token, >= 0 (0 when one gamma was timed: the
      per-proposal part cannot be told from the fixed one).
    unconstrained_s: {term: the least-squares value without the constraint},
      for the terms fitted.
    residual_s: the largest |measured - fitted| work over the timed
      configurations (per step for the baseline, per iteration at each gamma):
      0 when the constraint did not bind and the data determine the terms.
  """

  step_s: float
  iteration_s: float
  proposal_s: float
  unconstrained_s: Mapping[str, float]
  residual_s: float

  @property
  def misfit(self) -> dict[str, float]:
    """{term: its unconstrained value} for each term the unconstrained fit made negative
    ({} when the measurements fit non-negative terms; a value that only rounding took
    below 0 is 0)."""
    return {name: value for name, value in self.unconstrained_s.items() if value < -ROUNDING_S}


def nonnegative_least_squares(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  """argmin ||a x - b|| over x >= 0, exactly, for the few columns of a loop-work fit.

  The optimum is the least-squares solution on its own support, so the best of
  the feasible least-squares solutions over every subset of columns is it.
  Deterministic: the first subset (in `itertools.combinations` order) of least
  residual wins.

  Args:
    a: float `[m, n]`, n small (each subset is solved: 2^n least squares).
    b: float `[m]`.

  Returns:
    float64 `[n]`, >= 0.
  """
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  n = a.shape[1]
  best, best_error = np.zeros(n), float(np.sum(b ** 2))
  for size in range(1, n + 1):
    for support in itertools.combinations(range(n), size):
      columns = list(support)
      solution = np.linalg.lstsq(a[:, columns], b, rcond=None)[0]
      if np.all(solution >= 0):
        x = np.zeros(n)
        x[columns] = solution
        error = float(np.sum((a @ x - b) ** 2))
        if error < best_error - 1e-15 * max(best_error, 1.0):
          best, best_error = x, error
  return best


def fit_loop_work(step_work_s: float, iteration_work_s: Mapping[int, float]) -> LoopWork:
  """Fits the loop work per step, per iteration and per proposal, each >= 0.

  The baseline's step work is one measurement of one term. The speculative
  iterations' work at each gamma is o_iteration + gamma o_proposal, one
  equation per gamma, each weighted alike (seconds per iteration): two gammas
  determine both terms, one gamma the fixed part alone.

  Args:
    step_work_s: measured seconds per baseline step beyond its model call.
    iteration_work_s: {gamma: measured seconds per speculative iteration beyond
      gamma draft tokens and the verification}, one or more gammas >= 1.

  Returns:
    The `LoopWork`.

  Raises:
    ValueError: naming the argument, for no gamma or a non-finite time.
  """
  if not iteration_work_s:
    raise ValueError("iteration_work_s must hold the measured work of at least one gamma; "
                     "time the speculative decoder at a gamma first.")
  values = [step_work_s, *iteration_work_s.values()]
  if not np.all(np.isfinite(values)):
    raise ValueError(f"step_work_s and iteration_work_s must be finite seconds, got "
                     f"{step_work_s!r} and {dict(iteration_work_s)!r}.")
  gammas = np.array(sorted(iteration_work_s), np.float64)
  work = np.array([iteration_work_s[int(g)] for g in gammas])
  columns = [np.ones_like(gammas)] + ([gammas] if len(gammas) > 1 else [])
  a = np.stack(columns, axis=1)  # [gammas, terms]
  constrained = nonnegative_least_squares(a, work)
  free = np.linalg.lstsq(a, work, rcond=None)[0]
  iteration_s = float(constrained[0])
  proposal_s = float(constrained[1]) if len(constrained) > 1 else 0.0
  step_s = max(float(step_work_s), 0.0)
  residuals = [step_work_s - step_s, *(work - a @ constrained)]
  unconstrained = {STEP: float(step_work_s), ITERATION: float(free[0])}
  if len(free) > 1:
    unconstrained[PROPOSAL] = float(free[1])
  return LoopWork(step_s=step_s, iteration_s=iteration_s, proposal_s=proposal_s,
                  unconstrained_s=types.MappingProxyType(unconstrained),
                  residual_s=float(np.max(np.abs(residuals))))
