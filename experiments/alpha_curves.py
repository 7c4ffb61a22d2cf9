"""alpha against training time for every recipe trained with alpha measured.

  python -m experiments.alpha_curves --model_dirs=checkpoints/draft_shared_enc_signals,... \
      [--output_dir=results/alpha]

Reads each run's `alpha_curve.json` (`python -m experiments.train` with
`train.alpha_every_steps`) and writes `<output_dir>/curves.json` (recipes already in it
and not named now are kept) and `<output_dir>/curves.png` (`specdec_jax.harness.
alpha_curves`).
"""

from __future__ import annotations

import json
import os

from absl import app, flags

from specdec_jax import atomic_io
from specdec_jax.data import layout
from specdec_jax.harness import alpha_curves

_MODEL_DIRS = flags.DEFINE_list("model_dirs", None, "Training run directories, comma-separated.")
_OUTPUT_DIR = flags.DEFINE_string("output_dir", os.path.join(layout.REPO_ROOT, "results", "alpha"),
                                  "Where curves.json and curves.png go.")
flags.mark_flag_as_required("model_dirs")

JSON_FILE, FIGURE_FILE = "curves.json", "curves.png"


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}.")
  try:
    curves = alpha_curves.collect(_MODEL_DIRS.value)
  except (FileNotFoundError, ValueError) as e:
    raise app.UsageError(str(e)) from e
  path = os.path.join(_OUTPUT_DIR.value, JSON_FILE)
  if os.path.exists(path):
    with open(path, encoding="utf-8") as f:
      curves = {**json.load(f), **curves}
  atomic_io.write_json(path, curves)
  figure = alpha_curves.fig_alpha_curves(curves, os.path.join(_OUTPUT_DIR.value, FIGURE_FILE))
  print(f"Wrote {path} and {figure} ({len(curves)} recipes).")


if __name__ == "__main__":
  app.run(main)
