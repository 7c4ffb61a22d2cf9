"""What every measured row records about where it ran, and what the timing loops run."""

from __future__ import annotations

import os
import re
import subprocess
import time

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import make_model

from specdec_jax.costs import timing
from specdec_jax.decoding.sampling import Warp
from specdec_jax.models.t5 import T5Draft, T5Scorer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_environment_names_the_code_it_measured():
  env = timing.environment()
  assert env["backend"] and env["cpu_count"] >= 1
  with open("/proc/cpuinfo") as f:
    avx512 = " avx512f " in f.read().replace("\n", " ")
  assert (env["cpu_vectors"] == "avx512f") == avx512
  head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short=12", "HEAD"],
                        capture_output=True, text=True).stdout.strip()
  if not head:  # Not a git checkout (an installed copy): nothing to name.
    assert "git_commit" not in env
    return
  assert re.fullmatch(r"[0-9a-f]{12}(\+changes)?", env["git_commit"])
  assert env["git_commit"].startswith(head)


def test_the_timed_pair_runs_and_checks_its_position():
  target, target_params = make_model("test-v1_1")
  draft_model, draft_params = make_model("test-v1_1", seed=1)
  scorer = T5Scorer(target, target.prepare(target_params))
  draft = T5Draft(draft_model, draft_params)
  inputs = jnp.asarray(np.random.RandomState(0).randint(2, 97, size=(1, 8)), jnp.int32)
  pair = timing.propose_verify_time(scorer, draft, inputs, gamma=3, warp=Warp(0.0),
                                    cache_len=12, position=4, calls=2, repeats=1)
  assert pair.seconds > 0
  with pytest.raises(ValueError, match="must fit in cache_len=12"):
    timing.propose_verify_time(scorer, draft, inputs, gamma=3, warp=Warp(0.0),
                                     cache_len=12, position=8, calls=2, repeats=1)


@pytest.mark.parametrize("min_s,max_passes,want", [
    (0.0, 8, (1, 1)),  # Off: the passes asked for.
    (0.035, 8, (2, 4)),  # Each call sleeps >= 10 ms: 4 passes add up to 40 ms at most.
    (10.0, 3, (3, 3)),  # Never reached: stopped at max_passes.
])
def test_time_interleaved_adds_passes_until_each_decoder_has_min_s(min_s, max_passes, want):
  decoders = {name: (lambda i: time.sleep(0.01) or jnp.zeros(())) for name in "ab"}
  timings, outputs = timing.time_interleaved(decoders, 1, 1, min_s=min_s,
                                             max_passes=max_passes)
  for t in timings.values():
    assert want[0] <= len(t.calls_s) <= want[1]
    assert len(t.calls_s) == len(timings["a"].calls_s)
  assert all(len(o) == 1 for o in outputs.values())  # The first pass's outputs.


def test_time_rotated_calls_each_program_once_untimed_then_in_rotated_order():
  calls = []
  programs = {name: (lambda name=name: calls.append(name) or jnp.zeros(())) for name in "abc"}
  seconds = timing.time_rotated(programs, repetitions=3)
  assert calls == list("abc") + list("abc") + list("bca") + list("cab")
  assert sorted(seconds) == list("abc")
  assert all(len(s) == 3 and min(s) >= 0 for s in seconds.values())
