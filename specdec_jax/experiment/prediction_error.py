"""The cost model checked where it is used: its error over the committed rows.

Every row carries its cost model's error (`PointRow.cost_model_error`: the
predicted over the measured speedup, less 1). `summarize` reads the committed
rows of the README's first command and of the main sweeps under a results root
and gives, per group and per file, the median error, the median and largest
|error| and the share of rows within `WITHIN` of the measurement;
`section` writes it as the Markdown of results/README.md's section
(`python -m experiments.analyze --cost_model_error`). Nothing is timed.
"""

from __future__ import annotations

import dataclasses
import glob
import os
from collections.abc import Mapping, Sequence

import numpy as np

from specdec_jax.experiment import results_io
from specdec_jax.experiment.record import PointRow

WITHIN = 0.10  # The bar: the prediction within ±10% of the measured speedup.

# Under the results root: the rows of each group, as glob patterns.
GROUPS: Mapping[str, tuple[str, ...]] = {
    "the first command": (
        "quickstart_t5/results.jsonl", "quickstart_t5/back_to_back/*.jsonl",
        "first_command_e/*.jsonl",
        # Not the tree rows beside them. The SmolLM2 pair's reference,
        # quickstart_smollm2/results.jsonl, is a copy of the first of these runs' rows.
        "first_command_b/quickstart_t5.jsonl", "first_command_b/quickstart_smollm2.jsonl",
        "first_command_b/rerun/*/quickstart_t5.jsonl",
        "first_command_b/rerun/*/quickstart_smollm2.jsonl",
        "smollm2_tree_order_b/results.jsonl", "first_command_gammas/*/results.jsonl"),
    "the main sweeps": tuple(f"{name}/results.jsonl" for name in (
        "paper_table2", "sweep_gamma", "sweep_batch", "sweep_draft_size", "trivial_drafts",
        "distilled_drafts", "llama_smollm2")),
}


@dataclasses.dataclass(frozen=True)
class ErrorSummary:
  """The cost model's error over a set of rows.

  Attributes:
    name: what the rows are (a group, or a file under the results root).
    rows: how many.
    median: the median signed error (> 0: the model promised more than was measured).
    median_abs: the median |error|.
    max_abs: the largest |error|.
    within: the share of rows with |error| <= `WITHIN`.
    baseline: the median error of the cost model's seconds per token for the baseline
      (`PointRow.cost_model_time_errors`, > 0: priced slower than it ran) over the rows at
      batch 1, None where there are none.
    speculative: the same for the speculative decoder.
  """

  name: str
  rows: int
  median: float
  median_abs: float
  max_abs: float
  within: float
  baseline: float | None
  speculative: float | None

  @classmethod
  def of(cls, name: str, rows: Sequence[PointRow]) -> ErrorSummary:
    """The summary of `rows` (at least one).

    Raises:
      ValueError: no rows.
    """
    if not rows:
      raise ValueError(f"{name}: no rows to summarize; check the results root and GROUPS.")
    errors = np.array([r.cost_model_error for r in rows])
    times = np.array([r.cost_model_time_errors for r in rows
                      if r.batch_size == 1 and r.cost_model_terms.loop_tokens > 0]).reshape(-1, 2)
    baseline, speculative = (float(np.median(e)) if len(e) else None for e in times.T)
    return cls(name=name, rows=len(rows), median=float(np.median(errors)),
               median_abs=float(np.median(np.abs(errors))), max_abs=float(np.max(np.abs(errors))),
               within=float(np.mean(np.abs(errors) <= WITHIN)), baseline=baseline,
               speculative=speculative)


def group_files(results_root: str, patterns: Sequence[str]) -> list[str]:
  """The files under `results_root` that `patterns` name, sorted, each once.

  Raises:
    FileNotFoundError: a pattern names no file (the group would silently shrink).
  """
  files = []
  for pattern in patterns:
    found = sorted(glob.glob(os.path.join(results_root, pattern)))
    if not found:
      raise FileNotFoundError(f"No rows at {os.path.join(results_root, pattern)}; pass the "
                              "results root that holds them (--results_root).")
    files += [f for f in found if f not in files]
  return files


def summarize(results_root: str, groups: Mapping[str, Sequence[str]] = GROUPS
              ) -> tuple[list[ErrorSummary], list[ErrorSummary]]:
  """The error per group (and over all of them) and per file.

  Args:
    results_root: the directory the groups' patterns are relative to.
    groups: {name: glob patterns of its results files}.

  Returns:
    (per group, then "all", in order; per file, named relative to the root).
  """
  by_group, by_file, everything = [], [], []
  for name, patterns in groups.items():
    rows = []
    for path in group_files(results_root, patterns):
      points = results_io.read_points(path)
      by_file.append(ErrorSummary.of(os.path.relpath(path, results_root), points))
      rows += points
    by_group.append(ErrorSummary.of(name, rows))
    everything += rows
  return by_group + [ErrorSummary.of("all", everything)], by_file


def _signed(value: float | None) -> str:
  return "-" if value is None else f"{value:+.1%}"


def _table(summaries: Sequence[ErrorSummary], what: str) -> str:
  lines = [f"| {what} | rows | median error | median abs error | max abs error | "
           f"within ±{WITHIN:.0%} | baseline's time | speculative's time |",
           "|---|---|---|---|---|---|---|---|"]
  lines += [f"| {s.name} | {s.rows} | {s.median:+.1%} | {s.median_abs:.1%} | {s.max_abs:.1%} | "
            f"{s.within:.0%} | {_signed(s.baseline)} | {_signed(s.speculative)} |"
            for s in summaries]
  return "\n".join(lines)


def section(results_root: str) -> str:
  """The Markdown of results/README.md's section on the cost model's error."""
  by_group, by_file = summarize(results_root)
  return "\n\n".join([
      "Error = (predicted - measured) / measured speedup, the prediction being each row's "
      "`speedup_predicted_cost_model` as it was recorded (older rows: the cost model of "
      "their day). The last two columns say where it comes from, over the rows at batch 1: "
      "the median error of the cost model's seconds per token for each decoder (> 0: priced "
      "slower than it ran; a baseline priced slower, or a speculative decoder priced faster, "
      "raises the predicted speedup), from the row's own terms "
      "(`PointRow.cost_model_time_errors`).",
      _table(by_group, "rows of"), _table(by_file, "file")]) + "\n"
