"""alpha against training time, per recipe: the curves of runs trained with alpha
measured (`alpha_tracking`), gathered into one JSON and one figure.

`python -m experiments.analyze --alpha_curves=A,B` is the command. The JSON:
`{"<recipe>": {"model_dir", "recipe", "settings", "best", "points": [{"step", "passes",
"wall_time_s", "alpha": {task: {"T=0": .., "T=1": ..}}, "score"}, ...]}}`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from specdec_jax.data import layout  # noqa: E402
from specdec_jax.experiment import figures  # noqa: E402
from specdec_jax.training import alpha_tracking  # noqa: E402

POINT_FIELDS = ("step", "passes", "wall_time_s", "alpha", "score")
LINESTYLES = ("-", "--", ":", "-.")  # One per temperature, in the order measured.


def collect(model_dirs: Sequence[str]) -> dict[str, dict]:
  """Each run's curve, keyed by its recipe name (the model directory's name).

  Raises:
    FileNotFoundError / ValueError: a directory without a curve (see
      `alpha_tracking.read_curve`), or two directories of the same name.
  """
  curves = {}
  for model_dir in model_dirs:
    curve = alpha_tracking.read_curve(model_dir)
    name = curve["recipe"]["name"]
    if name in curves:
      raise ValueError(f"--model_dirs names two runs called {name!r} ({curves[name]['model_dir']}"
                       f", {model_dir}): train them in directories of different names.")
    curves[name] = {
        "model_dir": os.path.relpath(os.path.abspath(model_dir), layout.REPO_ROOT),
        "recipe": curve["recipe"], "settings": curve["settings"], "best": curve["best"],
        "points": [{k: e[k] for k in POINT_FIELDS} for e in curve["entries"]]}
  return curves


def fig_alpha_curves(curves: dict[str, dict], path: str) -> str:
  """alpha vs training hours, one panel per task, a colour per recipe, a line style per
  temperature; each recipe's best point (by its selection score) starred."""
  tasks = sorted({t for c in curves.values() for p in c["points"] for t in p["alpha"]})
  fig, axes = plt.subplots(1, len(tasks), figsize=(6 * len(tasks), 4.5), squeeze=False)
  colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  for ax, task in zip(axes[0], tasks, strict=True):
    for i, (name, curve) in enumerate(sorted(curves.items())):
      points = [p for p in curve["points"] if task in p["alpha"]]
      hours = [p["wall_time_s"] / 3600 for p in points]
      keys = [alpha_tracking.temperature_key(t) for t in curve["settings"]["temperatures"]]
      for key, style in zip(keys, LINESTYLES, strict=False):
        ax.plot(hours, [p["alpha"][task][key] for p in points], style, marker=".",
                color=colors[i % len(colors)], label=f"{name} {key}")
      best = curve["best"] and next(p for p in points if p["step"] == curve["best"]["step"])
      if best:
        for key in keys:
          ax.plot(best["wall_time_s"] / 3600, best["alpha"][task][key], "*", markersize=12,
                  color=colors[i % len(colors)])
    ax.set(title=f"{task} (validation, held out)", xlabel="training time (hours)",
           ylabel="alpha (mean beta)")
    ax.grid(alpha=0.3)
  axes[0][-1].legend(fontsize="small")
  return figures.save_figure(fig, path)
