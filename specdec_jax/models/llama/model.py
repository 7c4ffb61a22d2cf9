"""A Llama-architecture decoder-only model: Flax modules and cached generation.

Llama (Touvron et al. 2023) as SmolLM2 uses it: RMSNorm before attention and
MLP, rotary position embeddings (RoPE, HuggingFace's half-split layout),
grouped-query attention (GQA: `num_kv_heads` key/value heads, each shared by
`num_heads / num_kv_heads` query heads), a SwiGLU MLP, and logits tied to the
token embedding. `gguf_loader` reads a GGUF file into this tree.

Parameter tree (T5X-style names; `LlamaModel.param_info()` lists each
parameter's shape and logical axes, declared where it is created with
`layers.declare`; dense kernels are `[in, out]`):

  token_embedder/embedding                                  [vocab, d_model]
  decoder/layers_N/pre_attention_layer_norm/scale           [d_model]
  decoder/layers_N/attention/query/kernel                   [d_model, heads * head_dim]
  decoder/layers_N/attention/{key, value}/kernel            [d_model, kv_heads * head_dim]
  decoder/layers_N/attention/out/kernel                     [heads * head_dim, d_model]
  decoder/layers_N/pre_mlp_layer_norm/scale                 [d_model]
  decoder/layers_N/mlp/{wi_0 (gate), wi_1 (up)}/kernel      [d_model, d_ff]
  decoder/layers_N/mlp/wo/kernel                            [d_ff, d_model]
  decoder/decoder_norm/scale                                [d_model]

The Flax modules give the teacher-forced logits (parity with the reference
implementation). Generation goes through `decode_chunk`, as the T5 decoder's
does (`models.kernels`): weights prepared once (`prepare`: query | key | value
and gate | up fused, the query pre-scaled by head_dim^-0.5, the tied embedding
transposed into a `[d_model, vocab]` logits matrix, float32 matrices packed
into panels for `panel_dot` on CPU), a chunk of k >= 1 tokens scored per call
at per-row positions against a `kernels.DecoderCache` of the key/value
heads, rewound by setting its lengths. Both paths share `rope` and
`grouped_attention`, so they compute the same thing (tested).
"""

from __future__ import annotations

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specdec_jax.models import kernels, layers
from specdec_jax.models.config import ModelConfig, check_dtype
from specdec_jax.models.kernels import DecoderCache
from specdec_jax.models.layers import Dense, LogicalRules, RMSNorm
from specdec_jax.models.options import DecodeOptions

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class LlamaConfig(ModelConfig):
  """Hyper-parameters of a Llama-architecture decoder (tied embeddings).

  Field names follow `T5Config` where the meaning is the same (`d_model`,
  `d_ff`, `layer_norm_epsilon`, ...), so the shared building blocks
  (`layers.RMSNorm`, `layers.Dense`) read either.
  """

  vocab_size: int = 49152
  d_model: int = 576
  num_layers: int = 30
  num_heads: int = 9
  num_kv_heads: int = 3
  head_dim: int = 64
  d_ff: int = 1536
  rope_theta: float = 100000.0
  layer_norm_epsilon: float = 1e-5
  bos_token_id: int = 1
  eos_token_id: int = 2
  pad_token_id: int = 0
  dtype: str = "float32"
  param_dtype: str = "float32"

  def __post_init__(self):
    for name in ("vocab_size", "d_model", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                 "d_ff"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}.")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"num_heads={self.num_heads} must be a multiple of num_kv_heads="
                       f"{self.num_kv_heads} (each key/value head serves a group of query heads).")
    if self.head_dim % 2:
      raise ValueError(f"head_dim={self.head_dim} must be even (RoPE rotates pairs).")
    for name in ("dtype", "param_dtype"):
      check_dtype(name, getattr(self, name))



# A tiny config of the same architecture for tests (GQA with groups of 2).
TEST_CONFIG = LlamaConfig(vocab_size=97, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2,
                          head_dim=8, d_ff=48, rope_theta=10000.0)


def rope(x: Array, positions: Array, theta: float) -> Array:
  """Rotary position embedding of `x [batch, length, heads, head_dim]` at `positions`.

  HuggingFace's layout: dimension i of the first half and i of the second
  half form the pair rotated by angle `position * theta^(-2i / head_dim)`,
  computed in float32.

  Args:
    x: queries or keys.
    positions: int32 `[batch, length]` absolute positions.
    theta: the RoPE base.

  Returns:
    `x` rotated, in its dtype.
  """
  half = x.shape[-1] // 2
  inv_freq = 1.0 / (np.float32(theta) ** (np.arange(0, 2 * half, 2, dtype=np.float32)
                                           / np.float32(2 * half)))
  angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)  # [b, L, half]
  cos, sin = jnp.cos(angles)[:, :, None], jnp.sin(angles)[:, :, None]  # [b, L, 1, half]
  x32 = x.astype(jnp.float32)
  x1, x2 = x32[..., :half], x32[..., half:]
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def grouped_attention(q: Array, k: Array, v: Array, mask: Array, dtype: jnp.dtype) -> Array:
  """Grouped-query attention, through `layers.attention` with no copy of keys or values.

  The query heads that share a key/value head are stacked along the query
  axis (head h reads key/value head h // group), so each key/value head is
  read as it is laid out in the cache.

  Args:
    q: `[batch, q_len, heads, head_dim]`, already scaled by head_dim^-0.5.
    k: the key/value heads' keys, `[batch * kv_heads, head_dim, kv_len]` (or
      `[batch, kv_heads, head_dim, kv_len]`: `layers.key_layout`).
    v: their values, `[batch * kv_heads, kv_len, head_dim]` (or 4-D).
    mask: bool `[batch, q_len, kv_len]`, True = visible.
    dtype: the compute dtype.

  Returns:
    `[batch, q_len, heads * head_dim]`.
  """
  b, q_len, heads, d = q.shape
  kv_heads = k.shape[1] if k.ndim == 4 else k.shape[0] // b
  group = heads // kv_heads
  q = q.reshape(b, q_len, kv_heads, group, d).transpose(0, 3, 1, 2, 4)  # [b, g, L, kvh, d]
  mask = jnp.tile(mask, (1, group, 1))[:, None]  # [b, 1, g * L, kv_len]
  y = layers.attention(q.reshape(b, group * q_len, kv_heads, d), k, v, None, mask, dtype)
  y = y.reshape(b, group, q_len, kv_heads, d).transpose(0, 2, 3, 1, 4)  # [b, L, kvh, g, d]
  return y.reshape(b, q_len, heads * d)


class LlamaAttention(nn.Module):
  """Grouped-query self-attention with RoPE over a whole sequence (teacher forcing)."""

  config: LlamaConfig

  @nn.compact
  def __call__(self, x: Array, positions: Array, mask: Array) -> Array:
    """`x [batch, L, d_model]` at `positions [batch, L]`, `mask [batch, L, L]` -> same shape."""
    cfg = self.config
    d, dtype = cfg.head_dim, cfg.compute_dtype
    q = Dense(cfg.num_heads * d, cfg, ("embed", "heads"), name="query")(x)
    k = Dense(cfg.num_kv_heads * d, cfg, ("embed", "heads"), name="key")(x)
    v = Dense(cfg.num_kv_heads * d, cfg, ("embed", "heads"), name="value")(x)
    q = rope(layers.split_heads(q, cfg.num_heads), positions, cfg.rope_theta)
    k = rope(layers.split_heads(k, cfg.num_kv_heads), positions, cfg.rope_theta)
    y = grouped_attention(q * jnp.asarray(d**-0.5, dtype), layers.key_layout(k),
                          layers.value_layout(layers.split_heads(v, cfg.num_kv_heads)), mask,
                          dtype)
    return Dense(cfg.d_model, cfg, ("heads", "embed"), name="out")(y)


class LlamaMLP(nn.Module):
  """SwiGLU: `wo(silu(wi_0(x)) * wi_1(x))`."""

  config: LlamaConfig

  @nn.compact
  def __call__(self, x: Array) -> Array:
    cfg = self.config
    gate = Dense(cfg.d_ff, cfg, ("embed", "mlp"), name="wi_0")(x)
    up = Dense(cfg.d_ff, cfg, ("embed", "mlp"), name="wi_1")(x)
    return Dense(cfg.d_model, cfg, ("mlp", "embed"), name="wo")(swiglu(gate, up))


def swiglu(gate: Array, up: Array) -> Array:
  """Llama's gated activation: silu(x @ wi_0) * (x @ wi_1)."""
  return jax.nn.silu(gate) * up


class LlamaBlock(nn.Module):
  """One decoder layer: pre-norm attention and pre-norm MLP, each with a residual."""

  config: LlamaConfig

  @nn.compact
  def __call__(self, x: Array, positions: Array, mask: Array) -> Array:
    cfg = self.config
    x = x + LlamaAttention(cfg, name="attention")(
        RMSNorm(cfg, name="pre_attention_layer_norm")(x), positions, mask)
    return x + LlamaMLP(cfg, name="mlp")(RMSNorm(cfg, name="pre_mlp_layer_norm")(x))


class LlamaTransformer(nn.Module):
  """The decoder as a Flax module: teacher-forced logits (see `LlamaModel`)."""

  config: LlamaConfig

  @nn.compact
  def __call__(self, tokens: Array) -> Array:
    """`tokens [batch, L]` at positions 0..L-1 -> float32 logits `[batch, L, vocab]`.

    Causal, with no padding mask: in a right-padded row the real positions
    never see the padding after them.
    """
    cfg = self.config
    embedder = nn.Embed(cfg.vocab_size, cfg.d_model, dtype=cfg.compute_dtype,
                        param_dtype=cfg.parameter_dtype, name="token_embedder",
                        embedding_init=layers.declare(nn.initializers.normal(stddev=1.0),
                                                      ("vocab", "embed")))
    length = tokens.shape[1]
    positions = jnp.broadcast_to(jnp.arange(length), tokens.shape)
    mask = jnp.broadcast_to(jnp.tril(jnp.ones((length, length), bool)),
                            (tokens.shape[0], length, length))
    x = embedder(tokens)
    decoder = LlamaDecoder(cfg, name="decoder")
    x = decoder(x, positions, mask)
    return embedder.attend(x).astype(jnp.float32)


class LlamaDecoder(nn.Module):
  """The layers and the final norm (the `decoder/` subtree)."""

  config: LlamaConfig

  @nn.compact
  def __call__(self, x: Array, positions: Array, mask: Array) -> Array:
    cfg = self.config
    for i in range(cfg.num_layers):
      x = LlamaBlock(cfg, name=f"layers_{i}")(x, positions, mask)
    return RMSNorm(cfg, name="decoder_norm")(x)


@struct.dataclass
class LlamaLayerWeights:
  """One layer's weights, prepared for generation (`prepare`).

  Each `[K, N]` matrix is `[N / P, K, P]` panels instead where `prepare`
  packed it (`kernels.pack_weight`).

  Attributes:
    attn_norm: `[d_model]` scale before attention.
    qkv: `[d_model, (heads + 2 * kv_heads) * head_dim]`: query (scaled by
      head_dim^-0.5) | key | value.
    attn_out: `[heads * head_dim, d_model]`.
    mlp_norm: `[d_model]` scale before the MLP.
    wi: `[d_model, 2 * d_ff]`: gate | up.
    wo: `[d_ff, d_model]`.
  """

  attn_norm: Array
  qkv: Array
  attn_out: Array
  mlp_norm: Array
  wi: Array
  wo: Array


@struct.dataclass
class LlamaWeights:
  """The model's weights prepared once for generation (`LlamaModel.prepare`).

  Attributes:
    embedding: `[vocab, d_model]` token embedding.
    layers: one `LlamaLayerWeights` per layer (a layer-skip draft holds the
      first L of the target's: the same arrays).
    final_norm: `[d_model]` scale of the final norm.
    logits: `[d_model, vocab]`, the embedding transposed (tied); panels where packed.
      `[d_model, head]` with `head_tokens`.
    logits_bias: None, or `[head]` (or `[vocab]`) added to the logits.
    head_tokens: None, or int32 `[head]` distinct ids: the tokens the logits'
      columns score (a draft's shortlist); every other token's logit is -inf,
      its probability 0 (speculative sampling stays exact).
  """

  embedding: Array
  layers: tuple[LlamaLayerWeights, ...]
  final_norm: Array
  logits: Array
  logits_bias: Array | None = None
  head_tokens: Array | None = None

  def first_layers(self, num_layers: int) -> LlamaWeights:
    """The first `num_layers` layers with this model's final norm and head (no copy)."""
    return self.replace(layers=self.layers[:num_layers])


def prepare(config: LlamaConfig, params: dict, panels: bool = False,
            half: bool = False) -> LlamaWeights:
  """The weights of a parameter tree, fused and cast for generation.

  With `panels` (`DecodeOptions.packs_panels`), every matrix that
  `panel_dot.packable` is stored as panels and multiplied by `panel_dot.dot`; in
  float16 with `half` (`kernels.half_panels(options, params)` must hold).
  """
  dtype = config.compute_dtype

  def layout(w: Array, exact_in_half: bool = True) -> Array:
    return kernels.pack_weight(w, panels, half and exact_in_half)

  def kernel(tree: dict) -> Array:
    return jnp.asarray(tree["kernel"], dtype)

  scale = jnp.asarray(config.head_dim**-0.5, dtype)
  prepared = []
  for i in range(config.num_layers):
    p = params["decoder"][f"layers_{i}"]
    att, mlp = p["attention"], p["mlp"]
    qkv = jnp.concatenate([kernel(att["query"]) * scale, kernel(att["key"]),
                           kernel(att["value"])], axis=1)
    prepared.append(LlamaLayerWeights(
        attn_norm=p["pre_attention_layer_norm"]["scale"],
        qkv=layout(qkv, False),  # The query scaled: not float16 values in general.
        attn_out=layout(kernel(att["out"])),
        mlp_norm=p["pre_mlp_layer_norm"]["scale"],
        wi=layout(jnp.concatenate([kernel(mlp["wi_0"]), kernel(mlp["wi_1"])], axis=1)),
        wo=layout(kernel(mlp["wo"]))))
  embedding = jnp.asarray(params["token_embedder"]["embedding"], dtype)
  return LlamaWeights(embedding=embedding, layers=tuple(prepared),
                      final_norm=params["decoder"]["decoder_norm"]["scale"],
                      logits=layout(embedding.T))


def _layer(config: LlamaConfig, w: LlamaLayerWeights, x: Array, *, positions: Array,
           mask: Array, cache_k: Array, cache_v: Array, start: Array,
           by_row: bool) -> tuple[Array, Array, Array]:
  """One layer over a chunk `x [batch, k, d_model]`; returns x and the layer's cache."""
  dtype, eps, d = config.compute_dtype, config.layer_norm_epsilon, config.head_dim
  heads, kv_heads = config.num_heads, config.num_kv_heads
  dense = functools.partial(kernels.dense, by_row=by_row)
  qkv = dense(layers.rms_norm(x, w.attn_norm, eps, dtype), w.qkv)
  q = layers.split_heads(qkv[..., :heads * d], heads)
  k = layers.split_heads(qkv[..., heads * d:(heads + kv_heads) * d], kv_heads)
  v = layers.split_heads(qkv[..., (heads + kv_heads) * d:], kv_heads)
  write = kernels.write_positions
  cache_k = write(cache_k, layers.key_layout(rope(k, positions, config.rope_theta)), start,
                  axis=2)
  cache_v = write(cache_v, layers.value_layout(v), start, axis=1)
  y = grouped_attention(rope(q, positions, config.rope_theta), cache_k, cache_v, mask, dtype)
  x = x + dense(y, w.attn_out)
  h = dense(layers.rms_norm(x, w.mlp_norm, eps, dtype), w.wi)
  return x + dense(swiglu(h[..., :config.d_ff], h[..., config.d_ff:]), w.wo), cache_k, cache_v


def decode_hidden(config: LlamaConfig, options: DecodeOptions, weights: LlamaWeights,
                  cache: DecoderCache, tokens: Array, extra: Array | None = None,
                  tree: tuple[Array, Array] | None = None) -> tuple[Array, DecoderCache]:
  """Runs `tokens [batch, k]` through every layer, row b at positions `cache.lengths[b]`
  ... + k - 1, up to the final norm; `extra [batch, k, d_model]`, if given, is added
  to the tokens' embeddings (a draft's projected target features: `feature_draft`).

  The chunk is a token tree when `tree` = (depths int32 `[batch, k]`, ancestors
  bool `[batch, k, k]`) is given (`decoding.trees.layout`): node i is written at
  cache position `cache.lengths + i` but rotated as position `cache.lengths +
  depths[i]`, and attends to the cache and to its ancestors and itself only
  (`kernels.chunk_mask`). None is the chain (depths 0 .. k - 1, every earlier
  node an ancestor): the same computation.

  Every layer of `weights` runs (a layer-skip draft passes fewer); the cache
  holds as many. The caller keeps `cache.lengths + k <= cache.max_len`.
  Positions are RoPE's: the token at cache position p is rotated by p.
  `options` say how many rows an unpacked weight multiplies row by row
  (`DecodeOptions.row_dots`); the weights and the cache were made by them.

  Returns:
    The final-normed hidden states `[batch, k, d_model]` (compute dtype; what the
    head reads: `logits_of`) and the cache with every row's length advanced by k.
  """
  batch, k = tokens.shape
  by_row = options.row_dots(batch * k)
  if tree is None:
    tree = (jnp.broadcast_to(jnp.arange(k), (batch, k)), kernels.chain_ancestors(batch, k))
  depths, ancestors = tree
  positions = cache.lengths[:, None] + depths  # [batch, k]: RoPE's
  mask = kernels.chunk_mask(cache.lengths, cache.max_len, ancestors)  # [b, k, max_len]
  x = jnp.take(weights.embedding, tokens, axis=0)  # [batch, k, d_model]
  if extra is not None:
    x = x + extra.astype(x.dtype)
  keys, values = [], []
  for i, w in enumerate(weights.layers):
    x, cache_k, cache_v = _layer(config, w, x, positions=positions, mask=mask,
                                 cache_k=cache.keys[i], cache_v=cache.values[i],
                                 start=cache.lengths, by_row=by_row)
    keys.append(cache_k)
    values.append(cache_v)
  x = layers.rms_norm(x, weights.final_norm, config.layer_norm_epsilon, config.compute_dtype)
  return x, DecoderCache(tuple(keys), tuple(values), cache.lengths + k)


def logits_of(config: LlamaConfig, options: DecodeOptions, weights: LlamaWeights,
              hidden: Array) -> Array:
  """The head: logits `[batch, k, vocab]` (compute dtype) of final-normed `hidden
  [batch, k, d_model]`; -inf off a shortlist (`LlamaWeights.head_tokens`)."""
  batch, k = hidden.shape[:2]
  logits = kernels.dense(hidden, weights.logits, options.row_dots(batch * k))
  if weights.logits_bias is not None:
    logits = logits + weights.logits_bias
  if weights.head_tokens is not None:
    logits = jnp.full(logits.shape[:-1] + (config.vocab_size,), -jnp.inf, logits.dtype).at[
        ..., weights.head_tokens].set(logits, unique_indices=True)
  return logits


def decode_chunk(config: LlamaConfig, options: DecodeOptions, weights: LlamaWeights,
                 cache: DecoderCache, tokens: Array) -> tuple[Array, DecoderCache]:
  """`decode_hidden`, then the head: logits `[batch, k, vocab]` (compute dtype;
  logits[:, i] predict the token after tokens[:, i]) and the advanced cache."""
  hidden, cache = decode_hidden(config, options, weights, cache, tokens)
  return logits_of(config, options, weights, hidden), cache


@dataclasses.dataclass(frozen=True)
class LlamaModel:
  """Functional API around `LlamaTransformer` and `decode_chunk`: pure functions of params.

  Hashable (by config, rules and options), so it can be a static argument of
  jitted decoders; its methods are jitted (inlined inside another jit).
  `params` is the tree without the outer `{"params": ...}` level, of plain
  arrays.

  Attributes:
    config: the architecture.
    axis_rules: logical -> mesh axis rules its parameters are sharded by;
      under a multi-device mesh its caches are constrained by them.
    options: how its cached decoder runs (`models.options.DecodeOptions`); by
      default `DecodeOptions.for_backend()`, chosen when the model is created
      (on a mesh of more than one device: `for_backend(devices=mesh.size)`).
  """

  config: LlamaConfig
  axis_rules: LogicalRules | None = None
  options: DecodeOptions = dataclasses.field(default_factory=DecodeOptions.for_backend)

  @property
  def module(self) -> LlamaTransformer:
    return LlamaTransformer(self.config)

  def init_params(self, rng: Array) -> dict:
    """Randomly initialised parameters (embedding N(0, 1), fan-in truncated normal kernels)."""
    tokens = jnp.ones((1, 8), jnp.int32)
    return layers.unbox(jax.jit(self.module.init)(rng, tokens)["params"])

  def param_info(self) -> dict:
    """Every parameter's `layers.ParamInfo` (shape, dtype, logical axes), as declared
    where it is created (nothing is allocated)."""
    return _declared_params(self.config)

  def prepare(self, params: dict | LlamaWeights) -> LlamaWeights:
    """`params` fused and cast for generation (returned as is if already prepared).

    Prepare once per parameter set and hold the result: this copies every
    weight, and nothing is remembered. Panels and their dtype as `options` say
    (float16 only where exact: `kernels.half_panels`).
    """
    if isinstance(params, LlamaWeights):
      return params
    return self._prepare(params, kernels.half_panels(self.options, params))

  @functools.partial(jax.jit, static_argnums=(0, 2))
  def _prepare(self, params: dict, half: bool) -> LlamaWeights:
    return prepare(self.config, params, self.options.packs_panels, half)

  def init_cache(self, batch_size: int, max_len: int, num_layers: int | None = None
                 ) -> DecoderCache:
    """An empty cache of `max_len` positions for `num_layers` layers (default: all).

    Keys are `[batch * kv_heads, head_dim, max_len]`, values `[batch * kv_heads,
    max_len, head_dim]` (batch and heads apart with `options.split_heads`, then
    constrained by `axis_rules`).
    """
    cfg = self.config
    return DecoderCache.empty(
        num_layers=cfg.num_layers if num_layers is None else num_layers, batch_size=batch_size,
        heads=cfg.num_kv_heads, head_dim=cfg.head_dim, max_len=max_len, dtype=cfg.compute_dtype,
        split_heads=self.options.split_heads, axis_rules=self.axis_rules)

  @functools.partial(jax.jit, static_argnums=0)
  def decode_chunk(self, weights: LlamaWeights, cache: DecoderCache, tokens: Array
                   ) -> tuple[Array, DecoderCache]:
    """`decode_chunk` with float32 logits `[batch, k, vocab]`."""
    logits, cache = decode_chunk(self.config, self.options, weights, cache, tokens)
    return logits.astype(jnp.float32), cache

  @functools.partial(jax.jit, static_argnums=0)
  def decode_features(self, weights: LlamaWeights, cache: DecoderCache, tokens: Array,
                      tree: tuple[Array, Array] | None = None
                      ) -> tuple[Array, Array, DecoderCache]:
    """`decode_chunk` with its final-normed hidden states: float32 logits `[batch, k,
    vocab]`, float32 features `[batch, k, d_model]` and the advanced cache; a token
    tree's chunk with `tree` = (depths, ancestors) (`decode_hidden`)."""
    hidden, cache = decode_hidden(self.config, self.options, weights, cache, tokens, tree=tree)
    logits = logits_of(self.config, self.options, weights, hidden)
    return logits.astype(jnp.float32), hidden.astype(jnp.float32), cache

  @functools.partial(jax.jit, static_argnums=0)
  def logits(self, params: dict, tokens: Array) -> Array:
    """Teacher-forced float32 logits `[batch, L, vocab]` of `tokens [batch, L]`."""
    return self.module.apply({"params": params}, tokens)


@functools.cache
def _declared_params(config: LlamaConfig) -> dict:
  """`LlamaModel.param_info`, once per config."""
  return layers.declared_params(LlamaTransformer(config), jax.ShapeDtypeStruct((1, 8), jnp.int32))
