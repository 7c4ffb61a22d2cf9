"""The accelerator check's own measurements (`experiments.device_check`): jax#40101's small
writes into large buffers, and the target's step at a long cache.

Both are context for the decode runs on a new device: an in-place write costs the same
at any buffer size, and a step at a longer cache costs about the extra bytes it reads; the
regression of jax#40101 (XLA:CPU from jaxlib 0.11.1, updates under 256 bytes inside a loop)
rewrites the whole buffer on every write instead.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.costs import timing
from specdec_jax.data import prompts
from specdec_jax.decoding import buckets
from specdec_jax.experiment.settings import Experiment
from specdec_jax.experiment.targets.interface import LoadedTarget
from specdec_jax.models.t5 import T5Config

Array = jax.Array

# jax#40101: per-write time at the large buffer over the small one; an in-place write stays
# near 1.
WRITE_RATIO_LIMIT = 2.0
# The step at a long cache: its time ratio allowed over the ratio of bytes read.
CACHE_RATIO_SLACK = 1.5


@dataclasses.dataclass(frozen=True)
class WriteCheck:
  """One write of the jax#40101 check on one backend.

  Attributes:
    backend: the jax backend ("gpu", "tpu", "cpu").
    device_kind: its device.
    write: which of our writes (`write_cases`).
    update_shape: the written slice's shape (one position).
    dtype: its dtype.
    update_bytes: its bytes.
    buffer_lengths: (small, large) positions of the buffer written into.
    seconds_per_write: at each buffer length, the median over repeats.
    compile_s: both loops' compile time.
  """

  backend: str
  device_kind: str
  write: str
  update_shape: tuple[int, ...]
  dtype: str
  update_bytes: int
  buffer_lengths: tuple[int, int]
  seconds_per_write: tuple[float, float]
  compile_s: float

  @property
  def ratio(self) -> float:
    """Seconds per write at the large buffer over the small one (in place: near 1)."""
    return self.seconds_per_write[1] / self.seconds_per_write[0]

  @property
  def verdict(self) -> str:
    return "pass" if self.ratio < WRITE_RATIO_LIMIT else "warn"


@functools.partial(jax.jit, static_argnames=("axis", "calls"), donate_argnums=0)
def write_loop(buffer: Array, update: Array, *, axis: int, calls: int) -> Array:
  """Writes `update` into `buffer` `calls` times, at positions 0, 1, ... of `axis` (wrapping).

  Args:
    buffer: any shape, donated: the loop may update it in place.
    update: `buffer`'s shape with one position on `axis`.
    axis: the position axis.
    calls: writes (loop iterations).

  Returns:
    The buffer after the writes.
  """
  slots = buffer.shape[axis] - update.shape[axis] + 1

  def body(i: Array, buf: Array) -> Array:
    index = [jnp.zeros((), jnp.int32)] * buf.ndim
    index[axis] = (i % slots).astype(jnp.int32)
    return jax.lax.dynamic_update_slice(buf, update, tuple(index))

  return jax.lax.fori_loop(0, calls, body, buffer)


def write_cases(draft: T5Config, dtype: str) -> dict[str, tuple[tuple[int, ...], str, int]]:
  """Our smallest loop writes at batch 1: name -> (update shape, dtype, position axis).

  The baseline writes one int32 token per step into `[batch, max_decode_len]`;
  a draft layer writes one position of keys `[heads, d_kv, 1]` and values
  `[heads, 1, d_kv]` into its cache (`kernels.DecoderCache` layouts).
  """
  heads, d_kv = draft.num_heads, draft.d_kv
  return {"token": ((1, 1), "int32", 1),
          "draft_key_cache": ((heads, d_kv, 1), dtype, 2),
          "draft_value_cache": ((heads, 1, d_kv), dtype, 1)}


def seconds_per_write(device: jax.Device, shape: tuple[int, ...], dtype: str, axis: int,
                      length: int, calls: int, repeats: int) -> tuple[float, float]:
  """(median seconds per write, compile seconds) of `write_loop` on a buffer of `length`."""
  update = jnp.ones(shape, dtype, device=device)
  buffer_shape = list(shape)
  buffer_shape[axis] = length
  state = [jnp.zeros(buffer_shape, dtype, device=device)]

  def call() -> Array:
    state[0] = write_loop(state[0], update, axis=axis, calls=calls)
    return state[0]

  timed = timing.time_calls(call, repeats)
  return timed.median_s / calls, timed.compile_s


def check_jax_40101(draft: T5Config, dtype: str, write_bytes: Sequence[int], calls: int,
                    repeats: int, log: Callable[[str], Any]) -> list[WriteCheck]:
  """Every write case of `draft` (`write_cases`) on the default backend and on the CPU.

  Args:
    draft: the draft whose cache writes are timed.
    dtype: the dtype its cache holds.
    write_bytes: (small, large) buffer sizes in bytes.
    calls: writes per timed loop.
    repeats: timed runs of each loop (the median is used).
    log: says each result.
  """
  rows = []
  for backend in dict.fromkeys([jax.default_backend(), "cpu"]):
    device = jax.devices(backend)[0]
    for name, (shape, case_dtype, axis) in write_cases(draft, dtype).items():
      position_bytes = int(np.prod(shape)) * jnp.dtype(case_dtype).itemsize
      lengths = tuple(max(b // position_bytes, 2) for b in write_bytes)
      (small_s, small_compile), (large_s, large_compile) = (seconds_per_write(
          device, shape, case_dtype, axis, n, calls, repeats) for n in lengths)
      rows.append(WriteCheck(backend, device.device_kind, name, shape, case_dtype,
                             position_bytes, lengths, (small_s, large_s),
                             small_compile + large_compile))
      log(f"jax#40101 {backend} {name} ({position_bytes} B): {1e6 * small_s:.2f} -> "
          f"{1e6 * large_s:.2f} us/write at {lengths[0]} -> {lengths[1]} positions "
          f"({rows[-1].ratio:.2f}X)")
  return rows


@dataclasses.dataclass(frozen=True)
class CacheCheck:
  """The target's one-token step at the decoders' cache and at a long one.

  Attributes:
    run: the run whose target and first batch size were timed.
    batch_size: rows per step.
    cache_lengths: (the decoders', long) cache positions.
    t_step_s: T_step at each.
    state_bytes: bytes of the state a step reads at each (`Scorer.init_state`).
  """

  run: str
  batch_size: int
  cache_lengths: tuple[int, int]
  t_step_s: tuple[float, float]
  state_bytes: tuple[int, int]

  @property
  def ratio(self) -> float:
    return self.t_step_s[1] / self.t_step_s[0]

  @property
  def bytes_ratio(self) -> float:
    return self.state_bytes[1] / self.state_bytes[0]

  @property
  def verdict(self) -> str:
    """"warn" where T_step grew more than `CACHE_RATIO_SLACK` times the bytes read."""
    return "pass" if self.ratio <= CACHE_RATIO_SLACK * self.bytes_ratio else "warn"


def _tree_bytes(tree: Any) -> int:
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


def check_cache_length(exp: Experiment, target: LoadedTarget, inputs: Array, max_k: int,
                       long_cache_len: int, log: Callable[[str], Any]) -> CacheCheck:
  """T_step of `target` at the decoders' cache and at `long_cache_len`.

  Args:
    exp: the run whose decoders' cache is timed (its lengths and timing settings).
    target: its loaded target.
    inputs: int32 `[batch, input_len]`, its examples at the run's first batch size.
    max_k: the largest chunk the decoders' cache holds beyond `max_decode_len`.
    long_cache_len: the long cache's positions.
    log: says the result.

  Raises:
    ValueError: `long_cache_len` is not longer than the decoders' cache.
  """
  short, position = timing.timing_geometry(exp.max_decode_len, max_k - 1)
  if long_cache_len <= short:
    raise ValueError(f"DeviceCheck.long_cache_len={long_cache_len} must exceed the "
                     f"decoders' cache, {short} positions.")
  lengths = (short, long_cache_len)
  steps = [timing.target_step_times(
      target.scorer, inputs, chunk_lengths=[1], cache_len=n, position=position,
      calls=exp.timing_calls, repeats=exp.timing_repeats)[1].seconds for n in lengths]
  context = target.scorer.encode(inputs)
  row = CacheCheck(exp.name, int(inputs.shape[0]), lengths, tuple(steps),
                   tuple(_tree_bytes(target.scorer.init_state(context, n)) for n in lengths))
  log(f"cache length {lengths[0]} -> {lengths[1]}: T_step {1e3 * steps[0]:.3f} -> "
      f"{1e3 * steps[1]:.3f} ms ({row.ratio:.2f}X; bytes read {row.bytes_ratio:.2f}X)")
  return row


def first_batch(exp: Experiment, target: LoadedTarget) -> Array:
  """int32 `[batch, input_len]`: the run's first examples at its first batch size, cut to
  their length bucket, as the runner feeds them."""
  task, batch = exp.tasks[0], exp.batch_sizes[0]
  pairs, _ = prompts.load_examples(task, exp.split, batch)
  return buckets.to_bucket(jnp.asarray(target.tokenize(task, [x for x, _ in pairs],
                                                       exp.input_len)))
