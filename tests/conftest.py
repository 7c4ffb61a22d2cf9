"""Shared fixtures: small random T5 models of both families."""

from __future__ import annotations

import functools
import os

# Tests compile many small programs; LLVM's optimisations triple XLA:CPU compile
# times here and buy nothing at these sizes. Benchmarks never import this file.
os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0")
# The suite's own workers keep both cores busy: timing commands run in tests record
# their contention check but do not refuse (specdec_jax.contention).
os.environ.setdefault("SPECDEC_TIMING_GUARD", "off")

import jax  # noqa: E402
import pytest  # noqa: E402

from specdec_jax.models import T5Model, get_config  # noqa: E402

# Random T5s with T5X's init decode one token over and over; scaling the kernels
# makes them chaotic enough that greedy decoding exercises many tokens.
KERNEL_SCALE = {"test-v1_0": 3.0, "test-v1_1": 1.0}


def make_model(name: str, seed: int = 0, **overrides) -> tuple[T5Model, dict]:
  """A small random model of config `name` (see `NAMED_CONFIGS`) and its params."""
  model = T5Model(get_config(name, **overrides))
  return model, _random_params(name, seed, model)


@functools.cache
def _random_params(name: str, seed: int, model: T5Model) -> dict:
  # Cached: initialisation compiles one PRNG program per parameter (seconds).
  params = model.init_params(jax.random.PRNGKey(seed))
  scale = KERNEL_SCALE[name]
  params = jax.tree_util.tree_map_with_path(
      lambda path, x: x * scale if "kernel" in jax.tree_util.keystr(path) else x, params)
  return params


@pytest.fixture(params=["test-v1_0", "test-v1_1"])
def family(request) -> str:
  """Both architecture families users bring: T5 v1.0 and T5.1.1 / Flan-T5."""
  return request.param


@pytest.fixture(scope="module")
def one_torch_thread():
  """PyTorch on one thread for a module: its pool spins badly on a loaded 2-core machine,
  and the models it runs in the tests are small."""
  import torch  # noqa: PLC0415  (only the modules that compare against PyTorch need it)

  threads = torch.get_num_threads()
  torch.set_num_threads(1)
  yield
  torch.set_num_threads(threads)

