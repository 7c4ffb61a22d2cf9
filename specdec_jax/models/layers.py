"""Building blocks of T5: RMS norm, dense projections, MLP, attention, relative bias.

Parameter names and layouts follow T5X (`t5x/examples/t5/layers.py`): dense kernels
are stored 2-D as `[in_features, out_features]`, attention projections as
`[d_model, heads * d_kv]`, the relative bias table as `[heads, num_buckets]`.
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.models.config import T5Config

Array = jax.Array
NEG_INF = -1e10


def _kernel_init(scale: float):
  return nn.initializers.variance_scaling(scale, "fan_in", "truncated_normal")


class RMSNorm(nn.Module):
  """T5's layer norm: rescales by the root mean square, no centring, no bias."""

  config: T5Config

  @nn.compact
  def __call__(self, x: Array) -> Array:
    cfg = self.config
    scale = self.param("scale", nn.initializers.ones, (x.shape[-1],), cfg.parameter_dtype)
    x32 = x.astype(jnp.float32)
    var = jnp.mean(jnp.square(x32), axis=-1, keepdims=True)
    y = x32 * jax.lax.rsqrt(var + cfg.layer_norm_epsilon)
    return (y * scale.astype(jnp.float32)).astype(cfg.compute_dtype)


class Dense(nn.Module):
  """A bias-free linear map with a 2-D `kernel` of shape `[in, features]`."""

  features: int
  config: T5Config
  init_scale: float = 1.0

  @nn.compact
  def __call__(self, x: Array) -> Array:
    cfg = self.config
    kernel = self.param("kernel", _kernel_init(self.init_scale),
                        (x.shape[-1], self.features), cfg.parameter_dtype)
    return jnp.dot(x.astype(cfg.compute_dtype), kernel.astype(cfg.compute_dtype))


class MLP(nn.Module):
  """Feed-forward block: ReLU (`wi`, T5 v1.0) or gated-GELU (`wi_0`, `wi_1`, T5.1.1)."""

  config: T5Config

  @nn.compact
  def __call__(self, x: Array, deterministic: bool) -> Array:
    cfg = self.config
    if cfg.gated:
      gate = jax.nn.gelu(Dense(cfg.d_ff, cfg, name="wi_0")(x), approximate=True)
      h = gate * Dense(cfg.d_ff, cfg, name="wi_1")(x)
    else:
      h = jax.nn.relu(Dense(cfg.d_ff, cfg, name="wi")(x))
    h = nn.Dropout(cfg.dropout_rate)(h, deterministic=deterministic)
    return Dense(cfg.d_model, cfg, name="wo")(h)


class MultiHeadAttention(nn.Module):
  """Multi-head attention without the 1/sqrt(d_kv) factor (T5 folds it into init).

  Split into projection and attention methods so that the decoder can project
  the encoder's keys/values once and the cache can hold the self-attention ones.
  """

  config: T5Config

  def setup(self):
    cfg = self.config
    inner = cfg.num_heads * cfg.d_kv
    self.query = Dense(inner, cfg, init_scale=1.0 / cfg.d_kv)
    self.key = Dense(inner, cfg)
    self.value = Dense(inner, cfg)
    self.out = Dense(cfg.d_model, cfg)
    self.dropout = nn.Dropout(cfg.dropout_rate)

  def _split(self, x: Array) -> Array:
    # [batch, length, heads * d_kv] -> [batch, length, heads, d_kv]
    return x.reshape(x.shape[:-1] + (self.config.num_heads, self.config.d_kv))

  def project_q(self, x: Array) -> Array:
    """`[batch, q_len, d_model]` -> queries `[batch, q_len, heads, d_kv]`."""
    return self._split(self.query(x))

  def project_kv(self, x: Array) -> tuple[Array, Array]:
    """`[batch, kv_len, d_model]` -> keys, values, each `[batch, kv_len, heads, d_kv]`."""
    return self._split(self.key(x)), self._split(self.value(x))

  def attend(self, q: Array, k: Array, v: Array, bias: Array | None, mask: Array,
             deterministic: bool) -> Array:
    """Attention of queries over keys/values.

    Args:
      q: `[batch, q_len, heads, d_kv]`.
      k: `[batch, kv_len, heads, d_kv]`.
      v: `[batch, kv_len, heads, d_kv]`.
      bias: `[batch or 1, heads, q_len, kv_len]` relative position bias, or None.
      mask: bool, broadcastable to `[batch, heads, q_len, kv_len]`; True = visible.
      deterministic: disables dropout.

    Returns:
      `[batch, q_len, d_model]`.
    """
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32)
    if bias is not None:
      scores = scores + bias.astype(jnp.float32)
    scores = jnp.where(mask, scores, NEG_INF)
    weights = jax.nn.softmax(scores, axis=-1).astype(self.config.compute_dtype)
    weights = self.dropout(weights, deterministic=deterministic)
    y = jnp.einsum("bhqk,bkhd->bqhd", weights, v)
    return self.out(y.reshape(y.shape[:2] + (-1,)))

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
    table = self.param("rel_embedding", _kernel_init(1.0),
                       (cfg.num_heads, cfg.relative_attention_num_buckets),
                       cfg.parameter_dtype)
    max_rel = k_len  # Every query position lies in [0, k_len).
    buckets_of_rel = jnp.asarray(relative_position_buckets(
        max_rel, self.bidirectional, cfg.relative_attention_num_buckets,
        cfg.relative_attention_max_distance))
    rel = jnp.arange(k_len)[None, None, :] - q_pos[:, :, None]  # [b, q, k]
    buckets = buckets_of_rel[jnp.clip(rel + max_rel, 0, 2 * max_rel)]  # [b, q, k]
    bias = jnp.take(table.astype(jnp.float32), buckets, axis=1)  # [heads, b, q, k]
    return jnp.transpose(bias, (1, 0, 2, 3))
