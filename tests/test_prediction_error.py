"""prediction_error: the cost model's error per row and over the committed rows."""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest
from absl import flags
from absl.testing import flagsaver
from conftest import make_point_row

from experiments import analyze
from specdec_jax.data import layout
from specdec_jax.experiment import prediction_error, results_io
from specdec_jax.theory import LoopCosts


def _write(path, predicted_and_measured) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  rows = [make_point_row(gamma=g, speedup_predicted_cost_model=p, speedup_measured=m)
          for g, (p, m) in enumerate(predicted_and_measured, start=1)]
  with open(path, "w", encoding="utf-8") as f:
    f.writelines(json.dumps(r.to_json(), sort_keys=True) + "\n" for r in rows)


def test_a_row_carries_its_cost_model_error():
  assert make_point_row(speedup_predicted_cost_model=1.49,
                        speedup_measured=1.19).cost_model_error == pytest.approx(0.30 / 1.19)
  assert make_point_row(speedup_predicted_cost_model=0.9,
                        speedup_measured=1.0).cost_model_error == pytest.approx(-0.1)


def test_the_error_splits_into_each_decoders_time():
  """The row's terms price each decoder per token; their errors give the speedup's, and a
  decoder priced slower than it ran raises (baseline) or lowers (speculative) it."""
  terms = LoopCosts(encode_target_s=0.02, encode_draft_s=0.004, step_overhead_s=0.001,
                    iteration_overhead_s=0.002, batches=1, held_out=True, loop_tokens=8.0,
                    proposal_overhead_s=0.0005)
  row = make_point_row(cost_model_terms=terms, alpha_beta=0.6, gamma=2,
                       speedup_predicted_cost_model=1.0, speedup_measured=1.0)
  model = terms.cost_model(row.t_verify_s, row.t_draft_token_s)
  predicted = model.sequence_speedup(0.6, 2, 8.0)
  row = dataclasses.replace(row, speedup_predicted_cost_model=predicted,
                            baseline_ms_per_token=15.0, speculative_ms_per_token=12.0,
                            speedup_measured=15.0 / 12.0)
  baseline, speculative = row.cost_model_time_errors
  assert baseline == pytest.approx((0.02 / 8 + 0.011) / 0.015 - 1)
  assert (1 + baseline) / (1 + speculative) - 1 == pytest.approx(row.cost_model_error)
  slower = dataclasses.replace(row, baseline_ms_per_token=16.0, speedup_measured=16.0 / 12.0)
  assert slower.cost_model_time_errors[0] < baseline and slower.cost_model_error < (
      row.cost_model_error)
  with pytest.raises(ValueError, match="batch_size=2"):
    _ = dataclasses.replace(row, batch_size=2).cost_model_time_errors


def test_summary_per_group_and_file(tmp_path):
  _write(tmp_path / "a" / "results.jsonl", [(1.08, 1.0), (1.0, 1.0)])  # +8%, 0%.
  _write(tmp_path / "a" / "back" / "run2.jsonl", [(1.5, 1.0)])  # +50%.
  _write(tmp_path / "b" / "results.jsonl", [(0.8, 1.0), (1.0, 1.0)])  # -20%, 0%.
  groups = {"first": ("a/results.jsonl", "a/back/*.jsonl"), "sweeps": ("b/results.jsonl",)}
  by_group, by_file = prediction_error.summarize(str(tmp_path), groups)
  first, sweeps, everything = by_group
  assert (first.name, first.rows) == ("first", 3)
  assert first.median == pytest.approx(0.08) and first.max_abs == pytest.approx(0.5)
  assert first.within == pytest.approx(2 / 3)
  assert sweeps.median == pytest.approx(-0.1) and sweeps.median_abs == pytest.approx(0.1)
  assert (everything.name, everything.rows) == ("all", 5) and everything.within == 0.6
  # The hand-made rows are at batch 1: each decoder's median time error over them. Their
  # terms price the baseline at T_step, 10 ms a token, against the 12.5 measured.
  assert first.baseline == pytest.approx(0.01 / 0.0125 - 1)
  rows = [r for p in ("results.jsonl", os.path.join("back", "run2.jsonl"))
          for r in results_io.read_points(str(tmp_path / "a" / p))]
  assert first.speculative == pytest.approx(
      np.median([r.cost_model_time_errors[1] for r in rows]))
  assert [s.name for s in by_file] == [os.path.join("a", "results.jsonl"),
                                       os.path.join("a", "back", "run2.jsonl"),
                                       os.path.join("b", "results.jsonl")]
  with pytest.raises(FileNotFoundError, match="No rows at .*missing"):
    prediction_error.summarize(str(tmp_path), {"x": ("missing/results.jsonl",)})


def test_the_committed_rows_of_every_group_are_summarized(tmp_path):
  """The command reads the committed rows alone, and writes its section atomically where
  told; every pattern of every group names committed rows (else it raises)."""
  root = os.path.join(layout.REPO_ROOT, "results")
  flags.FLAGS.mark_as_parsed()
  with flagsaver.flagsaver((analyze._COST_MODEL_ERROR, True),
                           (analyze._RESULTS_ROOT, root), (analyze._OUTPUT_DIR, str(tmp_path))):
    analyze.main(["analyze"])
  text = (tmp_path / analyze.COST_MODEL_ERROR_FILE).read_text()
  by_group, _ = prediction_error.summarize(root)
  rows = sum(len(results_io.read_points(p)) for patterns in prediction_error.GROUPS.values()
             for p in prediction_error.group_files(root, patterns))
  assert by_group[-1].rows == rows > 300
  assert "| the first command |" in text and "| the main sweeps |" in text
  assert f"| all | {rows} |" in text
