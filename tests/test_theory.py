"""Tests of the paper's formulas, optimal gamma and the cost model."""

import numpy as np
import pytest

from specdec_jax import theory

# Table 1 of the paper (c = c_hat = 0): (alpha, gamma, operations, speed).
TABLE_1 = [
    (0.6, 2, 1.53, 1.96),
    (0.7, 3, 1.58, 2.53),
    (0.8, 2, 1.23, 2.44),
    (0.8, 5, 1.63, 3.69),
    (0.9, 2, 1.11, 2.71),
    (0.9, 10, 1.60, 6.86),
]


@pytest.mark.parametrize("alpha,gamma,ops,speed", TABLE_1)
def test_table_1(alpha, gamma, ops, speed):
  assert round(theory.walltime_improvement(alpha, gamma, 0.0), 2) == speed
  assert round(theory.operations_factor(alpha, gamma, 0.0), 2) == ops


def test_expected_tokens_closed_form_and_edges():
  alphas = np.linspace(0, 0.99, 23)
  for gamma in (1, 2, 7):
    series = sum(alphas**i for i in range(gamma + 1))
    np.testing.assert_allclose(theory.expected_tokens_per_iteration(alphas, gamma), series,
                               rtol=1e-12)
  assert theory.expected_tokens_per_iteration(0.0, 5) == 1.0
  assert theory.expected_tokens_per_iteration(1.0, 5) == 6.0


def test_alpha_to_one_limit_is_continuous():
  for gamma in (1, 3, 10):
    near = theory.expected_tokens_per_iteration(1 - 1e-12, gamma)
    assert near == pytest.approx(gamma + 1, rel=1e-9)
    assert near < gamma + 1
  assert theory.walltime_improvement(1.0, 4, 0.5) == pytest.approx(5 / 3)
  assert theory.operations_factor(1.0, 4, 0.5) == pytest.approx(7 / 5)


def test_vectorised_broadcasting():
  out = theory.walltime_improvement(np.array([[0.5], [0.8]]), np.array([1, 2, 3]), 0.1)
  assert out.shape == (2, 3)
  assert out[1, 2] == pytest.approx((1 - 0.8**4) / (0.2 * 1.3))
  assert isinstance(theory.walltime_improvement(0.5, 2, 0.1), float)


def test_optimal_gamma_grows_with_alpha():
  c = 0.05
  gammas = [theory.optimal_gamma(a, c).gamma for a in (0.5, 0.7, 0.8, 0.9, 0.95)]
  assert gammas == sorted(gammas)
  assert gammas[0] < gammas[-1]
  best = theory.optimal_gamma(0.8, c)
  around = [theory.walltime_improvement(0.8, g, c) for g in range(1, 65)]
  assert best.improvement == pytest.approx(max(around))
  assert best.gamma == 1 + int(np.argmax(around))


def test_optimal_gamma_with_free_draft_is_max_gamma():
  assert theory.optimal_gamma(0.7, 0.0, max_gamma=12).gamma == 12


def test_no_improvement_when_alpha_below_c():
  result = theory.optimal_gamma(0.1, 0.3)
  assert not result.helps
  assert result.gamma == 1
  assert result.improvement < 1
  with pytest.raises(ValueError, match="alpha > c"):
    theory.min_improvement_bound(0.1, 0.3)


def test_min_improvement_bound_holds():
  for alpha, c in [(0.3, 0.1), (0.6, 0.02), (0.9, 0.5)]:
    bound = theory.min_improvement_bound(alpha, c)
    assert bound == pytest.approx((1 + alpha) / (1 + c))
    assert theory.optimal_gamma(alpha, c).improvement >= bound - 1e-12
    assert theory.optimal_gamma(alpha, c).helps


def test_cost_model_reduces_to_theorem_3_8():
  model = theory.CostModel(t_target_step=0.015, t_draft_step=0.015 * 0.04,
                           t_verify={1: 0.015, 32: 0.015})
  for alpha in (0.0, 0.5, 0.8, 1.0):
    for gamma in (1, 3, 7, 20):
      assert model.expected_speedup(alpha, gamma) == pytest.approx(
          theory.walltime_improvement(alpha, gamma, 0.04), rel=1e-12)
  ratios = theory.CostModel.from_ratios(0.04, {k: 1.0 for k in range(1, 33)})
  assert ratios.optimal_gamma(0.8) == theory.optimal_gamma(0.8, 0.04, max_gamma=31)


def test_cost_model_adds_the_loops_overheads_and_the_encoders():
  # T_step 2, draft 0.1 per token, T_verify(4) 2.6; overheads 0.5 a baseline step and
  # 0.9 an iteration; encoders 20 (target) and 3 (draft) per sequence.
  model = theory.CostModel(2.0, 0.1, {1: 2.0, 4: 2.6}, t_step_overhead=0.5,
                           t_iteration_overhead=0.9, t_encode_target=20.0, t_encode_draft=3.0)
  tokens = theory.expected_tokens_per_iteration(0.6, 3)
  assert model.iteration_time(3) == pytest.approx(0.3 + 2.6 + 0.9)
  assert model.expected_speedup(0.6, 3) == pytest.approx(tokens * 2.5 / 3.8)
  assert model.sequence_speedup(0.6, 3, 40) == pytest.approx(
      (20 + 40 * 2.5) / (23 + 40 / tokens * 3.8))
  # The encoders dilute the loops' speedup towards 1 as sequences get short.
  assert 1 < model.sequence_speedup(0.6, 3, 4) < model.sequence_speedup(0.6, 3, 400) < (
      model.expected_speedup(0.6, 3))
  bare = theory.CostModel(2.0, 0.1, {1: 2.0, 4: 2.6})
  assert bare.sequence_speedup(0.6, 3, 40) == pytest.approx(bare.expected_speedup(0.6, 3))


def test_a_cost_per_proposal_is_paid_gamma_times_and_favours_shorter_gammas():
  ratios = {k: 1.0 + 0.1 * k for k in range(1, 10)}
  fixed = theory.CostModel(1.0, 0.05, ratios, t_iteration_overhead=0.6)
  per_proposal = theory.CostModel(1.0, 0.05, ratios, t_iteration_overhead=0.2,
                                  t_proposal_overhead=0.2)
  assert per_proposal.iteration_time(3) == pytest.approx(3 * (0.05 + 0.2) + 1.4 + 0.2)
  assert per_proposal.iteration_time(2) == pytest.approx(fixed.iteration_time(2))
  assert per_proposal.optimal_gamma(0.6, 8).gamma < fixed.optimal_gamma(0.6, 8).gamma


def test_optimal_gamma_over_a_sequence_reports_its_speedup_not_another_gamma():
  model = theory.CostModel(2.0, 0.2, {k: 2.0 + 0.1 * k for k in range(1, 10)},
                           t_step_overhead=0.4, t_iteration_overhead=1.5, t_encode_target=30.0,
                           t_encode_draft=5.0)
  loops, sequence = model.optimal_gamma(0.6, 8), model.optimal_gamma(0.6, 8, tokens=30.0)
  assert sequence.gamma == loops.gamma  # The encoders add the same seconds at every gamma.
  assert sequence.improvement == pytest.approx(model.sequence_speedup(0.6, loops.gamma, 30.0))
  assert sequence.improvement < loops.improvement
  assert model.predicted_speedup(0.6, 3) == pytest.approx(model.expected_speedup(0.6, 3))
  assert model.predicted_speedup(0.6, 3, 30.0) == model.sequence_speedup(0.6, 3, 30.0)
  # A fixed cost per iteration is paid less often at longer gammas.
  steps_only = theory.CostModel(2.0, 0.2, model.t_verify)
  assert loops.gamma > steps_only.optimal_gamma(0.6, 8).gamma


def test_cost_model_interpolates_and_penalises_verification():
  model = theory.CostModel.from_ratios(0.02, {1: 1.0, 2: 1.2, 4: 1.4, 8: 1.5, 16: 1.8},
                                       t_target_step=2.0)
  assert model.verify_time(3) == pytest.approx(2.6)
  assert model.verify_time(12) == pytest.approx(3.3)
  assert model.iteration_time(3) == pytest.approx(3 * 0.04 + 2.8)
  assert model.expected_speedup(0.8, 3) == pytest.approx(
      theory.expected_tokens_per_iteration(0.8, 3) * 2.0 / (3 * 0.04 + 2.8))
  assert model.expected_speedup(0.8, 5) < theory.walltime_improvement(0.8, 5, 0.02)
  best = model.optimal_gamma(0.8)
  assert 1 <= best.gamma <= 15
  assert best.gamma < theory.optimal_gamma(0.8, 0.02).gamma
  with pytest.raises(ValueError, match="outside the measured range"):
    model.verify_time(17)
  with pytest.raises(ValueError, match="outside the measured range"):
    model.optimal_gamma(0.8, max_gamma=20)


def test_alpha_needed_inverts_the_cost_model():
  free = theory.CostModel.from_ratios(0.0, {1: 1.0, 2: 1.0, 4: 1.0})
  assert free.alpha_needed(1.6, 1) == pytest.approx(0.6, abs=1e-8)  # 1 + alpha = 1.6.
  assert free.alpha_needed(1.0, 3) == 0.0
  assert free.alpha_needed(2.01, 1) is None  # Two tokens per iteration at most.
  model = theory.CostModel.from_ratios(0.05, {1: 1.0, 2: 1.6, 4: 1.8})
  for gamma in (1, 2, 3):
    for target in (1.0, 1.15):
      alpha = model.alpha_needed(target, gamma)
      assert model.expected_speedup(alpha, gamma) == pytest.approx(target, rel=1e-6)
      assert model.expected_speedup(alpha - 1e-3, gamma) < target
  assert model.alpha_needed(1.0, 1) == pytest.approx(0.65, abs=1e-8)  # 1 + a = 1.65.
  assert model.alpha_needed(4.0 / 1.95 + 1e-6, 3) is None
  with pytest.raises(ValueError, match="speedup must be"):
    model.alpha_needed(0.0, 1)


def test_cost_model_is_immutable_copy():
  table = {1: 1.0, 4: 2.0}
  model = theory.CostModel(t_target_step=1.0, t_draft_step=0.1, t_verify=table)
  table[8] = 3.0
  assert list(model.t_verify) == [1, 4]
  with pytest.raises(TypeError):
    model.t_verify[2] = 1.5


@pytest.mark.parametrize("call", [
    lambda: theory.expected_tokens_per_iteration(1.1, 2),
    lambda: theory.expected_tokens_per_iteration(-0.1, 2),
    lambda: theory.expected_tokens_per_iteration(np.nan, 2),
    lambda: theory.expected_tokens_per_iteration(0.5, 0),
    lambda: theory.expected_tokens_per_iteration(0.5, 2.5),
    lambda: theory.walltime_improvement(0.5, 2, -0.1),
    lambda: theory.operations_factor(0.5, 2, -1.0),
    lambda: theory.optimal_gamma(0.5, 0.1, max_gamma=0),
    lambda: theory.CostModel(t_target_step=0.0, t_draft_step=0.1, t_verify={1: 1.0}),
    lambda: theory.CostModel(t_target_step=1.0, t_draft_step=-0.1, t_verify={1: 1.0}),
    lambda: theory.CostModel(t_target_step=1.0, t_draft_step=0.1, t_verify={}),
    lambda: theory.CostModel(t_target_step=1.0, t_draft_step=0.1, t_verify={0: 1.0}),
    lambda: theory.CostModel.from_ratios(-0.5, {1: 1.0}),
    lambda: theory.CostModel(1.0, 0.1, {1: 1.0}, t_iteration_overhead=float("nan")),
    lambda: theory.CostModel(1.0, 0.1, {1: 1.0}, t_proposal_overhead=float("inf")),
    lambda: theory.CostModel(1.0, 0.1, {1: 1.0}, t_encode_draft=-1.0),
    lambda: theory.CostModel(1.0, 0.1, {1: 1.0, 2: 1.0}).sequence_speedup(0.5, 1, 0),
])
def test_bad_inputs_raise(call):
  with pytest.raises(ValueError):
    call()
