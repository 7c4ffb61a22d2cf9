"""Tables and figures in the paper's form, from results.jsonl files alone.

  python -m experiments.analyze [--results_dir=results/quickstart ...] [--results_root=results]

For each results directory (default: every `<results_root>/*/results.jsonl`)
writes `tables.md` (Table 2: best gamma per task / draft / T; Table 3: alpha
per draft; Table 4: expected vs measured; every point, with those whose
measured speedup is more than `FLAG_TOLERANCE` from the refined prediction
flagged; speedup vs batch size with the crossover; the measured cost of
scoring k tokens in one target call) and PNG figures next to it.
The theory figures (Fig. 2, Fig. 3) go to `<results_root>/theory/`, and
`<results_root>/analysis_section.md` collects everything for results/README.md.
"""

from __future__ import annotations

import collections
import glob
import os
import textwrap
from collections.abc import Iterable, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

from experiments import results_io  # noqa: E402
from specdec_jax import atomic_io, theory  # noqa: E402

FLAG_TOLERANCE = 0.15  # |measured / predicted - 1| above this is flagged.
THEORY_GAMMAS = (1, 2, 3, 5, 7, 10)  # Fig. 2 curves.
THEORY_CS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5)  # Fig. 3 curves (the paper's c = .02-.11 inside).
ALPHA_GRID = np.linspace(0.0, 0.99, 100)
SECTION_FILE = "analysis_section.md"
TABLES_FILE = "tables.md"
THEORY_DIR = "theory"
FIG1_CHARS_PER_LINE = 80

_RESULTS_DIR = flags.DEFINE_multi_string(
    "results_dir", [], "Directories holding results.jsonl (default: all under --results_root).")
_RESULTS_ROOT = flags.DEFINE_string("results_root", "results",
                                    "Root of the experiments' result directories.")

Row = dict


# ---- Tables ---------------------------------------------------------------------------------


def md_table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
  """A GitHub Markdown table; floats with 2 decimals."""
  fmt = lambda v: f"{v:.2f}" if isinstance(v, float) else str(v)
  lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
  lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
  return "\n".join(lines) + "\n"


def _group(rows: Iterable[Row], *fields: str) -> dict[tuple, list[Row]]:
  groups: dict[tuple, list[Row]] = collections.defaultdict(list)
  for row in rows:
    groups[tuple(row[f] for f in fields)].append(row)
  return dict(sorted(groups.items()))


def deviation(row: Row) -> float:
  """Measured / refined-predicted speedup - 1."""
  return row["speedup_measured"] / row["speedup_predicted_cost_model"] - 1


def is_flagged(row: Row) -> bool:
  """Whether the measured speedup is more than FLAG_TOLERANCE from the refined prediction."""
  return abs(deviation(row)) > FLAG_TOLERANCE


def fixed_gamma_rows(rows: Sequence[Row]) -> list[Row]:
  """The rows measured at a gamma given in the config (not chosen by gamma = 'auto')."""
  return [r for r in rows if not r.get("gamma_auto")]


def best_rows(rows: Sequence[Row]) -> list[Row]:
  """Per (task, draft, temperature), the batch-1 fixed-gamma point of highest speedup."""
  batch1 = [r for r in fixed_gamma_rows(rows) if r["batch_size"] == 1]
  return [max(group, key=lambda r: r["speedup_measured"])
          for group in _group(batch1, "task", "draft", "temperature").values()]


def table2(rows: Sequence[Row]) -> str:
  """The paper's Table 2: task, draft, T, best gamma, alpha, speedup."""
  return md_table(["task", "draft", "T", "gamma", "alpha", "speedup"],
                  [(r["task"], r["draft"], f"{r['temperature']:g}", r["gamma"], r["alpha_beta"],
                    f"{r['speedup_measured']:.2f}X") for r in best_rows(rows)])


def table3(rows: Sequence[Row]) -> str:
  """The paper's Table 3: alpha (mean beta over all of a draft's points) at each T."""
  temps = sorted({r["temperature"] for r in rows})
  out = []
  for (task, draft), group in _group(rows, "task", "draft").items():
    by_t = _group(group, "temperature")
    alphas = []
    for t in temps:
      g = by_t.get((t,), [])
      count = sum(r["beta_count"] for r in g)
      alphas.append(sum(r["beta_sum"] for r in g) / count if count else "-")
    out.append((task, draft, *alphas))
  return md_table(["task", "draft", *(f"alpha T={t:g}" for t in temps)], out)


def table4(rows: Sequence[Row]) -> str:
  """The paper's Table 4 (expected vs measured) for the Table 2 points, plus the refined model."""
  return md_table(
      ["task", "draft", "T", "gamma", "c", "expected (Thm 3.8)", "expected (cost model)",
       "measured", "flag"],
      [(r["task"], r["draft"], f"{r['temperature']:g}", r["gamma"], f"{r['c']:.3f}",
        r["speedup_predicted_thm38"], r["speedup_predicted_cost_model"], r["speedup_measured"],
        "**>15%**" if is_flagged(r) else "") for r in best_rows(rows)])


def points_table(rows: Sequence[Row]) -> str:
  """Every point, with the deviation from the refined prediction and its flag."""
  ordered = sorted(rows, key=lambda r: (r["task"], r["draft"], r["temperature"], r["batch_size"],
                                        r["gamma"]))
  return md_table(
      ["task", "draft", "T", "batch", "gamma", "alpha (beta)", "alpha (S/(S+R))", "tokens/call",
       "c", "Thm 3.8", "cost model", "measured", "deviation", "flag"],
      [(r["task"], r["draft"], f"{r['temperature']:g}", r["batch_size"], r["gamma"],
        r["alpha_beta"], r["alpha_empirical"], r["tokens_per_iteration"], f"{r['c']:.3f}",
        r["speedup_predicted_thm38"], r["speedup_predicted_cost_model"], r["speedup_measured"],
        f"{100 * deviation(r):+.0f}%", "**>15%**" if is_flagged(r) else "") for r in ordered])


AUTO_TOLERANCE = 0.05  # gamma = 'auto' should be within this of the sweep's best.


def auto_table(rows: Sequence[Row]) -> str | None:
  """gamma = 'auto' against the fixed gammas of the same run, per point.

  Two comparisons: the auto row's own measured speedup over the best fixed row's (two
  independent measurements: their noise is in it), and the fixed row at the gamma auto
  chose over the best fixed row (the choice alone, one sweep).
  """
  autos = [r for r in rows if r.get("gamma_auto")]
  if not autos:
    return None
  fixed = _group(fixed_gamma_rows(rows), "task", "draft", "temperature", "batch_size")
  out = []
  for r in sorted(autos, key=lambda r: (r["task"], r["draft"], r["temperature"],
                                        r["batch_size"])):
    group = fixed.get((r["task"], r["draft"], r["temperature"], r["batch_size"]), [])
    if not group:
      continue
    best = max(group, key=lambda x: x["speedup_measured"])
    same = [x for x in group if x["gamma"] == r["gamma"]]
    chosen = same[0]["speedup_measured"] / best["speedup_measured"] if same else None
    own = r["speedup_measured"] / best["speedup_measured"]
    ok = (chosen if chosen is not None else own) >= 1 - AUTO_TOLERANCE
    out.append((r["task"], r["draft"], f"{r['temperature']:g}", r["batch_size"], r["gamma"],
                f"{r['speedup_measured']:.2f}X", best["gamma"],
                f"{best['speedup_measured']:.2f}X", f"{own:.3f}",
                "-" if chosen is None else f"{chosen:.3f}",
                "yes" if ok else f"**no** (>{AUTO_TOLERANCE:.0%})"))
  return md_table(["task", "draft", "T", "batch", "auto gamma", "auto speedup", "best gamma",
                   "best speedup", "auto / best", "sweep at auto's gamma / best",
                   f"within {AUTO_TOLERANCE:.0%}"], out)


def crossover_batch(group: Sequence[Row]) -> int | None:
  """The smallest batch size whose measured speedup is below 1 (None: it always pays)."""
  below = [r["batch_size"] for r in group if r["speedup_measured"] < 1]
  return min(below) if below else None


def batch_table(rows: Sequence[Row]) -> str | None:
  """Speedup per batch size, per (task, draft, T, gamma) measured at several batch sizes."""
  batches = sorted({r["batch_size"] for r in rows})
  if len(batches) < 2:
    return None
  out = []
  for (task, draft, t, gamma), group in _group(rows, "task", "draft", "temperature",
                                               "gamma").items():
    by_b = {r["batch_size"]: r["speedup_measured"] for r in group}
    if len(by_b) < 2:
      continue
    cross = crossover_batch(group)
    out.append((task, draft, f"{t:g}", gamma, *(by_b.get(b, "-") for b in batches),
                "never" if cross is None else cross))
  return md_table(["task", "draft", "T", "gamma", *(f"b={b}" for b in batches),
                   "stops paying at"], out)


def _verify_ratios(group: Sequence[Row]) -> dict[int, float]:
  """{k: median T_verify(k) / T_step over the rows of one (task, batch size)}."""
  ks = sorted({int(k) for r in group for k in r["verify_ratio"]})
  return {k: float(np.median([r["verify_ratio"][str(k)] for r in group
                              if str(k) in r["verify_ratio"]])) for k in ks}


def verify_costs(rows: Sequence[Row]) -> dict[tuple, dict[int, float]]:
  """{(task, batch size): {k: median T_verify(k) / T_step over the rows}}.

  Rows of one run and (task, batch size) share one measurement; medians also
  pool runs appended to the same file.
  """
  return {key: _verify_ratios(group)
          for key, group in _group(rows, "task", "batch_size").items()}


def verify_table(rows: Sequence[Row]) -> str:
  """T_verify(k) / T_step per task and batch size (Thm 3.8 assumes 1 for every k)."""
  groups = _group(rows, "task", "batch_size")
  costs = {key: _verify_ratios(group) for key, group in groups.items()}
  ks = sorted({k for by_k in costs.values() for k in by_k})
  return md_table(
      ["task", "batch", "T_step (ms)", *(f"k={k}" for k in ks)],
      [(task, b, f"{1e3 * np.median([r['t_target_step_s'] for r in groups[(task, b)]]):.2f}",
        *(by_k.get(k, "-") for k in ks)) for (task, b), by_k in costs.items()])


# ---- Figures --------------------------------------------------------------------------------


def _save(fig: plt.Figure, path: str) -> str:
  fig.tight_layout()
  tmp = path + ".tmp.png"
  fig.savefig(tmp, dpi=120)
  plt.close(fig)
  os.replace(tmp, path)
  return path


def _panels(keys: Sequence[tuple]) -> tuple[plt.Figure, list[plt.Axes]]:
  fig, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 4), squeeze=False)
  return fig, list(axes[0])


def fig_speedup_vs_gamma(rows: Sequence[Row], path: str) -> str | None:
  """Measured (solid), cost-model (dashed) and Thm 3.8 (dotted) speedup vs gamma per draft;
  gamma = 'auto' points as stars."""
  autos = [r for r in rows if r.get("gamma_auto") and r["batch_size"] == 1]
  batch1 = [r for r in fixed_gamma_rows(rows) if r["batch_size"] == 1]
  if len({r["gamma"] for r in batch1}) < 2:
    return None
  panels = _group(batch1, "task", "temperature")
  fig, axes = _panels(list(panels))
  for ax, ((task, t), group) in zip(axes, panels.items(), strict=True):
    for i, ((draft,), drows) in enumerate(_group(group, "draft").items()):
      drows = sorted(drows, key=lambda r: r["gamma"])
      g = [r["gamma"] for r in drows]
      color = f"C{i}"
      ax.plot(g, [r["speedup_measured"] for r in drows], "o-", color=color, label=draft)
      ax.plot(g, [r["speedup_predicted_cost_model"] for r in drows], "--", color=color)
      ax.plot(g, [r["speedup_predicted_thm38"] for r in drows], ":", color=color)
      chosen = [r for r in autos if (r["task"], r["temperature"], r["draft"]) == (task, t, draft)]
      ax.plot([r["gamma"] for r in chosen], [r["speedup_measured"] for r in chosen], "*",
              color=color, markersize=14, label=f"{draft}, gamma='auto'" if chosen else None)
    ax.axhline(1, color="gray", lw=0.8)
    ax.set(title=f"{task}, T={t:g} (— measured, -- cost model, ·· Thm 3.8)", xlabel="gamma",
           ylabel="speedup over baseline")
    ax.legend(fontsize="small")
  return _save(fig, path)


def fig_measured_vs_predicted(rows: Sequence[Row], path: str) -> str:
  """Measured vs predicted speedup for every point, with y = x and the flag band."""
  fig, ax = plt.subplots(figsize=(5, 5))
  pred_c = [r["speedup_predicted_cost_model"] for r in rows]
  pred_t = [r["speedup_predicted_thm38"] for r in rows]
  meas = [r["speedup_measured"] for r in rows]
  ax.scatter(pred_c, meas, label="cost model (measured T_verify)")
  ax.scatter(pred_t, meas, marker="x", label="Thm 3.8")
  hi = max(pred_c + pred_t + meas) * 1.1
  xs = np.linspace(0, hi, 2)
  ax.plot(xs, xs, "k-", lw=0.8, label="y = x")
  ax.fill_between(xs, xs * (1 - FLAG_TOLERANCE), xs * (1 + FLAG_TOLERANCE), color="gray",
                  alpha=0.2, label=f"±{FLAG_TOLERANCE:.0%}")
  ax.set(xlim=(0, hi), ylim=(0, hi), xlabel="predicted speedup", ylabel="measured speedup")
  ax.legend(fontsize="small")
  return _save(fig, path)


def fig_speedup_vs_batch(rows: Sequence[Row], path: str) -> str | None:
  if len({r["batch_size"] for r in rows}) < 2:
    return None
  panels = _group(rows, "task")
  fig, axes = _panels(list(panels))
  for ax, ((task,), group) in zip(axes, panels.items(), strict=True):
    for key, g in _group(group, "draft", "temperature", "gamma").items():
      g = sorted(g, key=lambda r: r["batch_size"])
      ax.plot([r["batch_size"] for r in g], [r["speedup_measured"] for r in g], "o-",
              label=f"{key[0]} T={key[1]:g} γ={key[2]}")
    ax.axhline(1, color="gray", lw=0.8)
    ax.set(xscale="log", title=task, xlabel="batch size", ylabel="measured speedup")
    ax.legend(fontsize="small")
  return _save(fig, path)


def fig_speedup_vs_alpha(rows: Sequence[Row], path: str) -> str:
  """Measured speedup vs alpha, one colour per draft (the paper's Fig. 4, measured)."""
  fig, ax = plt.subplots(figsize=(6, 4))
  for (draft,), group in _group(rows, "draft").items():
    ax.scatter([r["alpha_beta"] for r in group], [r["speedup_measured"] for r in group],
               label=draft)
  ax.axhline(1, color="gray", lw=0.8)
  ax.set(xlabel="alpha (mean beta)", ylabel="measured speedup", xlim=(0, 1))
  ax.legend(fontsize="small")
  return _save(fig, path)


def fig_verify_cost(rows: Sequence[Row], path: str) -> str:
  """T_verify(k) / T_step vs k per task and batch size, against the paper's 1."""
  fig, ax = plt.subplots(figsize=(5, 4))
  for (task, b), by_k in verify_costs(rows).items():
    ax.plot(list(by_k), list(by_k.values()), "o-", label=f"{task}, batch {b}")
  ax.axhline(1, color="gray", lw=0.8, label="Thm 3.8 assumption")
  ax.set(xlabel="tokens scored in one target call (k = gamma + 1)",
         ylabel="T_verify(k) / T_step", ylim=(0, None))
  ax.legend(fontsize="small")
  return _save(fig, path)


def fig_example(row: Row, path: str) -> str:
  """Fig. 1 style: one generated text, accepted draft tokens in green, target tokens in red."""
  ex = row["example"]
  text_lines: list[list[tuple[str, bool]]] = [[]]
  width = 0
  for piece, accepted in zip(ex["pieces"], ex["accepted_mask"], strict=True):
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
  ax.set_title(f"{row['task']}, {row['draft']}, T={row['temperature']:g}, γ={row['gamma']}: "
               "green = draft token accepted, red = sampled by the target", fontsize=9)
  return _save(fig, path)


def fig2_expected_tokens(path: str) -> str:
  """Fig. 2: E[tokens per iteration] vs alpha for several gamma."""
  fig, ax = plt.subplots(figsize=(5, 4))
  for g in THEORY_GAMMAS:
    ax.plot(ALPHA_GRID, theory.expected_tokens_per_iteration(ALPHA_GRID, g), label=f"γ={g}")
  ax.set(xlabel="alpha", ylabel="expected tokens per iteration")
  ax.legend(fontsize="small")
  return _save(fig, path)


def fig3_optimal_gamma(path: str) -> str:
  """Fig. 3: the optimal gamma vs alpha for several c (only where speculation helps)."""
  fig, ax = plt.subplots(figsize=(5, 4))
  for c in THEORY_CS:
    best = [theory.optimal_gamma(a, c) for a in ALPHA_GRID]
    ax.plot(ALPHA_GRID, [b.gamma if b.helps else np.nan for b in best], label=f"c={c:g}")
  ax.set(xlabel="alpha", ylabel="optimal gamma", yscale="log")
  ax.legend(fontsize="small")
  return _save(fig, path)


# ---- Driver ---------------------------------------------------------------------------------


def analyze_dir(results_dir: str) -> str:
  """Writes tables.md and the figures of one results directory; returns its Markdown."""
  rows = results_io.read_rows(os.path.join(results_dir, results_io.RESULTS_FILE))
  if not rows:
    raise FileNotFoundError(f"--results_dir={results_dir!r} has no rows in "
                            f"{results_io.RESULTS_FILE}; run experiments.run into it first.")
  name = os.path.basename(os.path.normpath(results_dir))
  figures = {
      "speedup vs gamma": fig_speedup_vs_gamma(rows, os.path.join(results_dir,
                                                                   "speedup_vs_gamma.png")),
      "measured vs predicted": fig_measured_vs_predicted(
          rows, os.path.join(results_dir, "measured_vs_predicted.png")),
      "speedup vs batch size": fig_speedup_vs_batch(rows, os.path.join(results_dir,
                                                                       "speedup_vs_batch.png")),
      "speedup vs alpha": fig_speedup_vs_alpha(rows, os.path.join(results_dir,
                                                                  "speedup_vs_alpha.png")),
      "verification cost": fig_verify_cost(rows, os.path.join(results_dir, "verify_cost.png")),
      "generated text (Fig. 1 style)": fig_example(best_rows(rows)[0] if best_rows(rows)
                                                   else rows[0],
                                                   os.path.join(results_dir, "fig1_example.png")),
  }
  flagged = [r for r in rows if is_flagged(r)]
  parts = [f"## {name}\n",
           f"{len(rows)} points; {len(flagged)} flagged (measured speedup more than "
           f"{FLAG_TOLERANCE:.0%} from the cost-model prediction).\n",
           "### Table 2: best gamma per task, draft and temperature (batch 1)\n", table2(rows),
           "### Table 3: alpha per draft\n", table3(rows),
           "### Table 4: expected vs measured speedup\n", table4(rows)]
  autos = auto_table(rows)
  if autos:
    parts += ["### gamma = 'auto' against the sweep\n", autos]
  batches = batch_table(rows)
  if batches:
    parts += ["### Speedup vs batch size\n", batches]
  parts += ["### Verification cost: T_verify(k) / T_step (Thm 3.8 assumes 1)\n",
            verify_table(rows)]
  parts += ["### All points\n", points_table(rows)]
  for title, fig in figures.items():
    if fig:
      parts.append(f"![{title}]({name}/{os.path.basename(fig)})\n")
  text = "\n".join(parts)
  atomic_io.atomic_write_bytes(os.path.join(results_dir, TABLES_FILE),
                             text.replace(f"]({name}/", "](").encode("utf-8"))
  return text


def analyze(results_dirs: Sequence[str], results_root: str) -> str:
  """Analyses each directory, draws the theory figures; returns the section file's path."""
  theory_dir = os.path.join(results_root, THEORY_DIR)
  os.makedirs(theory_dir, exist_ok=True)
  fig2 = fig2_expected_tokens(os.path.join(theory_dir, "fig2_expected_tokens.png"))
  fig3 = fig3_optimal_gamma(os.path.join(theory_dir, "fig3_optimal_gamma.png"))
  sections = [textwrap.dedent(f"""\
      ## Theory

      ![Fig. 2: expected tokens per iteration]({THEORY_DIR}/{os.path.basename(fig2)})
      ![Fig. 3: optimal gamma]({THEORY_DIR}/{os.path.basename(fig3)})
      """)]
  sections += [analyze_dir(d) for d in results_dirs]
  path = os.path.join(results_root, SECTION_FILE)
  atomic_io.atomic_write_bytes(path, "\n".join(sections).encode("utf-8"))
  return path


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}.")
  dirs = _RESULTS_DIR.value or sorted(
      os.path.dirname(p) for p in glob.glob(os.path.join(_RESULTS_ROOT.value, "*",
                                                         results_io.RESULTS_FILE)))
  if not dirs:
    raise app.UsageError(f"No {results_io.RESULTS_FILE} under {_RESULTS_ROOT.value}/*/; run "
                         "python -m experiments.run first or pass --results_dir.")
  print(f"Wrote {analyze(dirs, _RESULTS_ROOT.value)} from {len(dirs)} result directories.")


if __name__ == "__main__":
  app.run(main)
