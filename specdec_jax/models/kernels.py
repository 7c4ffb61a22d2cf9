"""What both model families' cached decoders share: the KV cache, its writes, the weight products.

Generation streams every decoder weight once per step, so the step is built
around that: each family prepares its weights once per parameter set (fused
projections, cast to the compute dtype, on XLA:CPU packed into `panel_dot`'s
panels by `pack_weight`), and a decoder call multiplies a chunk of k >= 1
tokens per row by each of them (`dense`). Keys and values live in a
`DecoderCache` whose rows may sit at different lengths; moving a row's length
back (rewinding) needs no copy, because attention masks every cached position
at or beyond it and the next chunk overwrites them (`write_positions`). The
layouts are the ones XLA's batched dots read without a transposing copy
(`layers.attention`).

Under a multi-device mesh, caches and cross-attention keys/values are
constrained where they are created to their logical axes (`KEY_AXES`,
`VALUE_AXES`) by the model's axis rules; on one device nothing is added.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from specdec_jax.models import layers, panel_dot

Array = jax.Array

# XLA options for the programs that run decoding loops. On XLA:CPU (jaxlib
# 0.10), dots with 2-16 rows (a verification chunk, a small batch) otherwise go
# to YNNPACK, which costs 1.3-1.6X XLA's own emitter there (2-core Zen 4,
# results/decode_step); one-row dots never do. The dots left to XLA in a
# decoder call (attention over the cache) are a few microseconds of work that
# Eigen would split between threads: of 2-8 query rows, single-threaded costs
# 0.4-0.6X as much (2-core Zen 3; the weight products are panel_dot's, which
# shares its own work between the threads). Other backends ignore both options.
# Encoders run as their own programs and keep the defaults (YNNPACK and threads
# win at input_len rows).
COMPILER_OPTIONS = {"xla_cpu_experimental_ynn_fusion_type": "",
                    "xla_cpu_multi_thread_eigen": False}

# The most rows (batch * k) a decoder call multiplies by the weights one row at
# a time (a row-vector product per row) instead of in one matrix product, per
# backend. On XLA:CPU a 2-row product costs 1.8X a one-row one, two one-row
# products 1.5X: the target's 2-token call (a verification at gamma = 1, a
# draft's catch-up chunk) drops from 1.83 to 1.52 one-token steps, its batch-2
# step from 1.9X to 1.6X a batch-1 step; from 3 rows one product wins (2-core
# Zen 4, measured side by side in commit 17c2e6a's benchmark_decode_step). It
# applies to XLA's dots only (weights not packed for `panel_dot`).
# Accelerators read every weight once per product, so they keep one product
# (no entry: 1).
ROW_DOTS_MAX_ROWS = {"cpu": 2}

# Backends whose float32 decoder weights are packed into panels for
# `panel_dot` (an XLA FFI custom call; needs a C++ compiler at first use, else
# XLA's dots and `ROW_DOTS_MAX_ROWS` apply).
PANEL_DOTS = {"cpu": True}

# Whether the models pack their panels in float16 when float16 holds every
# weight exactly (`half_panels`): a checkpoint saved in float16, as ours are,
# then streams half the bytes per call for bit-identical products.
HALF_PANELS = True

# Logical axes of each keys / values array (self-attention caches and the
# encoder's cross-attention keys/values) under a multi-device mesh, where batch
# and heads are apart (`layers.split_heads_layout`).
KEY_AXES = ("batch", "heads", "kv", "length")
VALUE_AXES = ("batch", "heads", "length", "kv")


def constrain_kv(keys: tuple[Array, ...], values: tuple[Array, ...],
                 rules: layers.LogicalRules | None) -> tuple[tuple[Array, ...], tuple[Array, ...]]:
  """Per-layer keys and values constrained to `KEY_AXES` / `VALUE_AXES` by `rules`.

  A no-op without rules or a multi-device mesh (`layers.with_logical_constraint`).
  """
  return (tuple(layers.with_logical_constraint(k, KEY_AXES, rules) for k in keys),
          tuple(layers.with_logical_constraint(v, VALUE_AXES, rules) for v in values))


# Options that `compiler_options` lays over `COMPILER_OPTIONS` in its block.
_OVERRIDES: contextvars.ContextVar[tuple[tuple[str, Any], ...]] = contextvars.ContextVar(
    "compiler_option_overrides", default=())


@contextlib.contextmanager
def compiler_options(**overrides: Any) -> Iterator[None]:
  """Within the block, loops compiled by `loop_jit` on XLA:CPU use `COMPILER_OPTIONS | overrides`.

  Each set of options compiles and keeps its own program, so a benchmark can
  time two sets against each other in one process
  (`experiments.benchmark_compiler_options`).

  Args:
    **overrides: XLA debug options by name, e.g.
      `xla_cpu_enable_concurrency_optimized_scheduler=True`.
  """
  token = _OVERRIDES.set(_OVERRIDES.get() + tuple(sorted(overrides.items())))
  try:
    yield
  finally:
    _OVERRIDES.reset(token)


def loop_jit(fn: Callable[..., Any], *, static_argnames: tuple[str, ...]) -> Callable[..., Any]:
  """`jax.jit(fn)` with `COMPILER_OPTIONS` when called at top level on XLA:CPU.

  Compiler options can only be given to a top-level program, so a call under
  an outer trace (the data-parallel decoders, a user's `jit`) runs a plain
  `jax.jit(fn)` that the outer program inlines. Other backends (which may
  refuse a CPU option) always get the plain one; the backend is looked up at
  the first call, not at import. Inside `compiler_options(...)` the top-level
  program is the one compiled with those options laid over.
  """
  nested = jax.jit(fn, static_argnames=static_argnames)
  top_level: dict[tuple[tuple[str, Any], ...], Callable[..., Any]] = {}

  def top() -> Callable[..., Any]:
    overrides = _OVERRIDES.get()
    if overrides not in top_level:
      options = ({**COMPILER_OPTIONS, **dict(overrides)} if jax.default_backend() == "cpu"
                 else {})
      top_level[overrides] = jax.jit(fn, static_argnames=static_argnames,
                                     compiler_options=options)
    return top_level[overrides]

  @functools.wraps(fn)
  def call(*args: Any, **kwargs: Any) -> Any:
    traced = any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves((args, kwargs)))
    return (nested if traced else top())(*args, **kwargs)

  call.lower = lambda *args, **kwargs: top().lower(*args, **kwargs)
  call._cache_size = lambda: top()._cache_size()  # noqa: SLF001  (tests: no recompilation)

  def clear_cache() -> None:
    for program in top_level.values():
      program.clear_cache()
    nested.clear_cache()

  call.clear_cache = clear_cache
  return call


@struct.dataclass
class DecoderCache:
  """Self-attention keys/values of every decoder layer, with per-row lengths.

  Attributes:
    keys: one `[batch * heads, d_kv, max_len]` array per decoder layer (heads:
      the key/value heads)
      (`[batch, heads, d_kv, max_len]` under a multi-device mesh: see
      `layers.split_heads_layout`).
    values: one `[batch * heads, max_len, d_kv]` array per decoder layer
      (`[batch, heads, max_len, d_kv]` under a multi-device mesh).
    lengths: int32 `[batch]`, the number of valid positions of each row; the
      next chunk of a row is written at positions `lengths[row]...`.
  """

  keys: tuple[Array, ...]
  values: tuple[Array, ...]
  lengths: Array

  @property
  def max_len(self) -> int:
    return self.keys[0].shape[-1]

  @classmethod
  def empty(cls, *, num_layers: int, batch_size: int, heads: int, head_dim: int, max_len: int,
            dtype: jnp.dtype, axis_rules: layers.LogicalRules | None = None) -> DecoderCache:
    """A cache of `max_len` positions per row for `num_layers` layers, all lengths 0.

    Args:
      num_layers: the layers whose keys and values it holds.
      batch_size: rows.
      heads: key/value heads per layer.
      head_dim: d_kv, each head's width.
      max_len: positions per row.
      dtype: the keys' and values' dtype (the model's compute dtype).
      axis_rules: under a multi-device mesh, keys and values are constrained to
        `KEY_AXES` / `VALUE_AXES` by them (None: left to sharding propagation).
    """
    rows = (batch_size, heads) if layers.split_heads_layout() else (batch_size * heads,)
    keys = tuple(jnp.zeros(rows + (head_dim, max_len), dtype) for _ in range(num_layers))
    values = tuple(jnp.zeros(rows + (max_len, head_dim), dtype) for _ in range(num_layers))
    keys, values = constrain_kv(keys, values, axis_rules)
    return cls(keys, values, jnp.zeros((batch_size,), jnp.int32))

  def rewind(self, lengths: Array) -> DecoderCache:
    """Sets each row's valid length (int32 `[batch]`); stale entries are masked."""
    return self.replace(lengths=lengths.astype(jnp.int32))


def weight_dots() -> str:
  """What multiplies the decoder's float32 weights now: "panel_dot" (`PANEL_DOTS` of
  the default backend, one device and the custom call built), or "xla (<why not>)"."""
  backend = jax.default_backend()
  if not PANEL_DOTS.get(backend, False):
    return f"xla (PANEL_DOTS off on {backend})"
  if layers.split_heads_layout():
    return "xla (a mesh of more than one device)"
  return "panel_dot" if panel_dot.available() else f"xla (panel_dot {panel_dot.status()})"


def panel_dots() -> bool:
  """Whether `prepare` packs weights for `panel_dot` now (`weight_dots`)."""
  return weight_dots() == "panel_dot"


def half_panels(params: Any) -> bool:
  """Whether `prepare` may pack `params` into float16 panels: `HALF_PANELS` is on,
  panels are (`panel_dots`), and float16 holds every weight exactly. Concrete arrays."""
  return HALF_PANELS and panel_dots() and panel_dot.exact_in_half(params)


def pack_weight(kernel: Array, panels: bool, half: bool) -> Array:
  """A prepared `[K, N]` weight as the products will read it.

  Args:
    kernel: the weight, in the compute dtype.
    panels: pack it into `[N / P, K, P]` panels for `panel_dot` (`panel_dots()`),
      if `panel_dot.packable`; otherwise it stays `[K, N]` for XLA's dots.
    half: panels in float16 (`half_panels(params)` must hold, and the weight
      must be one of the parameters as stored, not a product of them).

  Returns:
    `kernel`, or its panels.
  """
  if not (panels and panel_dot.packable(kernel)):
    return kernel
  return panel_dot.pack(kernel, half)


def write_positions(cache: Array, chunk: Array, start: Array, axis: int) -> Array:
  """Writes `chunk` into `cache` along the position `axis` at per-row `start`.

  Args:
    cache: `[batch * heads, ...]` with `max_len` positions on `axis` (1 or 2),
      or `[batch, heads, ...]` with them on `axis + 1`.
    chunk: the same shape with k positions there.
    start: int32 `[batch]`, where each batch row's chunk goes.
  """
  chunk = chunk.astype(cache.dtype)
  if cache.ndim == 4:  # Batch and heads apart: one update per row.
    return jax.vmap(functools.partial(_write_row, axis=axis))(cache, chunk, start)
  if start.shape[0] == 1:  # One row: an in-place update, no per-row machinery.
    return _write_row(cache, chunk, start[0], axis=axis)
  batch = start.shape[0]
  view = cache.reshape((batch, -1) + cache.shape[1:])
  update = chunk.reshape((batch, -1) + chunk.shape[1:])
  return jax.vmap(functools.partial(_write_row, axis=axis))(view, update, start).reshape(
      cache.shape)


def _write_row(cache: Array, chunk: Array, start: Array, *, axis: int) -> Array:
  """One row's `[heads, ...]` update at position `start` along `axis`."""
  index = [jnp.zeros((), jnp.int32)] * cache.ndim
  index[axis] = start
  return jax.lax.dynamic_update_slice(cache, chunk, tuple(index))


def row_dots(rows: int) -> bool:
  """Whether a call on `rows` (batch * k) rows multiplies them by the weights one at a
  time (`ROW_DOTS_MAX_ROWS` of the default backend)."""
  return 1 < rows <= ROW_DOTS_MAX_ROWS.get(jax.default_backend(), 1)


def dense(x: Array, kernel: Array, by_row: bool) -> Array:
  """`x [batch, k, d_in] @ kernel [d_in, d_out]`, one row-vector product per row if `by_row`.

  A kernel packed into panels (`[d_out / P, d_in, P]`) goes to `panel_dot.dot`.
  """
  if kernel.ndim == 3:
    return panel_dot.dot(x, kernel).astype(x.dtype)
  if not by_row:
    return jnp.dot(x, kernel)
  flat = x.reshape(-1, x.shape[-1])
  out = jnp.concatenate([jnp.dot(flat[i:i + 1], kernel) for i in range(flat.shape[0])])
  return out.reshape(x.shape[:-1] + kernel.shape[-1:])
