"""Shared fixtures: small random T5 models of both families, and a hand-made results row."""

from __future__ import annotations

import dataclasses
import functools
import gc
import os
import tempfile

# Tests compile many small programs; LLVM's optimisations triple XLA:CPU compile
# times here and buy nothing at these sizes, and XLA:CPU's MLIR fusion emitters take
# 1.5-5X as long to compile as its loop emitters for the same run times (a sharded
# speculative loop on 8 devices: 11 s against 2.3 s). Benchmarks never import this
# file. The processes tests start pass the same flags (test_distributed,
# multidevice_checks).
XLA_TEST_FLAGS = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
os.environ.setdefault("XLA_FLAGS", XLA_TEST_FLAGS)
# The suite's own workers keep both cores busy: timing commands run in tests record
# their contention check but do not refuse (specdec_jax.contention).
os.environ.setdefault("SPECDEC_TIMING_GUARD", "off")
# Nor do they pause the developer's registered background jobs (training, signals), nor
# the jobs that the other worker's tests start: each worker (and what it starts) registers
# and pauses jobs in a folder of its own.
os.environ["SPECDEC_JOBS_DIR"] = tempfile.mkdtemp(prefix="specdec_test_jobs_")
# No persistent compilation cache, in the workers or the processes tests start (JAX
# reads this at import): XLA:CPU segfaults now and then in `executable.serialize()`, and
# a worker lost that way hung the whole run. The commands' cache has its own test.
os.environ["JAX_ENABLE_COMPILATION_CACHE"] = "false"

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from specdec_jax.costs import timing  # noqa: E402
from specdec_jax.decoding import baseline  # noqa: E402
from specdec_jax.decoding.sampling import Warp  # noqa: E402
from specdec_jax.experiment.record import Example, PointRow  # noqa: E402
from specdec_jax.models.t5 import (  # noqa: E402
  SharedEncoderModel,  # noqa: E402
  T5Model,
  get_config,
)
from specdec_jax.models.t5.checkpoints import save_hf_checkpoint  # noqa: E402
from specdec_jax.theory import LoopCosts  # noqa: E402

# The modules whose tests take a minute or more each (other processes, the 30-layer GGUF
# model), longest first. They run before the rest, so that the two workers end together
# instead of one finishing such a test alone at the end.
LONG_MODULES = ("test_llama_gguf.py", "test_distributed.py", "test_partitioning.py",
                "test_experiments.py", "test_device_check.py", "test_costs.py",
                "test_notebook.py")


@pytest.fixture(autouse=True, scope="module")
def _drop_compiled_programs():
  """Each test module ends by dropping every program it compiled (`jax.clear_caches`).

  Otherwise a worker keeps the programs of every module it ran. Late in full runs (past
  79%), a worker segfaulted inside XLA:CPU four times: three times serializing an executable
  for the persistent cache, once compiling one (`backend_compile_and_load`). And
  pytest-xdist 3.8's loadgroup scheduling hangs for good once a worker is lost. Programs
  are rarely shared across modules, so little is compiled twice.
  """
  yield
  jax.clear_caches()
  gc.collect()


@pytest.fixture(autouse=True)
def _one_loop_cost_pass(monkeypatch):
  """The loops' own work timed in one pass over the held-out batches.

  `timing.LOOP_COST_MIN_S` adds passes until a decoder has spent a second, for a
  fit from the millisecond decodings of the T5 pair; the tests' tiny models decode
  in milliseconds too, and would pay those passes in every calibration for nothing
  a test checks. `time_interleaved`'s own test covers the passes.
  """
  monkeypatch.setattr(timing, "LOOP_COST_MIN_S", 0.0)


def pytest_collection_modifyitems(config, items):
  del config
  rank = {name: i for i, name in enumerate(LONG_MODULES)}
  items.sort(key=lambda item: rank.get(item.path.name, len(LONG_MODULES)))  # Stable.


# Random T5s with T5X's init decode one token over and over; scaling the kernels
# makes them chaotic enough that greedy decoding exercises many tokens.
KERNEL_SCALE = {"test-v1_0": 3.0, "test-v1_1": 1.0}


def require_smollm2() -> str:
  """The SmolLM2 GGUF file, or this test failed with one line that gives the install command
  (`gguf_loader.smollm2_path`'s message) instead of a traceback from fixture setup."""
  from specdec_jax.models.llama import gguf_loader  # noqa: PLC0415 (the llama extra)
  try:
    return gguf_loader.smollm2_path()
  except FileNotFoundError as e:
    pytest.fail(str(e), pytrace=False)


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


def greedy_with_mid_run_eos(target, inputs, max_decode_len: int):
  """The target's greedy output without an EOS, an EOS id that row 0 first emits
  mid-run (so rows end at different lengths), and the greedy output with that EOS.

  Returns:
    (greedy, eos, want): the two `baseline.decode` outputs and the EOS id.
  """
  def decode(eos_id: int):
    return baseline.decode(target, inputs, jax.random.PRNGKey(0),
                           max_decode_len=max_decode_len, warp=Warp(), eos_id=eos_id)

  greedy = decode(-1)
  row = [int(t) for t in greedy.sequences[0]]
  eos = next(t for i, t in enumerate(row) if i >= 3 and t not in row[:i])
  want = decode(eos)
  assert len(set(np.asarray(want.lengths).tolist())) > 1
  return greedy, eos, want


def make_point_row(**fields) -> PointRow:
  """A measured point with every field set (En-De, batch 1, T = 0, gamma 2, 2X measured and
  predicted), `fields` replacing any of them: what the readers of results rows are tested on."""
  values = dict(
      experiment="test", task="ende", split="test", draft="draft", draft_spec="draft",
      target="target", temperature=0.0, gamma=2, batch_size=1, num_examples=2, input_len=16,
      max_decode_len=8, repetitions=1, seed=0, baseline_s=[0.2], speculative_s=[0.1],
      baseline_median_s=0.2, speculative_median_s=0.1, baseline_compile_s=1.0,
      speculative_compile_s=1.0, baseline_tokens=16, speculative_tokens=16,
      baseline_ms_per_token=12.5, speculative_ms_per_token=6.25, speedup_measured=2.0,
      speedup_walltime_ratio=2.0, alpha_empirical=0.7, alpha_beta=0.7, accepted=7, rejections=3,
      beta_sum=7.0, beta_count=10, iterations=8, loop_iterations=8, draft_forward_passes=16,
      tokens_per_iteration=2.0, accepted_histogram=[3, 2, 3], t_target_step_s=0.01,
      t_verify_s={1: 0.01, 2: 0.011, 3: 0.012}, verify_ratio={1: 1.0, 2: 1.1, 3: 1.2},
      t_draft_token_s=0.0005, c=0.05, step_timing_compile_s=1.0, speedup_predicted_thm38=2.0,
      speedup_predicted_cost_model=2.0, speedup_predicted_steps_only=2.0,
      speedup_predicted_cost_model_measured_tokens=2.0,
      cost_model_terms=LoopCosts(encode_target_s=0.0, encode_draft_s=0.0, step_overhead_s=0.0,
                                 iteration_overhead_s=0.0, batches=1, held_out=False,
                                 loop_tokens=8.0),
      greedy_identical=True, idle_check={}, idle_check_target_costs={},
      example=Example(tokens=[5, 6, 1], pieces=["\u2581Hallo", "\u2581Welt", "</s>"],
                      accepted_mask=[True, False, False]),
      environment={"cpu_model": "Test CPU", "cpu_vectors": "avx2"},
      date="2026-01-01T00:00:00+00:00", gamma_auto=False, gamma_choice=None)
  return PointRow(**{**values, **fields})


@pytest.fixture(scope="module")
def pair_dir(tmp_path_factory) -> str:
  """A tiny random T5.1.1 target (the committed vocabulary's 8,192 ids) and a copy of it
  perturbed by 5% as its draft, saved as HF checkpoints in `<dir>/target`, `<dir>/draft`."""
  root = str(tmp_path_factory.mktemp("models"))
  model, params = make_model("test-v1_1", seed=0, vocab_size=8192)
  params = jax.device_get(params)
  save_hf_checkpoint(os.path.join(root, "target"), model.config, params)
  save_hf_checkpoint(os.path.join(root, "draft"), model.config,
                     jax.tree.map(lambda x: x * 1.05, params))
  return root


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

