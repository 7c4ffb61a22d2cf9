"""The paper's tables (2, 3, 4) and ours, in Markdown, from results rows (`PointRow`) alone."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from specdec_jax import stats, theory
from specdec_jax.experiment import results_io
from specdec_jax.experiment.record import PointRow

FLAG_TOLERANCE = 0.15  # |measured / predicted - 1| above this is flagged.
AUTO_TOLERANCE = 0.05  # gamma = 'auto' should be within this of the sweep's best.


def md_table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
  """A GitHub Markdown table; floats with 2 decimals."""
  fmt = lambda v: f"{v:.2f}" if isinstance(v, float) else str(v)
  lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
  lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
  return "\n".join(lines) + "\n"


def deviation(row: PointRow) -> float:
  """Measured / predicted speedup - 1 (the whole cost model: loops and encoders included)."""
  return row.speedup_measured / row.speedup_predicted_cost_model - 1


def is_flagged(row: PointRow) -> bool:
  """Whether the measured speedup is more than FLAG_TOLERANCE from the refined prediction."""
  return abs(deviation(row)) > FLAG_TOLERANCE


def table2(rows: Sequence[PointRow]) -> str:
  """The paper's Table 2: task, draft, T, best gamma, alpha, speedup."""
  return md_table(["task", "draft", "T", "gamma", "alpha", "speedup"],
                  [(r.task, r.draft, f"{r.temperature:g}", r.gamma, r.alpha_beta,
                    f"{r.speedup_measured:.2f}X") for r in results_io.best_rows(rows)])


def alpha_over_rows(rows: Sequence[PointRow]) -> float | None:
  """alpha (mean beta, `stats.alpha_beta`) pooled over the verified positions of `rows`;
  None if they verified none."""
  count = sum(r.beta_count for r in rows)
  return float(stats.alpha_beta(sum(r.beta_sum for r in rows), count)) if count else None


def table3(rows: Sequence[PointRow]) -> str:
  """The paper's Table 3: alpha (mean beta over all of a draft's points) at each T."""
  temps = sorted({r.temperature for r in rows})
  out = []
  for (task, draft), group in results_io.group(rows, "task", "draft").items():
    by_t = results_io.group(group, "temperature")
    alphas = [alpha_over_rows(by_t.get((t,), [])) for t in temps]
    out.append((task, draft, *("-" if a is None else a for a in alphas)))
  return md_table(["task", "draft", *(f"alpha T={t:g}" for t in temps)], out)


def _alpha_json_order(draft: str) -> tuple:
  """Layer-skip drafts by depth first, then the others by name."""
  depth = draft.removeprefix("layer_skip_")
  return (0, int(depth), "") if depth.isdigit() else (1, 0, draft)


def table3_decoder_only(alpha: Mapping[str, Mapping[str, Mapping[str, Mapping[str, Any]]]]
                        ) -> str:
  """Table 3's decoder-only rows: alpha of each draft against a decoder-only target.

  Args:
    alpha: `{draft: {task: {"T=0": {"alpha_beta": ..., "alpha_empirical": ...,
      "tokens_per_call": ...}, "T=1": ...}}}`, the "alpha" of
      `experiments.measure_alpha`'s JSON (results/alpha/llama.json).

  Returns:
    Per task and draft, alpha by both estimators (mean beta, S/(S+R)) and tokens
    per target call at each temperature; "-" where a value is absent.
  """
  temps = sorted({t for by_task in alpha.values() for by_t in by_task.values() for t in by_t},
                 key=lambda t: float(t.removeprefix("T=")))
  fields = (("alpha_beta", "alpha (beta)"), ("alpha_empirical", "alpha (S/(S+R))"),
            ("tokens_per_call", "tokens/call"))
  out = []
  for task in sorted({task for by_task in alpha.values() for task in by_task}):
    for draft in sorted(alpha, key=_alpha_json_order):
      by_t = alpha[draft].get(task)
      if by_t is None:
        continue
      out.append((task, draft, *(by_t.get(t, {}).get(field, "-") for t in temps
                                 for field, _ in fields)))
  return md_table(["task", "draft", *(f"{name} {t}" for t in temps for _, name in fields)], out)


def table4(rows: Sequence[PointRow]) -> str:
  """The paper's Table 4 (expected vs measured) for the Table 2 points, plus the refined model."""
  return md_table(
      ["task", "draft", "T", "gamma", "c", "expected (Thm 3.8)", "cost model, steps only",
       "cost model + loops, encoders", "measured", "deviation", "flag"],
      [(r.task, r.draft, f"{r.temperature:g}", r.gamma, f"{r.c:.3f}",
        r.speedup_predicted_thm38, r.speedup_predicted_steps_only,
        r.speedup_predicted_cost_model, r.speedup_measured,
        f"{100 * deviation(r):+.0f}%", "**>15%**" if is_flagged(r) else "")
       for r in results_io.best_rows(rows)])


def points_table(rows: Sequence[PointRow]) -> str:
  """Every point, with the deviation from the refined prediction and its flag."""
  ordered = sorted(rows, key=lambda r: (r.task, r.draft, r.temperature, r.batch_size, r.gamma))
  return md_table(
      ["task", "draft", "T", "batch", "gamma", "alpha (beta)", "alpha (S/(S+R))", "tokens/call",
       "c", "Thm 3.8", "cost model, steps only", "cost model + loops, encoders", "measured",
       "deviation", "flag"],
      [(r.task, r.draft, f"{r.temperature:g}", r.batch_size, r.gamma,
        r.alpha_beta, r.alpha_empirical, r.tokens_per_iteration, f"{r.c:.3f}",
        r.speedup_predicted_thm38, r.speedup_predicted_steps_only,
        r.speedup_predicted_cost_model, r.speedup_measured,
        f"{100 * deviation(r):+.0f}%", "**>15%**" if is_flagged(r) else "") for r in ordered])


def auto_table(rows: Sequence[PointRow]) -> str | None:
  """gamma = 'auto' against the fixed gammas of the same run, per point.

  Two comparisons: the auto row's own measured speedup over the best fixed row's (two
  independent measurements: their noise is in it), and the fixed row at the gamma auto
  chose over the best fixed row (the choice alone, one sweep).
  """
  autos = [r for r in rows if r.gamma_auto]
  if not autos:
    return None
  fixed = results_io.group(results_io.fixed_gamma_rows(rows), "task", "draft", "temperature",
                           "batch_size")
  out = []
  for r in sorted(autos, key=lambda r: (r.task, r.draft, r.temperature, r.batch_size)):
    group = fixed.get((r.task, r.draft, r.temperature, r.batch_size), [])
    if not group:
      continue
    best = max(group, key=lambda x: x.speedup_measured)
    same = [x for x in group if x.gamma == r.gamma]
    chosen = same[0].speedup_measured / best.speedup_measured if same else None
    own = r.speedup_measured / best.speedup_measured
    ok = (chosen if chosen is not None else own) >= 1 - AUTO_TOLERANCE
    out.append((r.task, r.draft, f"{r.temperature:g}", r.batch_size, r.gamma,
                f"{r.speedup_measured:.2f}X", best.gamma,
                f"{best.speedup_measured:.2f}X", f"{own:.3f}",
                "-" if chosen is None else f"{chosen:.3f}",
                "yes" if ok else f"**no** (>{AUTO_TOLERANCE:.0%})"))
  return md_table(["task", "draft", "T", "batch", "auto gamma", "auto speedup", "best gamma",
                   "best speedup", "auto / best", "sweep at auto's gamma / best",
                   f"within {AUTO_TOLERANCE:.0%}"], out)


def crossover_batch(group: Sequence[PointRow]) -> int | None:
  """The smallest batch size whose measured speedup is below 1 (None: it always pays)."""
  below = [r.batch_size for r in group if r.speedup_measured < 1]
  return min(below) if below else None


def batch_table(rows: Sequence[PointRow]) -> str | None:
  """Speedup per batch size, per (task, draft, T, gamma) measured at several batch sizes."""
  batches = sorted({r.batch_size for r in rows})
  if len(batches) < 2:
    return None
  out = []
  for (task, draft, t, gamma), group in results_io.group(rows, "task", "draft", "temperature",
                                               "gamma").items():
    by_b = {r.batch_size: r.speedup_measured for r in group}
    if len(by_b) < 2:
      continue
    cross = crossover_batch(group)
    out.append((task, draft, f"{t:g}", gamma, *(by_b.get(b, "-") for b in batches),
                "never" if cross is None else cross))
  return md_table(["task", "draft", "T", "gamma", *(f"b={b}" for b in batches),
                   "stops paying at"], out)


def _verify_ratios(group: Sequence[PointRow]) -> dict[int, float]:
  """{k: median T_verify(k) / T_step over the rows of one (task, batch size)}."""
  ks = sorted({k for r in group for k in r.verify_ratio})
  return {k: float(np.median([r.verify_ratio[k] for r in group if k in r.verify_ratio]))
          for k in ks}


def verify_costs(rows: Sequence[PointRow]) -> dict[tuple, dict[int, float]]:
  """{(task, batch size): {k: median T_verify(k) / T_step over the rows}}.

  Rows of one run and (task, batch size) share one measurement; medians also
  pool runs appended to the same file.
  """
  return {key: _verify_ratios(group)
          for key, group in results_io.group(rows, "task", "batch_size").items()}


def verify_table(rows: Sequence[PointRow]) -> str:
  """T_verify(k) / T_step per task and batch size (Thm 3.8 assumes 1 for every k)."""
  groups = results_io.group(rows, "task", "batch_size")
  costs = {key: _verify_ratios(group) for key, group in groups.items()}
  ks = sorted({k for by_k in costs.values() for k in by_k})
  return md_table(
      ["task", "batch", "T_step (ms)", *(f"k={k}" for k in ks)],
      [(task, b, f"{1e3 * np.median([r.t_target_step_s for r in groups[(task, b)]]):.2f}",
        *(by_k.get(k, "-") for k in ks)) for (task, b), by_k in costs.items()])


def alpha_needed_table(rows: Sequence[PointRow], speedups: Sequence[float] = (1.0, 1.6),
                       max_gamma: int = 6) -> str | None:
  """The alpha each draft would need for a given speedup, from this run's measured costs.

  Per (task, draft) at batch 1: the cost model (`theory.CostModel.alpha_needed`) with the
  task's median T_verify(k) / T_step, the draft's median c and the draft's median loop
  overheads per iteration and per baseline step (in T_step), inverted
  at each gamma, beside the draft's measured alpha (T=0 / T=1). The decoding loops only: the
  encoders, paid once per sequence, dilute any speedup further. "-" where even a perfect draft
  (alpha = 1) falls short; the last column is that perfect draft's best speedup.
  """
  batch1 = [r for r in rows if r.batch_size == 1]
  if not batch1:
    return None
  ratios = {task: _verify_ratios(g) for (task,), g in results_io.group(batch1, "task").items()}
  gammas = range(1, min(max_gamma, min(max(r) for r in ratios.values()) - 1) + 1)
  if not gammas:
    return None
  out = []
  for (task, draft), group in results_io.group(batch1, "task", "draft").items():
    model = theory.CostModel(
        1.0, float(np.median([r.c for r in group])), ratios[task],
        t_step_overhead=float(np.median([r.cost_model_terms.step_overhead_s
                                         / r.t_target_step_s for r in group])),
        t_iteration_overhead=float(np.median([r.cost_model_terms.iteration_overhead_s
                                              / r.t_target_step_s for r in group])))
    measured = " / ".join(f"{alpha_over_rows(g):.2f}"
                          for g in results_io.group(group, "temperature").values())
    cells = []
    for gamma in gammas:
      needed = [model.alpha_needed(s, gamma) for s in speedups]
      cells.append(" / ".join("-" if a is None else f"{a:.2f}" for a in needed))
    ceiling = max(float(model.expected_speedup(1.0, g)) for g in gammas)
    out.append((task, draft, measured, f"{model.t_draft_step:.3f}", *cells,
                f"{ceiling:.2f}X"))
  wanted = " / ".join(f"{s:g}X" for s in speedups)
  return md_table(["task", "draft", "alpha measured (T=0 / T=1)", "c",
                   *(f"gamma={g}: alpha for {wanted}" for g in gammas),
                   "alpha = 1 gives"], out)
