"""gamma = 'auto': the decision on hand-made numbers, the calibration on tiny T5s, the gin run."""

from __future__ import annotations

import json
import os

import jax
import numpy as np
import pytest
from conftest import make_model

from specdec_jax import auto_gamma, benchmarking, stats, theory
from specdec_jax.checkpoints import save_hf_checkpoint
from specdec_jax.decoding.sampling import Warp
from specdec_jax.decoding.speculative import SpeculativeStats
from specdec_jax.experiment import measure, results_io, runner, settings
from specdec_jax.experiment.record import PointRow
from specdec_jax.models.t5 import T5Draft, T5Scorer

# The module-scoped fixtures run once: every test of this file on one worker.
pytestmark = pytest.mark.xdist_group("auto_gamma")

VOCAB = 8192  # The committed SentencePiece model's size (the gin run tokenises with it).
FLAT = {k: 1.0 for k in range(1, 12)}  # Free verification: the paper's Theorem 3.8.


def _by_hand(alpha: float, c: float, ratios: dict[int, float], max_gamma: int) -> list[float]:
  """Cost-model speedup of gamma = 1..max_gamma, written out independently of theory.py."""
  return [sum(alpha**i for i in range(g + 1)) / (g * c + ratios[g + 1])
          for g in range(1, max_gamma + 1)]


def _decide(alpha: float, c: float, ratios: dict[int, float], max_gamma: int) -> int:
  """The steps-only choice from ratios to T_step (T_step = 1 s)."""
  return auto_gamma.make_choice(alpha, ratios, c, max_gamma=max_gamma).gamma


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
                tokens: float = 30.0) -> auto_gamma.LoopCosts:
  return auto_gamma.LoopCosts(encode_target_s=encoders, encode_draft_s=encoders / 4,
                              step_overhead_s=step, iteration_overhead_s=iteration, batches=2,
                              held_out=True, loop_tokens=tokens)


def _whole_by_hand(alpha: float, c: float, ratios: dict[int, float], costs: auto_gamma.LoopCosts,
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
  choice = auto_gamma.make_choice(alpha, ratios, 0.08, loop_costs=costs, max_gamma=8)
  expected = _whole_by_hand(alpha, 0.08, ratios, costs, 8)
  np.testing.assert_allclose(list(choice.speedup_cost_model.values()), expected)
  assert choice.gamma == 1 + int(np.argmax(expected))
  np.testing.assert_allclose(list(choice.speedup_steps_only.values()),
                             _by_hand(alpha, 0.08, ratios, 8))
  # The encoders dilute the speedup but do not move the best gamma.
  assert choice.gamma == auto_gamma.make_choice(
      alpha, ratios, 0.08, loop_costs=_loop_costs(iteration, step), max_gamma=8).gamma
  assert choice.loop_costs == costs and "loop work" in choice.reason


def test_loop_work_per_iteration_lengthens_gamma():
  """A fixed cost per iteration is paid less often at longer gammas."""
  ratios = {k: 1.0 + 0.05 * (k - 1) for k in range(1, 10)}
  steps_only = auto_gamma.make_choice(0.5, ratios, 0.1, max_gamma=8)
  whole = auto_gamma.make_choice(0.5, ratios, 0.1, loop_costs=_loop_costs(2.0), max_gamma=8)
  assert whole.gamma > steps_only.gamma
  assert f"steps only would pick gamma={steps_only.gamma}" in whole.reason


def test_make_choice_records_the_decision():
  t_step = 0.004
  t_chunk = {k: t_step * (1.0 + 0.1 * (k - 1)) for k in range(1, 7)}
  estimate = auto_gamma.AlphaEstimate(beta=0.7, empirical=0.68, examples=4, gamma=3, tokens=90,
                                      tokens_per_iteration=2.5)
  costs = _loop_costs(iteration=0.3 * t_step, step=0.2 * t_step, encoders=5 * t_step)
  spread = dict.fromkeys(range(1, 7), 0.02)
  choice = auto_gamma.make_choice(estimate, t_chunk, 0.05 * t_step, loop_costs=costs,
                                  spread=spread, max_gamma=5, calibration_s=2.5,
                                  idle_check={"ok": True})
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


def test_reason_names_a_near_tie():
  ratios = {1: 1.0, 2: 1.0, 3: 1.09, 4: 1.09, 5: 1.09, 6: 1.11, 7: 1.88, 8: 1.9, 9: 1.9}
  choice = auto_gamma.make_choice(0.54, ratios, 0.094, max_gamma=8,
                                  loop_costs=_loop_costs(0.57, 0.33, 12.0, tokens=28.0))
  predicted = choice.speedup_cost_model
  assert choice.gamma == 3 and predicted[4] > 0.99 * predicted[3]
  assert choice.reason.endswith(f"within 1%: gamma=4: {predicted[4]:.2f}X")


def test_make_choice_says_when_nothing_helps():
  choice = auto_gamma.make_choice(0.05, {1: 1.0, 2: 1.5, 3: 1.8}, 0.5, max_gamma=2)
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
  choice = auto_gamma.make_choice(0.47, measured, 0.064, max_gamma=8)
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
  assert auto_gamma.pooled_alpha([stats], 3) == auto_gamma.AlphaEstimate(
      beta=3.0 / 8, empirical=4 / 8, examples=2, gamma=3, tokens=12, tokens_per_iteration=2.0)
  assert auto_gamma.pooled_alpha([stats, stats], 3) == auto_gamma.AlphaEstimate(
      beta=3.0 / 8, empirical=4 / 8, examples=4, gamma=3, tokens=24, tokens_per_iteration=2.0)
  with pytest.raises(ValueError, match="no verified token"):
    auto_gamma.pooled_alpha([stats.replace(beta_count=zeros)], 3)


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
    auto_gamma.make_choice(args.pop("alpha"), args.pop("t_chunk"), args.pop("t_draft"), **args)


@pytest.fixture(scope="module")
def pair():
  target, params = make_model("test-v1_1", seed=0, num_decoder_layers=2)
  inputs = np.random.RandomState(0).randint(2, 97, size=(2, 9)).astype(np.int32)
  return target, params, inputs


def test_choose_gamma_calibrates(pair):
  """The target as its own draft: every proposal accepted, alpha = 1 by both estimators."""
  target, params, inputs = pair
  choice = auto_gamma.choose_gamma(target, params, T5Draft(target, params), inputs,
                                   max_decode_len=6, temperature=1.0, max_gamma=2,
                                   calibration_gamma=2, timing_calls=2, timing_repeats=1,
                                   timing_rounds=2)
  measured = choice.alpha_measured
  np.testing.assert_allclose([measured.beta, measured.empirical], 1.0, atol=1e-5)
  assert (measured.examples, measured.gamma) == (2, 2) and measured.tokens > 0
  assert choice.gamma in (1, 2) and list(choice.verify_ratio) == [1, 2, 3]
  assert list(choice.verify_spread) == [1, 2, 3]
  assert choice.gamma == max(choice.speedup_cost_model, key=choice.speedup_cost_model.get)
  loops = choice.loop_costs
  assert loops.batches == 1 and loops.encode_target_s > 0 and loops.loop_tokens > 0
  assert choice.calibration_s > 0 and "enforced" in choice.idle_check


def test_verify_times_reads_the_level_from_medians_and_the_shape_from_fastest_rounds(
    pair, monkeypatch):
  """Rounds alternate the order of k. Each call of k costs 1 + 0.1 k slowed by its
  moment's factor: T_step is its median over rounds, and T_verify(k) / T_step
  the ratio of the fastest rounds, which per-k medians would get wrong."""
  target, params, inputs = pair
  orders = []
  slowed = [{1: 3.0, 2: 1.0, 3: 1.0}, {1: 1.5, 2: 1.0, 3: 1.5}, {1: 1.0, 2: 1.2, 3: 1.2}]

  def fake(*a, chunk_lengths, **k):
    orders.append(list(chunk_lengths))
    factor = slowed[len(orders) - 1]
    return {c: benchmarking.StepTimes(seconds=factor[c] * (1 + 0.1 * c), compile_s=0.5)
            for c in chunk_lengths}

  monkeypatch.setattr(auto_gamma.benchmarking, "target_step_times", fake)
  got = auto_gamma.verify_times(T5Scorer(target, params), inputs, max_gamma=2,
                                max_decode_len=6, calls=2, repeats=1, rounds=3)
  assert orders == [[1, 2, 3], [3, 2, 1], [1, 2, 3]]
  t_step = 1.65  # The median of 3.3, 1.65 and 1.1.
  np.testing.assert_allclose([got.t_chunk[k] for k in (1, 2, 3)],
                             [t_step, t_step * 1.2 / 1.1, t_step * 1.3 / 1.1])
  np.testing.assert_allclose([got.fastest[k] for k in (1, 2, 3)], [1.1, 1.2, 1.3])
  assert np.median([1.2, 1.2, 1.44]) / t_step < 1  # Medians: 2 tokens cheaper than 1.
  np.testing.assert_allclose(got.spread[1], (3.3 - 1.1) / t_step) and got.rounds == 3
  assert got.compile_s == 1.5 and "enforced" in got.idle_check


@pytest.mark.parametrize("fixed, per_proposal, want_fixed, want_per_proposal", [
    (0.5, 0.2, 0.5, 0.2),  # The line through gamma = 1 and 3.
    (0.5, -0.1, 0.5 - 0.2, 0.0),  # A falling line: flat at the two overheads' mean.
])
def test_measure_loop_costs_prices_the_loop_per_iteration_and_per_proposal(
    pair, monkeypatch, fixed, per_proposal, want_fixed, want_per_proposal):
  """Each speculative decoding's time is its model calls, encoders and loop work
  fixed + gamma * per_proposal per iteration; two gammas recover both terms."""
  target, params, inputs = pair
  batches = [inputs[:1], inputs[1:]]
  t_chunk, t_draft, encoders = {k: 1.0 + 0.1 * k for k in range(1, 5)}, 0.05, 0.003
  monkeypatch.setattr(auto_gamma.benchmarking, "time_calls",
                      lambda fn, repeats: benchmarking.Timing(first_s=0.0, times_s=(0.001,)))
  real = benchmarking.time_interleaved

  def timed(decoders, *a, **k):
    timings, outputs = real(decoders, *a, **k)
    for name, outs in outputs.items():
      if name != "baseline":
        g = int(name.removeprefix("gamma="))
        loop = g * t_draft + t_chunk[g + 1] + fixed + g * per_proposal
        total = len(batches) * encoders + sum(int(o.stats.loop_iterations) for o in outs) * loop
        timings[name] = benchmarking.DecoderTiming(first_s=(0.0,), calls_s=((total,),),
                                                   warmup=(0,))
    return timings, outputs

  monkeypatch.setattr(auto_gamma.benchmarking, "time_interleaved", timed)
  costs, estimate = auto_gamma.measure_loop_costs(
      T5Scorer(target, params), T5Draft(target, params), batches, gamma=3, warp=Warp(0.0),
      max_decode_len=6, eos_id=1, t_chunk=t_chunk, t_draft=t_draft,
      rng=jax.random.PRNGKey(0), repeats=1, held_out=True, slope_gamma=1)
  assert costs.encode_target_s + costs.encode_draft_s == pytest.approx(encoders)
  assert costs.proposal_overhead_s == pytest.approx(want_per_proposal)
  assert costs.iteration_overhead_s == pytest.approx(want_fixed)
  assert estimate.gamma == 3
  model = costs.cost_model(t_chunk, t_draft)
  assert model.iteration_time(2) == pytest.approx(
      2 * (t_draft + want_per_proposal) + t_chunk[3] + want_fixed)


@pytest.mark.parametrize("calibration_gamma, max_gamma, want", [(3, 8, 1), (1, 8, 2), (1, 1, None)])
def test_the_second_gamma_of_a_calibration(calibration_gamma, max_gamma, want):
  assert auto_gamma.second_gamma(calibration_gamma, max_gamma) == want


def test_choose_gamma_with_given_alpha_decides_with_it(pair, monkeypatch):
  target, params, inputs = pair
  steps = benchmarking.StepTimes(seconds=1.0, compile_s=0.0)
  monkeypatch.setattr(auto_gamma.benchmarking, "target_step_times",
                      lambda *a, chunk_lengths, **k: dict.fromkeys(chunk_lengths, steps))
  monkeypatch.setattr(auto_gamma.benchmarking, "draft_token_time",
                      lambda *a, **k: benchmarking.StepTimes(seconds=0.01, compile_s=0.0))
  measured = auto_gamma.AlphaEstimate(0.1, 0.1, 2, 3, 12, 1.1)
  monkeypatch.setattr(auto_gamma, "measure_loop_costs",
                      lambda *a, **k: (_loop_costs(iteration=0.1), measured))
  choice = auto_gamma.choose_gamma(target, params, T5Draft(target, params), inputs,
                                   max_decode_len=6, alpha=0.95, max_gamma=5)
  assert choice.alpha_measured is None and choice.alpha == 0.95
  assert choice.gamma == 5 and choice.c == 0.01  # Free verification, cheap draft.


@pytest.mark.parametrize("kwargs, match", [
    (dict(max_gamma=0), r"max_gamma must be an int >= 1"),
    (dict(calibration_gamma=4, max_gamma=3), r"calibration_gamma=4 must lie in 1..max_gamma=3"),
    (dict(alpha=2.0), r"alpha must be an acceptance rate in \[0, 1\]"),
    (dict(timing_calls=0), r"timing_calls must be an int >= 1"),
    (dict(timing_repeats=1.5), r"timing_repeats must be an int"),
    (dict(timing_rounds=0), r"timing_rounds must be an int >= 1"),
    (dict(temperature=-1.0), r"temperature must be a finite float >= 0"),
    (dict(max_decode_len=0), r"max_decode_len must be an int >= 1"),
    (dict(draft="draft"), r"draft must be a specdec_jax.decoding.drafts.Draft"),
])
def test_choose_gamma_rejects_bad_arguments_before_work(pair, monkeypatch, kwargs, match):
  target, params, inputs = pair
  monkeypatch.setattr(auto_gamma.speculative, "speculative_decode",
                      lambda *a, **k: pytest.fail("decoded"))
  monkeypatch.setattr(auto_gamma.benchmarking, "target_step_times",
                      lambda *a, **k: pytest.fail("timed"))
  args = dict(draft=T5Draft(target, params), max_decode_len=6) | kwargs
  with pytest.raises(ValueError, match=match):
    auto_gamma.choose_gamma(target, params, args.pop("draft"), inputs, **args)


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory) -> str:
  """A tiny random target and a perturbed copy as its draft, in HF format."""
  root = str(tmp_path_factory.mktemp("models"))
  model, params = make_model("test-v1_1", seed=0, vocab_size=VOCAB)
  params = jax.device_get(params)
  save_hf_checkpoint(os.path.join(root, "target"), model.config, params)
  save_hf_checkpoint(os.path.join(root, "draft"), model.config,
                     jax.tree.map(lambda x: x * 1.05, params))
  return root


def _gin(tmp_path, models_dir: str, gammas: str) -> str:
  bindings = {
      "name": "'tiny_auto'", "models_dir": repr(models_dir), "drafts": "['draft']",
      "tasks": "['ende']", "num_examples": "2", "temperatures": "[0.0]", "gammas": gammas,
      "auto_max_gamma": "2", "auto_calibration_examples": "2", "max_decode_len": "8",
      "input_len": "16", "repetitions": "1", "timing_calls": "2", "timing_repeats": "1",
      "timing_rounds": "2"}
  path = tmp_path / "tiny.gin"
  path.write_text("".join(f"Experiment.{k} = {v}\n" for k, v in bindings.items()))
  return str(path)


def test_gin_auto_plans_validates_and_rejects_other_strings(tmp_path, models_dir):
  exp = runner.load_experiment([_gin(tmp_path, models_dir, "['auto', 3]")], [])
  points = settings.plan(exp)
  assert [p.gamma for p in points] == ["auto", 3]
  assert points[0].key == ("ende", "draft", 0.0, "auto", 1)
  assert settings.largest_gamma(exp, points) == 3
  assert settings.largest_gamma(exp, points[:1]) == exp.auto_max_gamma == 2
  for bad in ("'Auto'", "'best'", "'3'"):
    with pytest.raises(ValueError, match=r"Experiment\.gammas\[0\]=.* is not a gamma: use an "
                                         r"int >= 1 .* or 'auto'"):
      runner.load_experiment([_gin(tmp_path, models_dir, f"[{bad}]")], [])
  for field in ("auto_max_gamma", "auto_calibration_examples"):
    with pytest.raises(ValueError, match=rf"Experiment\.{field} must be an int >= 1"):
      runner.load_experiment([_gin(tmp_path, models_dir, "['auto']")],
                             [f"Experiment.{field} = 0"])


def test_run_with_auto_gamma_records_the_choice(tmp_path, models_dir, monkeypatch):
  exp = runner.load_experiment([_gin(tmp_path, models_dir, "['auto']")], [])
  path = runner.run(exp, str(tmp_path / "out"))
  (row,) = results_io.read_rows(path)
  choice = row["gamma_choice"]
  assert row["gamma_auto"] is True and row["gamma"] == choice["gamma"] in (1, 2)
  assert set(choice["speedup_cost_model"]) == {"1", "2"}
  assert set(choice["verify_ratio"]) == {"1", "2", "3"}
  assert choice["alpha_measured"]["examples"] == 2 and 0 <= choice["alpha"] <= 1
  assert choice["reason"].startswith(f"gamma={row['gamma']}: cost model predicts")
  assert row["greedy_identical"] is True
  assert choice["loop_costs"]["batches"] == 2 and set(choice["speedup_steps_only"]) == {"1", "2"}
  record = PointRow.from_json(row)
  assert record.gamma_choice == choice and record.key == ("ende", "draft", 0.0, "auto", 1)
  assert f"| {row['gamma']} (auto) |" in runner.summary_table([record], [])

  # A restart finds the 'auto' point done without calibrating again.
  monkeypatch.setattr(measure, "measure_point", lambda *a: pytest.fail("measured again"))
  monkeypatch.setattr(measure, "calibrate", lambda *a, **k: pytest.fail("calibrated again"))
  runner.run(exp, str(tmp_path / "out"))
  assert results_io.read_rows(path) == [row]
