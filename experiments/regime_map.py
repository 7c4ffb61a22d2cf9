"""The T5 regime map: where speculative decoding starts to pay on this machine, shape by shape.

  python -m experiments.regime_map --gin_file=gin_configs/regime_map.gin \
      [--output_dir=results/regime_map] [--gin.RegimeMap.shapes="['t5-small']"] [--nomeasure]

Measures (`specdec_jax.regime_map.sweep`) every cost of the cost model on random-weight
models of the public T5 shapes, each saved in float16 and loaded back as a user's checkpoint
is, and on our shipped family, in one run; then prices every (draft, target) pair at every
gamma with the paper's alpha and with ours (`regime_predictions`), after stating the cost
model's error on our family's points measured first in the same run (`--family_runs`:
speculative against baseline decoding, `experiments.run`'s rows, under
`<output_dir>/family/`). Writes to `--output_dir`:

  rows.jsonl       the measurements, one row per model and per (draft, target, temperature),
                   each appended atomically: rerunning measures only the rows missing, so an
                   interrupted run resumes (delete the file to measure again);
  predictions.json every prediction, the error check and its verdict;
  tables.md        the tables; regime_map.png the figure.

Every timing runs inside the timing guard (`specdec_jax.contention`: our registered jobs
paused; a timing beside another busy process is refused and measured again once the machine
is quiet). About 20 minutes on the 2-core CPU, the shapes' checkpoints written on the first
run (under `<data_dir>/regime_map_models`, about 4 GB). `--nomeasure` only redraws the
predictions, tables and figure from the rows there (e.g. those of
`experiments/device_check.sh OUT --regime_map`, with the device check's settings bound).
"""

from __future__ import annotations

import dataclasses
import os
import sys

import gin
from absl import app, flags

from specdec_jax.experiment import gin_flags, results_io, runner
from specdec_jax.experiment.measure import GreedyCheck
from specdec_jax.regime_map import regime_figure, regime_predictions, sweep

_OUTPUT_DIR = flags.DEFINE_string(
    "output_dir", os.path.join("results", "regime_map"),
    "Where rows.jsonl, predictions.json, tables.md and the figure go.")
_MEASURE = flags.DEFINE_bool("measure", True, "Measure the rows missing from rows.jsonl first. "
                             "--nomeasure redraws from the rows there, with their own settings.")
_FAMILY_RUNS = flags.DEFINE_list(
    "family_runs", [os.path.join("gin_configs", "regime_map_family.gin")],
    "experiments.run configs of our family measured first, in the same run (rows under "
    "<output_dir>/family/<Experiment.name>/): the points the cost model's error is taken on, "
    "and our alpha. Empty: RegimePredictions.measured_rows (committed rows) instead.")

RegimeMap = gin.external_configurable(sweep.MapSettings, "RegimeMap")
RegimePredictions = gin.external_configurable(regime_predictions.MapPredictions,
                                              "RegimePredictions")
FIGURE_FILE = "regime_map.png"


def measured_rows(output_dir: str) -> tuple[list[dict], sweep.MapSettings]:
  """The rows already in `output_dir` and the settings they were measured with.

  Raises:
    app.UsageError: there are none.
  """
  rows = results_io.read_rows(os.path.join(output_dir, sweep.ROWS_FILE))
  if not rows:
    raise app.UsageError(f"--nomeasure: {output_dir} holds no {sweep.ROWS_FILE}; measure "
                         "first (drop --nomeasure) or point --output_dir at a run's rows.")
  return rows, sweep.MapSettings(**rows[0]["settings"])


def family_rows(gin_files: list[str], output_dir: str, measure: bool) -> list[str]:
  """Runs (or resumes) each family experiment into `<output_dir>/family/<name>/`; returns
  the results files (each experiment parses its gin file afresh)."""
  paths = []
  for gin_file in gin_files:
    exp = gin_flags.load_experiment([gin_file], [])
    directory = os.path.join(output_dir, "family", exp.name)
    paths.append(runner.run(exp, directory, greedy=GreedyCheck(),
                            placement=gin_flags.placement()) if measure
                 else os.path.join(directory, results_io.RESULTS_FILE))
  return paths


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}.")
  output_dir = _OUTPUT_DIR.value
  family = family_rows(_FAMILY_RUNS.value, output_dir, _MEASURE.value)
  gin_flags.parse_gin(gin_flags.GIN_FILE.value, gin_flags.GIN_BINDINGS.value)
  try:
    map_settings, prediction_settings = RegimeMap(), RegimePredictions()
  except ValueError as e:
    raise app.UsageError(f"gin: {e}") from e
  if family:
    prediction_settings = dataclasses.replace(prediction_settings, measured_rows=family)
  if _MEASURE.value:
    rows = sweep.run(map_settings, output_dir)
  else:
    rows, map_settings = measured_rows(output_dir)
  command = " ".join(["python -m experiments.regime_map"] + sys.argv[1:])
  report = regime_predictions.write_report(rows, map_settings, prediction_settings, output_dir,
                                           command)
  figure = regime_figure.fig_regime_map(report["predictions"], report["family_errors"],
                                        report["last_level_cache"],
                                        os.path.join(output_dir, FIGURE_FILE))
  with open(os.path.join(output_dir, regime_predictions.TABLES_FILE), encoding="utf-8") as f:
    print(f.read())
  print(f"Cost model on our family: {report['error_summary']['verdict']}. Wrote {output_dir}/"
        f"{{{sweep.ROWS_FILE}, {regime_predictions.PREDICTIONS_FILE}, "
        f"{regime_predictions.TABLES_FILE}}} and {figure}.")


if __name__ == "__main__":
  app.run(main, flags_parser=gin_flags.parse_flags)
