"""The T5 regime map: shapes, the checkpoint round trip, predictions, the error check, resume.

Tiny configs and hand-made rows only: nothing here is timed.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os

import jax
import numpy as np
import pytest
from conftest import make_point_row
from safetensors.numpy import load_file

from specdec_jax import theory
from specdec_jax.data import layout
from specdec_jax.experiment import results_io
from specdec_jax.models.t5 import T5Model, get_config
from specdec_jax.models.t5.checkpoints import load_hf_checkpoint, save_hf_checkpoint
from specdec_jax.regime_map import regime_predictions, regime_rows, sweep
from specdec_jax.regime_map.regime_rows import ModelRow, PairRow
from specdec_jax.theory import LoopCosts

TINY = "test-v1_1"  # conftest's small T5.1.1 config, standing in for a shape.
MAX_GAMMA = 4


def _count(name: str) -> int:
  info = T5Model(get_config(name)).param_info()
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(
      info, is_leaf=lambda x: hasattr(x, "shape")))


@pytest.mark.parametrize("name", sorted(sweep.SHAPES))
def test_shapes_have_their_public_parameter_counts(name):
  assert abs(_count(name) / sweep.SHAPES[name] - 1) < 0.01


def test_v1_0_shapes_are_the_named_sizes():
  # 60M and 220M as published; t5-large's "770M" is the T5 paper's rounding of 737.7M.
  assert round(_count("t5-small") / 1e6) == 61 and round(_count("t5-base") / 1e6) == 223
  assert round(_count("t5-large") / 1e6) == 738
  assert {sweep.architecture(n) for n in ("t5-small", "t5-base", "t5-large")} == {"relu"}
  assert sweep.architecture("t5-v1_1-large") == "gated-gelu"


def test_float16_round_trip(tmp_path):
  cfg = get_config(TINY)
  params = sweep.random_params(cfg, seed=0)
  path = str(tmp_path / "tiny")
  save_hf_checkpoint(path, cfg, params, dtype="float16")
  assert {v.dtype for v in load_file(os.path.join(path, "model.safetensors")).values()} == {
      np.dtype(np.float16)}
  loaded_cfg, loaded = load_hf_checkpoint(path)
  assert loaded_cfg == cfg
  for want, got in zip(jax.tree.leaves(params), jax.tree.leaves(loaded), strict=True):
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want.astype(np.float16).astype(np.float32))


def test_save_rejects_other_dtypes(tmp_path):
  cfg = get_config(TINY)
  with pytest.raises(ValueError, match="dtype"):
    save_hf_checkpoint(str(tmp_path / "x"), cfg, sweep.random_params(cfg, 0),
                       dtype="bfloat16")


def test_load_writes_a_shape_once_and_reads_it_as_a_user_would(tmp_path, monkeypatch):
  monkeypatch.setitem(sweep.SHAPES, TINY, _count(TINY))
  settings = sweep.MapSettings(shapes=(TINY,), family_drafts=("draft_small",),
                                    checkpoints_dir=str(tmp_path))
  first = sweep.load(settings, TINY)
  weights = os.path.join(str(tmp_path), TINY, "model.safetensors")
  written = os.path.getmtime(weights)
  second = sweep.load(settings, TINY)
  assert os.path.getmtime(weights) == written
  assert first.info["params"] == _count(TINY) == second.info["params"]
  assert 0 < first.info["decoder_bytes"] < 4 * first.info["params"]
  assert first.info["checkpoint_bytes"] == os.path.getsize(weights)


def test_settings_reject_bad_values():
  with pytest.raises(ValueError, match="shapes"):
    sweep.MapSettings(shapes=("t5-huge",))
  with pytest.raises(ValueError, match="draft_gamma"):
    sweep.MapSettings(draft_gamma=9, max_gamma=7)
  with pytest.raises(ValueError, match="loop_reference"):
    sweep.MapSettings(family_drafts=("draft_shared_enc_d192",))
  with pytest.raises(ValueError, match="timing_calls"):
    sweep.MapSettings(timing_calls=0)
  with pytest.raises(ValueError, match="paper_tokens"):
    regime_predictions.MapPredictions(paper_tokens={"ende": 32})


def test_pairs_stay_within_an_architecture_and_go_up_in_size():
  settings = sweep.MapSettings(shapes=("t5-base", "t5-small", "t5-v1_1-small"),
                                    family_drafts=("draft_small",))
  assert sweep.pairs(settings) == [("draft_small", "target"), ("t5-small", "t5-base")]
  keys = [job.key for job in sweep.plan(settings)]
  assert keys[:3] == [("model", "target"), ("pair", "draft_small", "target", 0.0),
                      ("pair", "draft_small", "target", 1.0)]
  assert keys.index(("model", "t5-base")) < keys.index(("pair", "t5-small", "t5-base", 0.0))
  assert len(keys) == len(set(keys)) == 8  # 4 models, 2 pairs at 2 temperatures.


def test_prompt_batches_are_real_tokens_ending_in_eos():
  batches = sweep.prompt_batches(32, 3)
  assert [b.shape for b in batches] == [(1, 32)] * 3
  for b in batches:
    assert b[0, -1] == 1 and np.all(b[0, :-1] > 1)
  assert not np.array_equal(batches[0], batches[1])


def test_cache_size_parsing():
  assert sweep.parse_size("32768K") == 32 << 20
  assert sweep.parse_size("1M") == 1 << 20 and sweep.parse_size("512") == 512
  cache = sweep.last_level_cache()
  assert cache is None or cache["bytes"] > 0


# --- Predictions on hand-made rows ----------------------------------------------------------

ENV = {"cpu_model": "Test CPU", "cpu_vectors": "avx2", "last_level_cache": None}
DATE = "2026-01-01T00:00:00+00:00"


def _model_row(name, t_step, ratios=None, encoder_s=0.0, family="t5 public", nbytes=1 << 20,
               max_gamma=MAX_GAMMA) -> ModelRow:
  ratios = {k: ratios.get(k, 1.0) if ratios else 1.0 for k in range(1, max_gamma + 2)}
  return ModelRow(
      model=name, family=family, public_params=None, d_model=8, d_ff=16, num_layers=1,
      num_decoder_layers=1, num_heads=1, d_kv=8, vocab_size=32, feed_forward_proj="relu",
      tie_word_embeddings=False, checkpoint_dir=name, params=nbytes // 2,
      checkpoint_bytes=nbytes, decoder_bytes=nbytes, write_s=0.0, load_s=0.0, t_step_s=t_step,
      t_verify_s={k: t_step * r for k, r in ratios.items()}, verify_ratio=ratios,
      verify_spread={k: 0.0 for k in ratios}, verify_compile_s=1.0, encoder_s=encoder_s,
      encoder_compile_s=0.1, prompt_len=32, idle_check_verify={}, idle_check={}, settings={},
      environment=ENV, date=DATE)


def _loops(**terms) -> LoopCosts:
  base = {"encode_target_s": 0.0, "encode_draft_s": 0.0, "step_overhead_s": 0.0,
          "iteration_overhead_s": 0.0, "proposal_overhead_s": 0.0, "batches": 1,
          "held_out": False, "loop_tokens": 10.0}
  return LoopCosts(**{**base, **terms})


def _pair_row(draft, target, t_draft, loops=None, temperature=0.0) -> PairRow:
  return PairRow(draft=draft, target=target, temperature=temperature, draft_gamma=2,
                 draft_params=1, draft_decoder_bytes=1, draft_reads_target_encoder=False,
                 t_draft_s=t_draft, c=0.0, draft_compile_s=1.0, loop_costs=loops,
                 alpha_of_these_weights=None, measure_s=0.0, idle_check={}, settings={},
                 environment=ENV, date=DATE)


def test_every_committed_row_loads_and_writes_back_the_same_json():
  paths = glob.glob(os.path.join(layout.REPO_ROOT, "results", "**", sweep.ROWS_FILE),
                    recursive=True)
  assert paths
  for path in paths:
    with open(path, encoding="utf-8") as f:
      for line in filter(str.strip, f):
        row = regime_rows.read_row(json.loads(line))
        assert json.dumps(row.to_json(), sort_keys=True) == line.rstrip("\n")
  with pytest.raises(ValueError, match="kind='benchmark'"):
    regime_rows.read_row({"kind": "benchmark"})


def _settings():
  return sweep.MapSettings(shapes=("t5-small", "t5-base"), family_drafts=("draft_small",),
                                temperatures=(0.0,), max_gamma=MAX_GAMMA, draft_gamma=2)


def test_free_verification_and_no_overhead_is_theorem_3_8():
  target, pair = _model_row("target", 0.01), _pair_row("d", "target", 0.002, _loops())
  models, pair_rows = {"target": target}, {("d", "target", 0.0): pair}
  loops = regime_predictions.loop_costs(pair, models, pair_rows, _settings(), tokens=20)
  choice = regime_predictions.predict(target, pair, loops, alpha=0.7, max_gamma=MAX_GAMMA)
  for g in range(1, MAX_GAMMA + 1):
    assert choice.speedup_cost_model[g] == pytest.approx(theory.walltime_improvement(0.7, g, 0.2))
  assert choice.gamma == theory.optimal_gamma(0.7, 0.2, MAX_GAMMA).gamma


def test_measured_costs_give_the_cost_models_sequence_speedup():
  ratios = {2: 1.1, 3: 1.3, 4: 1.2, 5: 1.6}  # k = 4 below k = 3: fitted non-decreasing.
  target = _model_row("target", 0.01, ratios)
  loops = _loops(encode_target_s=0.05, encode_draft_s=0.01, step_overhead_s=0.001,
                 iteration_overhead_s=0.002, proposal_overhead_s=0.0005)
  pair = _pair_row("d", "target", 0.003, loops)
  costs = regime_predictions.loop_costs(pair, {"target": target}, {}, _settings(), tokens=30)
  choice = regime_predictions.predict(target, pair, costs, alpha=0.6, max_gamma=MAX_GAMMA)
  fitted = {1: 0.01, 2: 0.011, 3: 0.0125, 4: 0.0125, 5: 0.016}
  model = theory.CostModel(0.01, 0.003, fitted, t_step_overhead=0.001,
                           t_iteration_overhead=0.002, t_proposal_overhead=0.0005,
                           t_encode_target=0.05, t_encode_draft=0.01)
  for g in range(1, MAX_GAMMA + 1):
    assert choice.speedup_cost_model[g] == pytest.approx(model.sequence_speedup(0.6, g, 30))
  assert choice.gamma == model.optimal_gamma(0.6, MAX_GAMMA, tokens=30).gamma


def test_a_shapes_pair_borrows_the_reference_loop_work_and_the_model_rows_encoders():
  settings = _settings()
  models = {"t5-small": _model_row("t5-small", 0.004, encoder_s=0.02),
            "t5-base": _model_row("t5-base", 0.012, encoder_s=0.07)}
  reference = _pair_row("draft_small", "target", 1e-4, _loops(
      iteration_overhead_s=0.001, proposal_overhead_s=0.0002, step_overhead_s=0.0003,
      encode_target_s=9.0))
  pair = _pair_row("t5-small", "t5-base", 0.004)
  costs = regime_predictions.loop_costs(pair, models, {("draft_small", "target", 0.0): reference},
                                        settings, tokens=32)
  assert (costs.iteration_overhead_s, costs.proposal_overhead_s, costs.step_overhead_s) == (
      0.001, 0.0002, 0.0003)
  assert (costs.encode_target_s, costs.encode_draft_s, costs.loop_tokens) == (0.07, 0.02, 32.0)


def _measured(draft, gamma, alpha, speedup, cpu="Test CPU"):
  return make_point_row(draft=draft, gamma=gamma, alpha_beta=alpha, speedup_measured=speedup,
                        cost_model_terms=_loops(loop_tokens=20.0),
                        environment={"cpu_model": cpu, "cpu_vectors": "avx2"})


def test_family_errors_and_their_verdict():
  rows = [_model_row("target", 0.01, family="ours"),
          _pair_row("draft_small", "target", 0.002, _loops())]
  exact = theory.walltime_improvement(0.5, 2, 0.2)
  measured = [_measured("draft_small", 2, 0.5, exact), _measured("draft_small", 2, 0.5, exact / 1.2,
                                                                  cpu="Other CPU"),
              _measured("draft_small", 9, 0.5, 1.0), _measured("other_draft", 1, 0.5, 1.0)]
  errors = regime_predictions.family_errors(rows, {"rows.jsonl": measured}, _settings())
  assert [round(e.error, 6) for e in errors] == [0.0, 0.2]  # gamma 9 and other_draft skipped.
  assert [e.same_cpu for e in errors] == [True, False]
  assert {e.source for e in errors} == {"rows.jsonl"}
  summary = regime_predictions.error_summary(errors)
  assert not summary["within_limit"] and summary["inside_limit"] == 1
  assert "NOT within" in summary["verdict"] and summary["same_cpu_points"] == 1
  assert regime_predictions.error_summary(errors[:1])["within_limit"]
  assert regime_predictions.error_summary([])["points"] == 0


def test_report_and_figure_from_rows(tmp_path):
  settings = _settings()
  rows = [_model_row("target", 0.001, family="ours", nbytes=20 << 20),
          _pair_row("draft_small", "target", 2e-4, _loops(iteration_overhead_s=0.001)),
          _model_row("t5-small", 0.004, encoder_s=0.01, nbytes=100 << 20),
          _model_row("t5-base", 0.012, encoder_s=0.05, nbytes=300 << 20),
          _pair_row("t5-small", "t5-base", 0.004)]
  measured_path = tmp_path / "measured.jsonl"
  measured_path.write_text(json.dumps(_measured("draft_small", 2, 0.5, 0.9).to_json()) + "\n")
  predictions = regime_predictions.MapPredictions(measured_rows=(str(measured_path),),
                                                  alpha_draft="draft_small")
  report = regime_predictions.write_report([r.to_json() for r in rows], settings, predictions,
                                           str(tmp_path), "cmd")
  sources = {(r.draft, r.source, r.task) for r in report["predictions"]}
  assert sources == {("draft_small", "ours", "ende"), ("t5-small", "ours", "ende"),
                     ("t5-small", "paper", "ende"), ("t5-small", "paper", "cnndm")}
  paper = next(r for r in report["predictions"] if r.source == "paper" and r.task == "ende")
  assert paper.alpha == regime_predictions.PAPER_ALPHA[("small", "ende", 0.0)]
  assert paper.speedup == max(paper.speedup_by_gamma.values())
  written = json.loads((tmp_path / regime_predictions.PREDICTIONS_FILE).read_text())
  assert [r.to_json() for r in report["predictions"]] == written["predictions"]
  assert [e.source for e in report["family_errors"]] == [
      e["source"] for e in written["family_errors"]] == [str(measured_path)]
  tables = (tmp_path / regime_predictions.TABLES_FILE).read_text()
  assert "not decodes of trained models" in tables and "t5-small" in tables
  from specdec_jax.regime_map import regime_figure  # noqa: PLC0415  (matplotlib)

  cache = {"level": 3, "bytes": 32 << 20, "shared_cpu_list": "0-1"}
  path = regime_figure.fig_regime_map(report["predictions"], report["family_errors"], cache,
                                      str(tmp_path / "map.png"))
  assert os.path.getsize(path) > 0


# --- Resume -----------------------------------------------------------------------------------


def test_an_interrupted_run_resumes_with_the_rows_it_lacks(tmp_path, monkeypatch):
  settings = sweep.MapSettings(shapes=("t5-small", "t5-base"),
                                    family_drafts=("draft_small",), temperatures=(0.0,))
  measured = []

  def fake_model(settings, name, loaded, inputs):
    del settings, loaded, inputs
    measured.append(("model", name))
    if name == "t5-base" and not os.environ.get("RESUMED"):
      raise KeyboardInterrupt  # The run is cut short here.
    return _model_row(name, 0.01)

  def fake_pair(settings, job, target, draft, target_row, batches):
    del settings, target, draft, batches
    assert target_row.model == job.target
    measured.append(job.key)
    return _pair_row(job.draft, job.target, 0.001, temperature=job.temperature)

  monkeypatch.setattr(sweep, "measure_model", fake_model)
  monkeypatch.setattr(sweep, "measure_pair", fake_pair)
  info = {"params": 1, "decoder_bytes": 1, "write_s": 0.0, "load_s": 0.0}
  monkeypatch.setattr(sweep, "load",
                      lambda settings, name: sweep.Loaded(None, None, info))
  monkeypatch.setattr(sweep.jax, "clear_caches", lambda: None)
  monkeypatch.setattr(sweep, "describe", lambda row: "")
  out = str(tmp_path)
  with pytest.raises(KeyboardInterrupt):
    sweep.run(settings, out, say=lambda _: None)
  path = os.path.join(out, sweep.ROWS_FILE)
  first = [regime_rows.read_row(r) for r in results_io.read_rows(path)]
  assert [r.key for r in first] == [("model", "target"), ("pair", "draft_small", "target", 0.0),
                                    ("model", "t5-small")]
  assert all(r.wall_s is not None for r in first)
  assert [j.key for j in sweep.pending(settings, first)] == [
      ("model", "t5-base"), ("pair", "t5-small", "t5-base", 0.0)]
  monkeypatch.setenv("RESUMED", "1")
  measured.clear()
  rows = sweep.run(settings, out, say=lambda _: None)
  assert measured == [("model", "t5-base"), ("pair", "t5-small", "t5-base", 0.0)]
  assert rows == results_io.read_rows(path)  # As the file holds them.
  assert [regime_rows.read_row(r).key for r in rows] == [
      j.key for j in sweep.plan(settings)]
  measured.clear()
  sweep.run(settings, out, say=lambda _: None)
  assert measured == []


def test_device_check_runs_the_same_sweep_with_one_flag(tmp_path, monkeypatch):
  from experiments import device_check  # noqa: PLC0415

  monkeypatch.setenv("SPECDEC_TIMING_GUARD", "off")
  calls = []

  def fake_run(settings, output_dir):
    calls.append((settings, output_dir))
    return [r.to_json() for r in (
        _model_row("t5-small", 0.004, nbytes=100 << 20, max_gamma=settings.max_gamma),
        _model_row("t5-base", 0.012, nbytes=300 << 20, max_gamma=settings.max_gamma),
        _pair_row("t5-small", "t5-base", 0.004))]

  monkeypatch.setattr(sweep, "run", fake_run)
  # No family pair in these rows: the shapes' pair is priced with no loop work.
  monkeypatch.setattr(regime_predictions, "loop_costs", lambda *args: _loops())
  device_check.main(["--output_dir", str(tmp_path), "--regime_map",
                     "--gin.Experiment.models_dir='models'"])
  (settings, output_dir), = calls
  assert settings == dataclasses.replace(device_check.REGIME_MAP, models_dir="models")
  assert "t5-3b" in settings.shapes and settings.dtype == "bfloat16"
  assert output_dir == str(tmp_path / device_check.REGIME_MAP_DIR)
  assert (tmp_path / device_check.REGIME_MAP_DIR / regime_predictions.TABLES_FILE).exists()
