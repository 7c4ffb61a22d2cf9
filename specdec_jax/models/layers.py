"""Building blocks of T5: RMS norm, dense projections, MLP, attention, relative bias.

Parameter names and layouts follow T5X (`t5x/examples/t5/layers.py`): dense kernels
are stored 2-D as `[in_features, out_features]`, attention projections as
`[d_model, heads * d_kv]`, the relative bias table as `[heads, num_buckets]`.

The math lives in pure functions (`rms_norm`, `attention`, `gated_gelu`,
`relative_bias`) that the Flax modules here and the cached decoder
(`cached_decoder.py`) share, so both compute the same thing by construction.
Keys are laid out `[batch * heads, d_kv, kv_len]` and values `[batch * heads,
kv_len, d_kv]`: the layouts XLA's batched dots read as they are, with no
transposing copy and no reshape between a cache update and the dot reading it
(with a reshape there, XLA:CPU copied every cache array several times a step).
Under a device mesh of more than one device (`jax.set_mesh`) they are
`[batch, heads, d_kv, kv_len]` / `[batch, heads, kv_len, d_kv]` instead, which
GSPMD can split over both the batch and the heads (`split_heads_layout`).

Every parameter declares its *logical* axes where it is created (`declare`):
"embed" (d_model), "heads" (attention heads, or heads * d_kv side by side),
"mlp" (MLP hidden units), "vocab", "relpos_buckets"; activations and caches
also use "batch", "length" (positions) and "kv" (d_kv). `declared_params`
reads the declarations back without allocating anything; the parameter tree
itself holds plain arrays (`unbox`). `specdec_jax.partitioning` maps logical
axes to mesh axes by its rules.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.models.config import T5Config

Array = jax.Array
LogicalAxes = tuple[str | None, ...]
# Logical axis -> mesh axis (or None: replicated) pairs, T5X's format
# (`partitioning.axis_rules`).
LogicalRules = tuple[tuple[str, str | None], ...]
NEG_INF = -1e10


@dataclasses.dataclass(frozen=True)
class ParamInfo:
  """One parameter as declared where it is created.

  Attributes:
    shape: its shape.
    dtype: its dtype (the config's `param_dtype`).
    axes: one logical axis name per dimension (None: never split).
  """

  shape: tuple[int, ...]
  dtype: jnp.dtype
  axes: LogicalAxes


def declare(init: Callable[..., Array], axes: LogicalAxes) -> Callable[..., Any]:
  """`init` with the logical axes of the parameter it creates attached.

  The module sees the plain array; `init` returns it boxed with `axes`
  (`unbox` strips the boxes, `declared_params` reads them).
  """
  return nn.with_logical_partitioning(init, axes)


def _is_declared(x: Any) -> bool:
  return isinstance(x, nn.LogicallyPartitioned)


def unbox(params: dict) -> dict:
  """A tree returned by `init` (declared parameters boxed) -> the same tree of plain arrays."""
  return jax.tree.map(lambda x: x.unbox(apply_constraint=False) if _is_declared(x) else x,
                      params, is_leaf=_is_declared)


def declared_params(module: nn.Module, *args: Any) -> dict:
  """The `ParamInfo` of every parameter `module.init(rng, *args)` creates (traced only).

  Args:
    module: the Flax module.
    *args: `init`'s inputs (arrays or `jax.ShapeDtypeStruct`s).

  Returns:
    The parameter tree (without the outer `{"params": ...}`) with a `ParamInfo` per leaf.

  Raises:
    ValueError: a parameter was created without `declare`.
  """
  boxed = jax.eval_shape(module.init, jax.random.PRNGKey(0), *args)["params"]

  def info(path: tuple, x: Any) -> ParamInfo:
    if not _is_declared(x):
      name = "/".join(getattr(k, "key", str(k)) for k in path)
      raise ValueError(f"Parameter {name} (shape {x.shape}) declares no logical axes; create "
                       "it with layers.declare(init, axes).")
    return ParamInfo(tuple(x.value.shape), x.value.dtype, tuple(x.names))

  return jax.tree_util.tree_map_with_path(info, boxed, is_leaf=_is_declared)


def with_logical_constraint(x: Array, axes: LogicalAxes, rules: LogicalRules | None) -> Array:
  """`x` constrained to the mesh axes that `rules` give its logical `axes`.

  A no-op, which traces nothing, without rules, outside a mesh of more than one
  device (`jax.set_mesh`), and inside `jax.shard_map` (whose manual axes the
  caller places by hand).
  """
  mesh = jax.sharding.get_abstract_mesh()
  if rules is None or mesh.size <= 1 or mesh.manual_axes:
    return x
  table = dict(rules)
  spec = jax.sharding.PartitionSpec(*(None if a is None else table[a] for a in axes))
  return jax.lax.with_sharding_constraint(x, spec)


def _kernel_init(scale: float, axes: LogicalAxes) -> Callable[..., Any]:
  return declare(nn.initializers.variance_scaling(scale, "fan_in", "truncated_normal"), axes)


def rms_norm(x: Array, scale: Array, epsilon: float, dtype: jnp.dtype) -> Array:
  """T5's layer norm of `x [..., d]` with `scale [d]`: no centring, no bias; in float32."""
  x32 = x.astype(jnp.float32)
  var = jnp.mean(jnp.square(x32), axis=-1, keepdims=True)
  y = x32 * jax.lax.rsqrt(var + epsilon)
  return (y * scale.astype(jnp.float32)).astype(dtype)


def gated_gelu(gate: Array, linear: Array) -> Array:
  """T5.1.1's gated activation: gelu_new(x @ wi_0) * (x @ wi_1)."""
  return jax.nn.gelu(gate, approximate=True) * linear


def split_heads(x: Array, num_heads: int) -> Array:
  """`[batch, length, heads * d_kv]` -> `[batch, length, heads, d_kv]`."""
  return x.reshape(x.shape[:-1] + (num_heads, x.shape[-1] // num_heads))


def split_heads_layout() -> bool:
  """Whether keys/values keep batch and heads apart: under a mesh of > 1 device."""
  return jax.sharding.get_abstract_mesh().size > 1


def key_layout(k: Array) -> Array:
  """Keys `[batch, length, heads, d_kv]` -> `[batch * heads, d_kv, length]` (or 4-D)."""
  b, length, h, d = k.shape
  k = jnp.transpose(k, (0, 2, 3, 1))
  return k if split_heads_layout() else k.reshape(b * h, d, length)


def value_layout(v: Array) -> Array:
  """Values `[batch, length, heads, d_kv]` -> `[batch * heads, length, d_kv]` (or 4-D)."""
  b, length, h, d = v.shape
  v = jnp.transpose(v, (0, 2, 1, 3))
  return v if split_heads_layout() else v.reshape(b * h, length, d)


def attention(q: Array, k: Array, v: Array, bias: Array | None, mask: Array,
              dtype: jnp.dtype, dropout: Callable[[Array], Array] | None = None) -> Array:
  """Multi-head attention of queries over keys/values, without output projection.

  No 1/sqrt(d_kv) factor: T5 folds it into the query initialisation.

  Args:
    q: `[batch, q_len, heads, d_kv]`.
    k: `[batch * heads, d_kv, kv_len]` or `[batch, heads, d_kv, kv_len]` (`key_layout`).
    v: `[batch * heads, kv_len, d_kv]` or `[batch, heads, kv_len, d_kv]` (`value_layout`).
    bias: `[batch or 1, heads, q_len, kv_len]` relative position bias, or None.
    mask: bool, broadcastable to `[batch, heads, q_len, kv_len]`; True = visible.
    dtype: the compute dtype of the weighted sum.
    dropout: applied to the attention weights (training), or None.

  Returns:
    The heads' outputs side by side, `[batch, q_len, heads * d_kv]`.
  """
  b, q_len, h, d = q.shape
  kv_len = k.shape[-1]
  q = jnp.transpose(q, (0, 2, 1, 3))  # [batch, heads, q_len, d_kv]
  if k.ndim == 3:  # Batch and heads merged.
    q = q.reshape(b * h, q_len, d)
    scores = jnp.einsum("nqd,ndk->nqk", q, k, preferred_element_type=jnp.float32)
  else:
    scores = jnp.einsum("bhqd,bhdk->bhqk", q, k, preferred_element_type=jnp.float32)
  scores = scores.reshape(b, h, q_len, kv_len)
  if bias is not None:
    scores = scores + bias.astype(jnp.float32)
  scores = jnp.where(mask, scores, NEG_INF)
  weights = jax.nn.softmax(scores, axis=-1).astype(dtype)
  if dropout is not None:
    weights = dropout(weights)
  if v.ndim == 3:
    y = jnp.einsum("nqk,nkd->nqd", weights.reshape(b * h, q_len, kv_len), v,
                   preferred_element_type=jnp.float32).astype(dtype)
  else:
    y = jnp.einsum("bhqk,bhkd->bhqd", weights, v,
                   preferred_element_type=jnp.float32).astype(dtype)
  return jnp.transpose(y.reshape(b, h, q_len, d), (0, 2, 1, 3)).reshape(b, q_len, h * d)


class RMSNorm(nn.Module):
  """T5's layer norm: rescales by the root mean square, no centring, no bias."""

  config: T5Config

  @nn.compact
  def __call__(self, x: Array) -> Array:
    cfg = self.config
    scale = self.param("scale", declare(nn.initializers.ones, ("embed",)), (x.shape[-1],),
                       cfg.parameter_dtype)
    return rms_norm(x, scale, cfg.layer_norm_epsilon, cfg.compute_dtype)


class Dense(nn.Module):
  """A bias-free linear map with a 2-D `kernel` of shape `[in, features]`.

  Attributes:
    features: the output width.
    config: the model's config (dtypes).
    axes: the kernel's logical axes `(in, out)`, e.g. `("embed", "mlp")`.
    init_scale: variance scale of the truncated-normal fan-in initialiser.
  """

  features: int
  config: T5Config
  axes: LogicalAxes
  init_scale: float = 1.0

  @nn.compact
  def __call__(self, x: Array) -> Array:
    cfg = self.config
    kernel = self.param("kernel", _kernel_init(self.init_scale, self.axes),
                        (x.shape[-1], self.features), cfg.parameter_dtype)
    return jnp.dot(x.astype(cfg.compute_dtype), kernel.astype(cfg.compute_dtype))


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
    table = self.param("rel_embedding", _kernel_init(1.0, ("heads", "relpos_buckets")),
                       (cfg.num_heads, cfg.relative_attention_num_buckets),
                       cfg.parameter_dtype)
    return relative_bias(table, q_pos, k_len, bidirectional=self.bidirectional,
                         max_distance=cfg.relative_attention_max_distance)


def relative_bias(table: Array, q_pos: Array, k_len: int, *, bidirectional: bool,
                  max_distance: int) -> Array:
  """T5's relative position bias for queries at `q_pos` over keys `0..k_len-1`.

  Args:
    table: `[heads, num_buckets]` learned bias per bucket.
    q_pos: int32 `[batch or 1, q_len]` absolute query positions (< k_len).
    k_len: static number of key positions.
    bidirectional: encoder (True) or causal decoder (False) bucketing.
    max_distance: distance at which the largest bucket starts.

  Returns:
    `[batch or 1, heads, q_len, k_len]` float32 bias.
  """
  max_rel = k_len  # Every query position lies in [0, k_len).
  buckets_of_rel = jnp.asarray(relative_position_buckets(
      max_rel, bidirectional, table.shape[1], max_distance))
  rel = jnp.arange(k_len)[None, None, :] - q_pos[:, :, None]  # [b, q, k]
  buckets = buckets_of_rel[jnp.clip(rel + max_rel, 0, 2 * max_rel)]  # [b, q, k]
  bias = jnp.take(table.astype(jnp.float32), buckets, axis=1)  # [heads, b, q, k]
  return jnp.transpose(bias, (1, 0, 2, 3))
