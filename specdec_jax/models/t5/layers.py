"""T5's own building blocks: gated GELU, the MLP, multi-head attention, relative position bias.

Parameter names and layouts follow T5X (`t5x/examples/t5/layers.py`); the
relative bias table is `[heads, num_buckets]`. The shared pieces (RMS norm,
dense, attention, declared parameters) are `models.layers`'.
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.models.layers import (
    Dense,
    attention,
    kernel_init,
    key_layout,
    split_heads,
    value_layout,
)
from specdec_jax.models.t5.config import T5Config

Array = jax.Array


def gated_gelu(gate: Array, linear: Array) -> Array:
  """T5.1.1's gated activation: gelu_new(x @ wi_0) * (x @ wi_1)."""
  return jax.nn.gelu(gate, approximate=True) * linear


class MLP(nn.Module):
  """Feed-forward block: ReLU (`wi`, T5 v1.0) or gated-GELU (`wi_0`, `wi_1`, T5.1.1)."""

  config: T5Config

  @nn.compact
  def __call__(self, x: Array, deterministic: bool) -> Array:
    cfg = self.config
    if cfg.gated:
      h = gated_gelu(Dense(cfg.d_ff, cfg, ("embed", "mlp"), name="wi_0")(x),
                     Dense(cfg.d_ff, cfg, ("embed", "mlp"), name="wi_1")(x))
    else:
      h = jax.nn.relu(Dense(cfg.d_ff, cfg, ("embed", "mlp"), name="wi")(x))
    h = nn.Dropout(cfg.dropout_rate)(h, deterministic=deterministic)
    return Dense(cfg.d_model, cfg, ("mlp", "embed"), name="wo")(h)


class MultiHeadAttention(nn.Module):
  """Multi-head attention without the 1/sqrt(d_kv) factor (T5 folds it into init).

  Split into projection and attention methods so that the decoder can project
  the encoder's keys/values once (`EncodedInputs`).
  """

  config: T5Config

  def setup(self):
    cfg = self.config
    inner = cfg.num_heads * cfg.d_kv
    # [d_model, heads * d_kv] (split at head boundaries) and back.
    self.query = Dense(inner, cfg, ("embed", "heads"), init_scale=1.0 / cfg.d_kv)
    self.key = Dense(inner, cfg, ("embed", "heads"))
    self.value = Dense(inner, cfg, ("embed", "heads"))
    self.out = Dense(cfg.d_model, cfg, ("heads", "embed"))
    self.dropout = nn.Dropout(cfg.dropout_rate)

  def project_q(self, x: Array) -> Array:
    """`[batch, q_len, d_model]` -> queries `[batch, q_len, heads, d_kv]`."""
    return split_heads(self.query(x), self.config.num_heads)

  def project_kv(self, x: Array) -> tuple[Array, Array]:
    """`[batch, kv_len, d_model]` -> keys, values in the layouts of `attention`."""
    heads = self.config.num_heads
    return (key_layout(split_heads(self.key(x), heads)),
            value_layout(split_heads(self.value(x), heads)))

  def attend(self, q: Array, k: Array, v: Array, bias: Array | None, mask: Array,
             deterministic: bool) -> Array:
    """Attention of queries over keys/values (layouts of `attention`), then `out`.

    Returns:
      `[batch, q_len, d_model]`.
    """
    drop = functools.partial(self.dropout, deterministic=deterministic)
    return self.out(attention(q, k, v, bias, mask, self.config.compute_dtype, drop))

  def __call__(self, x: Array, kv_input: Array, bias: Array | None, mask: Array,
               deterministic: bool) -> Array:
    k, v = self.project_kv(kv_input)
    return self.attend(self.project_q(x), k, v, bias, mask, deterministic)


@functools.lru_cache(maxsize=64)
def relative_position_buckets(max_relative: int, bidirectional: bool, num_buckets: int,
                              max_distance: int) -> np.ndarray:
  """Bucket of every relative position `key - query` in `[-max_relative, max_relative]`.

  Computed once in float64 numpy (not traced), so that boundary cases such as
  log(2)/log(16) land exactly where the reference implementation puts them.

  Returns:
    int32 `[2 * max_relative + 1]`; entry `i` is the bucket of `i - max_relative`.
  """
  rel = np.arange(-max_relative, max_relative + 1, dtype=np.int64)
  buckets = np.zeros_like(rel)
  if bidirectional:
    num_buckets //= 2
    buckets += (rel > 0) * num_buckets
    n = np.abs(rel)
  else:
    n = np.maximum(-rel, 0)
  max_exact = num_buckets // 2
  with np.errstate(divide="ignore"):
    large = max_exact + (np.log(np.maximum(n, 1) / max_exact) / np.log(max_distance / max_exact)
                         * (num_buckets - max_exact)).astype(np.int64)
  large = np.minimum(large, num_buckets - 1)
  buckets += np.where(n < max_exact, n, large)
  return buckets.astype(np.int32)


class RelativePositionBias(nn.Module):
  """T5's learned relative position bias, shared by all layers of a stack."""

  config: T5Config
  bidirectional: bool

  @nn.compact
  def __call__(self, q_pos: Array, k_len: int) -> Array:
    """Bias for queries at `q_pos` over keys at positions `0..k_len-1`.

    Args:
      q_pos: int32 `[batch or 1, q_len]` absolute query positions (< k_len).
      k_len: static number of key positions.

    Returns:
      `[batch or 1, heads, q_len, k_len]` float32 bias.
    """
    cfg = self.config
    table = self.param("rel_embedding", kernel_init(1.0, ("heads", "relpos_buckets")),
                       (cfg.num_heads, cfg.relative_attention_num_buckets),
                       cfg.parameter_dtype)
    return relative_bias(table, q_pos, jnp.arange(k_len)[None], bidirectional=self.bidirectional,
                         max_distance=cfg.relative_attention_max_distance)


def relative_bias(table: Array, q_pos: Array, k_pos: Array, *, bidirectional: bool,
                  max_distance: int) -> Array:
  """T5's relative position bias for queries at `q_pos` over keys at `k_pos`.

  The relative position of a query and a key is `k_pos - q_pos`: over a cache
  that holds a token tree, a key's position is not its index
  (`kernels.chunk_positions`).

  Args:
    table: `[heads, num_buckets]` learned bias per bucket.
    q_pos: int32 `[batch or 1, q_len]` absolute query positions (< k_len).
    k_pos: int32 `[batch or 1, k_len]` absolute key positions (< k_len), e.g.
      `0..k_len-1`.
    bidirectional: encoder (True) or causal decoder (False) bucketing.
    max_distance: distance at which the largest bucket starts.

  Returns:
    `[batch or 1, heads, q_len, k_len]` float32 bias.
  """
  max_rel = k_pos.shape[-1]  # Every position lies in [0, k_len).
  buckets_of_rel = jnp.asarray(relative_position_buckets(
      max_rel, bidirectional, table.shape[1], max_distance))
  rel = k_pos[:, None, :] - q_pos[:, :, None]  # [b, q, k]
  buckets = buckets_of_rel[jnp.clip(rel + max_rel, 0, 2 * max_rel)]  # [b, q, k]
  bias = jnp.take(table.astype(jnp.float32), buckets, axis=1)  # [heads, b, q, k]
  return jnp.transpose(bias, (1, 0, 2, 3))
