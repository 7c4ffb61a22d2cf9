"""Shared fixtures: small random T5 models of both families."""

from __future__ import annotations

import dataclasses
import functools
import os
import shutil
import tempfile

# Tests compile many small programs; LLVM's optimisations triple XLA:CPU compile
# times here and buy nothing at these sizes. Benchmarks never import this file.
os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0")
# The suite's own workers keep both cores busy: timing commands run in tests record
# their contention check but do not refuse (specdec_jax.contention).
os.environ.setdefault("SPECDEC_TIMING_GUARD", "off")

import jax  # noqa: E402
import pytest  # noqa: E402

from specdec_jax.models.t5 import (  # noqa: E402
    SharedEncoderModel,  # noqa: E402
    T5Model,
    get_config,
)

CACHE_ENV = "JAX_COMPILATION_CACHE_DIR"


def pytest_configure(config):
  """One XLA compilation cache per run, shared by the workers and the processes tests start.

  Many tests compile the same small programs in other processes (the other
  worker, a command run as a user runs it); each compiles once. The
  controller makes it before it starts the workers, which inherit it, and
  removes it at the end. A cache set by the caller is kept as it is.
  """
  if hasattr(config, "workerinput") or CACHE_ENV in os.environ:
    return
  os.environ[CACHE_ENV] = config._specdec_cache = tempfile.mkdtemp(prefix="specdec_xla_")
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
  jax.config.update("jax_compilation_cache_dir", os.environ[CACHE_ENV])  # Imported already.
  jax.config.update("jax_persistent_cache_min_compile_time_secs",
                    float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]))


# The modules whose tests take a minute or more each (other processes, the 30-layer GGUF
# model), longest first. They run before the rest, so that the two workers end together
# instead of one finishing such a test alone at the end.
LONG_MODULES = ("test_llama_gguf.py", "test_distributed.py", "test_partitioning.py",
                "test_experiments.py", "test_device_check.py", "test_costs.py",
                "test_notebook.py")


def pytest_collection_modifyitems(config, items):
  del config
  rank = {name: i for i, name in enumerate(LONG_MODULES)}
  items.sort(key=lambda item: rank.get(item.path.name, len(LONG_MODULES)))  # Stable.


def pytest_unconfigure(config):
  if getattr(config, "_specdec_cache", None):
    shutil.rmtree(config._specdec_cache, ignore_errors=True)

# Random T5s with T5X's init decode one token over and over; scaling the kernels
# makes them chaotic enough that greedy decoding exercises many tokens.
KERNEL_SCALE = {"test-v1_0": 3.0, "test-v1_1": 1.0}


def make_model(name: str, seed: int = 0, **overrides) -> tuple[T5Model, dict]:
  """A small random model of config `name` (see `NAMED_CONFIGS`) and its params."""
  model = T5Model(get_config(name, **overrides))
  return model, _random_params(name, seed, model)


def make_shared_encoder_pair() -> tuple[T5Model, dict, SharedEncoderModel, dict]:
  """A small random target and a one-layer shared-encoder student reading its encoder:
  (target, its params, student, the student's params)."""
  target, target_params = make_model("test-v1_1", seed=0, num_decoder_layers=2)
  cfg = dataclasses.replace(target.config, d_model=16, num_heads=2, d_ff=32,
                            num_decoder_layers=1)
  student = SharedEncoderModel(cfg, target.config.d_model)
  return target, target_params, student, student.init_params(jax.random.PRNGKey(5))


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

