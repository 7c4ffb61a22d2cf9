"""The training loop both drivers run (`training.loop`): work due between steps, the step
keys of a resumed run, a stop signal, and the save on the way out."""

from __future__ import annotations

import dataclasses
import itertools
import os
import signal

import jax
import numpy as np
import pytest

from specdec_jax.training import loop


@dataclasses.dataclass(frozen=True)
class _State:
  step: int
  seen: tuple = ()  # (batch, first word of the step's key) per step.


def _step(state: _State, batch: int, rng: jax.Array):
  word = int(np.asarray(rng).ravel()[-1])
  return _State(state.step + 1, state.seen + ((batch, word),)), {"loss": batch}


def _run(start: int, total: int, work=(), step=_step):
  saved = []
  state, metrics = loop.train_loop(_State(start), itertools.count(start), step,
                                   total_steps=total, seed=3,
                                   save=lambda s, st: saved.append(s), work=work)
  return state, metrics, saved


def test_work_runs_where_due_and_the_loop_saves_once_at_the_end():
  runs = []
  due = loop.Due(loop.every(3, 7), lambda step, st, m: runs.append((step, st.step, m["loss"])))
  state, metrics, saved = _run(0, 7, [due])
  assert runs == [(3, 3, 2), (6, 6, 5), (7, 7, 6)]
  assert state.step == 7 and metrics == {"loss": 6} and saved == [7]
  assert [b for b, _ in state.seen] == list(range(7))
  assert loop.every(0, 7)(6) is False and loop.every(0, 7)(7) is True


def test_a_resumed_run_steps_with_the_uninterrupted_runs_keys():
  whole = _run(0, 6)[0].seen
  resumed = _run(4, 6)[0].seen
  assert resumed == whole[4:]
  assert len({w for _, w in whole}) == 6  # Each step its own key.


def test_a_stop_signal_ends_the_loop_after_the_step_in_flight_and_saves_it():
  before = signal.getsignal(signal.SIGTERM)
  stop = loop.Due(lambda step: step == 2, lambda *_: os.kill(os.getpid(), signal.SIGTERM))
  state, _, saved = _run(0, 10, [stop])
  assert state.step == 2 and saved == [2]
  assert signal.getsignal(signal.SIGTERM) == before  # The handler is restored.


def test_a_failing_step_still_saves_what_was_done():
  def failing(state, batch, rng):
    if state.step == 3:
      raise RuntimeError("boom")
    return _step(state, batch, rng)

  saved = []
  with pytest.raises(RuntimeError, match="boom"):
    loop.train_loop(_State(0), itertools.count(), failing, total_steps=9, seed=0,
                    save=lambda s, st: saved.append(s))
  assert saved == [3]
