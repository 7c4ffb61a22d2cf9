"""loop_work: the loops' own work fitted with every term >= 0, and misfits reported."""

from __future__ import annotations

import numpy as np
import pytest

from specdec_jax.costs.loop_work import fit_loop_work, nonnegative_least_squares


def _work(fixed: float, per_proposal: float, gammas=(1, 3)) -> dict[int, float]:
  return {g: fixed + g * per_proposal for g in gammas}


@pytest.mark.parametrize("step, fixed, per_proposal", [
    (0.2, 0.5, 0.1), (0.0, 0.0, 0.3), (0.4, 0.7, 0.0)])
def test_consistent_timings_recover_the_terms(step, fixed, per_proposal):
  work = fit_loop_work(step, _work(fixed, per_proposal, gammas=(1, 2, 3)))
  assert (work.step_s, work.iteration_s, work.proposal_s) == pytest.approx(
      (step, fixed, per_proposal))
  assert work.misfit == {} and work.residual_s == pytest.approx(0.0, abs=1e-12)


def test_one_gamma_prices_the_whole_overhead_per_iteration():
  work = fit_loop_work(0.1, {3: 0.9})
  assert (work.iteration_s, work.proposal_s) == pytest.approx((0.9, 0.0))
  assert set(work.unconstrained_s) == {"step", "iteration"}


def test_a_negative_fixed_part_is_clamped_and_flagged():
  """The line through gamma = 1 and 3 starts below 0: its unconstrained fit (the negative
  control) wants a negative term; the constrained one goes through the origin."""
  overhead = _work(-0.12, 0.2)
  work = fit_loop_work(-0.18, overhead)
  assert work.unconstrained_s["iteration"] == pytest.approx(-0.12)  # Unconstrained: negative.
  assert work.unconstrained_s["step"] == pytest.approx(-0.18)
  assert set(work.misfit) == {"iteration", "step"}
  assert work.iteration_s == 0.0 and work.step_s == 0.0
  want_slope = sum(g * o for g, o in overhead.items()) / sum(g * g for g in overhead)
  assert work.proposal_s == pytest.approx(want_slope)
  residuals = [0.18] + [abs(o - g * want_slope) for g, o in overhead.items()]
  assert work.residual_s == pytest.approx(max(residuals)) and work.residual_s > 0.1


def test_a_falling_line_is_flat_at_the_mean():
  work = fit_loop_work(0.0, _work(0.5, -0.1))
  assert work.misfit == {"proposal": pytest.approx(-0.1)}
  assert (work.iteration_s, work.proposal_s) == pytest.approx((0.3, 0.0))
  assert work.residual_s == pytest.approx(0.1)


def test_every_term_negative_gives_zero_work():
  work = fit_loop_work(-0.1, {1: -0.2, 2: -0.3})
  assert (work.step_s, work.iteration_s, work.proposal_s) == (0.0, 0.0, 0.0)
  assert work.residual_s == pytest.approx(0.3)


@pytest.mark.parametrize("seed", range(5))
def test_nnls_is_no_worse_than_any_nonnegative_point(seed):
  rng = np.random.default_rng(seed)
  a, b = rng.normal(size=(6, 3)), rng.normal(size=6)
  x = nonnegative_least_squares(a, b)
  assert np.all(x >= 0)
  best = np.sum((a @ x - b) ** 2)
  for _ in range(200):
    other = np.abs(rng.normal(size=3)) * rng.integers(0, 2, size=3)
    assert np.sum((a @ other - b) ** 2) >= best - 1e-9


@pytest.mark.parametrize("step, overhead, match", [
    (0.1, {}, "at least one gamma"), (float("nan"), {1: 0.1}, "must be finite")])
def test_bad_inputs_name_the_argument(step, overhead, match):
  with pytest.raises(ValueError, match=match):
    fit_loop_work(step, overhead)
