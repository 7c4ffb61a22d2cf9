"""experiments.run / analyze and their library: settings, rows, restarts, early errors,
tables and figures."""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import subprocess
import sys
import types

import gin
import jax
import numpy as np
import pytest
from absl import app, flags
from absl.testing import flagsaver
from conftest import make_model, make_point_row

from experiments import analyze
from specdec_jax.data import chat_prompts, layout, prompts
from specdec_jax.decoding import programs
from specdec_jax.decoding.sampling import Warp
from specdec_jax.experiment import (
  gin_flags,
  measure,
  report,
  results_io,
  runner,
  settings,
  tables,
  tree_point,
)
from specdec_jax.experiment.measure import GreedyCheck
from specdec_jax.experiment.record import PointRow
from specdec_jax.experiment.targets import stand_ins, t5_target
from specdec_jax.models import t5
from specdec_jax.models.t5 import T5Draft
from specdec_jax.models.t5.checkpoints import save_hf_checkpoint
from specdec_jax.regime_map import sweep
from specdec_jax.training import alpha_tracking

VOCAB = 8192  # The committed SentencePiece model's size.


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory) -> str:
  """A tiny random target, a perturbed copy as the draft, one of another vocabulary and
  one whose config.json is malformed."""
  root = str(tmp_path_factory.mktemp("models"))
  model, params = make_model("test-v1_1", seed=0, vocab_size=VOCAB)
  params = jax.device_get(params)
  save_hf_checkpoint(os.path.join(root, "target"), model.config, params)
  draft_params = jax.tree.map(lambda x: x * 1.05, params)  # No second init to compile.
  save_hf_checkpoint(os.path.join(root, "draft"), model.config, draft_params)
  # Validation reads only config.json, so a copy whose config claims more tokens will do.
  wide = model.config.replace(vocab_size=VOCAB + 8)
  os.makedirs(os.path.join(root, "wide_draft"))
  with open(os.path.join(root, "wide_draft", "config.json"), "w") as f:
    json.dump(wide.to_hf_dict(), f)
  with open(os.path.join(root, "wide_draft", "model.safetensors"), "wb"):
    pass
  os.makedirs(os.path.join(root, "broken_draft"))
  with open(os.path.join(root, "broken_draft", "config.json"), "w") as f:
    json.dump(wide.to_hf_dict() | {"num_heads": "two"}, f)
  with open(os.path.join(root, "broken_draft", "model.safetensors"), "wb"):
    pass
  return root


def _gin(tmp_path, models_dir: str, **overrides) -> str:
  bindings = {
      "name": "'tiny'", "models_dir": repr(models_dir), "drafts": "['draft']",
      "tasks": "['ende']", "num_examples": "2", "temperatures": "[0.0]", "gammas": "[2]",
      "max_decode_len": "8", "input_len": "16", "repetitions": "1", "timing_calls": "2",
      "timing_repeats": "1", "timing_rounds": "2", **overrides}
  path = tmp_path / "tiny.gin"
  path.write_text("".join(f"Experiment.{k} = {v}\n" for k, v in bindings.items()))
  return str(path)


def test_split_gin_args():
  rest, bindings = gin_flags.split_gin_args(["run", "--gin.Experiment.gammas=[1, 2]", "--x=1"])
  assert rest == ["run", "--x=1"] and bindings == ["Experiment.gammas=[1, 2]"]


def test_run_writes_row_and_restart_skips(tmp_path, models_dir, monkeypatch):
  out = tmp_path / "out"
  out.mkdir()
  earlier = make_point_row(task="mansum", temperature=1.0, gamma=4).to_json()
  (out / results_io.RESULTS_FILE).write_text(json.dumps(earlier) + "\n")
  exp = gin_flags.load_experiment([_gin(tmp_path, models_dir)], [])
  cleared = []
  monkeypatch.setattr(programs, "drop_when_crowded", lambda: cleared.append(1))
  path = runner.run(exp, str(out), greedy=GreedyCheck(),
                    placement=gin_flags.placement())
  rows = results_io.read_rows(path)
  assert len(rows) == 2 and rows[0] == earlier  # Appending kept the earlier row.
  assert len(cleared) == 1  # Compiled programs dropped, if crowded, after the one point.
  row = results_io.read_points(path)[1]  # Every field of the record, no other.
  assert row.greedy_identical is True and row.draft == "draft"
  assert len(row.accepted_histogram) == 3 and row.speedup_measured > 0
  assert 0 <= row.alpha_beta <= 1 and set(row.t_verify_s) == {1, 2, 3}
  assert len(row.example.tokens) == len(row.example.accepted_mask)
  terms = row.cost_model_terms  # Timed apart for the cost model.
  assert terms.batches >= 1 and terms.encode_target_s > 0 and terms.loop_tokens > 0
  assert row.speedup_predicted_cost_model > 0 and row.speedup_predicted_steps_only > 0

  split = row.time_split_s  # The point's seconds apart, from the clock at its boundaries.
  assert set(split) == set(runner.PHASES) and min(split.values()) >= 0
  assert split["load"] > 0 and split["measurement"] > 0  # The run's first point loaded.
  assert split["compile"] > 0 and split["calibration"] > 0  # Step timings compile.
  line = runner.time_split_line([row, dataclasses.replace(row, time_split_s=None)])
  assert line.startswith("Time apart over 1 points: ")
  for phase in runner.PHASES:
    assert f"{phase} {split[phase]:.1f} s" in line

  table = runner.summary_table([row], [dataclasses.replace(row, speedup_measured=9.25)])
  assert "draft" in table and f"**{row.speedup_measured:.2f}X**" in table
  assert "9.25X" in table  # The committed reference speedup beside the measured one.

  # A restart measures nothing that is already in the file.
  monkeypatch.setattr(measure, "measure_point", lambda *a: pytest.fail("measured again"))
  runner.run(exp, str(out), greedy=GreedyCheck(),
             placement=gin_flags.placement())
  assert results_io.read_rows(path) == rows


def test_run_times_verification_to_a_larger_gamma_and_stops_at_its_deadline(
    tmp_path, models_dir, monkeypatch):
  exp = gin_flags.load_experiment([_gin(tmp_path, models_dir, temperatures="[0.0, 1.0]")], [])
  # The first point is started whatever its pace; the second would end past the deadline.
  clock = iter([100.0, 105.0, 105.0])
  monkeypatch.setattr(runner, "time", types.SimpleNamespace(monotonic=lambda: next(clock)))
  path = runner.run(exp, str(tmp_path / "out"), greedy=GreedyCheck(),
                    placement=gin_flags.placement(), max_gamma=4,
                    deadline=109.0)
  (row,) = results_io.read_points(path)
  assert row.temperature == 0.0 and row.gamma == 2 and set(row.t_verify_s) == {1, 2, 3, 4, 5}


def test_a_t5_target_measures_a_tree_beside_the_chain(tmp_path, models_dir):
  """`Experiment.tree` on the tiny T5 pair: the checkpoint draft's top-2 first tokens,
  scored by the T5 target in one pass (`T5Scorer.score_tree`), greedy tokens checked
  equal to the baseline's, into trees.jsonl beside the chain row."""
  exp = gin_flags.load_experiment([_gin(tmp_path, models_dir, tree="'2x1'")], [])
  path = runner.run(exp, str(tmp_path / "out"), greedy=GreedyCheck(),
                    placement=gin_flags.placement())
  (chain,) = results_io.read_points(path)
  (row,) = [tree_point.TreeRow.from_json(r) for r in results_io.read_rows(
      str(tmp_path / "out" / tree_point.TREES_FILE))]
  assert row.shape == "2x1" and row.parents == [-1, 0, 0]
  assert row.greedy_identical is True and row.draft == chain.draft == "draft"
  assert row.tokens_per_call >= 1 and sum(row.accepted_histogram) > 0


@pytest.mark.parametrize("binding, error, match", [
    ("Experiment.no_such_field = 1", ValueError, "gin"),
    ("Experiment.target = 'missing'", FileNotFoundError, "missing"),
    ("Experiment.gammas = [0]", ValueError, "gamma"),
    ("Experiment.drafts = ['wide_draft']", ValueError, "vocabulary"),
    ("Experiment.batch_sizes = [3]", ValueError, "batch_sizes"),
    ("Experiment.drafts = ['broken_draft']", ValueError,
     r"Experiment\.drafts \('broken_draft'\): .*config\.json: field 'num_heads' must be an int"),
    ("Experiment.gammas = [True]", ValueError, r"Experiment\.gammas\[0\] must be an int >= 1"),
    ("Experiment.gammas = [2.5]", ValueError, r"Experiment\.gammas\[0\] must be an int"),
    ("Experiment.temperatures = [True]", ValueError, r"Experiment\.temperatures\[0\]"),
    ("Experiment.temperatures = [-1.0]", ValueError, r"Experiment\.temperatures\[0\]"),
    ("Experiment.batch_sizes = [2.0]", ValueError, r"Experiment\.batch_sizes\[0\] must be an int"),
    ("Experiment.max_decode_len = 2.5", ValueError, r"Experiment\.max_decode_len must be an int"),
    ("Experiment.input_len = 1", ValueError, r"Experiment\.input_len must be an int >= 2"),
    ("Experiment.drafts = 'draft'", ValueError, r"Experiment\.drafts must be a list"),
    ("Experiment.dtype = 'float33'", ValueError, r"Experiment\.dtype='float33' is not a dtype"),
    ("Experiment.tree = '2'", ValueError, r"Experiment\.tree='2' is not a tree's shape"),
    ("Experiment.tree = '2x2'", ValueError, r"'2x2' has 4 candidates, but the run's largest "
                                            r"gamma is 2"),
    ("Experiment.tree = '1x1+lookup2'", ValueError, r"'1x1\+lookup2' has 3 candidates, but "
                                                    r"the run's largest gamma is 2"),
    ("Experiment.tree = '1x1+lookup'", ValueError, r"'1x1\+lookup' is not a tree's shape: .*"
                                                   r"'<k>x<depth>\+lookup<n>'"),
    ("Experiment.tree = 'lookup1+1x1+lookup1'", ValueError,
     r"'lookup1\+1x1\+lookup1' is not a tree's shape: .*'lookup<n>\+<k>x<depth>'"),
    ("Experiment.tree = 'lookup2+1x1'", ValueError, r"'lookup2\+1x1' has 3 candidates"),
    ("Experiment.tree = '1x1'\nExperiment.tree_tasks = ['mansum']", ValueError,
     r"Experiment\.tree_tasks=\['mansum'\] must be None or a list of the run's tasks"),
])
def test_bad_config_fails_before_work(tmp_path, models_dir, monkeypatch, binding, error, match):
  monkeypatch.setattr(t5_target, "load_hf_checkpoint", lambda *a, **k: pytest.fail("work started"))
  with pytest.raises(error, match=match):
    gin_flags.load_experiment([_gin(tmp_path, models_dir)], [binding])


def test_stand_ins_take_the_architectures_the_command_read(tmp_path, monkeypatch):
  """A missing target is swapped for stand-ins of the architectures `gin_flags` read from
  the family's training configs; the command's own gin stays parsed after."""
  monkeypatch.setenv("SPECDEC_DATA_DIR", str(tmp_path / "data"))
  tiny = t5.get_config("test-v1_1", vocab_size=VOCAB)
  given = []
  real_write = stand_ins.write_stand_ins

  def write(output_dir, names, architectures):  # The shapes read, written tiny.
    given.append((list(names), dict(architectures)))
    real_write(output_dir, names, {n: tiny for n in architectures})

  monkeypatch.setattr(stand_ins, "write_stand_ins", write)
  exp = gin_flags.load_experiment(
      [_gin(tmp_path, str(tmp_path / "no_models"), drafts="['draft_shared_enc']",
            stand_ins_when_missing="True")], [])
  assert exp.name == "tiny_random_stand_ins"
  assert exp.models_dir == str(tmp_path / "data" / "random_models")
  (names, architectures), = given
  assert names == ["target", "draft_shared_enc"]
  assert architectures == gin_flags.family_architectures()
  assert architectures["draft_shared_enc"].d_model == 128
  assert architectures["target"].d_model == 384
  gin_flags.load_experiment([_gin(tmp_path, str(tmp_path / "no_models"),
                                  drafts="['draft_shared_enc']", stand_ins_when_missing="True")],
                            ["make_mesh.model = 1"])
  assert gin.query_parameter("Experiment.name") == "tiny"  # Still the command's config.
  assert gin.query_parameter("make_mesh.model") == 1
  gin.clear_config()
  with pytest.raises(ValueError, match=r"no architecture for \['target'\]"):
    real_write(str(tmp_path / "x"), ["draft_shared_enc"], {"draft_shared_enc": tiny})


def test_plan_uses_best_gamma(tmp_path, models_dir):
  sweep = tmp_path / "sweep.jsonl"
  rows = [make_point_row(gamma=g, speedup_measured=s) for g, s in ((1, 1.1), (2, 1.5), (3, 1.2))]
  sweep.write_text("".join(json.dumps(r.to_json()) + "\n" for r in rows))
  exp = gin_flags.load_experiment([_gin(tmp_path, models_dir, gammas="[5]",
                                     temperatures="[0.0, 1.0]",
                                     best_gamma_from=repr(str(sweep)))], [])
  assert [(p.temperature, p.gamma) for p in settings.plan(exp)] == [(0.0, 2), (1.0, 5)]


def test_committed_prompts_exist():
  for task in {*layout.CORPORA, *chat_prompts.TASKS}:
    with open(os.path.join(layout.ASSETS_DIR, "prompts", f"{task}_test.jsonl")) as f:
      first = json.loads(f.readline())
    assert first["inputs"] and first["targets"]


def test_a_chat_task_reads_its_corpus_long_sources(tmp_path, monkeypatch):
  """'explain' reads the En-De corpus's English sources of at least min_words words, with
  the corpus's prefix; without prepared data, its committed prompts."""
  corpus = tmp_path / "corpora" / "ende"
  corpus.mkdir(parents=True)
  words = chat_prompts.task("explain").min_words
  rows = [{"id": str(i), "inputs": " ".join(["w"] * n), "targets": "t", "page": "p"}
          for i, n in enumerate((3, words, words - 1, words + 5))]
  (corpus / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  monkeypatch.setenv(layout.DATA_DIR_ENV, str(tmp_path))
  pairs, source = prompts.load_examples("explain", "test", None)
  prefix = layout.CORPORA["ende"].prefix
  assert [len(x.removeprefix(prefix).split()) for x, _ in pairs] == [words, words + 5]
  assert all(x.startswith(prefix) for x, _ in pairs) and source.endswith("ende/test.jsonl")
  monkeypatch.setenv(layout.DATA_DIR_ENV, str(tmp_path / "none"))
  pairs, source = prompts.load_examples("explain", "test", 4)
  assert len(pairs) == 4 and source.endswith("explain_test.jsonl")
  assert all(len(x.split()) >= words for x, _ in pairs)


def _synthetic_row(draft: str, temperature: float, gamma: int, batch_size: int,
                   measured: float, predicted: float) -> PointRow:
  return make_point_row(
      draft=draft, temperature=temperature, gamma=gamma, batch_size=batch_size,
      speedup_measured=measured, speedup_predicted_cost_model=predicted,
      speedup_predicted_steps_only=predicted, speedup_predicted_thm38=predicted * 1.2,
      t_target_step_s=0.01 * batch_size, verify_ratio={1: 1.0, 2: 1.0 + gamma / 10})


def _write_rows(path, rows: list[PointRow]) -> None:
  path.write_text("".join(json.dumps(r.to_json(), sort_keys=True) + "\n" for r in rows))


def test_analyze_writes_tables_figures_and_flags(tmp_path):
  rows = [_synthetic_row("small", t, g, 1, 1 + g / 10, 1 + g / 10) for t in (0.0, 1.0)
          for g in (1, 2, 3)]
  rows += [_synthetic_row("small", 0.0, 3, b, 2.0 / b, 2.0 / b) for b in (2, 4)]
  off = _synthetic_row("large", 0.0, 2, 1, 2.0, 1.5)  # 33% above its prediction.
  rows.append(off)
  exp_dir = tmp_path / "sweep"
  exp_dir.mkdir()
  _write_rows(exp_dir / results_io.RESULTS_FILE, rows)

  section = report.analyze([str(exp_dir)], str(tmp_path))
  text = (exp_dir / report.TABLES_FILE).read_text()
  for title in ("Table 2", "Table 3", "Table 4", "Speedup vs batch size", "All points",
                "Verification cost"):
    assert title in text
  assert "| ende | 1 | 10.00 | 1.00 | 1.20 |" in text  # Median over the batch-1 rows.
  assert "| ende | 2 | 20.00 | 1.00 | 1.30 |" in text
  assert "| ende | small | 0 | 3 | 0.70 | 1.30X |" in text  # Best gamma per (task, draft, T).
  assert "| ende | small | 0 | 3 | 1.30 | 1.00 | 0.50 | 4 |" in text  # Crossover at batch 4.
  assert tables.is_flagged(off) and not tables.is_flagged(rows[0])
  assert "1 flagged" in text and text.count("**>15%**") == 2  # Table 4 and all points.
  for png in ("speedup_vs_gamma", "measured_vs_predicted", "speedup_vs_batch",
              "speedup_vs_alpha", "verify_cost", "fig1_example"):
    assert (exp_dir / f"{png}.png").stat().st_size > 0
  for png in ("fig2_expected_tokens", "fig3_optimal_gamma"):
    assert (tmp_path / report.THEORY_DIR / f"{png}.png").stat().st_size > 0
  with open(section) as f:
    assert "## sweep" in f.read()


def test_analyze_by_default_reads_only_run_points(tmp_path):
  """A benchmark's rows (e.g. results/decode_step) beside run points are left alone."""
  rows = [_synthetic_row("small", 0.0, g, 1, 1 + g / 10, 1 + g / 10).to_json() for g in (1, 2)]
  for name, lines in (("sweep", rows), ("decode_step", [{"model": "target", "k": 2}])):
    (tmp_path / name).mkdir()
    (tmp_path / name / results_io.RESULTS_FILE).write_text(
        "".join(json.dumps(r) + "\n" for r in lines))
  assert results_io.is_point_row(rows[0]) and not results_io.is_point_row({"k": 2})
  flags.FLAGS.mark_as_parsed()
  with flagsaver.flagsaver(results_root=str(tmp_path)):
    analyze.main(["analyze"])
  assert (tmp_path / "sweep" / report.TABLES_FILE).exists()
  assert not (tmp_path / "decode_step" / report.TABLES_FILE).exists()
  section = (tmp_path / report.SECTION_FILE).read_text()
  assert "## sweep" in section and "## decode_step" not in section


def _curve(step: int, alpha: float) -> dict:
  return {"model_dir": "checkpoints/x", "recipe": {}, "settings": {"temperatures": [0.0]},
          "best": {"step": step, "score": alpha},
          "points": [{"step": step, "passes": 1.0, "wall_time_s": 3600.0, "score": alpha,
                      "alpha": {"ende": {"T=0": alpha}}}]}


def test_analyze_draws_alpha_curves_keeping_recipes_not_named(tmp_path, monkeypatch):
  (tmp_path / analyze.CURVES_JSON).write_text(json.dumps({"old": _curve(5, 0.5)}))
  monkeypatch.setattr(analyze.alpha_curves, "collect",
                      lambda dirs: {os.path.basename(d): _curve(9, 0.6) for d in dirs})
  said = analyze.draw_alpha_curves(["checkpoints/new"], str(tmp_path))
  curves = json.loads((tmp_path / analyze.CURVES_JSON).read_text())
  assert set(curves) == {"old", "new"} and curves["old"] == _curve(5, 0.5)
  assert (tmp_path / analyze.CURVES_FIGURE).stat().st_size > 0 and "2 recipes" in said
  monkeypatch.undo()
  with pytest.raises(app.UsageError, match="--alpha_curves: "):
    analyze.draw_alpha_curves([str(tmp_path / "no_run")], str(tmp_path))


def test_auto_table_compares_the_choice_with_the_sweep():
  sweep = [_synthetic_row("small", 0.0, g, 1, s, s) for g, s in ((1, 1.0), (2, 1.2), (3, 1.1))]
  good = dataclasses.replace(_synthetic_row("small", 0.0, 2, 1, 1.19, 1.2), gamma_auto=True)
  bad = dataclasses.replace(_synthetic_row("small", 1.0, 1, 1, 0.9, 1.0), gamma_auto=True)
  sweep += [_synthetic_row("small", 1.0, g, 1, s, s) for g, s in ((1, 1.0), (3, 1.3))]
  table = tables.auto_table(sweep + [good, bad])
  assert "| ende | small | 0 | 1 | 2 | 1.19X | 2 | 1.20X | 0.992 | 1.000 | yes |" in table
  assert "| ende | small | 1 | 1 | 1 | 0.90X | 3 | 1.30X | 0.692 | 0.769 | **no** (>5%) |" in table
  # Auto rows are not sweep points: the best fixed gamma stays the sweep's.
  assert [r.gamma for r in results_io.best_rows(sweep + [good, bad])] == [2, 3]
  assert tables.auto_table(sweep) is None


def test_decoder_only_table3_has_both_estimators_in_order():
  row = lambda b, e: {"alpha_beta": b, "alpha_empirical": e, "tokens_per_call": 1.5}  # noqa: E731
  alpha = {"prompt_lookup": {"mansum": {"T=0": row(0.57, 0.56), "T=1": row(0.14, 0.15)}},
           "layer_skip_24": {"mansum": {"T=0": row(0.33, 0.32)}},
           "layer_skip_4": {"mansum": {"T=1": row(0.07, 0.08)}}}
  lines = tables.table3_decoder_only(alpha).splitlines()
  assert lines[0] == ("| task | draft | alpha (beta) T=0 | alpha (S/(S+R)) T=0 | tokens/call T=0 "
                      "| alpha (beta) T=1 | alpha (S/(S+R)) T=1 | tokens/call T=1 |")
  assert lines[2:] == ["| mansum | layer_skip_4 | - | - | - | 0.07 | 0.08 | 1.50 |",
                       "| mansum | layer_skip_24 | 0.33 | 0.32 | 1.50 | - | - | - |",
                       "| mansum | prompt_lookup | 0.57 | 0.56 | 1.50 | 0.14 | 0.15 | 1.50 |"]
  committed = report.decoder_only_section(os.path.join(layout.REPO_ROOT, "results",
                                                       report.DECODER_ONLY_ALPHA))
  assert "| mansum | layer_skip_24 |" in committed and "experiments.measure_alpha" in committed


@pytest.mark.parametrize("binding, match", [
    ("Settings.gamma = 0", r"Settings\.gamma must be an int >= 1"),
    ("Settings.input_len = 1", r"Settings\.input_len must be an int >= 2"),
    ("Settings.max_decode_len = 0", r"Settings\.max_decode_len must be an int >= 1"),
    ("Settings.dtype = 'float33'", r"Settings\.dtype='float33' is not a dtype"),
    ("Settings.no_such_field = 1", "gin"),
])
def test_bad_settings_fail_when_loaded(binding, match):
  try:
    with pytest.raises(ValueError, match=match):
      gin_flags.load_settings([], [binding])
  finally:
    gin.clear_config()


def test_settings_are_shared_and_a_run_may_override_them(tmp_path, models_dir):
  try:
    shared = gin_flags.load_settings([], ["Settings.input_len = 32", "Settings.gamma = 5"])
    assert (shared.input_len, shared.gamma, shared.max_decode_len) == (32, 5, 64)
    # An Experiment takes what it leaves unbound from Settings; its own bindings win.
    gin_file = _gin(tmp_path, models_dir)
    exp = gin_flags.load_experiment([gin_file], ["Settings.input_len = 32", "Settings.seed = 7",
                                              "Settings.gamma = 4"])
    assert (exp.input_len, exp.seed, exp.gammas) == (16, 7, [2])
    unbound_gammas = tmp_path / "no_gammas.gin"
    lines = (tmp_path / "tiny.gin").read_text().splitlines()
    unbound_gammas.write_text("".join(line + "\n" for line in lines
                                      if not line.startswith("Experiment.gammas")))
    exp = gin_flags.load_experiment([str(unbound_gammas)], ["Settings.gamma = 4"])
    assert exp.gammas == (4,) and exp.gamma == 4
  finally:
    gin.clear_config()


def test_measure_alpha_is_one_for_the_target_as_its_own_draft():
  model, params = make_model("test-v1_1", 0)
  draft = T5Draft(model, params)
  rows = np.random.RandomState(0).randint(2, 97, (5, 6)).astype(np.int32)
  batches = [rows[:3], rows[3:]]
  kwargs = dict(gamma=2, max_decode_len=6, warp=Warp(1.0), eos_id=1, rng=jax.random.PRNGKey(0))
  scorer = t5.T5Scorer(model, model.prepare(params))
  got = alpha_tracking.measure_alpha(scorer, draft, batches, **kwargs)
  np.testing.assert_allclose([got.beta, got.empirical], [1.0, 1.0], atol=1e-5)
  # gamma + 1 tokens per call, except where EOS or the length limit cut the last call.
  assert 2.0 < got.tokens_per_iteration <= 3.0 and 5 <= got.tokens <= 5 * 6
  assert got.examples == 5
  worse = alpha_tracking.measure_alpha(scorer, T5Draft(model, jax.tree.map(
      lambda x: x * 1.5, params)), batches, **kwargs)
  assert worse.beta < 0.99


def _committed_lines(pattern: str) -> dict[str, list[str]]:
  """{path: its lines} of every file under results/ matching `pattern` (recursively)."""
  files = {}
  for path in sorted(glob.glob(os.path.join(layout.REPO_ROOT, "results", "**", pattern),
                               recursive=True)):
    with open(path, encoding="utf-8") as f:
      files[path] = [line.rstrip("\n") for line in f if line.strip()]
  return files


def test_every_committed_row_loads_and_writes_back_the_same_json():
  """Every row of experiments.run under results/ (results.jsonl and the runs beside them, at
  any depth) is a PointRow; a file of another kind (a benchmark's rows) holds none of them."""
  lines = []
  for path, rows in _committed_lines("*.jsonl").items():
    if os.path.basename(path) == sweep.ROWS_FILE:
      continue  # The regime map's own rows (test_regime_map).
    points = [results_io.is_point_row(json.loads(line)) for line in rows]
    assert all(points) or not any(points), f"{path} mixes points with other rows"
    if all(points):
      lines += rows
      assert len(results_io.read_points(path)) == len(rows)
  assert len(lines) > 300
  for line in lines:
    row = PointRow.from_json(json.loads(line))
    assert json.dumps(row.to_json(), sort_keys=True) == line
    assert row.key == results_io.row_key(json.loads(line))
  with pytest.raises(TypeError, match="no_such_field"):
    PointRow.from_json(json.loads(lines[0]) | {"no_such_field": 1})


@pytest.mark.parametrize("name,points", [
    ("quickstart_t5", 2), ("quickstart_smollm2", 4), ("sweep_gamma", 144),
    ("sweep_draft_size", 28), ("trivial_drafts", 24), ("paper_table2", 48),
    ("sweep_batch", 24), ("llama_smollm2", 48)])
def test_shipped_experiment_configs_parse_and_plan(name, points):
  gin.clear_config()
  gin.add_config_file_search_path(layout.REPO_ROOT)
  try:
    gin.parse_config_files_and_bindings(
        [os.path.join(layout.REPO_ROOT, "gin_configs", f"{name}.gin")],
        ["Experiment.best_gamma_from = None"],  # Plan every gamma, whatever results exist.
        finalize_config=False)
    exp = gin_flags.build_experiment()
  finally:
    gin.clear_config()
  assert exp.name == name
  assert len(settings.plan(exp)) == points
  trees = settings.tree_points(exp)  # The first command's trees: beside its greedy points.
  assert [(p.task, p.temperature) for p in trees] == (
      [("mansum", 0.0), ("explain", 0.0)] if name == "quickstart_smollm2" else [])
  assert all(exp.num_examples % b == 0 for b in exp.batch_sizes)


def test_the_readme_main_command_is_a_suite_of_both_pairs():
  assert gin_flags.listed_experiments([os.path.join(layout.REPO_ROOT, "gin_configs",
                                                "quickstart.gin")], []) == (
      "gin_configs/quickstart_t5.gin", "gin_configs/quickstart_smollm2.gin")
  gin.clear_config()


def test_the_readme_main_command_measures_and_ends_with_its_table(tmp_path):
  """The README's first command's T5 pair on the shipped family, cut to a tiny budget (one
  example, T = 0, eight tokens, γ = 'auto' among 1..3 calibrated on two examples in one
  round): it measures although results/quickstart_t5 holds the same points, and ends with
  the summary table, the committed reference speedup beside the measured one."""
  out = tmp_path / "quickstart_t5"
  done = subprocess.run(
      [sys.executable, "-m", "experiments.run", "--gin_file=gin_configs/quickstart_t5.gin",
       f"--output_dir={out}", "--gin.Experiment.num_examples=1",
       "--gin.Experiment.temperatures=[0.0]", "--gin.Experiment.repetitions=1",
       "--gin.Experiment.max_decode_len=8", "--gin.Experiment.timing_calls=2",
       "--gin.Experiment.timing_repeats=1", "--gin.Experiment.timing_rounds=1",
       "--gin.Experiment.auto_max_gamma=3", "--gin.Experiment.auto_calibration_examples=2"],
      cwd=layout.REPO_ROOT, capture_output=True, text=True, timeout=600, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  assert "quickstart_t5: 1 points, 0 already in" in done.stdout + done.stderr
  rows = results_io.read_points(str(out / results_io.RESULTS_FILE))
  assert len(rows) == 1 and rows[0].speedup_measured > 0 and rows[0].greedy_identical
  head = ("| task | draft | T | gamma | batch | base ms/tok | spec ms/tok | speedup | "
          "per example (p10-p90) | alpha (beta) | alpha (S/(S+R)) | c | tokens/call | "
          "Thm 3.8 | efficiency | cost model | reference |")
  assert head in done.stdout
  line = next(x for x in done.stdout.splitlines()
              if x.startswith("| ende | draft_shared_enc_d192 | 0 |"))
  row = rows[0]
  assert f"| {row.gamma} (auto) |" in line  # The command chooses gamma itself.
  assert f"**{row.speedup_measured:.2f}X**" in line
  low, mid, high = row.speedup_spread  # One example: its speedup is every percentile.
  assert low == mid == high and f"| {low:.2f}-{high:.2f}X |" in line
  assert f"| {row.efficiency:.2f} |" in line
  reference = results_io.read_points(os.path.join(layout.REPO_ROOT, "results", "quickstart_t5",
                                                  results_io.RESULTS_FILE))
  committed = next(r for r in reference if r.temperature == 0)
  assert line.endswith(f"| {committed.speedup_measured:.2f}X |")
  assert runner.time_split_line(rows) in done.stdout  # Load, compile, calibration, measurement.


def test_a_suite_measures_each_experiment_and_skips_a_missing_model(tmp_path, models_dir):
  """A gin file listing experiments (`Suite.experiments`): each is measured as if alone,
  into runs/<name>/; one whose GGUF file is missing is skipped with its install message."""
  tiny = _gin(tmp_path, models_dir, name="'suite_t5'", num_examples="1")
  llama = tmp_path / "llama.gin"
  llama.write_text("Experiment.name = 'suite_llama'\nExperiment.target_kind = 'llama_gguf'\n"
                   "Experiment.target = '/no/such.gguf'\nExperiment.drafts = ['prompt_lookup']\n"
                   "Experiment.tasks = ['mansum']\nExperiment.num_examples = 1\n")
  suite_gin = tmp_path / "suite.gin"
  suite_gin.write_text(f"Suite.experiments = [{str(llama)!r}, {tiny!r}]\n")
  done = subprocess.run([sys.executable, "-m", "experiments.run", f"--gin_file={suite_gin}"],
                        cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  assert f"{llama}: not measured, its model is missing: " in done.stdout
  assert "no GGUF file at '/no/such.gguf'" in done.stdout
  rows = results_io.read_points(str(tmp_path / "runs" / "suite_t5" / results_io.RESULTS_FILE))
  assert len(rows) == 1 and rows[0].draft == "draft"
  assert "suite_t5: 1 points" in done.stdout and "| ende | draft | 0 |" in done.stdout
