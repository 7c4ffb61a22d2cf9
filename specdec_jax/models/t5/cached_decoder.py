"""The T5 decoder for cached generation: weights prepared once, a chunk scored per call.

Generation streams every decoder weight once per step, so the step is built
around that: `prepare` turns the T5X-layout parameter tree into
`DecodeWeights` once per set of parameters (self-attention query | key | value
kernels side by side in one `[d_model, 3 * heads * d_kv]` matrix, the gated
MLP's `wi_0 | wi_1` in one `[d_model, 2 * d_ff]`, a tied embedding transposed
and scaled into a `[d_model, vocab]` logits matrix, everything cast to the
compute dtype), so a layer costs six weight dots instead of nine (XLA:CPU
pays a fixed cost per op). Keys and values live in the layouts XLA's batched
dots read without a transposing copy (`layers.attention`). The math is the
Flax modules' own (`layers.rms_norm`, `layers.attention`, ...), so the
logits equal `Transformer`'s teacher-forced ones (tested).

Decoding scores a *chunk* of k >= 1 new tokens per row against a `DecoderCache`
whose rows may sit at different lengths; moving a row's length back (rewinding)
needs no copy, because attention masks every cached position at or beyond it
and the next chunk overwrites them.

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
from specdec_jax.models.config import T5Config

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
    keys: one `[batch * heads, d_kv, max_len]` array per decoder layer
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
  def empty(cls, config: T5Config, batch_size: int, max_len: int,
            axis_rules: layers.LogicalRules | None = None) -> DecoderCache:
    """A cache of `max_len` positions per row, all lengths 0.

    Under a multi-device mesh, keys and values are constrained to `KEY_AXES` /
    `VALUE_AXES` by `axis_rules` (None: left to sharding propagation).
    """
    heads, d_kv, n = config.num_heads, config.d_kv, config.num_decoder_layers
    rows = (batch_size, heads) if layers.split_heads_layout() else (batch_size * heads,)
    keys = tuple(jnp.zeros(rows + (d_kv, max_len), config.compute_dtype) for _ in range(n))
    values = tuple(jnp.zeros(rows + (max_len, d_kv), config.compute_dtype) for _ in range(n))
    keys, values = constrain_kv(keys, values, axis_rules)
    return cls(keys, values, jnp.zeros((batch_size,), jnp.int32))

  def rewind(self, lengths: Array) -> DecoderCache:
    """Sets each row's valid length (int32 `[batch]`); stale entries are masked."""
    return self.replace(lengths=lengths.astype(jnp.int32))


@struct.dataclass
class EncodedInputs:
  """What the decoder needs from the encoder, computed once per generation.

  Attributes:
    cross_keys: one `[batch * heads, d_kv, input_len]` array per decoder layer.
    cross_values: one `[batch * heads, input_len, d_kv]` array per decoder layer.
      (Both with batch and heads apart under a multi-device mesh.)
    mask: bool `[batch, input_len]`, True at real (non-padding) input tokens.
    hidden: the encoder's final hidden states `[batch, input_len, d_model]`, or
      None; a draft that reads the target's encoder (`shared_encoder`) takes
      its cross-attention keys/values from them.
  """

  cross_keys: tuple[Array, ...]
  cross_values: tuple[Array, ...]
  mask: Array
  hidden: Array | None = None


@struct.dataclass
class LayerWeights:
  """One decoder layer's weights, prepared for generation.

  Each `[K, N]` matrix below is `[N / P, K, P]` panels instead where `prepare`
  packed it (`panel_dot.pack`).

  Attributes:
    self_norm: `[d_model]` scale before self-attention.
    qkv: `[d_model, 3 * heads * d_kv]`, the query, key and value kernels side by side.
    self_out: `[heads * d_kv, d_model]`.
    cross_norm: `[d_model]` scale before cross-attention.
    cross_query: `[d_model, heads * d_kv]` (the encoder's keys/values are in
      `EncodedInputs`).
    cross_out: `[heads * d_kv, d_model]`.
    mlp_norm: `[d_model]` scale before the MLP.
    wi: `[d_model, d_ff]` (ReLU), or `[d_model, 2 * d_ff]`: wi_0 | wi_1 (gated).
    wo: `[d_ff, d_model]`.
  """

  self_norm: Array
  qkv: Array
  self_out: Array
  cross_norm: Array
  cross_query: Array
  cross_out: Array
  mlp_norm: Array
  wi: Array
  wo: Array


@struct.dataclass
class DecodeWeights:
  """The decoder's weights, prepared once per generation by `prepare`.

  Attributes:
    embedding: `[vocab, d_model]` token embedding.
    relpos: `[heads, num_buckets]` relative position bias table.
    layers: one `LayerWeights` per decoder layer.
    final_norm: `[d_model]` scale of the final layer norm.
    logits: `[d_model, vocab]`: `logits_dense` (T5.1.1), or the embedding
      transposed and scaled by d_model^-0.5 (T5 v1.0, tied); panels where
      packed, as the layers' matrices. `[d_model, head]` with `head_tokens`.
    head_tokens: None, or int32 `[head]`: the tokens the logits' columns score
      (`prepare`'s `head_tokens`); every other token's logit is -inf.
  """

  embedding: Array
  relpos: Array
  layers: tuple[LayerWeights, ...]
  final_norm: Array
  logits: Array
  head_tokens: Array | None = None


@struct.dataclass
class PreparedParams:
  """A model's parameters ready for generation (`T5Model.prepare`).

  Attributes:
    params: the T5X-layout parameter tree (the encoder reads it).
    decoder: the decoder's weights prepared from it (`DecodeWeights`).
  """

  params: dict
  decoder: DecodeWeights


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


def half_panels(params: dict) -> bool:
  """Whether `prepare` may pack `params` into float16 panels: `HALF_PANELS` is on,
  panels are (`panel_dots`), and float16 holds every weight exactly. Concrete arrays."""
  return HALF_PANELS and panel_dots() and panel_dot.exact_in_half(params)


def prepare(config: T5Config, params: dict, panels: bool = False, half: bool = False,
            head_tokens: Array | None = None) -> DecodeWeights:
  """The decoder weights of a T5X-layout parameter tree, fused and cast for generation.

  With `panels` (`panel_dots()`), every weight matrix that `panel_dot.packable`
  is stored as `[N / P, K, P]` panels (`panel_dot.pack`) and multiplied by
  `panel_dot.dot`; in float16 with `half` (`half_panels(params)` must hold).

  `head_tokens` (int32 `[head]`, distinct ids) keeps only those columns of the
  logits matrix: a draft whose output layer scores a shortlist of the vocabulary
  (the rest get probability 0, which speculative sampling allows) streams
  `head / vocab` of that matrix per call.
  """
  dtype = config.compute_dtype
  dec = params["decoder"]

  def layout(w: Array, exact_in_half: bool = True) -> Array:
    if not (panels and panel_dot.packable(w)):
      return w
    return panel_dot.pack(w, half and exact_in_half)

  def kernel(tree: dict) -> Array:
    return jnp.asarray(tree["kernel"], dtype)

  prepared = []
  for i in range(config.num_decoder_layers):
    p = dec[f"layers_{i}"]
    att, cross, mlp = p["self_attention"], p["encoder_decoder_attention"], p["mlp"]
    wi = (jnp.concatenate([kernel(mlp["wi_0"]), kernel(mlp["wi_1"])], axis=1)
          if config.gated else kernel(mlp["wi"]))
    prepared.append(LayerWeights(
        self_norm=p["pre_self_attention_layer_norm"]["scale"],
        qkv=layout(jnp.concatenate(
            [kernel(att["query"]), kernel(att["key"]), kernel(att["value"])], axis=1)),
        self_out=layout(kernel(att["out"])),
        cross_norm=p["pre_cross_attention_layer_norm"]["scale"],
        cross_query=layout(kernel(cross["query"])),
        cross_out=layout(kernel(cross["out"])),
        mlp_norm=p["pre_mlp_layer_norm"]["scale"],
        wi=layout(wi),
        wo=layout(kernel(mlp["wo"]))))
  embedding = jnp.asarray(params["token_embedder"]["embedding"], dtype)
  if config.tie_word_embeddings:
    logits = embedding.T * jnp.asarray(config.d_model**-0.5, dtype)
  else:
    logits = kernel(dec["logits_dense"])
  if head_tokens is not None:
    logits = jnp.take(logits, head_tokens, axis=1)
  return DecodeWeights(embedding=embedding, relpos=dec["relpos_bias"]["rel_embedding"],
                       layers=tuple(prepared), final_norm=dec["decoder_norm"]["scale"],
                       # Tied: scaled by d_model^-0.5, no longer float16 values.
                       logits=layout(logits, not config.tie_word_embeddings),
                       head_tokens=head_tokens)


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


def _layer(config: T5Config, w: LayerWeights, x: Array, *, self_bias: Array, self_mask: Array,
           cross_k: Array, cross_v: Array, cross_mask: Array, cache_k: Array, cache_v: Array,
           start: Array, by_row: bool) -> tuple[Array, Array, Array]:
  """One decoder block over a chunk `x [batch, k, d_model]`; returns x and the layer's cache.

  `by_row`: weight products one row at a time (`dense`).
  """
  dtype, eps, heads = config.compute_dtype, config.layer_norm_epsilon, config.num_heads
  inner = heads * config.d_kv
  matmul = functools.partial(dense, by_row=by_row)
  h = layers.rms_norm(x, w.self_norm, eps, dtype)
  qkv = matmul(h, w.qkv)  # [batch, k, 3 * inner]
  q, k, v = (layers.split_heads(qkv[..., i * inner:(i + 1) * inner], heads) for i in range(3))
  cache_k = write_positions(cache_k, layers.key_layout(k), start, axis=2)
  cache_v = write_positions(cache_v, layers.value_layout(v), start, axis=1)
  x = x + matmul(layers.attention(q, cache_k, cache_v, self_bias, self_mask, dtype), w.self_out)
  h = layers.rms_norm(x, w.cross_norm, eps, dtype)
  q = layers.split_heads(matmul(h, w.cross_query), heads)
  x = x + matmul(layers.attention(q, cross_k, cross_v, None, cross_mask, dtype), w.cross_out)
  h = matmul(layers.rms_norm(x, w.mlp_norm, eps, dtype), w.wi)
  if config.gated:
    h = layers.gated_gelu(h[..., :config.d_ff], h[..., config.d_ff:])
  else:
    h = jax.nn.relu(h)
  return x + matmul(h, w.wo), cache_k, cache_v


def decode_chunk(config: T5Config, weights: DecodeWeights, encoded: EncodedInputs,
                 cache: DecoderCache, tokens: Array) -> tuple[Array, DecoderCache]:
  """Scores `tokens [batch, k]`, row b at positions `cache.lengths[b] ... + k - 1`.

  The caller keeps `cache.lengths + k <= cache.max_len`.

  Returns:
    Logits `[batch, k, vocab]` (compute dtype; logits[:, i] predict the token
    after tokens[:, i]) and the cache with every row's length advanced by k.
  """
  dtype = config.compute_dtype
  batch, k = tokens.shape
  by_row = row_dots(batch * k)
  positions = cache.lengths[:, None] + jnp.arange(k)[None]  # [batch, k]
  kv_len = cache.max_len
  self_mask = (jnp.arange(kv_len)[None, None, :] <= positions[:, :, None])[:, None]
  self_bias = layers.relative_bias(weights.relpos, positions, kv_len, bidirectional=False,
                                   max_distance=config.relative_attention_max_distance)
  cross_mask = encoded.mask[:, None, None, :]
  x = jnp.take(weights.embedding, tokens, axis=0)  # [batch, k, d_model]
  keys, values = [], []
  for i, w in enumerate(weights.layers):
    x, cache_k, cache_v = _layer(
        config, w, x, self_bias=self_bias, self_mask=self_mask, cross_k=encoded.cross_keys[i],
        cross_v=encoded.cross_values[i], cross_mask=cross_mask, cache_k=cache.keys[i],
        cache_v=cache.values[i], start=cache.lengths, by_row=by_row)
    keys.append(cache_k)
    values.append(cache_v)
  x = layers.rms_norm(x, weights.final_norm, config.layer_norm_epsilon, dtype)
  logits = dense(x, weights.logits, by_row)
  if weights.head_tokens is not None:
    logits = jnp.full(logits.shape[:-1] + (config.vocab_size,), -jnp.inf, logits.dtype).at[
        ..., weights.head_tokens].set(logits, unique_indices=True)
  return logits, DecoderCache(tuple(keys), tuple(values), cache.lengths + k)
