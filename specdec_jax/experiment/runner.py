"""The measurement run behind `python -m experiments.run`: load, plan, measure, resume.

`prepare` checks a `settings.Experiment` that a command assembled from gin
(`gin_flags.load_experiment`) before any work; `run` measures each point
(task, batch size, draft, temperature, gamma) with `measure.measure_point` and
appends its row (`record.PointRow`) to `<output_dir>/results.jsonl` atomically.
A gamma of 'auto' is chosen first (`timing.calibrate`: the whole cost model,
calibrated on held-out examples with the step costs the run measures anyway);
its row holds the gamma chosen and why. With `Experiment.tree`, a token tree is
then measured beside the chain points it names, with the same draft, into
`<output_dir>/trees.jsonl` (`tree_point`). Points already in those files are
skipped, so an interrupted run resumes where it stopped. `summary_table` is
the table the command prints.

The target and drafts are whatever kind `Experiment.target_kind` names
(`experiment.targets.registry`): the kind loads the target (its `Scorer`) and builds
each draft from its spec; everything else here is the same for every kind.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
import tqdm

from specdec_jax import contention, distributed, partitioning, validation
from specdec_jax.costs import timing
from specdec_jax.data import prompts
from specdec_jax.decoding import buckets, programs
from specdec_jax.decoding.drafts import Draft
from specdec_jax.experiment import measure, results_io, settings, tree_point
from specdec_jax.experiment.record import PointRow
from specdec_jax.experiment.targets import interface, registry

RESULTS_ROOT = "results"  # Committed reference measurements (commands: results/README.md).
RUNS_ROOT = "runs"  # A user's own runs (not committed).


def prepare(exp: settings.Experiment,
            architectures: Mapping[str, Any] | None = None) -> settings.Experiment:
  """The run checked before any work (`registry.check`), its target swapped for random-init
  stand-ins first when `Experiment.stand_ins_when_missing` asks for them.

  Args:
    exp: the run.
    architectures: the stand-ins' shapes, member -> model config (the command reads them:
      `gin_flags.family_architectures`); needed when `exp.stand_ins_when_missing`.

  Raises:
    ValueError / FileNotFoundError: naming the field and the fix.
  """
  if exp.stand_ins_when_missing:
    kind = registry.target_kind(exp.target_kind, "Experiment.target_kind")
    if kind.stand_ins is None:
      raise ValueError(f"Experiment.stand_ins_when_missing: a {kind.name!r} target has no "
                       "random-init stand-ins; set it to False.")
    if architectures is None:
      raise ValueError("Experiment.stand_ins_when_missing: the stand-ins' architectures are "
                       "not given; load the run with gin_flags.load_experiment, which reads "
                       "them (family_architectures).")
    exp = kind.stand_ins(exp, architectures)
  registry.check(exp)
  return exp


def run(exp: settings.Experiment, output_dir: str, *, greedy: measure.GreedyCheck,
        placement: partitioning.Placement, max_gamma: int | None = None,
        deadline: float | None = None) -> str:
  """Measures every point of `exp` missing from `<output_dir>/results.jsonl`.

  Args:
    exp: the run.
    output_dir: where results.jsonl is.
    greedy: what a greedy point does when its tokens differ from the baseline's (the
      command builds it from gin: `GreedyCheck()`).
    placement: the device mesh the models and inputs live on, and the rules they are
      sharded by (the command builds it from gin: `gin_flags.placement()`).
    max_gamma: the caches are sized for gamma up to it and every row's T_verify(k) covers
      k = 1..max_gamma + 1 (at least the largest gamma of the run's points, the default).
    deadline: a `time.monotonic()` time: no point is started that would end after it at
      the pace of the slowest point so far; a later run measures the points left.

  Returns:
    The path of results.jsonl.
  """
  path = os.path.join(output_dir, results_io.RESULTS_FILE)
  trees_path = os.path.join(output_dir, tree_point.TREES_FILE)
  points = settings.plan(exp)
  done = {r.key for r in results_io.read_points(path)}
  pending = [p for p in points if p.key not in done]
  trees_done = {tree_point.TreeRow.from_json(r).key for r in results_io.read_rows(trees_path)}
  tree_points = settings.tree_points(exp)
  trees = [p for p in tree_points if _tree_key(exp, p) not in trees_done]
  print(f"{exp.name}: {len(points)} points, {len(points) - len(pending)} already in {path}.",
        file=sys.stderr)
  if not pending and not trees:
    return path
  bar = tqdm.tqdm(total=len(points) + len(tree_points),
                  initial=len(points) - len(pending) + len(trees_done), unit="point",
                  file=sys.stderr, dynamic_ncols=True)
  slowest = 0.0
  with jax.set_mesh(placement.mesh):  # Decoders compile for the mesh's shardings.
    bench = _Bench(exp, max(max_gamma or 1, settings.largest_gamma(exp, points)), placement,
                   greedy)
    for point in pending:
      start = time.monotonic()
      if deadline is not None and start + slowest > deadline:
        bar.write(f"{exp.name}: {bar.total - bar.n} points left for a later run (deadline).")
        bar.close()
        return path
      bar.set_description(f"{point.task} b{point.batch_size} {settings.draft_name(point.draft)} "
                          f"T={point.temperature:g} g={point.gamma}")
      for attempt in contention.attempts(bar.write):
        with attempt:
          row = bench.measure(point, bar.write)
      if distributed.is_primary():  # Every process measures; process 0 writes.
        results_io.append_row(path, row.to_json())
      bar.write(f"{row.task} {row.draft} T={row.temperature:g} gamma={row.gamma_label} "
                f"batch={row.batch_size}: speedup {row.speedup_measured:.2f}X (predicted "
                f"{row.speedup_predicted_cost_model:.2f}X), alpha {row.alpha_beta:.2f}, "
                f"c {row.c:.3f}, {row.tokens_per_iteration:.2f} tokens/call")
      bar.update(1)
      slowest = max(slowest, time.monotonic() - start)
      # Every point compiles programs of its own (the loop at its gamma, step timers); a
      # later point runs some again (the baseline, T_verify's), so they stay until the
      # process nears its memory-map limit (compilation is timed apart).
      programs.drop_when_crowded()
    chains = {r.key: r for r in results_io.read_points(path)}
    for point in trees:  # Beside its chain, on the same examples with the same draft.
      bar.set_description(f"{point.task} b{point.batch_size} {settings.draft_name(point.draft)} "
                          f"T={point.temperature:g} tree {exp.tree}")
      for attempt in contention.attempts(bar.write):
        with attempt:
          row = bench.measure_tree(point, chains[point.key])
      if distributed.is_primary():
        results_io.append_row(trees_path, row.to_json())
      if row.shape_choice is not None:
        bar.write(f"tree='auto' chose {row.shape_choice['reason']}")
      bar.write(f"{row.task} {row.draft} T={row.temperature:g} tree {row.shape} "
                f"batch={row.batch_size}: speedup {row.speedup_measured:.2f}X (predicted "
                f"{row.speedup_predicted:.2f}X), {row.tokens_per_call:.2f} tokens/call "
                f"(chain: {row.chain_speedup:.2f}X, {row.chain_tokens_per_call:.2f})")
      bar.update(1)
      programs.drop_when_crowded()
  bar.close()
  return path


def _tree_key(exp: settings.Experiment, point: settings.Point) -> tuple:
  """The key of the tree point beside `point` (`tree_point.TreeRow.key`)."""
  return tree_point.tree_key(point.task, settings.draft_name(point.draft), point.temperature,
                             exp.tree, point.batch_size)


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
  gamma = 'auto' choices it needs are made on first use and kept (the costs as
  `timing.SharedCosts`, filled in as they are measured), so a point retried after a
  timing refused as noisy redoes only what failed. The loading's seconds go to the
  row of the first point measured after it (`PointRow.time_split_s["load"]`).
  """

  def __init__(self, exp: settings.Experiment, max_gamma: int,
               placement: partitioning.Placement, greedy: measure.GreedyCheck):
    self.exp, self.max_gamma, self.placement, self.greedy = exp, max_gamma, placement, greedy
    self.kind = registry.target_kind(exp.target_kind, "Experiment.target_kind")
    self._watch = timing.Stopwatch()
    with self._watch("load"):
      self.target = self.kind.load(exp, placement)
    self._made: dict[tuple, Any] = {}

  def _once(self, key: tuple, make: Callable[[], Any]) -> Any:
    if key not in self._made:
      self._made[key] = make()
    return self._made[key]

  def _inputs(self, point: settings.Point) -> tuple[_Examples, Draft]:
    """The examples and the draft of `point`, made on first use; the draft checked against
    the target."""
    with self._watch("load"):
      draft_kind = self.kind.draft_kind(point.draft)
      draft = self._once(("draft", *interface.draft_key(draft_kind, point.draft, point.task)),
                         lambda: draft_kind.build(self.target, point.draft,
                                                  point.task if draft_kind.per_task else ""))
      examples = self._once(("examples", point.task, point.batch_size),
                            lambda: self._examples(point.task, point.batch_size))
      validation.check_draft(draft, self.target.scorer.vocab_size, examples.measured[0], None,
                             self.target.encoder_width, self.target.scorer.feature_size)
    return examples, draft

  def measure_tree(self, point: settings.Point, chain: PointRow) -> tree_point.TreeRow:
    """Measures `Experiment.tree` beside `point`'s chain row `chain`, with its draft."""
    examples, draft = self._inputs(point)
    if not examples.held_out and self.exp.tree == settings.AUTO:
      raise ValueError(
          f"Experiment.auto_calibration_examples={self.exp.auto_calibration_examples}: tree="
          f"'auto' measures acceptance on whole batches of {point.batch_size} of the examples "
          f"after the {self.exp.num_examples} measured ones, and {point.task!r} has none; "
          "raise auto_calibration_examples or lower num_examples.")
    return tree_point.measure_tree(
        self.exp, point, chain, self.target, functools.partial(self.kind.tree_proposer, draft),
        examples.measured, examples.held_out, self.greedy)

  def measure(self, point: settings.Point, say: Callable[[str], Any]) -> PointRow:
    """Measures `point`, choosing its gamma first if it is 'auto'."""
    exp = self.exp
    examples, draft = self._inputs(point)
    # T_verify(k) at the batch size, timed at a fixed cached length (`timing_geometry`):
    # every task of a decoder-only target shares it; a target with an encoder attends over
    # its outputs, so its tasks share it at one input length (the first batch's bucket).
    inputs = () if self.target.encoder_width is None else examples.measured[0].shape[1:]
    verify = self._once(("verify", point.batch_size, *inputs), timing.SharedCosts)
    work = self._once(("sequence_work", point.draft, point.batch_size), dict)
    shared = self._once(("costs", point.key),
                        lambda: dataclasses.replace(verify, sequence_work=work))
    if not examples.held_out and point.gamma == settings.AUTO:
      raise ValueError(
          f"Experiment.auto_calibration_examples={exp.auto_calibration_examples}: gamma="
          f"'auto' calibrates on whole batches of {point.batch_size} of the examples after the "
          f"{exp.num_examples} measured ones, and {point.task!r} has none; raise "
          "auto_calibration_examples or lower num_examples.")
    try:
      row = measure.measure_point(exp, point, self.target, draft, examples.measured,
                                  examples.held_out, self.max_gamma, shared,
                                  self.greedy, loading=self._watch.spans["load"])
      self._watch.pop("load")  # Counted in this row; a retried point counts it again.
      return row
    finally:
      verify.verify, verify.verify_check = shared.verify, shared.verify_check
      if shared.choice is not None and point.gamma == settings.AUTO:
        say(f"{point.task} {settings.draft_name(point.draft)} T={point.temperature:g} "
            f"batch={point.batch_size}: gamma='auto' chose {shared.choice.reason} "
            f"(calibration {shared.choice.calibration_s:.1f} s)")

  def _examples(self, task: str, batch_size: int) -> _Examples:
    """The task's measured and held-out examples in batches of `batch_size`: the target's
    inputs, checked against its vocabulary, each batch cut to its length bucket and placed
    on the mesh."""
    exp = self.exp
    pairs, source = prompts.load_examples(task, exp.split, None)
    inputs = [x for x, _ in pairs]
    if len(inputs) < exp.num_examples:
      raise ValueError(f"Experiment.num_examples={exp.num_examples}, but {source} holds only "
                       f"{len(inputs)} examples of {task!r}; lower num_examples.")
    held_out = inputs[exp.num_examples:exp.num_examples + exp.auto_calibration_examples]
    texts = inputs[:exp.num_examples] + held_out[:len(held_out) // batch_size * batch_size]
    tokens = self.target.tokenize(task, texts, exp.input_len)
    validation.check_token_ids("inputs", tokens, self.target.scorer.vocab_size)
    batches = [partitioning.shard_batch(buckets.to_bucket(b), self.placement.mesh,
                                        self.placement.rules)
               for b in np.split(tokens, len(tokens) // batch_size)]
    measured = exp.num_examples // batch_size
    return _Examples(batches[:measured], batches[measured:])


PHASES = ("load", "compile", "calibration", "measurement")  # `PointRow.time_split_s`.


def time_split_line(rows: list[PointRow]) -> str:
  """One line: the seconds the rows' points spent loading, compiling, calibrating and
  measuring, summed over those that recorded them (rows from before it are left out)."""
  split = [r.time_split_s for r in rows if r.time_split_s is not None]
  if not split:
    return "Time apart: not recorded in these rows."
  total = {phase: sum(s.get(phase, 0.0) for s in split) for phase in PHASES}
  return (f"Time apart over {len(split)} points: " + ", ".join(
      f"{phase} {seconds:.1f} s" for phase, seconds in total.items())
      + f" ({sum(total.values()):.1f} s in all).")


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
