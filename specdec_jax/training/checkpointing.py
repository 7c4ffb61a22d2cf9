"""Training-state checkpoints with Orbax: keep the last N, save every N steps and on signals.

What is saved is a pytree: the `TrainState` (step, params, optimizer state) and the run's
counters (wall time, tokens seen). The data position is the step itself: one batch per
step, and `batching.bucketed_batches(start_batch=step)` replays the stream
deterministically, so a resumed run sees the batches the interrupted one would have.
"""

from __future__ import annotations

import os
import signal
import types
from typing import Any

import jax
import orbax.checkpoint as ocp


class Checkpointer:
  """An Orbax `CheckpointManager` over `<model_dir>/checkpoints`.

  Args:
    model_dir: the run's directory.
    keep: number of most recent checkpoints kept.
  """

  def __init__(self, model_dir: str, *, keep: int = 2):
    if keep < 1:
      raise ValueError(f"keep must be >= 1, got {keep}.")
    self.directory = os.path.join(os.path.abspath(model_dir), "checkpoints")
    self._manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                             enable_async_checkpointing=False))

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def restore(self, like: Any) -> Any | None:
    """The latest saved pytree, shaped like `like`, or None if there is none."""
    step = self._manager.latest_step()
    if step is None:
      return None
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
    return self._manager.restore(step, args=ocp.args.StandardRestore(abstract))

  def save(self, step: int, item: Any) -> None:
    """Saves `item` as `step` (a no-op if that step is saved). Orbax writes atomically."""
    if self._manager.latest_step() == step:
      return
    self._manager.save(step, args=ocp.args.StandardSave(item), force=True)
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.close()


class StopFlag:
  """Turns SIGTERM (and SIGINT) into a flag that the training loop polls.

  The loop then saves a checkpoint and returns, instead of dying mid-step.
  """

  def __init__(self):
    self.requested = False
    self._previous: dict[int, object] = {}

  def _handle(self, signum: int, frame: types.FrameType | None) -> None:
    del frame
    self.requested = True
    print(f"Received signal {signum}: saving a checkpoint and stopping.", flush=True)

  def __enter__(self) -> StopFlag:
    for sig in (signal.SIGTERM, signal.SIGINT):
      self._previous[sig] = signal.signal(sig, self._handle)
    return self

  def __exit__(self, *exc) -> None:
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
