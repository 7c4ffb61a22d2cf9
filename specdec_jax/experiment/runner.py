"""The measurement run behind `python -m experiments.run`: load, plan, measure, resume.

`load_experiment` parses the gin files and bindings into a validated
`settings.Experiment` (checked before any work); `run` measures each point
(task, batch size, draft, temperature, gamma) with `measure.measure_point` and
appends its row (`record.PointRow`) to `<output_dir>/results.jsonl` atomically.
A gamma of 'auto' is chosen first (`measure.calibrate`: the whole cost model,
calibrated on held-out examples with the step costs the run measures anyway);
its row holds the gamma chosen and why. Points already in that file are
skipped, so an interrupted run resumes where it stopped. `summary_table` is
the table the command prints.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import sentencepiece as spm
import tqdm
from absl import logging

from specdec_jax import auto_gamma, contention, distributed, partitioning
from specdec_jax.checkpoints import load_hf_checkpoint, load_model
from specdec_jax.data import layout
from specdec_jax.data.ngram_stats import load_ngram_stats
from specdec_jax.decoding import buckets
from specdec_jax.decoding.drafts import Draft, NgramDraft, PromptLookupDraft, make_draft
from specdec_jax.experiment import measure, prompts, results_io, settings, stand_ins
from specdec_jax.experiment.record import PointRow
from specdec_jax.models import T5Model

RESULTS_ROOT = "results"  # Committed reference measurements (experiments/reproduce_results.sh).
RUNS_ROOT = "runs"  # A user's own runs (not committed).
# A point timed beside another busy process is refused and measured again once
# the machine is quiet (`specdec_jax.contention`), at most this often.
QUIET_ATTEMPTS = 3
QUIET_WAIT_S = 600
HELD_OUT_BATCHES = 4  # Most held-out batches a row's loop costs are timed on.


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


def run(exp: settings.Experiment, output_dir: str) -> str:
  """Measures every point of `exp` missing from `<output_dir>/results.jsonl`.

  Returns:
    The path of results.jsonl.
  """
  path = os.path.join(output_dir, results_io.RESULTS_FILE)
  points = settings.plan(exp)
  done = {results_io.row_key(r) for r in results_io.read_rows(path)}
  pending = [p for p in points if p.key not in done]
  print(f"{exp.name}: {len(points)} points, {len(points) - len(pending)} already in {path}.",
        file=sys.stderr)
  if not pending:
    return path
  bench = _Bench(exp, settings.largest_gamma(exp, points))
  bar = tqdm.tqdm(total=len(points), initial=len(points) - len(pending), unit="point",
                  file=sys.stderr, dynamic_ncols=True)
  with jax.set_mesh(bench.mesh):  # Decoders compile for the mesh's shardings.
    for point in pending:
      bar.set_description(f"{point.task} b{point.batch_size} {settings.draft_name(point.draft)} "
                          f"T={point.temperature:g} g={point.gamma}")
      row = _when_quiet(lambda p=point: bench.measure(p, bar.write), bar.write)
      if distributed.is_primary():  # Every process measures; process 0 writes.
        results_io.append_row(path, row.to_json())
      bar.write(f"{row.task} {row.draft} T={row.temperature:g} gamma={row.gamma_label} "
                f"batch={row.batch_size}: speedup {row.speedup_measured:.2f}X (predicted "
                f"{row.speedup_predicted_cost_model:.2f}X), alpha {row.alpha_beta:.2f}, "
                f"c {row.c:.3f}, {row.tokens_per_iteration:.2f} tokens/call")
      bar.update(1)
      # Every point compiles programs of its own (the loop at its gamma, step timers), and
      # XLA:CPU maps memory for each compiled program until it is dropped: a 160-point sweep
      # in one process ran out of memory maps (vm.max_map_count) at point 45. Drop them; a
      # program a later point needs again is recompiled (compilation is timed apart).
      jax.clear_caches()
  bar.close()
  return path


def _when_quiet(measure_fn: Callable[[], PointRow], say: Callable[[str], Any]) -> PointRow:
  """`measure_fn()`; when it was timed beside another busy process, waits for a quiet
  machine and calls it again (`QUIET_ATTEMPTS` calls at most)."""
  for attempt in range(1, QUIET_ATTEMPTS):
    try:
      return measure_fn()
    except contention.ContentionError as e:
      say(f"{e}\nWaiting up to {QUIET_WAIT_S} s for a quiet machine (attempt {attempt} of "
          f"{QUIET_ATTEMPTS}).")
      contention.wait_until_quiet(QUIET_WAIT_S)
  return measure_fn()


@dataclasses.dataclass(frozen=True)
class _Examples:
  """A task's examples at one batch size, int32 `[batch_size, input_len]` batches.

  Attributes:
    measured: the `num_examples` measured ones.
    held_out: the `auto_calibration_examples` after them (whole batches only).
  """

  measured: list[jax.Array]
  held_out: list[jax.Array]


class _Bench:
  """The models a run loads once, and what its points share, each measured once.

  `measure(point)` is one point; the drafts, examples, target step costs and
  gamma = 'auto' choices it needs are made on first use and kept, so a point
  retried after a timing refused as noisy redoes only what failed.
  """

  def __init__(self, exp: settings.Experiment, max_gamma: int):
    self.exp, self.max_gamma = exp, max_gamma
    self.mesh = partitioning.make_mesh()
    cfg, params = load_hf_checkpoint(exp.checkpoint_dir(exp.target), dtype=exp.dtype,
                                     param_dtype=exp.param_dtype)
    partitioning.check_model_fits(cfg, self.mesh)
    self.target = T5Model(cfg, axis_rules=partitioning.axis_rules())
    self.params = partitioning.shard_params(self.target, params, self.mesh)
    self.processor = spm.SentencePieceProcessor(model_file=exp.vocab_path)
    self._made: dict[tuple, Any] = {}

  def _once(self, key: tuple, make: Callable[[], Any]) -> Any:
    if key not in self._made:
      self._made[key] = make()
    return self._made[key]

  def measure(self, point: settings.Point, say: Callable[[str], Any]) -> PointRow:
    """Measures `point`, choosing its gamma first if it is 'auto'."""
    exp = self.exp
    draft_task = point.task if point.draft in settings.NGRAM_ORDER else ""  # n-grams: per task.
    draft = self._once(("draft", point.draft, draft_task), lambda: _build_draft(
        exp, point.draft, point.task, self.target.config.vocab_size, self.mesh))
    examples = self._once(("examples", point.task, point.batch_size),
                          lambda: self._examples(point.task, point.batch_size))
    verify = self._once(("verify", point.task, point.batch_size), lambda: (
        measure.measure_target_costs(exp, self.target, self.params, examples.measured[0],
                                     self.max_gamma)))
    choice = None
    if point.gamma == settings.AUTO:
      choice = self._once(("choice", point.key), lambda: self._choose(point, draft, examples,
                                                                     verify, say))
      point = dataclasses.replace(point, gamma=choice.gamma)
    return measure.measure_point(exp, point, self.target, self.params, draft, examples.measured,
                                 verify, self.max_gamma, self._pieces,
                                 examples.held_out[:HELD_OUT_BATCHES], choice)

  def _choose(self, point: settings.Point, draft: Draft, examples: _Examples,
              verify: auto_gamma.VerifyTimes, say: Callable[[str], Any]
              ) -> auto_gamma.GammaChoice:
    """gamma = 'auto' for `point`, calibrated on its held-out examples."""
    if not examples.held_out:
      raise ValueError(
          f"Experiment.auto_calibration_examples={self.exp.auto_calibration_examples}: gamma="
          f"'auto' calibrates on whole batches of {point.batch_size} of the examples after the "
          f"{self.exp.num_examples} measured ones, and {point.task!r} has none; raise "
          "auto_calibration_examples or lower num_examples.")
    choice = measure.calibrate(self.exp, point, self.target, self.params, draft,
                               examples.held_out, verify)
    say(f"{point.task} {settings.draft_name(point.draft)} T={point.temperature:g} "
        f"batch={point.batch_size}: gamma='auto' chose {choice.reason} (calibration "
        f"{choice.calibration_s:.1f} s)")
    return choice

  def _examples(self, task: str, batch_size: int) -> _Examples:
    """The task's measured and held-out examples in batches of `batch_size`."""
    exp = self.exp
    pairs, source = prompts.load_examples(task, exp.split, None)
    inputs = [x for x, _ in pairs]
    if len(inputs) < exp.num_examples:
      raise ValueError(f"Experiment.num_examples={exp.num_examples}, but {source} holds only "
                       f"{len(inputs)} examples of {task!r}; lower num_examples.")
    held_out = inputs[exp.num_examples:exp.num_examples + exp.auto_calibration_examples]
    return _Examples(self._batches(inputs[:exp.num_examples], batch_size),
                     self._batches(held_out[:len(held_out) // batch_size * batch_size],
                                   batch_size))

  def _batches(self, inputs: list[str], batch_size: int) -> list[jax.Array]:
    if not inputs:
      return []
    tokens = prompts.tokenize(self.processor, inputs, self.exp.input_len)
    return [partitioning.shard_batch(buckets.to_bucket(b), self.mesh)
            for b in np.split(tokens, len(tokens) // batch_size)]

  def _pieces(self, ids: list[int]) -> list[str]:
    return [self.processor.id_to_piece(i) for i in ids]


def summary_table(rows: list[PointRow], reference_rows: list[PointRow]) -> str:
  """A table a person reads at a glance: one line per measured point.

  Args:
    rows: the run's rows.
    reference_rows: the committed rows of the same experiment (their speedup is
      shown beside each point measured there too).
  """
  reference = {r.key: r.speedup_measured for r in reference_rows}
  head = ("| task | draft | T | gamma | batch | base ms/tok | spec ms/tok | speedup | "
          "per example (p10-p90) | alpha (beta) | alpha (S/(S+R)) | c | tokens/call | "
          "Thm 3.8 | efficiency | cost model | reference |")
  lines = [head, "|" + "---|" * (head.count("|") - 1)]
  for r in rows:
    ref = reference.get(r.key)
    spread = (f"{r.speedup_spread[0]:.2f}-{r.speedup_spread[2]:.2f}X"
              if r.speedup_spread else "-")
    lines.append(
        f"| {r.task} | {r.draft} | {r.temperature:g} | {r.gamma_label} | {r.batch_size} | "
        f"{r.baseline_ms_per_token:.2f} | {r.speculative_ms_per_token:.2f} | "
        f"**{r.speedup_measured:.2f}X** | {spread} | {r.alpha_beta:.3f} | "
        f"{r.alpha_empirical:.3f} | {r.c:.3f} | {r.tokens_per_iteration:.2f} | "
        f"{r.speedup_predicted_thm38:.2f}X | {r.efficiency:.2f} | "
        f"{r.speedup_predicted_cost_model:.2f}X | "
        + (f"{ref:.2f}X |" if ref is not None else "- |"))
  return "\n".join(lines)
