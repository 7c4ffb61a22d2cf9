"""Tables and figures in the paper's form, from results files alone.

  python -m experiments.analyze [--results_dir=results/quickstart_t5 ...] [--results_root=results] \
      [--output_dir=/tmp/analysis]
  python -m experiments.analyze --alpha_curves=checkpoints/RUN,... [--output_dir=results/alpha]
  python -m experiments.analyze --cost_model_error [--results_root=results]

For each results directory (default: every `<results_root>/*/results.jsonl` of
`experiments.run` points)
writes `tables.md` and PNG figures next to it, the theory figures to
`<results_root>/theory/`, and `<results_root>/analysis_section.md` for
results/README.md (`specdec_jax.experiment.report`); with --output_dir, all of it
goes there instead (one folder per results directory), and results/ is only read.

`--alpha_curves` draws instead alpha against training time for training runs that
measured it (`experiments.train` with `TrainConfig.alpha_every_steps`: each run's
`alpha_curve.json`, `specdec_jax.experiment.alpha_curves`) into `<output_dir>/curves.json`
(recipes already there and not named now are kept) and `curves.png`.

`--cost_model_error` prints instead the cost model's error over the committed rows of the
first command and the main sweeps (`specdec_jax.experiment.prediction_error`) and writes it
to `<output_dir or results_root>/cost_model_error.md`, the section of results/README.md.
"""

from __future__ import annotations

import glob
import json
import os

from absl import app, flags

from specdec_jax import atomic_io
from specdec_jax.experiment import alpha_curves, prediction_error, report, results_io

_RESULTS_DIR = flags.DEFINE_multi_string(
    "results_dir", [], "Directories holding results.jsonl (default: all under --results_root).")
_RESULTS_ROOT = flags.DEFINE_string("results_root", "results",
                                    "Root of the experiments' result directories.")
_OUTPUT_DIR = flags.DEFINE_string(
    "output_dir", None, "Where tables, figures and the section go (default: beside the results, "
    "under --results_root; with --alpha_curves: <results_root>/alpha).")
_ALPHA_CURVES = flags.DEFINE_list(
    "alpha_curves", None, "Training run directories whose alpha curves to draw, instead of the "
    "results' tables.")
_COST_MODEL_ERROR = flags.DEFINE_bool(
    "cost_model_error", False, "Print and write the cost model's error over the committed rows "
    "of the first command and the main sweeps, instead of the results' tables.")

CURVES_JSON, CURVES_FIGURE = "curves.json", "curves.png"
COST_MODEL_ERROR_FILE = "cost_model_error.md"


def draw_alpha_curves(model_dirs: list[str], output_dir: str) -> str:
  """Writes `<output_dir>/curves.json` (its recipes not in `model_dirs` kept) and
  `curves.png`; returns what it wrote, in words.

  Raises:
    app.UsageError: a directory holds no alpha curve.
  """
  try:
    curves = alpha_curves.collect(model_dirs)
  except (FileNotFoundError, ValueError) as e:
    raise app.UsageError(f"--alpha_curves: {e}") from e
  path = os.path.join(output_dir, CURVES_JSON)
  if os.path.exists(path):
    with open(path, encoding="utf-8") as f:
      curves = {**json.load(f), **curves}
  atomic_io.write_json(path, curves)
  figure = alpha_curves.fig_alpha_curves(curves, os.path.join(output_dir, CURVES_FIGURE))
  return f"{path} and {figure} ({len(curves)} recipes)"


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}.")
  if _ALPHA_CURVES.value:
    output_dir = _OUTPUT_DIR.value or os.path.join(_RESULTS_ROOT.value, "alpha")
    print(f"Wrote {draw_alpha_curves(_ALPHA_CURVES.value, output_dir)}.")
    return
  if _COST_MODEL_ERROR.value:
    text = prediction_error.section(_RESULTS_ROOT.value)
    path = os.path.join(_OUTPUT_DIR.value or _RESULTS_ROOT.value, COST_MODEL_ERROR_FILE)
    atomic_io.atomic_write_bytes(path, text.encode("utf-8"))
    print(f"{text}\nWrote {path}.")
    return
  # By default every directory of experiments.run points (benchmarks such as
  # results/decode_step keep rows of their own kind, with their own tables).
  dirs = _RESULTS_DIR.value or sorted(
      os.path.dirname(p) for p in glob.glob(os.path.join(_RESULTS_ROOT.value, "*",
                                                         results_io.RESULTS_FILE))
      if all(results_io.is_point_row(r) for r in results_io.read_rows(p)))
  if not dirs:
    raise app.UsageError(f"No {results_io.RESULTS_FILE} under {_RESULTS_ROOT.value}/*/; run "
                         "python -m experiments.run first or pass --results_dir.")
  section = report.analyze(dirs, _RESULTS_ROOT.value, _OUTPUT_DIR.value)
  print(f"Wrote {section} from {len(dirs)} result directories.")


if __name__ == "__main__":
  app.run(main)
