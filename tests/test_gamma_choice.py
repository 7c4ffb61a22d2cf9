"""gamma = 'auto', the decision (`specdec_jax.costs.gamma_choice`) on hand-made numbers."""

from __future__ import annotations

import json

import numpy as np
import pytest

from specdec_jax import stats, theory
from specdec_jax.costs import gamma_choice
from specdec_jax.decoding.speculative import SpeculativeStats

FLAT = {k: 1.0 for k in range(1, 12)}  # Free verification: the paper's Theorem 3.8.


def _by_hand(alpha: float, c: float, ratios: dict[int, float], max_gamma: int) -> list[float]:
  """Cost-model speedup of gamma = 1..max_gamma, written out independently of theory.py."""
  return [sum(alpha**i for i in range(g + 1)) / (g * c + ratios[g + 1])
          for g in range(1, max_gamma + 1)]


def _decide(alpha: float, c: float, ratios: dict[int, float], max_gamma: int) -> int:
  """The steps-only choice from ratios to T_step (T_step = 1 s)."""
  return gamma_choice.make_choice(alpha, ratios, c, max_gamma=max_gamma).gamma


@pytest.mark.parametrize("alpha", [0.05, 0.3, 0.5, 0.7, 0.9])
@pytest.mark.parametrize("c", [0.0, 0.05, 0.3])
@pytest.mark.parametrize("slope", [0.0, 0.1, 0.3])
def test_choice_maximises_the_cost_model(alpha, c, slope):
  ratios = {k: 1.0 + slope * (k - 1) for k in range(1, 10)}
  speedups = _by_hand(alpha, c, ratios, 8)
  assert _decide(alpha, c, ratios, 8) == 1 + int(np.argmax(speedups))
  if slope == 0:  # Free verification: the paper's optimal gamma.
    assert _decide(alpha, c, ratios, 8) == theory.optimal_gamma(alpha, c, 8).gamma


@pytest.mark.parametrize("max_gamma", [1, 4, 8])
def test_choice_extremes(max_gamma):
  # Proposals that are never accepted: the shortest gamma (and no speedup).
  assert _decide(0.01, 0.1, FLAT, max_gamma) == 1
  assert _decide(0.0, 0.0, FLAT, max_gamma) == 1
  # Almost always accepted, cheap draft, free verification: the longest.
  assert _decide(0.99, 0.01, FLAT, max_gamma) == max_gamma
  assert _decide(1.0, 0.0, FLAT, max_gamma) == max_gamma


def test_costly_verification_pulls_gamma_below_thm38():
  steep = {k: 1.0 + 0.4 * (k - 1) for k in range(1, 10)}
  assert _decide(0.7, 0.05, steep, 8) < theory.optimal_gamma(0.7, 0.05, 8).gamma


def _loop_costs(iteration: float = 0.0, step: float = 0.0, encoders: float = 0.0,
                tokens: float = 30.0) -> theory.LoopCosts:
  return theory.LoopCosts(encode_target_s=encoders, encode_draft_s=encoders / 4,
                                step_overhead_s=step, iteration_overhead_s=iteration, batches=2,
                                held_out=True, loop_tokens=tokens)


def _whole_by_hand(alpha: float, c: float, ratios: dict[int, float], costs: theory.LoopCosts,
                   max_gamma: int) -> list[float]:
  """`CostModel.sequence_speedup` written out (T_step = 1 s)."""
  n, e_t, e_d = costs.loop_tokens, costs.encode_target_s, costs.encode_draft_s
  return [(e_t + n * (1 + costs.step_overhead_s))
          / (e_t + e_d + n / sum(alpha**i for i in range(g + 1))
             * (g * c + ratios[g + 1] + costs.iteration_overhead_s))
          for g in range(1, max_gamma + 1)]


@pytest.mark.parametrize("alpha", [0.3, 0.5, 0.7])
@pytest.mark.parametrize("iteration, step, encoders", [
    (0.0, 0.0, 0.0), (0.5, 0.3, 0.0), (0.0, 0.0, 8.0), (0.5, 0.3, 8.0), (2.0, 0.0, 0.0)])
def test_choice_prices_the_loops_own_work_and_the_encoders(alpha, iteration, step, encoders):
  ratios = {k: 1.0 + 0.05 * (k - 1) + (0.8 if k >= 7 else 0.0) for k in range(1, 10)}
  costs = _loop_costs(iteration, step, encoders)
  choice = gamma_choice.make_choice(alpha, ratios, 0.08, loop_costs=costs, max_gamma=8)
  expected = _whole_by_hand(alpha, 0.08, ratios, costs, 8)
  np.testing.assert_allclose(list(choice.speedup_cost_model.values()), expected)
  assert choice.gamma == 1 + int(np.argmax(expected))
  np.testing.assert_allclose(list(choice.speedup_steps_only.values()),
                             _by_hand(alpha, 0.08, ratios, 8))
  # The encoders dilute the speedup but do not move the best gamma.
  assert choice.gamma == gamma_choice.make_choice(
      alpha, ratios, 0.08, loop_costs=_loop_costs(iteration, step), max_gamma=8).gamma
  assert choice.loop_costs == costs and "loop work" in choice.reason


def test_loop_work_per_iteration_lengthens_gamma():
  """A fixed cost per iteration is paid less often at longer gammas."""
  ratios = {k: 1.0 + 0.05 * (k - 1) for k in range(1, 10)}
  steps_only = gamma_choice.make_choice(0.5, ratios, 0.1, max_gamma=8)
  whole = gamma_choice.make_choice(0.5, ratios, 0.1, loop_costs=_loop_costs(2.0), max_gamma=8)
  assert whole.gamma > steps_only.gamma
  assert f"steps only would pick gamma={steps_only.gamma}" in whole.reason


def test_make_choice_records_the_decision():
  t_step = 0.004
  t_chunk = {k: t_step * (1.0 + 0.1 * (k - 1)) for k in range(1, 7)}
  estimate = gamma_choice.AlphaEstimate(beta=0.7, empirical=0.68, examples=4, gamma=3, tokens=90,
                                        tokens_per_iteration=2.5, positions=60)
  costs = _loop_costs(iteration=0.3 * t_step, step=0.2 * t_step, encoders=5 * t_step)
  spread = dict.fromkeys(range(1, 7), 0.02)
  choice = gamma_choice.make_choice(estimate, t_chunk, 0.05 * t_step, loop_costs=costs,
                                    spread=spread, max_gamma=5, calibration_s=2.5)
  ratios = {k: t / t_step for k, t in t_chunk.items()}
  np.testing.assert_allclose(list(choice.speedup_steps_only.values()),
                             _by_hand(0.7, 0.05, ratios, 5))
  assert list(choice.speedup_cost_model) == [1, 2, 3, 4, 5]
  assert choice.gamma == max(choice.speedup_cost_model, key=choice.speedup_cost_model.get)
  np.testing.assert_allclose(choice.speedup_thm38[3], theory.walltime_improvement(0.7, 3, 0.05))
  assert choice.alpha == 0.7 and choice.alpha_measured == estimate and choice.helps
  np.testing.assert_allclose([choice.c, choice.t_step_s], [0.05, t_step])
  assert list(choice.verify_ratio) == [1, 2, 3, 4, 5, 6] and choice.verify_ratio[1] == 1.0
  g = choice.gamma
  assert choice.reason.startswith(f"gamma={g}: cost model predicts "
                                  f"{choice.speedup_cost_model[g]:.2f}X (gamma={g - 1}: ")
  assert f"alpha=0.70, c=0.050, T_verify({g + 1})/T_step=" in choice.reason
  assert "(spread 2%)" in choice.reason and "loop work 0.30 T_step per iteration" in choice.reason
  row = json.loads(json.dumps(choice.to_json()))
  assert row["gamma"] == g and row["alpha_source"] == "measured (beta)"
  assert row["alpha_measured"]["empirical"] == 0.68 and row["calibration_s"] == 2.5
  assert set(row["speedup_cost_model"]) == set(row["speedup_steps_only"]) == {"1", "2", "3", "4",
                                                                              "5"}
  assert row["loop_costs"]["loop_tokens"] == 30.0 and row["verify_spread"]["6"] == 0.02
  assert row["idle_check"] is None  # The guard and its record are the timing caller's.
  low, high = estimate.interval()
  assert row["alpha_interval"] == [low, high] and low < 0.7 < high
  assert row["gamma_tie"] == list(choice.gamma_tie)
  assert f"alpha 95% interval {low:.2f}-{high:.2f} over 60 positions" in choice.reason


def _estimate(alpha: float, positions: int) -> gamma_choice.AlphaEstimate:
  return gamma_choice.AlphaEstimate(beta=alpha, empirical=alpha, examples=4, gamma=3,
                                    tokens=positions, tokens_per_iteration=1.5,
                                    positions=positions)


def test_few_positions_leave_the_gamma_undecided_and_many_decide_it():
  """Free verification, c = 0.05: the best gamma is 1 below alpha 0.243, 2 up to ~0.42.
  Measured over 150 positions (the issue's calibration), an alpha of 0.30 cannot tell them
  apart; over 20,000 it can. The gamma decided is the same: the decision is alpha's."""
  ratios = dict.fromkeys(range(1, 8), 1.0)
  few = gamma_choice.make_choice(_estimate(0.30, 150), ratios, 0.05, max_gamma=6)
  many = gamma_choice.make_choice(_estimate(0.30, 20_000), ratios, 0.05, max_gamma=6)
  assert few.gamma == many.gamma == theory.optimal_gamma(0.30, 0.05, 6).gamma == 2
  low, high = few.alpha_interval
  assert high - low > 0.1 and few.gamma_tie  # Uncertain: the row names the tie.
  best = {theory.optimal_gamma(a, 0.05, 6).gamma for a in (low, high)}
  assert best - {few.gamma} == set(few.gamma_tie) == {1}
  assert "gamma_tie [" in few.reason
  assert many.gamma_tie == () and "best throughout" in many.reason  # Certain.
  assert many.alpha_interval[1] - many.alpha_interval[0] < 0.02
  given = gamma_choice.make_choice(0.30, ratios, 0.05, max_gamma=6)  # No measurement to doubt.
  assert given.alpha_interval is None and given.gamma_tie == ()


@pytest.mark.parametrize("alpha, positions", [(0.0, 10), (1.0, 10), (0.4, 1), (0.45, 153)])
def test_alpha_interval_holds_the_estimate_and_narrows_with_positions(alpha, positions):
  low, high = gamma_choice.alpha_interval(alpha, positions)
  assert 0.0 <= low <= alpha <= high <= 1.0 and high > low
  wider = gamma_choice.alpha_interval(alpha, positions // 2 or 1)
  narrower = gamma_choice.alpha_interval(alpha, positions * 100)
  assert narrower[1] - narrower[0] < high - low <= wider[1] - wider[0]
  assert gamma_choice.alpha_interval(alpha, 0) == (0.0, 1.0)


def test_alpha_interval_matches_the_wilson_formula():
  low, high = gamma_choice.alpha_interval(0.29, 153)
  assert (low, high) == pytest.approx((0.2239, 0.3663), abs=2e-4)
  with pytest.raises(ValueError, match="positions must be an int >= 0"):
    gamma_choice.alpha_interval(0.3, -1)


def test_reason_names_a_near_tie():
  ratios = {1: 1.0, 2: 1.0, 3: 1.09, 4: 1.09, 5: 1.09, 6: 1.11, 7: 1.88, 8: 1.9, 9: 1.9}
  choice = gamma_choice.make_choice(0.54, ratios, 0.094, max_gamma=8,
                                    loop_costs=_loop_costs(0.57, 0.33, 12.0, tokens=28.0))
  predicted = choice.speedup_cost_model
  assert choice.gamma == 3 and predicted[4] > 0.99 * predicted[3]
  assert choice.reason.endswith(f"within 1%: gamma=4: {predicted[4]:.2f}X")


def test_make_choice_says_when_nothing_helps():
  choice = gamma_choice.make_choice(0.05, {1: 1.0, 2: 1.5, 3: 1.8}, 0.5, max_gamma=2)
  assert choice.gamma == 1 and not choice.helps and choice.alpha_measured is None
  assert choice.reason.endswith("no gamma is predicted to beat the target alone")
  assert choice.to_json()["alpha_source"] == "given" and choice.loop_costs is None


def _closest_nondecreasing(values: list[float]) -> np.ndarray:
  """Least-squares non-decreasing fit by brute force: the fit is constant on runs of
  consecutive values, so try every split into runs and keep the best ordered one."""
  n, best, best_err = len(values), None, np.inf
  for cuts in range(2 ** (n - 1)):
    bounds = [0] + [i + 1 for i in range(n - 1) if cuts >> i & 1] + [n]
    fit = np.concatenate([np.full(b - a, np.mean(values[a:b]))
                          for a, b in zip(bounds[:-1], bounds[1:], strict=True)])
    err = np.sum((fit - values) ** 2)
    if np.all(np.diff(fit) >= -1e-12) and err < best_err:
      best, best_err = fit, err
  return best


@pytest.mark.parametrize("seed", range(6))
def test_nondecreasing_fit_is_the_closest_ordered_sequence(seed):
  values = list(np.random.RandomState(seed).uniform(1.0, 2.5, size=7))
  np.testing.assert_allclose(stats.nondecreasing_fit(values), _closest_nondecreasing(values))
  ordered = sorted(values)
  np.testing.assert_array_equal(stats.nondecreasing_fit(ordered), ordered)


def test_choice_smooths_a_dip_in_verification_cost():
  """The quickstart calibration that chose gamma = 6 on a T_verify(7) timed below T_verify(4)."""
  measured = {1: 1.0, 2: 1.35, 3: 1.49, 4: 1.90, 5: 1.49, 6: 1.39, 7: 1.33, 8: 1.57, 9: 1.67}
  choice = gamma_choice.make_choice(0.47, measured, 0.064, max_gamma=8)
  fitted = list(choice.verify_ratio.values())
  np.testing.assert_allclose(fitted[3:7], np.mean([1.90, 1.49, 1.39, 1.33]))
  assert np.all(np.diff(fitted) >= 0) and dict(choice.verify_ratio_measured) == measured
  np.testing.assert_allclose(list(choice.speedup_cost_model.values()),
                             _by_hand(0.47, 0.064, choice.verify_ratio, 8))
  assert choice.gamma <= 3
  # Unfitted, the dip wins: gamma = 6.
  assert theory.CostModel.from_ratios(0.064, measured).optimal_gamma(0.47, 8).gamma == 6
  assert json.loads(json.dumps(choice.to_json()))["verify_ratio_measured"]["7"] == 1.33


def test_pooled_alpha_pools_rows_of_every_call():
  zeros = np.zeros(2, np.int32)
  stats = SpeculativeStats(
      iterations=np.array([3, 3]), draft_forward_passes=zeros, tokens=np.array([5, 7]),
      accepted_histogram=np.zeros((2, 4), np.int32), accepted=np.array([3, 1]),
      rejections=np.array([1, 3]), beta_sum=np.array([2.0, 1.0], np.float32),
      beta_count=np.array([4, 4]), loop_iterations=np.int32(4))
  assert gamma_choice.pooled_alpha([stats], 3) == gamma_choice.AlphaEstimate(
      beta=3.0 / 8, empirical=4 / 8, examples=2, gamma=3, tokens=12, tokens_per_iteration=2.0,
      positions=8)
  assert gamma_choice.pooled_alpha([stats, stats], 3) == gamma_choice.AlphaEstimate(
      beta=3.0 / 8, empirical=4 / 8, examples=4, gamma=3, tokens=24, tokens_per_iteration=2.0,
      positions=16)
  with pytest.raises(ValueError, match="no verified token"):
    gamma_choice.pooled_alpha([stats.replace(beta_count=zeros)], 3)


@pytest.mark.parametrize("kwargs, match", [
    (dict(alpha=1.5), r"alpha must be an acceptance rate in \[0, 1\]"),
    (dict(alpha=-0.1), r"alpha must be an acceptance rate"),
    (dict(alpha=True), r"alpha must be a finite float"),
    (dict(alpha=float("nan")), r"alpha must be a finite float"),
    (dict(alpha="0.5"), r"alpha must be a finite float"),
    (dict(t_draft=-1.0), r"t_draft must be a finite float >= 0"),
    (dict(t_chunk={2: 1.0, 3: 1.0}), r"t_chunk must map .* k = 1 \(T_step\) included"),
    (dict(t_chunk=[1.0, 1.1]), r"t_chunk must map"),
    (dict(t_chunk={1: 0.0, 2: 1.0, 3: 1.0}), r"t_chunk must hold times > 0"),
    (dict(t_chunk={1: 1.0, 2: 1.0}), r"t_chunk lacks k=\[3\]: .* lower max_gamma"),
    (dict(t_chunk={1: 1.0, 2.0: 1.0, 3: 1.0}), r"a key of t_chunk must be an int"),
    (dict(max_gamma=0), r"max_gamma must be an int >= 1"),
    (dict(max_gamma=2.5), r"max_gamma must be an int"),
])
def test_make_choice_rejects_bad_arguments(kwargs, match):
  args = dict(alpha=0.5, t_chunk={1: 1.0, 2: 1.1, 3: 1.2}, t_draft=0.1, max_gamma=2) | kwargs
  with pytest.raises(ValueError, match=match):
    gamma_choice.make_choice(args.pop("alpha"), args.pop("t_chunk"), args.pop("t_draft"), **args)

