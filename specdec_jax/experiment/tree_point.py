"""A token tree measured beside the chain at the same draft: one row per tree point.

`Experiment.tree` names a shape "<k>x<depth>" (the draft's top-k branches, each `depth`
tokens: `trees.branches`), "<k>x<depth>+lookup<n>" (and after them the prompt's
continuation, a chain of n: `proposers.PromptLookup`, `shaped_proposer`),
"lookup<n>+<k>x<depth>" (the continuation tried before them) or 'auto'. For
each point of `settings.tree_points`, once its chain row is measured
(`measure.measure_point`), `measure_tree` times the baseline against the tree loop
(`decoding.tree_speculative`, over the target kind's `tree_proposer` of the same draft)
interleaved over the same batches (`timing.time_decoders`, under the timing guard),
greedy tokens checked equal to the baseline's. The row (`TreeRow`) holds the shape,
tokens per target call, the acceptance per depth and sibling rank, the measured speedup
per generated token, the chain's figures beside them, and two predictions from the
tree's measured rank rates and the chain row's measured costs:

  speedup_predicted             `tree_choice.predicted_speedup`: the chain row's whole
                                cost model (T_step, T_verify(n + 1), the loops' own
                                work, the encoders over the chain's loop tokens a
                                sequence), one draft call per level of the draft's
                                branches priced at the chain's T_draft per token;
  speedup_predicted_steps_only  `theory_trees.walltime_improvement` with an iteration
                                of T_verify(n + 1) / T_step + depth c target steps
                                (Theorem 3.8's counterpart).

'auto' (`choose_shape`) decodes the held-out examples with the widest tree it chooses
among, measures acceptance per depth and sibling rank there, and prices every shape
within the run's budget with the chain row's costs (`tree_choice.make_choice`); where
none is predicted to beat the target alone, the row says so and records the target
alone (nothing to time: speedup 1).

Rows go to `<output_dir>/trees.jsonl` (`TREES_FILE`), apart from the chain's
results.jsonl; `tree_table` prints them beside the chain.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from specdec_jax import contention, distributed, theory, theory_trees
from specdec_jax.costs import timing, tree_choice
from specdec_jax.decoding import baseline, trees
from specdec_jax.decoding.proposers import Merged, PromptLookup, Proposer, tree_parents
from specdec_jax.decoding.sampling import Warp
from specdec_jax.decoding.tree_speculative import tree_speculative_decode
from specdec_jax.experiment import measure
from specdec_jax.experiment.record import PointRow
from specdec_jax.experiment.settings import (
  AUTO,
  Experiment,
  Point,
  draft_name,
  tree_budget,
  tree_shape,
)
from specdec_jax.experiment.targets.interface import LoadedTarget

Array = jax.Array

TREES_FILE = "trees.jsonl"
AUTO_MAX_BRANCHES = 3  # Experiment.tree = 'auto' chooses among k = 1..3 branches.
TARGET_ALONE = "none"  # The shape of an 'auto' row where no tree is predicted to pay.


def tree_key(task: str, draft: str, temperature: float, shape: str, batch_size: int) -> tuple:
  """The identity of a tree point: (task, draft name, temperature, shape, batch size)."""
  return task, draft, float(temperature), shape, int(batch_size)


@dataclasses.dataclass(frozen=True)
class TreeRow:
  """One tree point, beside its chain point (same task, draft, temperature, examples).

  Attributes:
    experiment, task, draft, target, temperature, batch_size, num_examples,
      max_decode_len, repetitions, seed: what was measured (`PointRow`'s meaning).
    shape: the tree's shape, "<k>x<depth>" (`TARGET_ALONE` where 'auto' chose none).
    shape_auto: whether `Experiment.tree` = 'auto' chose it.
    shape_choice: 'auto''s `tree_choice.TreeChoice.to_json()` (the rates it was chosen
      from, every candidate's predicted speedup and the reason); None for a named shape.
    parents: the tree's parents, node 0 the root (`trees.branches(k, depth)`, then the
      look-up chain's).
    chain_gamma: the chain's gamma (chosen by gamma = 'auto' if `chain_gamma_auto`).
    chain_gamma_auto: whether gamma = 'auto' chose it.
    chain_tokens_per_call: the chain's tokens per target call.
    chain_speedup: the chain's measured speedup.
    tokens_per_call: the tree's tokens per target call.
    accepted_histogram: `[depth + 1]`, iterations that emitted n accepted candidates.
    rank_rates: `[depth][k]`, the probability that the sibling of rank r at depth d + 1
      is the child accepted, given the walk reached its parent.
    baseline_ms_per_token: the baseline's milliseconds per generated token.
    tree_ms_per_token: the tree loop's.
    speedup_measured: their ratio.
    speedup_predicted: by the chain row's cost model (module docstring).
    speedup_predicted_steps_only: by target steps alone (module docstring).
    greedy_identical: at T = 0, whether the tree's tokens equaled the baseline's; None
      at T > 0.
    idle_check: the timing guard's record.
    date: when measured (UTC, ISO 8601).
  """

  experiment: str
  task: str
  draft: str
  target: str
  temperature: float
  batch_size: int
  num_examples: int
  max_decode_len: int
  repetitions: int
  seed: int
  shape: str
  shape_auto: bool
  shape_choice: dict[str, Any] | None
  parents: list[int]
  chain_gamma: int
  chain_gamma_auto: bool
  chain_tokens_per_call: float
  chain_speedup: float
  tokens_per_call: float
  accepted_histogram: list[int]
  rank_rates: list[list[float]]
  baseline_ms_per_token: float
  tree_ms_per_token: float
  speedup_measured: float
  speedup_predicted: float
  speedup_predicted_steps_only: float
  greedy_identical: bool | None
  idle_check: dict[str, Any]
  date: str

  @property
  def key(self) -> tuple:
    return tree_key(self.task, self.draft, self.temperature,
                    AUTO if self.shape_auto else self.shape, self.batch_size)

  def to_json(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  @classmethod
  def from_json(cls, row: dict[str, Any]) -> TreeRow:
    return cls(**row)


def _rank_rates(outputs: Sequence[Any]) -> np.ndarray:
  """float64 `[depth, k]` rank rates pooled over fetched `TreeOutput`s."""
  accepted = np.sum([np.sum(o.stats.rank_accepted, axis=0) for o in outputs], axis=0)
  offered = np.sum([np.sum(o.stats.rank_offered, axis=0) for o in outputs], axis=0)
  return np.where(offered > 0, accepted / np.maximum(offered, 1), 0.0)


def _cost_model(chain: PointRow) -> theory.CostModel:
  """The chain row's measured costs as a `theory.CostModel` (a tree prices its draft calls
  at the chain's T_draft per token)."""
  return chain.cost_model_terms.cost_model(chain.t_verify_s, chain.t_draft_token_s)


def _predictions(chain: PointRow, costs: theory.CostModel, parents: np.ndarray,
                 rates: np.ndarray, draft_calls: int) -> dict[str, float]:
  """The tree's two predicted speedups from its rates, the chain row's costs (`costs`,
  `_cost_model`) and the draft's calls per iteration."""
  steps = chain.t_verify_s[parents.shape[0]] / chain.t_target_step_s + draft_calls * chain.c
  return dict(
      speedup_predicted=tree_choice.predicted_speedup(
          parents, rates, costs, draft_calls, chain.cost_model_terms.loop_tokens),
      speedup_predicted_steps_only=theory_trees.walltime_improvement(
          parents, theory_trees.rank_accept(parents, rates), steps))


def shaped_proposer(branches_of: Callable[[int, int], Proposer], shape: str) -> Proposer:
  """The proposer of a named shape: the draft's top-k branches (`branches_of(k, depth)`)
  and, for "+lookup<n>", the prompt's continuation as a chain of n (`PromptLookup`), tried
  after the branches, or before them for "lookup<n>+"."""
  parts = tree_shape(shape)
  branches = branches_of(parts.k, parts.depth)
  if not parts.lookup:
    return branches
  lookup = PromptLookup(depth=parts.lookup)
  return Merged((lookup, branches) if parts.lookup_first else (branches, lookup))


def choose_shape(exp: Experiment, point: Point, costs: theory.CostModel, target: LoadedTarget,
                 proposer_of: Callable[[int, int], Proposer], held_out: Sequence[Array]
                 ) -> tree_choice.TreeChoice:
  """`Experiment.tree` = 'auto': the shape "<k>x<depth>" of highest predicted speedup.

  The held-out batches are decoded (untimed) with `AUTO_MAX_BRANCHES` branches as deep
  as the budget (`settings.tree_budget`), which measures the acceptance of every rank at
  depth 1 and of each branch's child deeper; every k x depth within the budget is then
  priced with the chain row's cost model (`costs`, `_cost_model`; `tree_choice.make_choice`).
  """
  budget = tree_budget(exp)
  shapes = {f"{k}x{depth}": trees.branches(k, depth)
            for k in range(1, AUTO_MAX_BRANCHES + 1) for depth in range(1, budget // k + 1)}
  widest = proposer_of(AUTO_MAX_BRANCHES, budget)
  decoded = [tree_speculative_decode(
      target.scorer, widest, batch, jax.random.PRNGKey(exp.seed),
      max_decode_len=exp.max_decode_len, warp=Warp(point.temperature), eos_id=target.eos_id)
      for batch in held_out]
  outputs = distributed.fetch(decoded)
  return tree_choice.make_choice(_rank_rates(outputs), costs, shapes=shapes)


def _identity(exp: Experiment, point: Point, chain: PointRow) -> dict[str, Any]:
  """The fields that say what was measured (but the shape), and beside which chain."""
  return dict(
      experiment=exp.name, task=point.task, draft=draft_name(point.draft), target=exp.target,
      temperature=point.temperature, batch_size=point.batch_size,
      num_examples=exp.num_examples, max_decode_len=exp.max_decode_len,
      repetitions=exp.repetitions, seed=exp.seed, chain_gamma=chain.gamma,
      chain_gamma_auto=chain.gamma_auto, chain_tokens_per_call=chain.tokens_per_iteration,
      chain_speedup=chain.speedup_measured)


def _chosen(choice: tree_choice.TreeChoice | None) -> dict[str, Any]:
  """The fields that say whether 'auto' chose the shape, and why; and when it was measured."""
  return dict(shape_auto=choice is not None,
              shape_choice=None if choice is None else choice.to_json(),
              date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))


def measure_tree(exp: Experiment, point: Point, chain: PointRow, target: LoadedTarget,
                 proposer_of: Callable[[int, int], Proposer], batches: Sequence[Array],
                 held_out: Sequence[Array], greedy: measure.GreedyCheck) -> TreeRow:
  """Times the baseline against the tree loop over `batches`, beside the chain's row.

  Args:
    exp: the experiment (`tree`, max_decode_len, repetitions, seed, ...).
    point: the chain's point (task, draft, temperature, batch size).
    chain: the chain's row of `point` (its costs price the predictions).
    target: the loaded target.
    proposer_of: (k, depth) -> the tree's proposer over the chain's draft
      (`TargetKind.tree_proposer`).
    batches: the point's measured batches, as the chain's.
    held_out: batches outside them, where 'auto' chooses the shape (`choose_shape`).
    greedy: what a greedy point does when its tokens differ from the baseline's.

  Returns:
    The `TreeRow`.

  Raises:
    RuntimeError: at temperature 0, the tree's tokens differ from the baseline's (unless
      `greedy.enforce` is False).
    contention.ContentionError: another process was busy during the timing.
  """
  identity = _identity(exp, point, chain)
  costs = _cost_model(chain)
  choice = None
  shape = exp.tree
  if exp.tree == AUTO:
    choice = choose_shape(exp, point, costs, target, proposer_of, held_out)
    if not choice.helps:  # The target alone: the baseline itself, nothing to time.
      return TreeRow(
          **identity, **_chosen(choice), shape=TARGET_ALONE, parents=[-1],
          tokens_per_call=1.0, accepted_histogram=[], rank_rates=[list(r) for r in choice.rates],
          baseline_ms_per_token=chain.baseline_ms_per_token,
          tree_ms_per_token=chain.baseline_ms_per_token, speedup_measured=1.0,
          speedup_predicted=1.0, speedup_predicted_steps_only=1.0,
          greedy_identical=True if point.temperature == 0 else None, idle_check={})
    shape = choice.name
  proposer = shaped_proposer(proposer_of, shape)
  kwargs = dict(max_decode_len=exp.max_decode_len, warp=Warp(point.temperature),
                eos_id=target.eos_id)
  decoders = {
      "baseline": lambda batch, key: baseline.decode(target.scorer, batch, key, **kwargs),
      "speculative": lambda batch, key: tree_speculative_decode(
          target.scorer, proposer, batch, key, **kwargs)}
  with contention.quiet(f"{point} tree {exp.tree}") as checked:
    decoded = timing.time_decoders(decoders, batches, passes=exp.repetitions, seed=exp.seed,
                                   temperature=point.temperature,
                                   enforce_greedy=greedy.enforce, what=str(point))
  times = decoded.per_token
  tree = decoded.outputs["speculative"]
  parents = tree_parents(proposer)
  rates = _rank_rates(tree)
  tokens = sum(int(np.sum(o.stats.tokens)) for o in tree)
  calls = sum(int(np.sum(o.stats.iterations)) for o in tree)
  return TreeRow(
      **identity, **_chosen(choice), shape=shape, parents=parents.tolist(),
      tokens_per_call=tokens / max(calls, 1),
      accepted_histogram=np.sum([np.sum(o.stats.accepted_histogram, axis=0) for o in tree],
                                axis=0).astype(int).tolist(),
      rank_rates=rates.tolist(), baseline_ms_per_token=times["baseline_ms_per_token"],
      tree_ms_per_token=times["speculative_ms_per_token"],
      speedup_measured=times["speedup_measured"],
      **_predictions(chain, costs, parents, rates, tree_shape(shape).depth),
      greedy_identical=decoded.greedy_identical, idle_check=dict(checked.record()))


def tree_table(rows: Sequence[TreeRow]) -> str:
  """The trees beside their chains, one line per tree point."""
  head = ("| task | draft | T | chain gamma | chain tokens/call | chain speedup | tree | "
          "tree tokens/call | tree speedup | predicted (cost model) | predicted (steps) |")
  lines = [head, "|" + "---|" * (head.count("|") - 1)]
  for r in rows:
    gamma = f"{r.chain_gamma} (auto)" if r.chain_gamma_auto else str(r.chain_gamma)
    shape = f"{r.shape} (auto)" if r.shape_auto else r.shape
    lines.append(
        f"| {r.task} | {r.draft} | {r.temperature:g} | {gamma} | "
        f"{r.chain_tokens_per_call:.2f} | {r.chain_speedup:.2f}X | {shape} | "
        f"{r.tokens_per_call:.2f} | **{r.speedup_measured:.2f}X** | "
        f"{r.speedup_predicted:.2f}X | {r.speedup_predicted_steps_only:.2f}X |")
  return "\n".join(lines)
