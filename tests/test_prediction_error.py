"""prediction_error: the cost model's error per row and over the committed rows."""

from __future__ import annotations

import json
import os

import pytest
from absl import flags
from absl.testing import flagsaver
from conftest import make_point_row

from experiments import analyze
from specdec_jax.data import layout
from specdec_jax.experiment import prediction_error, results_io


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
