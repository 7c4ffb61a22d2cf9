"""Multi-process (multi-host) start-up: one JAX process per host, one global device mesh.

Every process runs the same program. After `maybe_initialize`, `jax.devices()`
lists the devices of all processes, `partitioning.make_mesh` spans them, and
`partitioning.shard_params` / `shard_batch` assemble global arrays from each
process's full copy of the params and inputs. Only the primary process
(`is_primary()`) should write results; `fetch` brings arrays that span processes
back to every host.

Call `maybe_initialize` before anything touches a JAX device. On CPU, JAX 0.10
runs cross-process collectives over gloo (`jax_cpu_collectives_implementation`,
already the default); `jax_num_cpu_devices` sets the devices per process.
"""

from __future__ import annotations

import glob
import importlib.util
from collections.abc import Sequence

import jax
import numpy as np
from jax.experimental import multihost_utils


def _on_cloud_tpu_vm() -> bool:
  """True on a Cloud TPU VM: libtpu is installed and TPU chips are present."""
  has_chips = bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))
  return has_chips and importlib.util.find_spec("libtpu") is not None


def maybe_initialize(coordinator_address: str | None = None, num_processes: int | None = None,
                     process_id: int | None = None, *,
                     local_device_ids: Sequence[int] | None = None,
                     timeout_s: int = 300) -> bool:
  """Joins a multi-process JAX job when asked to, or on a Cloud TPU VM.

  Args:
    coordinator_address: "host:port" of process 0's coordinator. With it,
      `num_processes` and `process_id` are required; without it, a Cloud TPU VM
      (pod slice or single host) is initialised from its metadata, and
      anything else stays a single process.
    num_processes: the number of processes in the job.
    process_id: this process's index, 0 ... num_processes - 1.
    local_device_ids: the local devices this process owns (default: all).
    timeout_s: how long to wait for the other processes to join.

  Returns:
    True if this process is now part of a `jax.distributed` job.
  """
  if jax.distributed.is_initialized():
    return True
  if coordinator_address is None:
    if num_processes is not None or process_id is not None:
      raise ValueError("num_processes and process_id need a coordinator_address "
                       "('host:port' of process 0).")
    if not _on_cloud_tpu_vm():
      return False
    jax.distributed.initialize(initialization_timeout=timeout_s)
    return True
  if num_processes is None or process_id is None:
    raise ValueError(f"coordinator_address={coordinator_address!r} also needs num_processes "
                     "and process_id (this process's index).")
  if not 0 <= process_id < num_processes:
    raise ValueError(f"process_id={process_id} must be in [0, num_processes={num_processes}).")
  jax.distributed.initialize(coordinator_address, num_processes, process_id,
                             local_device_ids=local_device_ids,
                             initialization_timeout=timeout_s)
  return True


def is_primary() -> bool:
  """True in the process that writes results (process 0)."""
  return jax.process_index() == 0


def fetch(tree):
  """Numpy copies of the arrays in `tree`, whole, on every process.

  In one process this is `jax.device_get`. Across processes an array split over
  the mesh (e.g. batch rows over "data") lives partly on other hosts, which
  `device_get` refuses; it is all-gathered instead (a collective: every process
  must call `fetch` on the same arrays).
  """
  if jax.process_count() == 1:
    return jax.device_get(tree)
  return jax.tree.map(np.asarray, multihost_utils.process_allgather(tree, tiled=True))


def agreed(values: Sequence[float]) -> list[float]:
  """Process 0's `values` on every process (a collective: every process must call it).

  Each process times the same global programs but reads its own clock; a
  decision from times that differed between processes would make them run
  different programs. In one process this returns the values unchanged.

  Args:
    values: `[n]` numbers, the same n on every process.

  Returns:
    Process 0's `[n]` values, as floats.
  """
  return list(map(float, multihost_utils.broadcast_one_to_all(np.array(values))))
