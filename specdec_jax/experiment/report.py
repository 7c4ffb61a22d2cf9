"""A results directory's report: tables.md and its figures; the section for results/README.md.

For each results directory, `analyze_dir` writes `tables.md` (Table 2: best gamma
per task / draft / T; Table 3: alpha per draft; Table 4: expected vs measured;
every point, with those whose measured speedup is more than
`tables.FLAG_TOLERANCE` from the refined prediction flagged; speedup vs batch
size with the crossover; the measured cost of scoring k tokens in one target
call) and PNG figures next to it (or into `<output_dir>/<name>/`). `analyze`
draws the theory figures (Fig. 2, Fig. 3) into `<results_root>/theory/`, adds
Table 3's decoder-only rows from `<results_root>/alpha/llama.json`
(`experiments.measure_alpha` over the GGUF target) when it exists, and collects everything in
`<results_root>/analysis_section.md` (or under `output_dir`, leaving the
results directories untouched).
"""

from __future__ import annotations

import json
import os
import textwrap
from collections.abc import Sequence

from specdec_jax import atomic_io
from specdec_jax.experiment import figures, results_io, tables

SECTION_FILE = "analysis_section.md"
TABLES_FILE = "tables.md"
THEORY_DIR = "theory"
DECODER_ONLY_ALPHA = os.path.join("alpha", "llama.json")  # Under the results root.


def analyze_dir(results_dir: str, output_dir: str | None = None) -> str:
  """Writes tables.md and the figures of one results directory; returns its Markdown.

  Args:
    results_dir: the directory holding results.jsonl (`PointRow`s).
    output_dir: where tables.md and the figures go (default: `results_dir`).
  """
  rows = results_io.read_points(os.path.join(results_dir, results_io.RESULTS_FILE))
  if not rows:
    raise FileNotFoundError(f"--results_dir={results_dir!r} has no rows in "
                            f"{results_io.RESULTS_FILE}; run experiments.run into it first.")
  name = os.path.basename(os.path.normpath(results_dir))
  best = results_io.best_rows(rows)
  output_dir = output_dir or results_dir
  os.makedirs(output_dir, exist_ok=True)
  path = lambda file: os.path.join(output_dir, file)  # noqa: E731
  drawn = {
      "speedup vs gamma": figures.fig_speedup_vs_gamma(rows, path("speedup_vs_gamma.png")),
      "measured vs predicted": figures.fig_measured_vs_predicted(
          rows, path("measured_vs_predicted.png")),
      "speedup vs batch size": figures.fig_speedup_vs_batch(rows, path("speedup_vs_batch.png")),
      "speedup vs alpha": figures.fig_speedup_vs_alpha(rows, path("speedup_vs_alpha.png")),
      "verification cost": figures.fig_verify_cost(rows, path("verify_cost.png")),
      "generated text (Fig. 1 style)": figures.fig_example(best[0] if best else rows[0],
                                                           path("fig1_example.png")),
  }
  flagged = [r for r in rows if tables.is_flagged(r)]
  parts = [f"## {name}\n",
           f"{len(rows)} points; {len(flagged)} flagged (measured speedup more than "
           f"{tables.FLAG_TOLERANCE:.0%} from the cost-model prediction).\n",
           "### Table 2: best gamma per task, draft and temperature (batch 1)\n",
           tables.table2(rows),
           "### Table 3: alpha per draft\n", tables.table3(rows),
           "### Table 4: expected vs measured speedup\n", tables.table4(rows)]
  autos = tables.auto_table(rows)
  if autos:
    parts += ["### gamma = 'auto' against the sweep\n", autos]
  batches = tables.batch_table(rows)
  if batches:
    parts += ["### Speedup vs batch size\n", batches]
  parts += ["### Verification cost: T_verify(k) / T_step (Thm 3.8 assumes 1)\n",
            tables.verify_table(rows)]
  needed = tables.alpha_needed_table(rows)
  if needed:
    parts += ["### The alpha a draft would need, from this run's costs (cost model)\n", needed]
  parts += ["### All points\n", tables.points_table(rows)]
  for title, fig in drawn.items():
    if fig:
      parts.append(f"![{title}]({name}/{os.path.basename(fig)})\n")
  text = "\n".join(parts)
  atomic_io.atomic_write_bytes(path(TABLES_FILE),
                              text.replace(f"]({name}/", "](").encode("utf-8"))
  return text


def decoder_only_section(path: str) -> str:
  """Table 3's decoder-only rows from `experiments.measure_alpha`'s JSON, with what they
  measured."""
  with open(path, encoding="utf-8") as f:
    result = json.load(f)
  details = result["_details"]
  settings = details["settings"]
  prompts = "; ".join(f"{task}: {text}" for task, text in details["prompts"].items())
  return (f"## Table 3, a decoder-only target (`{DECODER_ONLY_ALPHA}`)\n\n"
          f"{details['target']}. Prompts: {prompts}. gamma = {settings['gamma']}, "
          f"{settings['num_examples']} test examples per task, at most "
          f"{settings['max_decode_len']} tokens; the n-gram drafts fit on "
          f"{details['ngram_fit_tokens']} tokens ({details['ngram_fit']}). "
          "`python -m experiments.measure_alpha --gin_file=gin_configs/llama_smollm2.gin`.\n\n"
          + tables.table3_decoder_only(result["alpha"]))


def analyze(results_dirs: Sequence[str], results_root: str, output_dir: str | None = None
            ) -> str:
  """Analyses each directory, draws the theory figures; returns the section file's path.

  Args:
    results_dirs: directories holding results.jsonl.
    results_root: where the theory figures and the section go by default.
    output_dir: where everything goes instead (`<output_dir>/<name>/` per
      directory), leaving the results directories untouched.
  """
  root = output_dir or results_root
  theory_dir = os.path.join(root, THEORY_DIR)
  os.makedirs(theory_dir, exist_ok=True)
  fig2 = figures.fig2_expected_tokens(os.path.join(theory_dir, "fig2_expected_tokens.png"))
  fig3 = figures.fig3_optimal_gamma(os.path.join(theory_dir, "fig3_optimal_gamma.png"))
  sections = [textwrap.dedent(f"""\
      ## Theory

      ![Fig. 2: expected tokens per iteration]({THEORY_DIR}/{os.path.basename(fig2)})
      ![Fig. 3: optimal gamma]({THEORY_DIR}/{os.path.basename(fig3)})
      """)]
  decoder_only = os.path.join(results_root, DECODER_ONLY_ALPHA)
  if os.path.exists(decoder_only):
    sections.append(decoder_only_section(decoder_only))
  sections += [analyze_dir(d, output_dir and os.path.join(
      output_dir, os.path.basename(os.path.normpath(d)))) for d in results_dirs]
  path = os.path.join(root, SECTION_FILE)
  atomic_io.atomic_write_bytes(path, "\n".join(sections).encode("utf-8"))
  return path
