"""The figures of a results directory (PNG), the drafts' ranking (`draft_ranking`) and the
paper's theory figures (Fig. 2, Fig. 3)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from specdec_jax import theory  # noqa: E402
from specdec_jax.costs import gamma_choice  # noqa: E402
from specdec_jax.experiment import results_io, tables  # noqa: E402
from specdec_jax.experiment.record import PointRow  # noqa: E402

THEORY_GAMMAS = (1, 2, 3, 5, 7, 10)  # Fig. 2 curves.
THEORY_CS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5)  # Fig. 3 curves (the paper's c = .02-.11 inside).
ALPHA_GRID = np.linspace(0.0, 0.99, 100)
FIG1_CHARS_PER_LINE = 80
TRADEOFF_GRID = 60  # Points per axis of the iso-speedup contours.
TRADEOFF_LEVELS = (0.9, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.8, 2.0)


def save_figure(fig: plt.Figure, path: str) -> str:
  """Lays out `fig`, writes it to `path` as a PNG (atomically) and closes it; the path."""
  fig.tight_layout()
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  tmp = path + ".tmp.png"
  fig.savefig(tmp, dpi=120)
  plt.close(fig)
  os.replace(tmp, path)
  return path


def _panels(keys: Sequence[tuple]) -> tuple[plt.Figure, list[plt.Axes]]:
  fig, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 4), squeeze=False)
  return fig, list(axes[0])


def fig_speedup_vs_gamma(rows: Sequence[PointRow], path: str) -> str | None:
  """Measured (solid), cost-model (dashed) and Thm 3.8 (dotted) speedup vs gamma per draft;
  gamma = 'auto' points as stars."""
  autos = [r for r in rows if r.gamma_auto and r.batch_size == 1]
  batch1 = [r for r in results_io.fixed_gamma_rows(rows) if r.batch_size == 1]
  if len({r.gamma for r in batch1}) < 2:
    return None
  panels = results_io.group(batch1, "task", "temperature")
  fig, axes = _panels(list(panels))
  for ax, ((task, t), group) in zip(axes, panels.items(), strict=True):
    for i, ((draft,), drows) in enumerate(results_io.group(group, "draft").items()):
      drows = sorted(drows, key=lambda r: r.gamma)
      g = [r.gamma for r in drows]
      color = f"C{i}"
      ax.plot(g, [r.speedup_measured for r in drows], "o-", color=color, label=draft)
      ax.plot(g, [r.speedup_predicted_cost_model for r in drows], "--", color=color)
      ax.plot(g, [r.speedup_predicted_thm38 for r in drows], ":", color=color)
      chosen = [r for r in autos if (r.task, r.temperature, r.draft) == (task, t, draft)]
      ax.plot([r.gamma for r in chosen], [r.speedup_measured for r in chosen], "*",
              color=color, markersize=14, label=f"{draft}, gamma='auto'" if chosen else None)
    ax.axhline(1, color="gray", lw=0.8)
    ax.set(title=f"{task}, T={t:g} (— measured, -- cost model, ·· Thm 3.8)", xlabel="gamma",
           ylabel="speedup over baseline")
    ax.legend(fontsize="small")
  return save_figure(fig, path)


def fig_measured_vs_predicted(rows: Sequence[PointRow], path: str) -> str:
  """Measured vs predicted speedup for every point, with y = x and the flag band."""
  fig, ax = plt.subplots(figsize=(5, 5))
  pred_c = [r.speedup_predicted_cost_model for r in rows]
  pred_t = [r.speedup_predicted_thm38 for r in rows]
  meas = [r.speedup_measured for r in rows]
  ax.scatter(pred_c, meas, label="cost model (measured T_verify)")
  ax.scatter(pred_t, meas, marker="x", label="Thm 3.8")
  hi = max(pred_c + pred_t + meas) * 1.1
  xs = np.linspace(0, hi, 2)
  ax.plot(xs, xs, "k-", lw=0.8, label="y = x")
  tolerance = tables.FLAG_TOLERANCE
  ax.fill_between(xs, xs * (1 - tolerance), xs * (1 + tolerance), color="gray", alpha=0.2,
                  label=f"±{tolerance:.0%}")
  ax.set(xlim=(0, hi), ylim=(0, hi), xlabel="predicted speedup", ylabel="measured speedup")
  ax.legend(fontsize="small")
  return save_figure(fig, path)


def fig_speedup_vs_batch(rows: Sequence[PointRow], path: str) -> str | None:
  if len({r.batch_size for r in rows}) < 2:
    return None
  panels = results_io.group(rows, "task")
  fig, axes = _panels(list(panels))
  for ax, ((task,), group) in zip(axes, panels.items(), strict=True):
    for key, g in results_io.group(group, "draft", "temperature", "gamma").items():
      g = sorted(g, key=lambda r: r.batch_size)
      ax.plot([r.batch_size for r in g], [r.speedup_measured for r in g], "o-",
              label=f"{key[0]} T={key[1]:g} γ={key[2]}")
    ax.axhline(1, color="gray", lw=0.8)
    ax.set(xscale="log", title=task, xlabel="batch size", ylabel="measured speedup")
    ax.legend(fontsize="small")
  return save_figure(fig, path)


def fig_speedup_vs_alpha(rows: Sequence[PointRow], path: str) -> str:
  """Measured speedup vs alpha, one colour per draft (the paper's Fig. 4, measured), beside
  each row's cost-model prediction (hollow, same colour) and Theorem 3.8's curve at the
  rows' median gamma and c."""
  fig, ax = plt.subplots(figsize=(6, 4))
  for (draft,), group in results_io.group(rows, "draft").items():
    alphas = [r.alpha_beta for r in group]
    measured = ax.scatter(alphas, [r.speedup_measured for r in group], label=draft)
    ax.scatter(alphas, [r.speedup_predicted_cost_model for r in group], s=18,
               facecolors="none", edgecolors=measured.get_facecolor())
  gamma = int(np.median([r.gamma for r in rows]))
  c = float(np.median([r.c for r in rows]))
  ax.plot(ALPHA_GRID, theory.walltime_improvement(ALPHA_GRID, gamma, c), "k--", lw=1,
          label=f"Thm 3.8 (gamma {gamma}, c {c:.2f})")
  ax.scatter([], [], s=18, facecolors="none", edgecolors="gray", label="cost model (hollow)")
  ax.axhline(1, color="gray", lw=0.8)
  ax.set(xlabel="alpha (mean beta)", ylabel="speedup", xlim=(0, 1))
  ax.legend(fontsize="small")
  return save_figure(fig, path)


def fig_verify_cost(rows: Sequence[PointRow], path: str) -> str:
  """T_verify(k) / T_step vs k per task and batch size, against the paper's 1."""
  fig, ax = plt.subplots(figsize=(5, 4))
  for (task, b), by_k in tables.verify_costs(rows).items():
    ax.plot(list(by_k), list(by_k.values()), "o-", label=f"{task}, batch {b}")
  ax.axhline(1, color="gray", lw=0.8, label="Thm 3.8 assumption")
  ax.set(xlabel="tokens scored in one target call (k = gamma + 1)",
         ylabel="T_verify(k) / T_step", ylim=(0, None))
  ax.legend(fontsize="small")
  return save_figure(fig, path)


def fig_example(row: PointRow, path: str) -> str:
  """Fig. 1 style: one generated text, accepted draft tokens in green, target tokens in red."""
  ex = row.example
  text_lines: list[list[tuple[str, bool]]] = [[]]
  width = 0
  for piece, accepted in zip(ex.pieces, ex.accepted_mask, strict=True):
    piece = piece.replace("\u2581", " ")
    if width + len(piece) > FIG1_CHARS_PER_LINE and text_lines[-1]:
      text_lines.append([])
      width = 0
    text_lines[-1].append((piece, accepted))
    width += len(piece)
  fig, ax = plt.subplots(figsize=(10, 0.5 + 0.35 * len(text_lines)))
  ax.set_axis_off()
  renderer = fig.canvas.get_renderer()
  for i, line in enumerate(text_lines):
    x = 0.0
    y = 1 - (i + 1) / (len(text_lines) + 1)
    for piece, accepted in line:
      t = ax.text(x, y, piece, family="monospace", fontsize=10, transform=ax.transAxes,
                  bbox=dict(facecolor="#b7e4b0" if accepted else "#f4b6b6", pad=1,
                            edgecolor="none"))
      x += t.get_window_extent(renderer).width / ax.get_window_extent(renderer).width
  ax.set_title(f"{row.task}, {row.draft}, T={row.temperature:g}, γ={row.gamma}: "
               "green = draft token accepted, red = sampled by the target", fontsize=9)
  return save_figure(fig, path)


def fig2_expected_tokens(path: str) -> str:
  """Fig. 2: E[tokens per iteration] vs alpha for several gamma."""
  fig, ax = plt.subplots(figsize=(5, 4))
  for g in THEORY_GAMMAS:
    ax.plot(ALPHA_GRID, theory.expected_tokens_per_iteration(ALPHA_GRID, g), label=f"γ={g}")
  ax.set(xlabel="alpha", ylabel="expected tokens per iteration")
  ax.legend(fontsize="small")
  return save_figure(fig, path)


def fig3_optimal_gamma(path: str) -> str:
  """Fig. 3: the optimal gamma vs alpha for several c (only where speculation helps)."""
  fig, ax = plt.subplots(figsize=(5, 4))
  for c in THEORY_CS:
    best = [theory.optimal_gamma(a, c) for a in ALPHA_GRID]
    ax.plot(ALPHA_GRID, [b.gamma if b.helps else np.nan for b in best], label=f"c={c:g}")
  ax.set(xlabel="alpha", ylabel="optimal gamma", yscale="log")
  ax.legend(fontsize="small")
  return save_figure(fig, path)


def model_calls_speedup(alpha: float, c: float, verify_ratio: Mapping[int, float]) -> float:
  """The model calls' best predicted speedup over gamma (what `draft_ranking` ranks by).

  Args:
    alpha: the draft's acceptance rate.
    c: draft step time / target step time.
    verify_ratio: k -> T_verify(k) / T_step, measured for k = 1..max_gamma + 1; fitted
      non-decreasing in k as `gamma_choice.make_choice` fits them.

  Returns:
    `theory.CostModel.optimal_gamma`'s improvement over gamma = 1..max(verify_ratio) - 1.
  """
  ratios = gamma_choice.fitted_ratios(verify_ratio)
  return theory.CostModel.from_ratios(c, ratios).optimal_gamma(alpha).improvement


def fig_draft_tradeoff(record: dict, path: str) -> str:
  """alpha against c for every ranked draft, one panel per temperature, over the contours of
  the model calls' predicted speedup at this run's T_verify(k) (`model_calls_speedup`).

  Args:
    record: a ranking's JSON record (`draft_ranking.Ranking.to_json`, as
      `t5_runs.rank_runs` writes it).
    path: the PNG written.
  """
  runs = record["runs"]
  temperatures = sorted({t for run in runs.values() for t in run["by_temperature"]})
  fig, axes = _panels(temperatures)
  ratio = {int(k): v for k, v in record["verify_ratio"].items()}
  for ax, t in zip(axes, temperatures, strict=True):
    points = {name: run["by_temperature"][t] for name, run in sorted(runs.items())
              if t in run["by_temperature"]}
    cs = [p["c"] for p in points.values()]
    alphas = [p["alpha"] for p in points.values()]
    c_grid = np.linspace(0.5 * min(cs), 1.2 * max(cs), TRADEOFF_GRID)
    alpha_grid = np.linspace(min(alphas) - 0.05, min(max(alphas) + 0.05, 0.99), TRADEOFF_GRID)
    speedup = [[model_calls_speedup(a, c, ratio) for c in c_grid] for a in alpha_grid]
    lines = ax.contour(c_grid, alpha_grid, speedup, levels=TRADEOFF_LEVELS, colors="gray",
                       linewidths=0.8)
    ax.clabel(lines, fmt="%.1fX", fontsize="small")
    ax.scatter(cs, alphas, color="C0")
    for name, p in points.items():
      ax.annotate(f"{name} {p['speedup_steps_only']:.2f}X", (p["c"], p["alpha"]),
                  fontsize="x-small", xytext=(3, 3), textcoords="offset points")
    ax.set(title=f"{t} (contours: the model calls' predicted speedup)",
           xlabel="c (draft step / target step, timed in turn)", ylabel="held-out alpha")
  return save_figure(fig, path)
