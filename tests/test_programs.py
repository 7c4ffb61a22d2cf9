"""Compiled programs stay until the process nears its memory-map limit
(`programs.drop_when_crowded`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specdec_jax.decoding import programs


def _compiled_once() -> object:
  """A jitted function with one compiled program."""
  fn = jax.jit(lambda x: x * 2 + 1)
  fn(jnp.ones(3))
  assert fn._cache_size() == 1  # noqa: SLF001
  return fn


def test_this_process_maps_are_counted_against_the_kernels_limit():
  used, limit = programs.memory_maps()  # The suite runs on Linux.
  assert 0 < used < limit


def test_programs_stay_while_the_maps_are_few(monkeypatch):
  monkeypatch.setattr(programs, "memory_maps", lambda: (1000, 65530))
  fn = _compiled_once()
  assert programs.drop_when_crowded() is False
  assert fn._cache_size() == 1  # noqa: SLF001


def test_programs_are_dropped_past_the_fraction_of_the_limit(monkeypatch):
  monkeypatch.setattr(programs, "memory_maps", lambda: (40000, 65530))
  fn = _compiled_once()
  assert programs.drop_when_crowded() is True
  assert fn._cache_size() == 0  # noqa: SLF001


def test_programs_are_dropped_where_the_maps_cannot_be_counted(monkeypatch):
  monkeypatch.setattr(programs, "memory_maps", lambda: None)
  fn = _compiled_once()
  assert programs.drop_when_crowded() is True
  assert fn._cache_size() == 0  # noqa: SLF001
