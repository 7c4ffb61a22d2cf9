"""Drafts ranked by the speedup the whole cost model predicts from their alpha and c.

Alpha alone does not choose a draft: a wider or deeper one agrees more and costs more per
proposed token. `rank_drafts` takes a target (any `Scorer`) and the drafts to rank (any
`Draft`, each a `DraftToRank`: the draft, its held-out alpha per temperature, where it
came from), and prices each under the whole cost model on the calibration batches: the
draft's seconds per token, so its c, timed in turn with the other drafts'; both loops'
own work and the target's (and a draft's) work once per sequence; the target's
T_verify(k) timed once for all. It records gamma* and the predicted speedups
(`DraftPrice`), and ranks the drafts by the model calls' speedup (`Ranking`). Timings
run inside the guard (`contention.quiet`: our registered jobs paused).

Which drafts, and their alpha, is the caller's: `draft_pricing.t5_runs` reads the T5
training runs and exported drafts (`python -m benchmarks draft_speedups`).
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from specdec_jax import contention
from specdec_jax.costs import gamma_choice, timing
from specdec_jax.decoding import programs
from specdec_jax.decoding.drafts import Draft
from specdec_jax.decoding.sampling import Warp
from specdec_jax.decoding.scorer import Scorer

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class DraftToRank:
  """One draft to price, and what its record keeps beside the prices.

  Attributes:
    name: its name in the ranking (unique).
    draft: the draft, its parameters placed as it will be timed.
    alphas: {temperature: held-out alpha (beta) against the target}; it is priced at
      each of these temperatures.
    params: its parameter count (recorded).
    model_dir: where it was read from (recorded; "" for none).
    recipe: how it was made, as JSON (recorded as it is: a training run's recipe and
      best step, an exported draft's directory and how its alpha was measured, ...).
  """

  name: str
  draft: Draft
  alphas: Mapping[float, float]
  params: int
  model_dir: str = ""
  recipe: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class DraftPrice:
  """A draft priced at one temperature.

  Attributes:
    alpha: the held-out alpha it was priced with.
    c: its seconds per proposed token over the target's T_step.
    gamma: gamma* under the whole cost model.
    speedup_cost_model: the whole cost model's speedup at `gamma`.
    speedup_thm38: Theorem 3.8's at `gamma` (verification free, no loop work).
    gamma_steps_only: the gamma of the best speedup of the model calls alone.
    speedup_steps_only: that speedup (alpha, c and T_verify(k)): what drafts are ranked by.
    choice: the whole decision (`gamma_choice.make_choice`).
  """

  alpha: float
  c: float
  gamma: int
  speedup_cost_model: float
  speedup_thm38: float
  gamma_steps_only: int
  speedup_steps_only: float
  choice: gamma_choice.GammaChoice

  @classmethod
  def of(cls, alpha: float, choice: gamma_choice.GammaChoice) -> DraftPrice:
    """The price `choice` makes with `alpha`."""
    steps_gamma = max(choice.speedup_steps_only, key=choice.speedup_steps_only.get)
    return cls(alpha=alpha, c=choice.c, gamma=choice.gamma,
               speedup_cost_model=choice.speedup_cost_model[choice.gamma],
               speedup_thm38=choice.speedup_thm38[choice.gamma],
               gamma_steps_only=steps_gamma,
               speedup_steps_only=choice.speedup_steps_only[steps_gamma], choice=choice)

  def to_json(self) -> dict[str, Any]:
    return {**{f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.name != "choice"}, "choice": self.choice.to_json()}


@dataclasses.dataclass(frozen=True)
class RankedDraft:
  """A draft's prices, one per temperature of its alpha.

  Attributes:
    name, model_dir, recipe, params: as its `DraftToRank`.
    by_temperature: {temperature: its price there}.
  """

  name: str
  model_dir: str
  recipe: Mapping[str, Any]
  params: int
  by_temperature: Mapping[float, DraftPrice]

  @property
  def mean_speedup_steps_only(self) -> float:
    """The model calls' best speedup, the mean over temperatures (what ranks it)."""
    return float(np.mean([p.speedup_steps_only for p in self.by_temperature.values()]))

  @property
  def mean_speedup_cost_model(self) -> float:
    return float(np.mean([p.speedup_cost_model for p in self.by_temperature.values()]))

  def to_json(self) -> dict[str, Any]:
    return {"model_dir": self.model_dir, "recipe": dict(self.recipe), "params": self.params,
            "by_temperature": {f"T={t:g}": p.to_json() for t, p in self.by_temperature.items()},
            "mean_speedup_steps_only": self.mean_speedup_steps_only,
            "mean_speedup_cost_model": self.mean_speedup_cost_model}


@dataclasses.dataclass(frozen=True)
class Ranking:
  """Drafts priced against one target, and how they were timed.

  Attributes:
    drafts: the priced drafts, in the order given (`ranked()`: best first).
    calibration_examples: rows the loop costs were measured over (all batches).
    batch_size: rows per calibration batch.
    timing_calls: calls per timed loop.
    timing_repeats: timed runs per loop.
    draft_gamma: the gamma the drafts' seconds per token were timed at.
    verify: the target's T_verify(k) (`timing.verify_times`).
    idle_check: the guard's record of the machine (`contention.Guard.record`).
    environment: `timing.environment()`.
    date: when it was priced (UTC, ISO 8601).
  """

  drafts: tuple[RankedDraft, ...]
  calibration_examples: int
  batch_size: int
  timing_calls: int
  timing_repeats: int
  draft_gamma: int
  verify: timing.VerifyTimes
  idle_check: Mapping[str, Any]
  environment: Mapping[str, Any]
  date: str

  def ranked(self) -> list[RankedDraft]:
    """The drafts, highest `mean_speedup_steps_only` first."""
    return sorted(self.drafts, key=lambda d: -d.mean_speedup_steps_only)

  def to_json(self) -> dict[str, Any]:
    """The JSON record (`figures.fig_draft_tradeoff` draws it): how the drafts were timed,
    the target's T_verify(k) / T_step, and per draft (`runs`, by name) its record."""
    verify = self.verify
    return {"calibration_examples": self.calibration_examples, "batch_size": self.batch_size,
            "timing_calls": self.timing_calls, "timing_repeats": self.timing_repeats,
            "draft_gamma": self.draft_gamma,
            "verify_ratio": {str(k): t / verify.t_step for k, t in verify.t_chunk.items()},
            "t_step_s": verify.t_step, "idle_check": dict(self.idle_check),
            "runs": {d.name: d.to_json() for d in self.drafts},
            "environment": dict(self.environment), "date": self.date}


def rank_drafts(target: Scorer, drafts: Sequence[DraftToRank], batches: Sequence[Array], *,
                eos_id: int, max_decode_len: int = 64, max_gamma: int = 8,
                timing_calls: int = 32, timing_repeats: int = 5) -> Ranking:
  """Prices every draft at each temperature of its alpha.

  Inside the guard: the target's T_verify(k) once; per temperature, every draft's
  seconds per proposed token at gamma 3, the drafts timed in turn
  (`timing.draft_token_times_rotated`: their c are compared with each other,
  so neither the machine's drift nor their order may decide); then, per draft, both
  loops' own work and the encoders (`timing.measure_loop_costs` over the
  calibration batches, the speculative loop at gamma 3 and at
  `timing.second_gamma`'s); the choice of gamma under the whole cost model with the
  draft's held-out alpha (`gamma_choice.make_choice`).

  The loops' own work is the same for drafts of one kind; measured per draft it differs
  by its noise alone, so it prices the drafts but does not rank them: they are ranked by
  the model calls' speedup (`DraftPrice.speedup_steps_only`).

  Args:
    target: the target's scorer (any family), its parameters placed.
    drafts: the drafts to price (any `Draft`: one that reads the target's encoder outputs
      or features is given them, `timing.target_encoded_for`).
    batches: int32 `[batch, input_len]` calibration inputs of the target, checked and cut
      to their length bucket, held out from the drafts' alpha; the first is what the
      steps are timed on.
    eos_id: the end-of-sequence id the loops stop at.
    max_decode_len: the most tokens per output.
    max_gamma: gamma candidates are 1..max_gamma.
    timing_calls: calls per timed loop (T_verify(k), T_draft).
    timing_repeats: timed runs per loop (the median is used).

  Returns:
    The `Ranking`.

  Raises:
    ValueError: no drafts or batches, two drafts of one name, or a draft without alpha.
  """
  names = [d.name for d in drafts]
  if not drafts or not batches:
    raise ValueError(f"rank_drafts: {len(drafts)} drafts and {len(batches)} batches; give "
                     "at least one of each.")
  if len(set(names)) != len(names):
    raise ValueError(f"rank_drafts: draft names {names} repeat; name each draft once.")
  if without := [d.name for d in drafts if not d.alphas]:
    raise ValueError(f"rank_drafts: {without} have no alpha; give each draft its held-out "
                     "alpha at one temperature at least.")
  gamma = min(timing.DEFAULT_CALIBRATION_GAMMA, max_gamma)
  cache_len, position = timing.timing_geometry(max_decode_len, max_gamma)
  first = batches[0]
  # What each draft reads of the target (its encoder outputs, its features), made once.
  encoded = {d.name: timing.target_encoded_for(d.draft, target, first) for d in drafts}
  temperatures = sorted({t for d in drafts for t in d.alphas})
  prices: dict[str, dict[float, DraftPrice]] = {name: {} for name in names}
  with contention.quiet("draft ranking") as guard:
    verify = timing.verify_times(target, first, max_gamma=max_gamma,
                                 max_decode_len=max_decode_len, calls=timing_calls,
                                 repeats=timing_repeats)
    t_chunk = verify.fitted(max_gamma)
    for t in temperatures:
      warp = Warp(temperature=t)
      priced = [d for d in drafts if t in d.alphas]
      t_draft = timing.draft_token_times_rotated(
          {d.name: (d.draft, first, encoded[d.name]) for d in priced},
          gamma=gamma, warp=warp, cache_len=cache_len, position=position, calls=timing_calls,
          repetitions=timing_repeats)
      for d in priced:
        loop_costs, _ = timing.measure_loop_costs(
            target, d.draft, batches, gamma=gamma, warp=warp, max_decode_len=max_decode_len,
            eos_id=eos_id, t_chunk=t_chunk, t_draft=t_draft[d.name],
            rng=jax.random.PRNGKey(0), repeats=timing_repeats, held_out=True,
            slope_gamma=timing.second_gamma(gamma, max_gamma))
        choice = gamma_choice.make_choice(d.alphas[t], verify.t_chunk, t_draft[d.name],
                                          loop_costs=loop_costs, spread=verify.spread,
                                          max_gamma=max_gamma)
        # Each draft compiles its loops per length bucket and gamma: seven drafts' programs
        # passed the kernel's 65,530 maps per process and compilation failed.
        programs.drop_when_crowded()
        prices[d.name][t] = DraftPrice.of(d.alphas[t], choice)
  return Ranking(
      drafts=tuple(RankedDraft(d.name, d.model_dir, d.recipe, d.params, prices[d.name])
                   for d in drafts),
      calibration_examples=sum(int(b.shape[0]) for b in batches),
      batch_size=int(first.shape[0]), timing_calls=timing_calls,
      timing_repeats=timing_repeats, draft_gamma=gamma, verify=verify,
      idle_check=guard.record(), environment=timing.environment(),
      date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
