"""Building blocks every model family shares: declared parameters, RMS norm, dense, attention.

Parameter names and layouts follow T5X (`t5x/examples/t5/layers.py`): dense
kernels are stored 2-D as `[in_features, out_features]`, attention
projections as `[d_model, heads * d_kv]`.

The math lives in pure functions (`rms_norm`, `attention`) that the Flax
modules of each family and its cached decoder share, so both compute the same
thing by construction. Keys are laid out `[batch, heads, d_kv, kv_len]` and
values `[batch, heads, kv_len, d_kv]` (`key_layout`, `value_layout`): the
layouts XLA's batched dots read as they are, with no transposing copy, which
GSPMD can split over both the batch and the heads. A cached decoder may keep
them merged, `[batch * heads, d_kv, kv_len]` / `[batch * heads, kv_len, d_kv]`
(`DecodeOptions.split_heads`), which `attention` reads too: on one device,
XLA:CPU then reads its cache with no reshape between a cache update and the
dot (with a reshape there, it copied every cache array several times a step).

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
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from specdec_jax.models.config import ModelConfig

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


def kernel_init(scale: float, axes: LogicalAxes) -> Callable[..., Any]:
  """T5X's dense initialiser (fan-in truncated normal, variance `scale`), declaring `axes`."""
  return declare(nn.initializers.variance_scaling(scale, "fan_in", "truncated_normal"), axes)


def rms_norm(x: Array, scale: Array, epsilon: float, dtype: jnp.dtype) -> Array:
  """T5's layer norm of `x [..., d]` with `scale [d]`: no centring, no bias; in float32."""
  x32 = x.astype(jnp.float32)
  var = jnp.mean(jnp.square(x32), axis=-1, keepdims=True)
  y = x32 * jax.lax.rsqrt(var + epsilon)
  return (y * scale.astype(jnp.float32)).astype(dtype)


def split_heads(x: Array, num_heads: int) -> Array:
  """`[batch, length, heads * d_kv]` -> `[batch, length, heads, d_kv]`."""
  return x.reshape(x.shape[:-1] + (num_heads, x.shape[-1] // num_heads))


def key_layout(k: Array) -> Array:
  """Keys `[batch, length, heads, d_kv]` -> `[batch, heads, d_kv, length]`.

  A cached decoder whose options merge batch and heads reshapes them into
  `[batch * heads, d_kv, length]` (`kernels.merge_heads`, no copy).
  """
  return jnp.transpose(k, (0, 2, 3, 1))


def value_layout(v: Array) -> Array:
  """Values `[batch, length, heads, d_kv]` -> `[batch, heads, length, d_kv]` (or merged,
  `[batch * heads, length, d_kv]`, as `key_layout`'s)."""
  return jnp.transpose(v, (0, 2, 1, 3))


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
  """T5's layer norm, Llama's too: rescales by the root mean square, no centring, no bias.

  Attributes:
    config: the model's config (dtypes and `layer_norm_epsilon`).
  """

  config: ModelConfig

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
  config: ModelConfig
  axes: LogicalAxes
  init_scale: float = 1.0

  @nn.compact
  def __call__(self, x: Array) -> Array:
    cfg = self.config
    kernel = self.param("kernel", kernel_init(self.init_scale, self.axes),
                        (x.shape[-1], self.features), cfg.parameter_dtype)
    return jnp.dot(x.astype(cfg.compute_dtype), kernel.astype(cfg.compute_dtype))
