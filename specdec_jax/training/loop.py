"""The training loop both drivers run: steps, the work due between them, stop signals.

`train_t5` (T5 targets and drafts) and `train_student` (decoder-only drafts) differ in
what a step computes and what is due between steps (progress lines, validation, alpha,
checkpoints); the loop is theirs in common. One batch per step, and the step is the data
position: a driver resumed from a checkpoint at step s passes the batches from s on, and
step s's random key is `fold_in(PRNGKey(seed + 1), s)` in every run. SIGTERM or Ctrl-C
ends the loop after the step in flight (`checkpointing.StopFlag`); the loop saves on the
way out, whatever ends it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax

from specdec_jax.training.checkpointing import StopFlag

Batch = dict[str, Any]
Metrics = dict[str, jax.Array]


@dataclasses.dataclass(frozen=True)
class Due:
  """Work between steps: `run(step, state, metrics)` after each step where `due(step)`.

  `metrics` are the step's (device arrays: reading them waits for the step).
  """

  due: Callable[[int], bool]
  run: Callable[[int, Any, Metrics], None]


def every(steps: int, total_steps: int) -> Callable[[int], bool]:
  """`due` for every `steps`-th step and the last one (`steps` <= 0: the last only)."""
  return lambda step: step == total_steps or (steps > 0 and step % steps == 0)


def train_loop(state: Any, batches: Iterator[Batch],
               train_step: Callable[[Any, Batch, jax.Array], tuple[Any, Metrics]], *,
               total_steps: int, seed: int, save: Callable[[int, Any], None],
               work: Sequence[Due] = ()) -> tuple[Any, Metrics | None]:
  """Steps `state` from its `state.step` to `total_steps`, or until a stop signal.

  Args:
    state: a `trainer.TrainState` (or any state with an integer `step`).
    batches: the batches from `state.step` on.
    train_step: `(state, batch, rng) -> (state, metrics)`.
    total_steps: where training ends.
    seed: the run's seed (step keys as the module docstring says).
    save: `(step, state)`, a checkpoint; called once on the way out.
    work: what is due between steps, run in this order.

  Returns:
    The state and the last step's metrics (None if no step ran).
  """
  rng = jax.random.PRNGKey(seed + 1)
  metrics = None
  with StopFlag() as stop:
    try:
      while int(state.step) < total_steps and not stop.requested:
        batch = next(batches)
        state, metrics = train_step(state, batch, jax.random.fold_in(rng, state.step))
        step = int(state.step)
        for item in work:
          if item.due(step):
            item.run(step, state, metrics)
    finally:
      save(int(state.step), state)
  return state, metrics
