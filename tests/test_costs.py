"""Cost measurement and gamma = 'auto' (`specdec_jax.costs.timing`) on tiny T5s, and the gin run
with gamma = 'auto', which applies the timing guard and records its check."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import make_model

from specdec_jax.costs import gamma_choice, timing
from specdec_jax.decoding.sampling import Warp
from specdec_jax.experiment import gin_flags, measure, results_io, runner, settings
from specdec_jax.experiment.measure import GreedyCheck
from specdec_jax.experiment.record import PointRow
from specdec_jax.models.t5 import T5Draft, T5Scorer
from specdec_jax.theory import LoopCosts

# The module-scoped fixtures run once: every test of this file on one worker.
pytestmark = pytest.mark.xdist_group("costs")



@pytest.fixture(scope="module")
def pair():
  target, params = make_model("test-v1_1", seed=0, num_decoder_layers=2)
  inputs = np.random.RandomState(0).randint(2, 97, size=(2, 9)).astype(np.int32)
  return target, params, inputs


def _scorer(target, params) -> T5Scorer:
  return T5Scorer(target, target.prepare(params))


def test_choose_gamma_calibrates(pair):
  """The target as its own draft: every proposal accepted, alpha = 1 by both estimators."""
  target, params, inputs = pair
  choice = timing.choose_gamma(_scorer(target, params), T5Draft(target, params), inputs,
                               max_decode_len=6, eos_id=1, temperature=1.0, max_gamma=2,
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
  assert choice.calibration_s > 0 and choice.idle_check is None  # The guard is the caller's.


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
    return {c: timing.StepTimes(seconds=factor[c] * (1 + 0.1 * c), compile_s=0.5)
            for c in chunk_lengths}

  monkeypatch.setattr(timing, "target_step_times", fake)
  got = timing.verify_times(T5Scorer(target, params), inputs, max_gamma=2,
                           max_decode_len=6, calls=2, repeats=1, rounds=3)
  assert orders == [[1, 2, 3], [3, 2, 1], [1, 2, 3]]
  t_step = 1.65  # The median of 3.3, 1.65 and 1.1.
  np.testing.assert_allclose([got.t_chunk[k] for k in (1, 2, 3)],
                             [t_step, t_step * 1.2 / 1.1, t_step * 1.3 / 1.1])
  np.testing.assert_allclose([got.fastest[k] for k in (1, 2, 3)], [1.1, 1.2, 1.3])
  assert np.median([1.2, 1.2, 1.44]) / t_step < 1  # Medians: 2 tokens cheaper than 1.
  np.testing.assert_allclose(got.spread[1], (3.3 - 1.1) / t_step) and got.rounds == 3
  assert got.compile_s == 1.5


@pytest.mark.parametrize("fixed, per_proposal, want_fixed, want_per_proposal", [
    (0.5, 0.2, 0.5, 0.2),  # The line through gamma = 1 and 3.
    (0.5, -0.1, 0.5 - 0.2, 0.0),  # A falling line: flat at the two overheads' mean.
    (-0.2, 0.3, 0.0, (0.1 + 3 * 0.7) / 10),  # Starting below 0: through the origin.
])
def test_measure_loop_costs_prices_the_loop_per_iteration_and_per_proposal(
    pair, monkeypatch, fixed, per_proposal, want_fixed, want_per_proposal):
  """Each speculative decoding's time is its model calls, encoders and loop work
  fixed + gamma * per_proposal per iteration; two gammas recover both terms."""
  target, params, inputs = pair
  batches = [inputs[:1], inputs[1:]]
  t_chunk, t_draft, encoders = {k: 1.0 + 0.1 * k for k in range(1, 5)}, 0.05, 0.003
  monkeypatch.setattr(timing, "time_calls",
                      lambda fn, repeats: timing.Timing(first_s=0.0, times_s=(0.001,)))
  real = timing.time_interleaved

  def timed(decoders, *a, **k):
    timings, outputs = real(decoders, *a, **k)
    for name, outs in outputs.items():
      if name != "baseline":
        g = int(name.removeprefix("gamma="))
        loop = g * t_draft + t_chunk[g + 1] + fixed + g * per_proposal
        total = len(batches) * encoders + sum(int(o.stats.loop_iterations) for o in outs) * loop
        timings[name] = timing.DecoderTiming(first_s=(0.0,), calls_s=((total,),),
                                                   warmup=(0,))
    return timings, outputs

  monkeypatch.setattr(timing, "time_interleaved", timed)
  loops, estimate = timing.measure_loop_costs(
      T5Scorer(target, params), T5Draft(target, params), batches, gamma=3, warp=Warp(0.0),
      max_decode_len=6, eos_id=1, t_chunk=t_chunk, t_draft=t_draft,
      rng=jax.random.PRNGKey(0), repeats=1, held_out=True, slope_gamma=1)
  assert loops.encode_target_s + loops.encode_draft_s == pytest.approx(encoders)
  assert loops.proposal_overhead_s == pytest.approx(want_per_proposal)
  assert loops.iteration_overhead_s == pytest.approx(want_fixed)
  assert ("iteration" in loops.misfit) == (fixed < 0)  # In T_step units.
  if fixed < 0:
    assert loops.misfit["iteration"] == pytest.approx(fixed / t_chunk[1])
  assert loops.misfit_residual >= 0
  assert estimate.gamma == 3
  model = loops.cost_model(t_chunk, t_draft)
  assert model.iteration_time(2) == pytest.approx(
      2 * (t_draft + want_per_proposal) + t_chunk[3] + want_fixed)


def test_choose_gamma_with_given_alpha_decides_with_it(pair, monkeypatch):
  target, params, inputs = pair
  steps = timing.StepTimes(seconds=1.0, compile_s=0.0)
  monkeypatch.setattr(timing, "target_step_times",
                      lambda *a, chunk_lengths, **k: dict.fromkeys(chunk_lengths, steps))
  monkeypatch.setattr(timing, "draft_token_time",
                      lambda *a, **k: timing.StepTimes(seconds=0.01, compile_s=0.0))
  measured = gamma_choice.AlphaEstimate(0.1, 0.1, 2, 3, 12, 1.1, 10)
  loops = LoopCosts(encode_target_s=0.0, encode_draft_s=0.0, step_overhead_s=0.0,
                                 iteration_overhead_s=0.1, batches=2, held_out=True,
                                 loop_tokens=30.0)
  monkeypatch.setattr(timing, "measure_loop_costs", lambda *a, **k: (loops, measured))
  choice = timing.choose_gamma(_scorer(target, params), T5Draft(target, params), inputs,
                               max_decode_len=6, eos_id=1, alpha=0.95, max_gamma=5)
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
  monkeypatch.setattr(timing.speculative, "speculative_decode",
                      lambda *a, **k: pytest.fail("decoded"))
  monkeypatch.setattr(timing, "target_step_times",
                      lambda *a, **k: pytest.fail("timed"))
  args = dict(draft=T5Draft(target, params), max_decode_len=6, eos_id=1) | kwargs
  with pytest.raises(ValueError, match=match):
    timing.choose_gamma(_scorer(target, params), args.pop("draft"), inputs, **args)


def _count_calls(monkeypatch, name: str) -> list[int]:
  """`timing.<name>` made to append to the returned list at each call, then run."""
  calls, real = [], getattr(timing, name)
  monkeypatch.setattr(timing, name, lambda *a, **k: calls.append(1) or real(*a, **k))
  return calls


def _gin(tmp_path, pair_dir: str, gammas: str) -> str:
  bindings = {
      "name": "'tiny_auto'", "models_dir": repr(pair_dir), "drafts": "['draft']",
      "tasks": "['ende']", "num_examples": "2", "temperatures": "[0.0]", "gammas": gammas,
      "auto_max_gamma": "2", "auto_calibration_examples": "2", "max_decode_len": "8",
      "input_len": "16", "repetitions": "1", "timing_calls": "2", "timing_repeats": "1",
      "timing_rounds": "2"}
  path = tmp_path / "tiny.gin"
  path.write_text("".join(f"Experiment.{k} = {v}\n" for k, v in bindings.items()))
  return str(path)


def test_once_per_sequence_work_is_timed_once_per_batches_and_cache_length(pair, monkeypatch):
  target, params, inputs = pair
  scorer, draft, batches = _scorer(target, params), T5Draft(target, params), [inputs]
  taken = {}
  first = timing.time_sequence_work(scorer, draft, batches, cache_len=16, repeats=1,
                                    taken=taken)
  assert len(taken) == 1 and first[0] > 0 and first[1] > 0
  monkeypatch.setattr(timing, "time_calls", lambda *a: pytest.fail("timed again"))
  assert timing.time_sequence_work(scorer, draft, [inputs.copy()], cache_len=16, repeats=1,
                                   taken=taken) == first
  with pytest.raises(pytest.fail.Exception, match="timed again"):  # Another cache length.
    timing.time_sequence_work(scorer, draft, batches, cache_len=32, repeats=1, taken=taken)
  with pytest.raises(pytest.fail.Exception, match="timed again"):  # Other inputs.
    timing.time_sequence_work(scorer, draft, [inputs[::-1]], cache_len=16, repeats=1,
                              taken=taken)


def test_the_points_of_a_run_share_t_verify_and_the_encoders(tmp_path, pair_dir, monkeypatch):
  """Two temperatures of one task: T_verify(k) timed once for the batch size, and each
  batch's once-per-sequence work once for the draft (both rows carry the same times)."""
  exp = gin_flags.load_experiment([_gin(tmp_path, pair_dir, "[2]")],
                                  ["Experiment.temperatures = [0.0, 1.0]"])
  verified = _count_calls(monkeypatch, "verify_times")
  path = runner.run(exp, str(tmp_path / "out"), greedy=GreedyCheck(),
                    placement=gin_flags.placement())
  greedy, sampled = (PointRow.from_json(r) for r in results_io.read_rows(path))
  assert (greedy.temperature, sampled.temperature) == (0.0, 1.0) and len(verified) == 1
  assert greedy.t_verify_s == sampled.t_verify_s
  for name in ("encode_target_s", "encode_draft_s"):
    assert getattr(greedy.cost_model_terms, name) == getattr(sampled.cost_model_terms, name) > 0


def test_gin_auto_plans_validates_and_rejects_other_strings(tmp_path, pair_dir):
  exp = gin_flags.load_experiment([_gin(tmp_path, pair_dir, "['auto', 3]")], [])
  points = settings.plan(exp)
  assert [p.gamma for p in points] == ["auto", 3]
  assert points[0].key == ("ende", "draft", 0.0, "auto", 1)
  assert settings.largest_gamma(exp, points) == 3
  assert settings.largest_gamma(exp, points[:1]) == exp.auto_max_gamma == 2
  for bad in ("'Auto'", "'best'", "'3'"):
    with pytest.raises(ValueError, match=r"Experiment\.gammas\[0\]=.* is not a gamma: use an "
                                         r"int >= 1 .* or 'auto'"):
      gin_flags.load_experiment([_gin(tmp_path, pair_dir, f"[{bad}]")], [])
  for field in ("auto_max_gamma", "auto_calibration_examples"):
    with pytest.raises(ValueError, match=rf"Experiment\.{field} must be an int >= 1"):
      gin_flags.load_experiment([_gin(tmp_path, pair_dir, "['auto']")],
                             [f"Experiment.{field} = 0"])


def test_run_with_gamma_auto_records_the_choice(tmp_path, pair_dir, monkeypatch):
  exp = gin_flags.load_experiment([_gin(tmp_path, pair_dir, "['auto']")], [])
  timed = _count_calls(monkeypatch, "measure_loop_costs")
  path = runner.run(exp, str(tmp_path / "out"), greedy=GreedyCheck(),
                    placement=gin_flags.placement())
  (row,) = results_io.read_rows(path)
  choice = row["gamma_choice"]
  # The loops' own work is timed once, by the calibration, and the row prices with it.
  assert len(timed) == 1
  terms = PointRow.from_json(row).cost_model_terms
  for name in ("step_overhead_s", "iteration_overhead_s", "proposal_overhead_s"):
    assert getattr(terms, name) == choice["loop_costs"][name]
  assert row["gamma_auto"] is True and row["gamma"] == choice["gamma"] in (1, 2)
  assert set(choice["speedup_cost_model"]) == {"1", "2"}
  assert set(choice["verify_ratio"]) == {"1", "2", "3"}
  assert choice["alpha_measured"]["examples"] == 2 and 0 <= choice["alpha"] <= 1
  assert choice["reason"].startswith(f"gamma={row['gamma']}: cost model predicts")
  assert row["greedy_identical"] is True
  assert choice["loop_costs"]["batches"] == 2 and set(choice["speedup_steps_only"]) == {"1", "2"}
  assert "enforced" in choice["idle_check"] and "enforced" in row["idle_check_target_costs"]
  record = PointRow.from_json(row)
  assert record.gamma_choice == choice and record.key == ("ende", "draft", 0.0, "auto", 1)
  assert f"| {row['gamma']} (auto) |" in runner.summary_table([record], [])

  # A restart finds the 'auto' point done without calibrating again.
  monkeypatch.setattr(measure, "measure_point", lambda *a: pytest.fail("measured again"))
  monkeypatch.setattr(timing, "calibrate", lambda *a, **k: pytest.fail("calibrated again"))
  runner.run(exp, str(tmp_path / "out"), greedy=GreedyCheck(),
             placement=gin_flags.placement())
  assert results_io.read_rows(path) == [row]


@pytest.mark.parametrize("calibration_gamma, max_gamma, want", [(3, 8, 1), (1, 8, 2), (1, 1, None)])
def test_the_second_gamma_of_a_calibration(calibration_gamma, max_gamma, want):
  assert timing.second_gamma(calibration_gamma, max_gamma) == want


def test_a_stopwatch_puts_jaxs_compilation_apart():
  """A span that compiles a program reports JAX's compile seconds in it; the same
  program called again compiles nothing; spans of one name add up, and `pop` forgets."""
  watch = timing.Stopwatch()
  square = jax.jit(lambda x: jnp.tanh(x) @ x.T)
  x = jnp.ones((64, 64))
  with watch("first"):
    jax.block_until_ready(square(x))
  with watch("again"):
    jax.block_until_ready(square(x))
  first, again = watch.spans["first"], watch.spans["again"]
  assert 0 < first.compile_s <= first.seconds
  assert again.compile_s == 0.0 and again.rest_s == again.seconds > 0
  with watch("first"):
    pass
  assert watch.spans["first"].seconds > first.seconds
  assert watch.spans["first"].compile_s == first.compile_s
  assert watch.pop("first").seconds > first.seconds and "first" not in watch.spans
  assert watch.pop("never") == timing.Span()
