"""The T5 regime map's predictions: measured costs and published alpha through the cost model.

`regime_map` measures every cost on this machine; alpha is the one term that needs trained
weights. It comes from two places:

  paper  Table 2 of Leviathan et al. (2023): T5.1.1 small / base / large drafting for T5-XXL,
         En-De and CNN/DM, T = 0 and 1 (`PAPER_ALPHA`). A shape drafts with the alpha its
         size had against T5-XXL, whatever target it is paired with here: an assumption
         (a draft agrees more with a smaller target of its own family, not less).
  ours   our family's measured rows (`experiments.run`: alpha_beta per task and
         temperature), for the draft `MapPredictions.alpha_draft` names.

For each pair, alpha and temperature, `predict` prices gamma = 1..max_gamma with the whole
cost model (`gamma_choice.make_choice`: T_verify(k) fitted non-decreasing, the draft's cost,
both loops' own work and both encoders over a sequence of `tokens` output tokens) and
records its best gamma beside the model calls alone and Theorem 3.8.

Before any of that is read for shapes we cannot decode, `family_errors` holds the same cost
model against our family's measured speedups: each measured row of a pair this run
measured, predicted from this run's costs with the row's own alpha, gamma and output
length. The error is reported as it is (`error_summary`); the map stands on it only when
every point is within `ERROR_LIMIT`. Pure functions of rows (`regime_rows`, `PointRow`): no
timing, no model.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from specdec_jax import atomic_io
from specdec_jax.costs import gamma_choice
from specdec_jax.data import layout
from specdec_jax.experiment import results_io
from specdec_jax.experiment.record import PointRow
from specdec_jax.regime_map import regime_rows, sweep
from specdec_jax.regime_map.regime_rows import FamilyError, ModelRow, PairRow, Prediction
from specdec_jax.theory import LoopCosts

# alpha of the paper's Table 2 (T5-XXL target): (draft size, task, temperature) -> alpha.
PAPER_ALPHA: dict[tuple[str, str, float], float] = {
    ("small", "ende", 0.0): 0.75, ("small", "ende", 1.0): 0.62,
    ("base", "ende", 0.0): 0.80, ("base", "ende", 1.0): 0.68,
    ("large", "ende", 0.0): 0.82, ("large", "ende", 1.0): 0.71,
    ("small", "cnndm", 0.0): 0.65, ("small", "cnndm", 1.0): 0.53,
    ("base", "cnndm", 0.0): 0.73, ("base", "cnndm", 1.0): 0.55,
    ("large", "cnndm", 0.0): 0.74, ("large", "cnndm", 1.0): 0.56,
}
ERROR_LIMIT = 0.10  # The cost model is used for shapes we cannot decode only within this.


@dataclasses.dataclass(frozen=True, kw_only=True)
class MapPredictions:
  """Where the predictions' alpha and output lengths come from.

  Attributes:
    measured_rows: results files of our family (`experiments.run` rows), relative
      to the repository's root or absolute: the points the cost model's error is taken on,
      and our alpha.
    alpha_draft: the family draft whose alpha (mean alpha_beta per task and temperature
      over its rows in `measured_rows`) prices the shapes as "ours".
    paper_tokens: output tokens per sequence of each paper task, over which the encoders
      are spread ({"ende": n, "cnndm": n}).
  """

  measured_rows: tuple[str, ...] = tuple(
      os.path.join("results", name, results_io.RESULTS_FILE)
      for name in ("quickstart_t5", "distilled_drafts", "paper_table2"))
  alpha_draft: str = "draft_shared_enc_d192"
  paper_tokens: Mapping[str, float] = dataclasses.field(
      default_factory=lambda: {"ende": 32.0, "cnndm": 64.0})

  def __post_init__(self):
    object.__setattr__(self, "measured_rows", tuple(self.measured_rows))
    tasks = {task for _, task, _ in PAPER_ALPHA}
    if set(self.paper_tokens) != tasks or not all(
        np.isfinite(n) and n > 0 for n in self.paper_tokens.values()):
      raise ValueError(f"paper_tokens must give every paper task {sorted(tasks)} a number of "
                       f"output tokens > 0, got {dict(self.paper_tokens)!r}.")


@dataclasses.dataclass(frozen=True)
class AlphaSource:
  """One alpha to price a pair with.

  Attributes:
    source: "paper" or "ours".
    task: the task it was measured on.
    temperature: the sampling temperature.
    alpha: the acceptance rate.
    tokens: output tokens per sequence the encoders are spread over.
  """

  source: str
  task: str
  temperature: float
  alpha: float
  tokens: float


def paper_size(name: str) -> str | None:
  """A shape's size in the paper's Table 2 ("small", "base", "large"), else None."""
  size = name.rsplit("-", 1)[-1]
  return size if any(size == s for s, _, _ in PAPER_ALPHA) else None


def read_measured(paths: Sequence[str]) -> dict[str, list[PointRow]]:
  """{path: its points}: the results files of experiments.run (relative to the repository's
  root, or absolute).

  Raises:
    FileNotFoundError: a file is missing.
  """
  measured = {}
  for path in paths:
    full = os.path.join(layout.REPO_ROOT, path)  # An absolute `path` stays as it is.
    if not os.path.exists(full):
      raise FileNotFoundError(f"measured_rows has {path!r}, which does not exist; list "
                              "results.jsonl files of experiments.run.")
    measured[path] = results_io.read_points(full)
  return measured


def our_alphas(measured: Sequence[PointRow], draft: str, target: str) -> list[AlphaSource]:
  """Our family's alpha, per (task, temperature): the mean alpha_beta of `draft`'s batch-1
  rows for `target`, over the mean output length those rows' loops ran for."""
  rows = [r for r in measured if r.draft == draft and r.target == target
          and r.batch_size == 1]
  return [AlphaSource("ours", task, float(t), float(np.mean([r.alpha_beta for r in group])),
                      float(np.mean([output_tokens(r) for r in group])))
          for (task, t), group in results_io.group(rows, "task", "temperature").items()]


def output_tokens(row: PointRow) -> float:
  """Tokens per sequence a measured row's loops ran for (its cost model's N)."""
  return float(row.cost_model_terms.loop_tokens)


def paper_alphas(draft: str, settings: MapPredictions, temperatures: Sequence[float]
                 ) -> list[AlphaSource]:
  """The paper's alpha for a shape drafting (none for a shape the paper did not draft with)."""
  size = paper_size(draft)
  return [AlphaSource("paper", task, t, alpha, float(settings.paper_tokens[task]))
          for (s, task, t), alpha in PAPER_ALPHA.items() if s == size and t in temperatures]


def loop_costs(pair_row: PairRow, models: Mapping[str, ModelRow],
               pair_rows: Mapping[tuple, PairRow], settings: sweep.MapSettings,
               tokens: float) -> LoopCosts:
  """The loops' own work and the encoders that price a pair over `tokens` output tokens.

  Our family's pairs: their own (`sweep.measure_loops`). A shape's pair: the work per
  baseline step, iteration and proposal of `settings.loop_reference`'s pair at the same
  temperature (the loop's ops, not its models), and the encoders of the target's and the
  draft's model rows (`sweep.measure_pair` says why).

  Raises:
    KeyError: the reference pair or a model row is not measured.
  """
  own = pair_row.loop_costs
  if own is None:
    key = (settings.loop_reference, settings.family_target, float(pair_row.temperature))
    own = dataclasses.replace(pair_rows[key].loop_costs, held_out=False,
                              encode_target_s=models[pair_row.target].encoder_s,
                              encode_draft_s=models[pair_row.draft].encoder_s)
  return dataclasses.replace(own, loop_tokens=float(tokens))


def predict(target_row: ModelRow, pair_row: PairRow, loops: LoopCosts,
            alpha: float, max_gamma: int) -> gamma_choice.GammaChoice:
  """The whole cost model's speedup at gamma = 1..max_gamma, and its best gamma.

  Args:
    target_row: the target's model row (T_verify(k), k = 1..max_gamma + 1).
    pair_row: the pair's row (the draft's seconds per proposed token).
    loops: the loops' own work and the encoders over the sequence (`loop_costs`).
    alpha: the acceptance rate.
    max_gamma: the largest gamma priced.

  Returns:
    `gamma_choice.make_choice`'s record: `speedup_cost_model` per gamma (encoders
    included, over `loops.loop_tokens` tokens), `gamma` its best, `speedup_steps_only`
    and `speedup_thm38` beside it.
  """
  return gamma_choice.make_choice(alpha, target_row.t_verify_s, pair_row.t_draft_s,
                                  loop_costs=loops, max_gamma=max_gamma)


def _index(rows: Sequence[regime_rows.Row]
           ) -> tuple[dict[str, ModelRow], dict[tuple, PairRow]]:
  """(model rows by name, pair rows by (draft, target, temperature))."""
  models = {r.model: r for r in rows if isinstance(r, ModelRow)}
  pair_rows = {(r.draft, r.target, float(r.temperature)): r
               for r in rows if isinstance(r, PairRow)}
  return models, pair_rows


def prediction_record(models: Mapping[str, ModelRow], pair_rows: Mapping[tuple, PairRow],
                      pair_row: PairRow, source: AlphaSource, settings: sweep.MapSettings
                      ) -> Prediction:
  """One prediction: the pair, the alpha and where it comes from, every gamma's speedup, the
  best gamma and the terms at it."""
  target_row = models[pair_row.target]
  loops = loop_costs(pair_row, models, pair_rows, settings, source.tokens)
  choice = predict(target_row, pair_row, loops, source.alpha, settings.max_gamma)
  gamma = choice.gamma
  return Prediction(
      draft=pair_row.draft, target=pair_row.target, **dataclasses.asdict(source),
      target_family=target_row.family, target_decoder_bytes=target_row.decoder_bytes,
      t_step_s=choice.t_step_s, c=choice.c, gamma=gamma,
      speedup=choice.speedup_cost_model[gamma],
      speedup_by_gamma=dict(choice.speedup_cost_model),
      speedup_steps_only=choice.speedup_steps_only[gamma],
      speedup_thm38=choice.speedup_thm38[gamma],
      verify_ratio=choice.verify_ratio[gamma + 1],
      encoders_s=loops.encode_target_s + loops.encode_draft_s,
      loop_work_from="own" if pair_row.loop_costs else settings.loop_reference,
      reason=choice.reason)


def predictions(rows: Sequence[regime_rows.Row], settings: sweep.MapSettings,
                prediction_settings: MapPredictions, measured: Mapping[str, Sequence[PointRow]]
                ) -> list[Prediction]:
  """Every pair measured in `rows` at every alpha that applies: a shape's paper alpha and
  our family's (`alpha_draft`'s); our own pairs at their own drafts' alpha.

  Args:
    rows: the regime map's rows.
    settings: the settings they were measured with.
    prediction_settings: where alpha and output lengths come from.
    measured: our family's points by results file (`read_measured`).
  """
  models, pair_rows = _index(rows)
  points = [r for rows_of_file in measured.values() for r in rows_of_file]
  out = []
  for (draft, target, t), pair_row in pair_rows.items():
    if draft in sweep.SHAPES:
      sources = (paper_alphas(draft, prediction_settings, [t])
                 + our_alphas(points, prediction_settings.alpha_draft, settings.family_target))
    else:
      sources = our_alphas(points, draft, target)
    out += [prediction_record(models, pair_rows, pair_row, s, settings)
            for s in sources if s.temperature == t]
  return out


def family_errors(rows: Sequence[regime_rows.Row], measured: Mapping[str, Sequence[PointRow]],
                  settings: sweep.MapSettings) -> list[FamilyError]:
  """The cost model against our family's measured speedups: per measured batch-1 row of a
  pair this run measured (at a gamma it prices), the speedup predicted from this run's
  costs with the row's alpha, gamma, output length and encoders (timed on the row's own
  inputs: a task's inputs are not the map's `prompt_len`), and the error
  predicted / measured - 1.

  A row measured on another CPU than this run's (`same_cpu` False) carries the two
  machines' difference in its error too.

  Args:
    rows: the regime map's rows.
    measured: our family's points by results file (`read_measured`).
    settings: the settings the rows were measured with.
  """
  models, pair_rows = _index(rows)
  out = []
  for source, points in measured.items():
    for r in points:
      pair_row = pair_rows.get((r.draft, r.target, float(r.temperature)))
      if pair_row is None or r.batch_size != 1 or r.gamma > settings.max_gamma:
        continue
      loops = dataclasses.replace(  # The encoders at the row's own inputs' lengths.
          loop_costs(pair_row, models, pair_rows, settings, output_tokens(r)),
          encode_target_s=r.cost_model_terms.encode_target_s,
          encode_draft_s=r.cost_model_terms.encode_draft_s)
      choice = predict(models[r.target], pair_row, loops, r.alpha_beta, settings.max_gamma)
      predicted = choice.speedup_cost_model[r.gamma]
      env, here = r.environment, pair_row.environment
      out.append(FamilyError(
          source=source, task=r.task, draft=r.draft, target=r.target,
          temperature=float(r.temperature), gamma=r.gamma, gamma_auto=r.gamma_auto,
          alpha=r.alpha_beta, tokens=output_tokens(r), measured=r.speedup_measured,
          predicted=predicted, error=predicted / r.speedup_measured - 1,
          row_cpu=env.get("cpu_model"), row_commit=env.get("git_commit"), row_date=r.date,
          same_cpu=(env.get("cpu_model"), env.get("cpu_vectors"))
          == (here.get("cpu_model"), here.get("cpu_vectors"))))
  return out


def error_summary(errors: Sequence[FamilyError], limit: float = ERROR_LIMIT) -> dict[str, Any]:
  """The cost model's error over our family's points, and whether every point is within
  `limit` (the condition for using it on shapes we cannot decode)."""
  if not errors:
    return {"points": 0, "within_limit": False, "limit": limit,
            "verdict": "no measured point of a pair this run measured: the error is unknown"}
  e = np.array([r.error for r in errors])
  inside = int(np.sum(np.abs(e) <= limit))
  same = [r for r in errors if r.same_cpu]
  verdict = (f"every point within ±{limit:.0%}" if inside == len(e)
             else f"NOT within ±{limit:.0%}: {len(e) - inside} of {len(e)} points outside")
  if not same:
    verdict += (" (none of them measured on this run's CPU: remeasure our family's rows here, "
                "experiments.run on their gin configs, to check the model on this machine)")
  return {"points": len(e), "inside_limit": inside, "within_limit": inside == len(e),
          "limit": limit, "mean_error": float(e.mean()),
          "median_abs_error": float(np.median(np.abs(e))), "max_abs_error": float(np.abs(e).max()),
          "same_cpu_points": len(same), "verdict": verdict}


def where_it_pays(records: Sequence[Prediction]) -> list[dict[str, Any]]:
  """Per (alpha source, task, temperature): the smallest target (decoder bytes) for which some
  public-shape pair is predicted to beat the target alone, or None (as predictions.json
  holds it)."""
  shapes = [r for r in records if r.target_family == "t5 public"]
  out = []
  for (source, task, t), group in results_io.group(shapes, "source", "task",
                                                   "temperature").items():
    paying = [r for r in group if r.speedup > 1]
    first = min(paying, key=lambda r: (r.target_decoder_bytes, -r.speedup), default=None)
    out.append({"source": source, "task": task, "temperature": t,
                "first": None if first is None else {
                    "draft": first.draft, "target": first.target,
                    "target_decoder_bytes": first.target_decoder_bytes, "gamma": first.gamma,
                    "speedup": first.speedup, "alpha": first.alpha, "c": first.c}})
  return out


def _mib(n: float) -> str:
  return f"{n / 2**20:.1f}"


def _cache_line(cache: Mapping[str, Any] | None) -> str:
  if cache is None:
    return "This machine reports no CPU cache sizes."
  return (f"Largest CPU cache: L{cache['level']}, {_mib(cache['bytes'])} MiB (shared by CPUs "
          f"{cache['shared_cpu_list']}), read from /sys/devices/system/cpu/cpu0/cache.")


def _models_table(models: Sequence[ModelRow], cache: Mapping[str, Any] | None) -> list[str]:
  ks = sorted(k for k in models[0].verify_ratio if k != 1) if models else []
  lines = ["| model | params (M) | decoder MiB per call | fits in the cache | T_step ms | "
           + " | ".join(f"k={k}" for k in ks) + " | encoder ms | compile s |",
           "|---|---|---|---|---|" + "---|" * len(ks) + "---|---|"]
  for m in sorted(models, key=lambda m: m.decoder_bytes):
    fits = "-" if cache is None else ("yes" if m.decoder_bytes <= cache["bytes"] else "no")
    lines.append(
        f"| {m.model} | {m.params / 1e6:.1f} | {_mib(m.decoder_bytes)} | {fits} | "
        f"{1e3 * m.t_step_s:.2f} | "
        + " | ".join(f"{m.verify_ratio[k]:.2f}" for k in ks)
        + f" | {1e3 * m.encoder_s:.1f} | {m.verify_compile_s + m.encoder_compile_s:.0f} |")
  return lines


def _pairs_table(pair_rows: Sequence[PairRow]) -> list[str]:
  lines = ["| draft | target | T | c | loop work ms per iteration / proposal / step | "
           "compile s |", "|---|---|---|---|---|---|"]
  for p in pair_rows:
    loops = p.loop_costs
    work = ("(from the reference pair)" if loops is None else " / ".join(
        f"{1e3 * s:.2f}" for s in (loops.iteration_overhead_s, loops.proposal_overhead_s,
                                   loops.step_overhead_s)))
    lines.append(f"| {p.draft} | {p.target} | {p.temperature:g} | {p.c:.3f} | "
                 f"{work} | {p.draft_compile_s:.0f} |")
  return lines


def _errors_table(errors: Sequence[FamilyError], summary: Mapping[str, Any]) -> list[str]:
  if not errors:
    return [f"**{summary['verdict']}**."]
  lines = [f"**{summary['verdict']}**: {summary['points']} points, mean error "
           f"{summary['mean_error']:+.1%}, median |error| {summary['median_abs_error']:.1%}, "
           f"max |error| {summary['max_abs_error']:.1%}; {summary['same_cpu_points']} of them "
           "measured on this run's CPU (the others carry the two machines' difference too).",
           "", "| rows | task | draft | T | gamma | alpha | N | measured | predicted | error | "
           "row's CPU |", "|---|---|---|---|---|---|---|---|---|---|---|"]
  lines += [f"| {e.source} | {e.task} | {e.draft} | {e.temperature:g} | "
            f"{e.gamma}{' (auto)' if e.gamma_auto else ''} | {e.alpha:.3f} | "
            f"{e.tokens:.1f} | {e.measured:.2f}X | {e.predicted:.2f}X | "
            f"{e.error:+.1%} | {e.row_cpu}{'' if e.same_cpu else ' (other)'} |"
            for e in errors]
  return lines


def _predictions_table(records: Sequence[Prediction]) -> list[str]:
  lines = ["| draft | target | target decoder MiB | alpha from | task | T | alpha | N | c | "
           "gamma* | predicted | model calls alone | Thm 3.8 |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
  order = sorted(records, key=lambda r: (r.target_decoder_bytes, r.draft, r.source, r.task,
                                         r.temperature))
  lines += [f"| {r.draft} | {r.target} | {_mib(r.target_decoder_bytes)} | "
            f"{r.source} | {r.task} | {r.temperature:g} | {r.alpha:.2f} | "
            f"{r.tokens:.0f} | {r.c:.3f} | {r.gamma} | **{r.speedup:.2f}X** | "
            f"{r.speedup_steps_only:.2f}X | {r.speedup_thm38:.2f}X |" for r in order]
  return lines


def _pays_lines(pays: Sequence[dict]) -> list[str]:
  lines = []
  for p in pays:
    first = p["first"]
    where = ("no shape measured here is predicted to pay" if first is None else
             f"{first['draft']} drafting for {first['target']} "
             f"({_mib(first['target_decoder_bytes'])} MiB of decoder weights per call): "
             f"{first['speedup']:.2f}X at gamma "
             f"{first['gamma']} (alpha {first['alpha']:.2f}, c {first['c']:.3f})")
    lines.append(f"- alpha from {p['source']}, {p['task']}, T={p['temperature']:g}: {where}.")
  return lines


def markdown(rows: Sequence[regime_rows.Row], records: Sequence[Prediction],
             errors: Sequence[FamilyError], summary: Mapping[str, Any],
             cache: Mapping[str, Any] | None, command: str) -> str:
  """tables.md: the costs measured, the cost model's error on our family, the predictions
  and the smallest target that pays."""
  models = [r for r in rows if isinstance(r, ModelRow)]
  pair_rows = [r for r in rows if isinstance(r, PairRow)]
  env = rows[0].environment if rows else {}
  lines = [f"# The T5 regime map on {env.get('cpu_model', '?')} ({env.get('backend', '?')}, "
           f"{env.get('cpu_count', '?')} CPUs)", "",
           "**These are predictions from measured costs and published alpha, not decodes of "
           "trained models.** Every cost was measured here on random-weight models of the "
           "public shapes, saved in float16 and loaded as a user's checkpoint is; alpha is the "
           "paper's Table 2 (T5.1.1 drafts for T5-XXL) or our family's measured rows. "
           f"Command: `{command}`.", "", _cache_line(cache), "",
           "## Costs measured (batch 1; T_verify(k) / T_step for each k; encoder at the "
           "prompt's length)", ""]
  lines += _models_table(models, cache)
  lines += ["", "## Drafts: c = T_draft / T_step, and the loops' own work", ""]
  lines += _pairs_table(pair_rows)
  lines += ["", f"## The cost model on our family's measured points (limit ±{ERROR_LIMIT:.0%})",
            ""]
  lines += _errors_table(errors, summary)
  lines += ["", "## Predicted speedup at the best gamma (whole cost model, encoders included "
            "over N output tokens)", ""]
  if not summary["within_limit"]:
    lines += [f"**The cost model is not within ±{ERROR_LIMIT:.0%} on our family's measured "
              "points (above): the predictions below are not established for shapes we cannot "
              "decode.**", ""]
  lines += _predictions_table(records)
  lines += ["", "## Where this machine starts to pay (the smallest target predicted above 1X)",
            ""]
  lines += _pays_lines(where_it_pays(records))
  return "\n".join(lines) + "\n"


PREDICTIONS_FILE = "predictions.json"
TABLES_FILE = "tables.md"


def write_report(rows: Sequence[Mapping[str, Any]], settings: sweep.MapSettings,
                 prediction_settings: MapPredictions, output_dir: str, command: str
                 ) -> dict[str, Any]:
  """Writes `<output_dir>/predictions.json` and `tables.md` (atomically) from the rows.

  Args:
    rows: rows.jsonl's rows as the file holds them (`sweep.run` returns them,
      `results_io.read_rows` reads them), each read once (`regime_rows.read_row`).
    settings: the settings they were measured with.
    prediction_settings: where alpha and output lengths come from.
    output_dir: where the files go.
    command: the command line the tables name.

  Returns:
    The report: "predictions" (`Prediction`s), "family_errors" (`FamilyError`s),
    "error_summary", "where_it_pays", "last_level_cache" (this machine's, as the rows'
    environment recorded it) and the settings; predictions.json holds it as JSON.
  """
  map_rows = [regime_rows.read_row(r) for r in rows]
  measured = read_measured(prediction_settings.measured_rows)
  records = predictions(map_rows, settings, prediction_settings, measured)
  errors = family_errors(map_rows, measured, settings)
  summary = error_summary(errors)
  cache = (map_rows[0].environment["last_level_cache"] if map_rows
           else sweep.last_level_cache())
  report = {"predictions": records, "family_errors": errors, "error_summary": summary,
            "where_it_pays": where_it_pays(records), "last_level_cache": cache,
            "settings": sweep.settings_record(settings),
            "prediction_settings": {**dataclasses.asdict(prediction_settings),
                                    "paper_alpha": {f"{s} {task} T={t:g}": a for (s, task, t), a
                                                    in PAPER_ALPHA.items()}},
            "command": command}
  atomic_io.write_json(os.path.join(output_dir, PREDICTIONS_FILE), {
      **report, "predictions": [r.to_json() for r in records],
      "family_errors": [dataclasses.asdict(e) for e in errors]})
  atomic_io.atomic_write_text(os.path.join(output_dir, TABLES_FILE),
                              markdown(map_rows, records, errors, summary, cache, command))
  return report
