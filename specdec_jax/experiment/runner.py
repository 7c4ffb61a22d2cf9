"""The measurement run behind `python -m experiments.run`: load, plan, measure, resume.

`load_experiment` parses the gin files and bindings into a validated
`settings.Experiment` (checked before any work); `run` measures each point
(task, batch size, draft, temperature, gamma) with `measure.measure_point` and
appends its row to `<output_dir>/results.jsonl` atomically. A gamma of 'auto'
is chosen first (`specdec_jax.auto_gamma`: alpha from one speculative
pass over held-out examples, the step costs the run measures anyway); its row
holds the gamma chosen and why. Points already in that file are skipped, so an
interrupted run resumes where it stopped. `summary_table` is the table the
command prints.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time

import jax
import numpy as np
import sentencepiece as spm
import tqdm
from absl import logging

from specdec_jax import auto_gamma, contention, distributed, partitioning
from specdec_jax.checkpoints import load_hf_checkpoint, load_model
from specdec_jax.data import layout
from specdec_jax.data.ngram_stats import load_ngram_stats
from specdec_jax.decoding.drafts import Draft, NgramDraft, PromptLookupDraft, make_draft
from specdec_jax.decoding.sampling import Warp
from specdec_jax.experiment import measure, prompts, results_io, settings, stand_ins
from specdec_jax.models import T5Model

RESULTS_ROOT = "results"  # Committed reference measurements (experiments/reproduce_results.sh).
RUNS_ROOT = "runs"  # A user's own runs (not committed).
# A point timed beside another busy process is refused and measured again once
# the machine is quiet (`specdec_jax.contention`), at most this often.
QUIET_ATTEMPTS = 3
QUIET_WAIT_S = 600


def load_experiment(gin_files: list[str], bindings: list[str]) -> settings.Experiment:
  """Parses the gin files and bindings afresh and returns the validated `Experiment`."""
  settings.parse_gin(gin_files, bindings)
  try:
    exp = settings.Experiment()
  except TypeError as e:
    raise ValueError(f"Experiment is incomplete ({e}); bind it in a gin file, e.g. "
                     "Experiment.name = 'mine' and Experiment.drafts = ['draft_small'].") from e
  if exp.stand_ins_when_missing and not os.path.isdir(exp.checkpoint_dir(exp.target)):
    stand_ins_dir = os.path.join(layout.default_data_dir(), "random_models")
    logging.warning(
        "%s has no trained target yet: measuring RANDOM-INIT stand-ins of the family's shapes "
        "from %s instead. Timings are real, acceptance rates are meaningless.",
        exp.models_dir, stand_ins_dir)
    names = [exp.target] + [d for d in exp.drafts if exp.is_t5_draft(d)]
    stand_ins.write_stand_ins(stand_ins_dir, names)
    # Its own results directory: stand-in rows must never stand for the family's.
    exp = dataclasses.replace(exp, models_dir=stand_ins_dir, name=f"{exp.name}_random_stand_ins")
  settings.validate(exp)
  return exp


def _build_draft(exp: settings.Experiment, spec: str, task: str, vocab_size: int,
                 mesh: jax.sharding.Mesh) -> Draft:
  """The draft of `spec` for `task` (n-gram drafts use the task's corpus statistics)."""
  if spec in settings.NGRAM_ORDER:
    stats = load_ngram_stats(task)
    return NgramDraft.from_counts(stats.unigram, stats.bigram_prev, stats.bigram_next,
                                  stats.bigram_count, order=settings.NGRAM_ORDER[spec])
  if spec == "prompt_lookup":
    return PromptLookupDraft(vocab_size)
  model, params = load_model(exp.checkpoint_dir(spec), dtype=exp.dtype,
                             param_dtype=exp.param_dtype)
  # Sharded, and its caches constrained, by the draft rules.
  model = dataclasses.replace(model, axis_rules=partitioning.draft_axis_rules())
  return make_draft(model, partitioning.shard_params(model, params, mesh))


def _held_out_inputs(exp: settings.Experiment, task: str) -> tuple[list[str], str, int]:
  """The inputs of the (up to) `auto_calibration_examples` examples after the measured
  ones, where the examples come from, and how many the split holds."""
  pairs, source = prompts.load_examples(task, exp.split, None)
  held_out = pairs[exp.num_examples:exp.num_examples + exp.auto_calibration_examples]
  return [x for x, _ in held_out], source, len(pairs)


def _calibration_inputs(exp: settings.Experiment, task: str, processor: spm.SentencePieceProcessor,
                        mesh: jax.sharding.Mesh) -> jax.Array:
  """int32 `[auto_calibration_examples, input_len]`: the examples after the measured ones."""
  inputs, source, available = _held_out_inputs(exp, task)
  if len(inputs) < exp.auto_calibration_examples:
    raise ValueError(
        f"Experiment.auto_calibration_examples={exp.auto_calibration_examples}: gamma='auto' "
        f"calibrates on the examples after the {exp.num_examples} measured ones, but {source} "
        f"holds only {available} of {task!r}; lower auto_calibration_examples or num_examples.")
  return partitioning.shard_batch(prompts.tokenize(processor, inputs, exp.input_len), mesh)


HELD_OUT_BATCHES = 4  # Most held-out batches the cost model's overheads are timed on.


def _held_out_batches(exp: settings.Experiment, task: str, batch_size: int,
                      processor: spm.SentencePieceProcessor, mesh: jax.sharding.Mesh
                      ) -> list[jax.Array]:
  """Up to `HELD_OUT_BATCHES` batches of `batch_size` of the examples after the measured
  ones (`auto_calibration_examples` of them), or none if there are too few."""
  inputs, _, _ = _held_out_inputs(exp, task)
  count = min(len(inputs) // batch_size, HELD_OUT_BATCHES)
  if count == 0:
    return []
  tokens = prompts.tokenize(processor, inputs[:count * batch_size], exp.input_len)
  return [partitioning.shard_batch(b, mesh) for b in np.split(tokens, count)]


def _choose_gamma(exp: settings.Experiment, point: settings.Point, target: T5Model, params: dict,
                  draft: Draft, inputs: jax.Array,
                  target_costs: measure.TargetCosts, alpha: tuple[auto_gamma.AlphaEstimate, float],
                  max_gamma: int) -> auto_gamma.GammaChoice:
  """gamma = 'auto' for `point`: the run's target step costs, the draft's timed here.

  Args:
    exp: the experiment.
    point: the point, gamma AUTO.
    target: the target model.
    params: its parameters.
    draft: its draft.
    inputs: int32 `[point.batch_size, input_len]`, the batch the draft is timed on.
    target_costs: the target's step costs at this batch size (k = 1..max_gamma + 1).
    alpha: the calibration's estimate and the seconds its pass took.
    max_gamma: the run's largest gamma (sets the timing cache length).
  """
  estimate, alpha_s = alpha
  start = time.perf_counter()
  with contention.quiet(f"{point} draft cost for gamma='auto'") as guard:
    draft_cost = measure.measure_draft_cost(exp, draft, inputs, estimate.gamma,
                                            Warp(point.temperature), max_gamma, target=target,
                                            target_params=params)
  t_chunk, t_draft = auto_gamma.agreed_times(target_costs.t_chunk, draft_cost.seconds)
  return auto_gamma.make_choice(estimate, t_chunk, t_draft, max_gamma=exp.auto_max_gamma,
                                calibration_s=alpha_s + time.perf_counter() - start,
                                idle_check=guard.record())


def run(exp: settings.Experiment, output_dir: str) -> str:
  """Measures every point of `exp` missing from `<output_dir>/results.jsonl`.

  Returns:
    The path of results.jsonl.
  """
  path = os.path.join(output_dir, results_io.RESULTS_FILE)
  points = settings.plan(exp)
  done = {results_io.row_key(r) for r in results_io.read_rows(path)}
  pending = [p for p in points if p.key not in done]
  max_gamma = settings.largest_gamma(exp, points)
  print(f"{exp.name}: {len(points)} points, {len(points) - len(pending)} already in {path}.",
        file=sys.stderr)
  if not pending:
    return path

  mesh = partitioning.make_mesh()
  cfg, params = load_hf_checkpoint(exp.checkpoint_dir(exp.target), dtype=exp.dtype,
                                   param_dtype=exp.param_dtype)
  partitioning.check_model_fits(cfg, mesh)
  target = T5Model(cfg, axis_rules=partitioning.axis_rules())
  params = partitioning.shard_params(target, params, mesh)
  processor = spm.SentencePieceProcessor(model_file=exp.vocab_path)
  pieces = lambda ids: [processor.id_to_piece(i) for i in ids]
  drafts: dict[tuple[str, str], Draft] = {}  # (spec, task) -> draft, built once.
  batches: dict[tuple[str, int], list[jax.Array]] = {}
  held_out: dict[tuple[str, int], list[jax.Array]] = {}
  costs: dict[tuple[str, int], measure.TargetCosts] = {}
  # gamma = 'auto': alpha (and its pass's seconds) per (task, draft, T); the choice per point.
  alphas: dict[tuple[str, str, float], tuple[auto_gamma.AlphaEstimate, float]] = {}
  choices: dict[tuple, auto_gamma.GammaChoice] = {}

  bar = tqdm.tqdm(total=len(points), initial=len(points) - len(pending), unit="point",
                  file=sys.stderr, dynamic_ncols=True)
  with jax.set_mesh(mesh):  # Decoders compile for the mesh's shardings.
    for point in pending:
      bar.set_description(f"{point.task} b{point.batch_size} {settings.draft_name(point.draft)} "
                          f"T={point.temperature:g} g={point.gamma}")
      key = (point.task, point.batch_size)
      if key not in batches:
        pairs, _ = prompts.load_examples(point.task, exp.split, exp.num_examples)
        tokens = prompts.tokenize(processor, [x for x, _ in pairs], exp.input_len)
        batches[key] = [partitioning.shard_batch(b, mesh)
                        for b in np.split(tokens, len(tokens) // point.batch_size)]
        held_out[key] = _held_out_batches(exp, point.task, point.batch_size, processor, mesh)
      draft_key = (point.draft, point.task if point.draft in settings.NGRAM_ORDER else "")
      if draft_key not in drafts:
        drafts[draft_key] = _build_draft(exp, point.draft, point.task, cfg.vocab_size, mesh)
      draft = drafts[draft_key]
      alpha_key = (point.task, settings.draft_name(point.draft), point.temperature)
      if point.gamma == settings.AUTO and alpha_key not in alphas:
        start = time.perf_counter()
        estimate = auto_gamma.measure_alpha(
            target, params, draft, _calibration_inputs(exp, point.task, processor, mesh),
            gamma=min(auto_gamma.DEFAULT_CALIBRATION_GAMMA, exp.auto_max_gamma),
            max_decode_len=exp.max_decode_len, temperature=point.temperature,
            rng=jax.random.PRNGKey(exp.seed))
        alphas[alpha_key] = (estimate, time.perf_counter() - start)
      for attempt in range(1, QUIET_ATTEMPTS + 1):
        try:
          if key not in costs:
            costs[key] = measure.measure_target_costs(exp, target, params, batches[key][0],
                                                      max_gamma)
          if point.gamma == settings.AUTO and point.key not in choices:
            choices[point.key] = _choose_gamma(exp, point, target, params, draft,
                                               batches[key][0], costs[key], alphas[alpha_key],
                                               max_gamma)
            bar.write(f"{point.task} {settings.draft_name(point.draft)} T={point.temperature:g} "
                      f"batch={point.batch_size}: gamma='auto' chose "
                      f"{choices[point.key].reason} (calibration "
                      f"{choices[point.key].calibration_s:.1f} s)")
          choice = choices.get(point.key)
          measured = point if choice is None else dataclasses.replace(point, gamma=choice.gamma)
          row = measure.measure_point(exp, measured, target, params, draft, batches[key],
                                      costs[key], max_gamma, pieces, held_out[key])
          break
        except contention.ContentionError as e:
          if attempt == QUIET_ATTEMPTS:
            raise
          bar.write(f"{e}\nWaiting up to {QUIET_WAIT_S} s for a quiet machine "
                    f"(attempt {attempt} of {QUIET_ATTEMPTS}).")
          contention.wait_until_quiet(QUIET_WAIT_S)
      row.update(gamma_auto=choice is not None,
                 gamma_choice=None if choice is None else choice.to_json())
      if distributed.is_primary():  # Every process measures; process 0 writes.
        results_io.append_row(path, row)
      bar.write(f"{point.task} {row['draft']} T={point.temperature:g} gamma={_gamma_cell(row)} "
                f"batch={point.batch_size}: speedup {row['speedup_measured']:.2f}X (predicted "
                f"{row['speedup_predicted_cost_model']:.2f}X), alpha {row['alpha_beta']:.2f}, "
                f"c {row['c']:.3f}, {row['tokens_per_iteration']:.2f} tokens/call")
      bar.update(1)
      # Every point compiles programs of its own (the loop at its gamma, step timers), and
      # XLA:CPU maps memory for each compiled program until it is dropped: a 160-point sweep
      # in one process ran out of memory maps (vm.max_map_count) at point 45. Drop them; a
      # program a later point needs again is recompiled (compilation is timed apart).
      jax.clear_caches()
  bar.close()
  return path


def _gamma_cell(row: dict) -> str:
  return f"{row['gamma']} (auto)" if row.get("gamma_auto") else str(row["gamma"])


def summary_table(rows: list[dict], reference_rows: list[dict]) -> str:
  """A table a person reads at a glance: one line per measured point.

  Args:
    rows: the run's rows.
    reference_rows: the committed rows of the same experiment (their speedup is
      shown beside each point measured there too).
  """
  reference = {results_io.row_key(r): r["speedup_measured"] for r in reference_rows}
  head = ("| task | draft | T | gamma | batch | base ms/tok | spec ms/tok | speedup | "
          "alpha (beta) | alpha (S/(S+R)) | c | tokens/call | Thm 3.8 | cost model | "
          "reference |")
  lines = [head, "|" + "---|" * (head.count("|") - 1)]
  for r in rows:
    ref = reference.get(results_io.row_key(r))
    lines.append(
        f"| {r['task']} | {r['draft']} | {r['temperature']:g} | {_gamma_cell(r)} | "
        f"{r['batch_size']} | {r['baseline_ms_per_token']:.2f} | "
        f"{r['speculative_ms_per_token']:.2f} | **{r['speedup_measured']:.2f}X** | "
        f"{r['alpha_beta']:.3f} | {r['alpha_empirical']:.3f} | {r['c']:.3f} | "
        f"{r['tokens_per_iteration']:.2f} | {r['speedup_predicted_thm38']:.2f}X | "
        f"{r['speedup_predicted_cost_model']:.2f}X | "
        + (f"{ref:.2f}X |" if ref is not None else "- |"))
  return "\n".join(lines)
