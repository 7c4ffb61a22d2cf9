"""Two processes on one machine decode over one global mesh, as two hosts of a pod would."""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys

import jax
import multihost_worker as worker
import numpy as np
import pytest
from conftest import XLA_TEST_FLAGS, make_model

from specdec_jax import distributed
from specdec_jax.experiment import results_io
from specdec_jax.models.t5.checkpoints import save_hf_checkpoint

TIMEOUT_S = 240
VOCAB = 8192  # The committed SentencePiece model's size (experiments tokenize with it).


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _run_two_processes(*args: str) -> None:
  """Runs multihost_worker.py as processes 0 and 1 of one job; fails with their logs."""
  address = f"127.0.0.1:{_free_port()}"
  env = dict(os.environ, XLA_FLAGS=XLA_TEST_FLAGS, JAX_PLATFORMS="cpu")
  script = os.path.join(os.path.dirname(__file__), "multihost_worker.py")
  procs = [subprocess.Popen([sys.executable, script, address, "2", str(i), *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
           for i in range(2)]
  logs = []
  try:
    for p in procs:
      logs.append(p.communicate(timeout=TIMEOUT_S)[0])
  finally:
    for p in procs:
      p.kill()
  assert all(p.returncode == 0 for p in procs), "\n\n".join(logs)[-4000:]


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory) -> tuple[pathlib.Path, pathlib.Path]:
  """One two-process job (`multihost_worker.py`): both decode, then both run an experiment.

  Returns the gathered outputs' JSON and the experiment's output directory.
  """
  tmp_path = tmp_path_factory.mktemp("two_processes")
  model, params = make_model("test-v1_1", 0, vocab_size=VOCAB)
  params = jax.device_get(params)
  save_hf_checkpoint(str(tmp_path / "models" / "target"), model.config, params)
  save_hf_checkpoint(str(tmp_path / "models" / "draft"), model.config,
                     jax.tree.map(lambda x: x * 1.05, params))
  bindings = {
      "Experiment.name": "'two_hosts'", "Experiment.models_dir": repr(str(tmp_path / "models")),
      "Experiment.drafts": "['draft']", "Experiment.tasks": "['ende']",
      "Experiment.num_examples": "2", "Experiment.batch_sizes": "[2]",
      "Experiment.temperatures": "[0.0]", "Experiment.gammas": "[2]",
      "Experiment.max_decode_len": "8", "Experiment.input_len": "16",
      "Experiment.repetitions": "1", "Experiment.timing_calls": "2",
      "Experiment.timing_repeats": "1", "Experiment.timing_rounds": "1",
      "make_mesh.data": "2", "make_mesh.model": "2"}
  gin_file = tmp_path / "two_hosts.gin"
  gin_file.write_text("".join(f"{k} = {v}\n" for k, v in bindings.items()))
  outputs, out = tmp_path / "outputs.json", tmp_path / "out"
  _run_two_processes(str(outputs), str(out), str(gin_file))
  return outputs, out


@pytest.mark.xdist_group("two_processes")
def test_two_processes_agree_with_one_device(two_processes):
  got = json.loads(two_processes[0].read_text())
  model, params = make_model("test-v1_1", 0, **worker.CONFIG)
  want = worker.decode_all(model, params, worker.inputs_for_test())
  for name, sequences in want.items():
    np.testing.assert_array_equal(np.asarray(got[name]), np.asarray(sequences), err_msg=name)


def test_single_process_without_coordinator():
  assert not distributed.maybe_initialize()
  assert distributed.is_primary()


def test_coordinator_needs_process_counts():
  with pytest.raises(ValueError, match="num_processes and process_id"):
    distributed.maybe_initialize("127.0.0.1:1234")
  with pytest.raises(ValueError, match="process_id=2"):
    distributed.maybe_initialize("127.0.0.1:1234", 2, 2)


@pytest.mark.xdist_group("two_processes")
def test_two_processes_run_an_experiment(two_processes):
  """experiments.run across two processes: rows split over them, process 0 writes."""
  rows = results_io.read_points(str(two_processes[1] / results_io.RESULTS_FILE))
  assert len(rows) == 1  # Written once, by process 0.
  assert rows[0].batch_size == 2 and rows[0].greedy_identical is True
  assert rows[0].baseline_tokens == rows[0].speculative_tokens > 0
