"""Tables and figures in the paper's form, from results.jsonl files alone.

  python -m experiments.analyze [--results_dir=results/quickstart ...] [--results_root=results] \
      [--output_dir=/tmp/analysis]

For each results directory (default: every `<results_root>/*/results.jsonl` of
`experiments.run` points)
writes `tables.md` and PNG figures next to it, the theory figures to
`<results_root>/theory/`, and `<results_root>/analysis_section.md` for
results/README.md (`specdec_jax.harness.report`); with --output_dir, all of it
goes there instead (one folder per results directory), and results/ is only read.
"""

from __future__ import annotations

import glob
import os

from absl import app, flags

from specdec_jax.harness import report, results_io

_RESULTS_DIR = flags.DEFINE_multi_string(
    "results_dir", [], "Directories holding results.jsonl (default: all under --results_root).")
_RESULTS_ROOT = flags.DEFINE_string("results_root", "results",
                                    "Root of the experiments' result directories.")
_OUTPUT_DIR = flags.DEFINE_string(
    "output_dir", None, "Where tables, figures and the section go (default: beside the results, "
    "under --results_root).")


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}.")
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
