"""One process of the two-process CPU job started by `test_distributed.py`.

Usage: python multihost_worker.py COORDINATOR NUM_PROCESSES PROCESS_ID OUT_JSON [OUT_DIR GIN_FILE]

Each process owns 2 CPU devices; together they form one (data=2, model=2)
mesh: rows split across the processes, heads within each. Both decode the same
inputs with the baseline and with speculative sampling, and process 0 writes
the gathered outputs to OUT_JSON; then, given GIN_FILE (which binds the mesh),
both run `experiments.run` on it into OUT_DIR. One job does both, so the suite
starts the two processes once.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

import jax
import numpy as np
from jax.experimental import multihost_utils

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # experiments
from conftest import make_model  # noqa: E402

from specdec_jax import distributed, partitioning  # noqa: E402
from specdec_jax.models.options import DecodeOptions  # noqa: E402
from specdec_jax.models.t5 import (  # noqa: E402
  T5Draft,
  T5Model,
  speculative_sample,
  temperature_sample,
)

# Shared with test_distributed.py, which decodes the same on one device.
CONFIG = dict(vocab_size=96, num_layers=1, num_decoder_layers=1)
BATCH, INPUT_LEN, MAX_LEN, GAMMA = 4, 6, 10, 3
DRAFT_SCALE = 1.2  # The draft: the target with scaled weights.


def decode_all(model: T5Model, params: dict, inputs: jax.Array) -> dict[str, jax.Array]:
  """Greedy baseline and sampled speculative sequences `[batch, MAX_LEN]`."""
  draft = T5Draft(model, jax.tree.map(lambda p: p * DRAFT_SCALE, params))
  base = temperature_sample(model, params, inputs, max_decode_len=MAX_LEN)
  spec = speculative_sample(model, params, draft, inputs, gamma=GAMMA, max_decode_len=MAX_LEN,
                            temperature=1.0, rng=jax.random.PRNGKey(5))
  return {"base_greedy": base.sequences, "spec_sampled": spec.sequences}


def inputs_for_test() -> np.ndarray:
  """int32 `[BATCH, INPUT_LEN]` encoder tokens."""
  return np.random.RandomState(0).randint(2, 96, (BATCH, INPUT_LEN)).astype(np.int32)


def main(coordinator: str, num_processes: int, process_id: int, out_json: str,
         out_dir: str | None = None, gin_file: str | None = None) -> None:
  jax.config.update("jax_num_cpu_devices", 2)
  distributed.maybe_initialize(coordinator, num_processes, process_id, timeout_s=60)
  assert jax.process_count() == num_processes and jax.device_count() == 2 * num_processes
  model, params = make_model("test-v1_1", 0, **CONFIG)
  mesh = partitioning.make_mesh(num_processes, 2)
  model = dataclasses.replace(model, options=DecodeOptions.for_backend(devices=mesh.size))
  with jax.set_mesh(mesh):
    outputs = decode_all(model, partitioning.shard_params(model, params, mesh),
                         partitioning.shard_batch(inputs_for_test(), mesh))
  gathered = {k: multihost_utils.process_allgather(v, tiled=True).tolist()
              for k, v in outputs.items()}
  if distributed.is_primary():
    with open(out_json, "w") as f:
      json.dump(gathered, f)
  if gin_file:
    from specdec_jax.experiment import gin_flags, runner
    from specdec_jax.experiment.measure import GreedyCheck
    exp = gin_flags.load_experiment([gin_file], [])
    runner.run(exp, out_dir, greedy=GreedyCheck(), placement=gin_flags.placement())


if __name__ == "__main__":
  main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), *sys.argv[4:])
