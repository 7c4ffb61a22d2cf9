"""Two processes on one machine decode over one global mesh, as two hosts of a pod would."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import multihost_worker as worker
import numpy as np
import pytest
from conftest import make_model

from specdec_jax import distributed

TIMEOUT_S = 240


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def test_two_processes_agree_with_one_device(tmp_path):
  address = f"127.0.0.1:{_free_port()}"
  out = tmp_path / "outputs.json"
  env = dict(os.environ, XLA_FLAGS="--xla_backend_optimization_level=0", JAX_PLATFORMS="cpu")
  script = os.path.join(os.path.dirname(__file__), "multihost_worker.py")
  procs = [subprocess.Popen([sys.executable, script, address, "2", str(i), str(out)], env=env,
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
  got = json.loads(out.read_text())
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
