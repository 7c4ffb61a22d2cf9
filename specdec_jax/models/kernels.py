"""What both model families' cached decoders share: the KV cache, its writes, the weight products.

Generation streams every decoder weight once per step, so the step is built
around that: each family prepares its weights once per parameter set (fused
projections, cast to the compute dtype, packed into `panel_dot`'s panels where
the model's `DecodeOptions` say so: `pack_weight`), and a decoder call
multiplies a chunk of k >= 1 tokens per row by each of them (`dense`). Keys and
values live in a `DecoderCache` whose rows may sit at different lengths;
moving a row's length back (rewinding) needs no copy, because attention masks
every cached position at or beyond it and the next chunk overwrites them
(`write_positions`). Nothing here reads a switch: what runs is the options'
and the weights' (a packed weight is `[N / P, K, P]`, a plain one `[K, N]`).

Under a multi-device mesh, caches and cross-attention keys/values kept with
batch and heads apart are constrained where they are created to their logical
axes (`KEY_AXES`, `VALUE_AXES`) by the model's axis rules; on one device
nothing is added.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from specdec_jax.models import layers, panel_dot
from specdec_jax.models.options import DecodeOptions

Array = jax.Array

# Logical axes of each keys / values array (self-attention caches and the
# encoder's cross-attention keys/values) with batch and heads apart
# (`DecodeOptions.split_heads`).
KEY_AXES = ("batch", "heads", "kv", "length")
VALUE_AXES = ("batch", "heads", "length", "kv")


def constrain_kv(keys: tuple[Array, ...], values: tuple[Array, ...],
                 rules: layers.LogicalRules | None) -> tuple[tuple[Array, ...], tuple[Array, ...]]:
  """Per-layer keys and values with batch and heads apart (4-D) constrained to `KEY_AXES` /
  `VALUE_AXES` by `rules`.

  A no-op for merged (3-D) ones, which are left to sharding propagation, and
  without rules or a multi-device mesh (`layers.with_logical_constraint`).
  """
  def constrain(x: Array, axes: tuple[str, ...]) -> Array:
    return layers.with_logical_constraint(x, axes, rules) if x.ndim == 4 else x

  return (tuple(constrain(k, KEY_AXES) for k in keys),
          tuple(constrain(v, VALUE_AXES) for v in values))


def merge_heads(x: Array, split_heads: bool) -> Array:
  """Keys or values `[batch, heads, ...]` as the cache keeps them: as they are with
  `split_heads`, else `[batch * heads, ...]` (a reshape, no copy)."""
  return x if split_heads else x.reshape((-1,) + x.shape[2:])


@struct.dataclass
class DecoderCache:
  """Self-attention keys/values of every decoder layer, with per-row lengths.

  Attributes:
    keys: one `[batch * heads, d_kv, max_len]` array per decoder layer (heads:
      the key/value heads), or `[batch, heads, d_kv, max_len]` with batch and
      heads apart (`DecodeOptions.split_heads`).
    values: one `[batch * heads, max_len, d_kv]` array per decoder layer, or
      `[batch, heads, max_len, d_kv]` with batch and heads apart.
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
            dtype: jnp.dtype, split_heads: bool,
            axis_rules: layers.LogicalRules | None = None) -> DecoderCache:
    """A cache of `max_len` positions per row for `num_layers` layers, all lengths 0.

    Args:
      num_layers: the layers whose keys and values it holds.
      batch_size: rows.
      heads: key/value heads per layer.
      head_dim: d_kv, each head's width.
      max_len: positions per row.
      dtype: the keys' and values' dtype (the model's compute dtype).
      split_heads: keep batch and heads apart (`DecodeOptions.split_heads`).
      axis_rules: with batch and heads apart under a multi-device mesh, keys
        and values are constrained to `KEY_AXES` / `VALUE_AXES` by them (None:
        left to sharding propagation).
    """
    rows = (batch_size, heads) if split_heads else (batch_size * heads,)
    keys = tuple(jnp.zeros(rows + (head_dim, max_len), dtype) for _ in range(num_layers))
    values = tuple(jnp.zeros(rows + (max_len, head_dim), dtype) for _ in range(num_layers))
    keys, values = constrain_kv(keys, values, axis_rules)
    return cls(keys, values, jnp.zeros((batch_size,), jnp.int32))

  def rewind(self, lengths: Array) -> DecoderCache:
    """Sets each row's valid length (int32 `[batch]`); stale entries are masked."""
    return self.replace(lengths=lengths.astype(jnp.int32))

  def keep_path(self, start: Array, order: Array, lengths: Array) -> DecoderCache:
    """Moves a scored tree's accepted path to the front of its chunk, then rewinds.

    Args:
      start: int32 `[batch]`, where each row's chunk of k nodes was written.
      order: int32 `[batch, k]`, chunk entry j takes node `order[b, j]`'s keys
        and values (the path by depth, then anything: `decoding.trees.path_order`).
      lengths: int32 `[batch]`, each row's valid length afterwards.
    """
    def gather(cache: Array, axis: int) -> Array:
      window = read_positions(cache, start, order.shape[1], axis)  # [batch, heads, ...k...]
      index = order.reshape(order.shape[:1] + (1,) * axis + order.shape[1:]
                             + (1,) * (window.ndim - axis - 2))
      return write_positions(cache, jnp.take_along_axis(window, index, axis=axis + 1), start,
                             axis)

    return DecoderCache(tuple(gather(k, 2) for k in self.keys),
                        tuple(gather(v, 1) for v in self.values), lengths.astype(jnp.int32))


def chunk_mask(lengths: Array, max_len: int, ancestors: Array) -> Array:
  """bool `[batch, k, max_len]`: what each node of a chunk at `lengths` attends to.

  Node i of the chunk written at positions `lengths[b]` ... + k - 1 sees the
  cached positions before `lengths[b]` and the chunk's positions of its
  ancestors and itself. A chain's ancestors are the lower triangle, and then
  this is the causal mask.

  Args:
    lengths: int32 `[batch]`, the cached length before the chunk.
    max_len: the cache's positions.
    ancestors: bool `[batch, k, k]`, `[b, i, j]`: node j is node i or an ancestor.
  """
  batch, k = ancestors.shape[:2]
  rel = jnp.arange(max_len)[None] - lengths[:, None]  # [batch, max_len]
  index = jnp.broadcast_to(jnp.clip(rel, 0, k - 1)[:, None], (batch, k, max_len))
  in_chunk = jnp.take_along_axis(ancestors, index, axis=2) & (rel < k)[:, None]
  return (rel < 0)[:, None] | in_chunk


def chunk_positions(lengths: Array, max_len: int, depths: Array) -> Array:
  """int32 `[batch, max_len]`: the position of each cache entry, a chunk written at `lengths`.

  Entry p of row b stands at position p, except the chunk's: entry
  `lengths[b] + j` holds node j, which stands at `lengths[b] + depths[b, j]`
  (a tree's node: the cached length + its depth). A chain's depths are
  0 .. k - 1, and then every entry stands at its index. What a relative
  position (key - query) is taken from.

  Args:
    lengths: int32 `[batch]`, the cached length before the chunk.
    max_len: the cache's positions.
    depths: int32 `[batch, k]`, each node's depth (root 0).
  """
  k = depths.shape[1]
  index = jnp.arange(max_len, dtype=jnp.int32)[None]  # [1, max_len]
  rel = index - lengths[:, None]  # [batch, max_len]: j at the chunk's node j
  shift = depths - jnp.arange(k, dtype=jnp.int32)  # [batch, k]: 0 for a chain
  shift = jnp.take_along_axis(shift, jnp.clip(rel, 0, k - 1), axis=1)  # [batch, max_len]
  return index + jnp.where((rel >= 0) & (rel < k), shift, 0)


def chain_ancestors(batch: int, k: int) -> Array:
  """bool `[batch, k, k]`: a chain's ancestors (each node sees itself and every earlier one)."""
  return jnp.broadcast_to(jnp.tril(jnp.ones((k, k), bool)), (batch, k, k))


def half_panels(options: DecodeOptions, params: Any) -> bool:
  """Whether `prepare` packs `params` into float16 panels: `options.half_panels` and float16
  holds every weight exactly (`panel_dot.exact_in_half`: concrete arrays; False if traced)."""
  return options.half_panels and panel_dot.exact_in_half(params)


def pack_weight(kernel: Array, panels: bool, half: bool) -> Array:
  """A prepared `[K, N]` weight as the products will read it.

  Args:
    kernel: the weight, in the compute dtype.
    panels: pack it into `[N / P, K, P]` panels for `panel_dot`
      (`DecodeOptions.packs_panels`), if `panel_dot.packable`; otherwise it
      stays `[K, N]` for XLA's dots.
    half: panels in float16 (`half_panels` must hold for the parameters, and
      the weight must be one of them as stored, not a product of them).

  Returns:
    `kernel`, or its panels.
  """
  if not (panels and panel_dot.packable(kernel)):
    return kernel
  return panel_dot.pack(kernel, half)


def write_positions(cache: Array, chunk: Array, start: Array, axis: int) -> Array:
  """Writes `chunk` into `cache` along the position `axis` at per-row `start`.

  Args:
    cache: `[batch, heads, ...]` with `max_len` positions on `axis + 1`, or
      merged, `[batch * heads, ...]` (`merge_heads`).
    chunk: `[batch, heads, ...]` with k positions on `axis + 1` (`layers.key_layout`,
      `layers.value_layout`).
    start: int32 `[batch]`, where each batch row's chunk goes.
    axis: the position axis of one row's `[heads, ...]` (keys 2, values 1).

  Returns:
    `cache` with the chunk written.
  """
  chunk = chunk.astype(cache.dtype)
  write = jax.vmap(functools.partial(_write_row, axis=axis))
  if cache.ndim == chunk.ndim:  # Batch and heads apart: one update per row.
    return write(cache, chunk, start)
  if start.shape[0] == 1:  # One row: an in-place update, no per-row machinery.
    return _write_row(cache, chunk[0], start[0], axis=axis)
  view = cache.reshape(chunk.shape[:2] + cache.shape[1:])
  return write(view, chunk, start).reshape(cache.shape)


def read_positions(cache: Array, start: Array, k: int, axis: int) -> Array:
  """The k positions from per-row `start` along `axis`: `write_positions`' inverse.

  Args:
    cache: `[batch, heads, ...]` or merged `[batch * heads, ...]` (`merge_heads`).
    start: int32 `[batch]`.
    k: positions to read.
    axis: the position axis of one row's `[heads, ...]` (keys 2, values 1).

  Returns:
    `[batch, heads, ...]` with k positions on `axis + 1`.
  """
  batch = start.shape[0]
  view = cache if cache.ndim == 4 else cache.reshape((batch, -1) + cache.shape[1:])

  def read_row(row: Array, s: Array) -> Array:
    index = [jnp.zeros((), jnp.int32)] * row.ndim
    index[axis] = s
    size = list(row.shape)
    size[axis] = k
    return jax.lax.dynamic_slice(row, tuple(index), size)

  return jax.vmap(read_row)(view, start)


def _write_row(cache: Array, chunk: Array, start: Array, *, axis: int) -> Array:
  """One row's `[heads, ...]` update at position `start` along `axis`."""
  index = [jnp.zeros((), jnp.int32)] * cache.ndim
  index[axis] = start
  return jax.lax.dynamic_update_slice(cache, chunk, tuple(index))


def dense(x: Array, kernel: Array, by_row: bool) -> Array:
  """`x [batch, k, d_in] @ kernel [d_in, d_out]`, one row-vector product per row if `by_row`.

  A kernel packed into panels (`[d_out / P, d_in, P]`, `pack_weight`) goes to
  `panel_dot.dot`, whatever `by_row` (`DecodeOptions.row_dots`) says.
  """
  if kernel.ndim == 3:
    return panel_dot.dot(x, kernel).astype(x.dtype)
  if not by_row:
    return jnp.dot(x, kernel)
  flat = x.reshape(-1, x.shape[-1])
  out = jnp.concatenate([jnp.dot(flat[i:i + 1], kernel) for i in range(flat.shape[0])])
  return out.reshape(x.shape[:-1] + kernel.shape[-1:])
