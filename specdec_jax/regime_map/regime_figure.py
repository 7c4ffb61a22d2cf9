"""The regime map's figure: predicted speedup against the target's decoder bytes per call.

Apart from `regime_predictions` because it needs matplotlib, which the device check does not
(it writes the rows and the table; this draws them wherever matplotlib is).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import ticker  # noqa: E402

from specdec_jax.experiment import figures, results_io  # noqa: E402
from specdec_jax.regime_map.regime_rows import FamilyError, Prediction  # noqa: E402

MIB = 2**20


def fig_regime_map(records: Sequence[Prediction], errors: Sequence[FamilyError],
                   cache: Mapping[str, Any] | None, path: str) -> str:
  """Draws the regime map and writes it to `path` (PNG, replaced atomically).

  One panel per alpha source and task (columns) and temperature (rows): per draft, its
  predicted speedup at the best gamma against the target's decoder bytes per call (float16
  panels where exact, log scale); the line 1X; the CPU's largest cache where it reports one;
  in our family's panels, our measured speedups (`experiments.run` rows, `errors`) at our target's
  bytes, beside the cost model's prediction for the same pair.

  Args:
    records: `regime_predictions.predictions`.
    errors: `regime_predictions.family_errors` (their measured speedups are drawn).
    cache: `regime_map.last_level_cache()`, or None.
    path: the PNG to write.

  Returns:
    `path`.

  Raises:
    ValueError: `records` is empty.
  """
  if not records:
    raise ValueError("records is empty: there is no prediction to draw.")
  columns = sorted({(r.source, r.task) for r in records})
  temperatures = sorted({r.temperature for r in records})
  fig, axes = plt.subplots(len(temperatures), len(columns), squeeze=False, sharex=True,
                           sharey=True, figsize=(4.5 * len(columns), 3.6 * len(temperatures)))
  mib_of = {r.target: r.target_decoder_bytes / MIB for r in records}
  colors = {d: f"C{i}" for i, d in enumerate(sorted({r.draft for r in records}))}
  for i, t in enumerate(temperatures):
    for j, (source, task) in enumerate(columns):
      ax = axes[i][j]
      panel = [r for r in records if (r.source, r.task, r.temperature) == (source, task, t)]
      _draw_panel(ax, panel, colors, cache)
      measured = [e for e in errors if source == "ours" and (e.task, e.temperature) == (task, t)]
      if measured:
        ax.plot([mib_of[e.target] for e in measured], [e.measured for e in measured],
                "kx", markersize=7, label="ours, measured speedup")
      ax.set_title(f"alpha from {source}, {task}, T={t:g}", fontsize=10)
      ax.legend(fontsize=6, loc="best")
  for ax in axes[-1]:
    ax.set_xlabel("target's decoder weights read per call (MiB, log scale)")
  for row in axes:
    row[0].set_ylabel("predicted speedup at best gamma")
  return figures.save_figure(fig, path)


def _draw_panel(ax: plt.Axes, panel: Sequence[Prediction], colors: Mapping[str, str],
                cache: Mapping[str, Any] | None) -> None:
  """One panel: each draft's predictions as a line over its targets' bytes."""
  for (draft,), group in results_io.group(panel, "draft").items():
    group = sorted(group, key=lambda r: r.target_decoder_bytes)
    x = [r.target_decoder_bytes / MIB for r in group]
    ax.plot(x, [r.speedup for r in group], "o-", color=colors[draft], label=f"{draft} drafting")
    for xi, r in zip(x, group, strict=True):
      ax.annotate(f"{r.target} (g={r.gamma})", (xi, r.speedup), fontsize=5,
                  xytext=(3, 3), textcoords="offset points")
  ax.axhline(1.0, color="gray", linewidth=0.8)
  if cache is not None:
    ax.axvline(cache["bytes"] / MIB, color="red", linestyle="--", linewidth=0.8,
               label=f"L{cache['level']} cache, {cache['bytes'] / MIB:.0f} MiB")
  ax.set_xscale("log")
  ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
  ax.xaxis.set_minor_formatter(ticker.NullFormatter())
