"""A Flax T5 encoder-decoder with T5X parameter names, and its functional API.

Parameter tree (T5X names; `T5Model.param_info()` lists every parameter with
its shape and logical axes, as `layers.declare` declares them where they are
created):

  token_embedder/embedding
  {encoder, decoder}/relpos_bias/rel_embedding
  encoder/layers_N/{pre_attention_layer_norm, attention, pre_mlp_layer_norm, mlp}/...
  encoder/encoder_norm/scale
  decoder/layers_N/{pre_self_attention_layer_norm, self_attention,
                    pre_cross_attention_layer_norm, encoder_decoder_attention,
                    pre_mlp_layer_norm, mlp}/...
  decoder/decoder_norm/scale
  decoder/logits_dense/kernel (T5.1.1; T5 v1.0 ties the logits to the embedding)

where attention is `{query, key, value, out}/kernel` and mlp is
`{wi | wi_0, wi_1}/kernel, wo/kernel`.

The Flax modules compute the encoder and teacher-forced decoder logits
(training, parity with the reference implementation); cached generation goes
through `cached_decoder` (weights prepared once per generation, the same math),
behind the functional API `T5Model`.
"""

from __future__ import annotations

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.models import kernels, layers
from specdec_jax.models.kernels import DecoderCache
from specdec_jax.models.layers import Dense, LogicalRules, RMSNorm
from specdec_jax.models.options import DecodeOptions
from specdec_jax.models.t5 import cached_decoder
from specdec_jax.models.t5.cached_decoder import DecodeWeights, EncodedInputs, PreparedParams
from specdec_jax.models.t5.config import T5Config
from specdec_jax.models.t5.layers import MLP, MultiHeadAttention, RelativePositionBias

Array = jax.Array

class EncoderLayer(nn.Module):
  """Pre-norm self-attention and MLP block of the encoder."""

  config: T5Config

  @nn.compact
  def __call__(self, x: Array, bias: Array, mask: Array, deterministic: bool) -> Array:
    cfg = self.config
    drop = nn.Dropout(cfg.dropout_rate)
    h = RMSNorm(cfg, name="pre_attention_layer_norm")(x)
    h = MultiHeadAttention(cfg, name="attention")(h, h, bias, mask, deterministic)
    x = x + drop(h, deterministic=deterministic)
    h = RMSNorm(cfg, name="pre_mlp_layer_norm")(x)
    h = MLP(cfg, name="mlp")(h, deterministic)
    return x + drop(h, deterministic=deterministic)


class Encoder(nn.Module):
  """T5 encoder stack over a shared token embedder."""

  config: T5Config
  embedder: nn.Module

  @nn.compact
  def __call__(self, tokens: Array, deterministic: bool) -> Array:
    """`[batch, input_len]` int32 tokens -> `[batch, input_len, d_model]` outputs."""
    cfg = self.config
    mask = (tokens != cfg.pad_token_id)[:, None, None, :]  # [b, 1, 1, s]
    x = self.embedder(tokens).astype(cfg.compute_dtype)
    x = nn.Dropout(cfg.dropout_rate)(x, deterministic=deterministic)
    length = tokens.shape[1]
    bias = RelativePositionBias(cfg, bidirectional=True, name="relpos_bias")(
        jnp.arange(length)[None], length)
    for i in range(cfg.num_layers):
      x = EncoderLayer(cfg, name=f"layers_{i}")(x, bias, mask, deterministic)
    x = RMSNorm(cfg, name="encoder_norm")(x)
    return nn.Dropout(cfg.dropout_rate)(x, deterministic=deterministic)


class DecoderLayer(nn.Module):
  """Pre-norm causal self-attention, cross-attention and MLP block of the decoder."""

  config: T5Config

  def setup(self):
    cfg = self.config
    self.pre_self_attention_layer_norm = RMSNorm(cfg)
    self.self_attention = MultiHeadAttention(cfg)
    self.pre_cross_attention_layer_norm = RMSNorm(cfg)
    self.encoder_decoder_attention = MultiHeadAttention(cfg)
    self.pre_mlp_layer_norm = RMSNorm(cfg)
    self.mlp = MLP(cfg)
    self.dropout = nn.Dropout(cfg.dropout_rate)

  def cross_kv(self, encoder_outputs: Array) -> tuple[Array, Array]:
    """`[batch, input_len, d_model]` -> cross-attention keys, values `[b, s, h, d]`."""
    return self.encoder_decoder_attention.project_kv(encoder_outputs)

  def __call__(self, x: Array, *, self_bias: Array, self_mask: Array, cross_k: Array,
               cross_v: Array, cross_mask: Array, deterministic: bool) -> Array:
    """One decoder block over a teacher-forced sequence.

    Args:
      x: `[batch, length, d_model]` activations.
      self_bias: `[1, heads, length, length]` relative position bias.
      self_mask: bool, broadcastable to `[batch, heads, length, length]` (causal).
      cross_k: `[batch, heads, d_kv, input_len]`; cross_v `[batch, heads, input_len, d_kv]`.
      cross_mask: bool `[batch, 1, 1, input_len]`.
      deterministic: disables dropout.

    Returns:
      `[batch, length, d_model]`.
    """
    h = self.pre_self_attention_layer_norm(x)
    h = self.self_attention(h, h, self_bias, self_mask, deterministic)
    x = x + self.dropout(h, deterministic=deterministic)
    h = self.pre_cross_attention_layer_norm(x)
    h = self.encoder_decoder_attention.attend(
        self.encoder_decoder_attention.project_q(h), cross_k, cross_v, None, cross_mask,
        deterministic)
    x = x + self.dropout(h, deterministic=deterministic)
    h = self.mlp(self.pre_mlp_layer_norm(x), deterministic)
    return x + self.dropout(h, deterministic=deterministic)


class Decoder(nn.Module):
  """T5 decoder stack, teacher-forced (cached generation: `cached_decoder`)."""

  config: T5Config
  embedder: nn.Module

  def setup(self):
    cfg = self.config
    self.relpos_bias = RelativePositionBias(cfg, bidirectional=False)
    self.layers = [DecoderLayer(cfg, name=f"layers_{i}") for i in range(cfg.num_decoder_layers)]
    self.decoder_norm = RMSNorm(cfg)
    self.dropout = nn.Dropout(cfg.dropout_rate)
    if not cfg.tie_word_embeddings:
      self.logits_dense = Dense(cfg.vocab_size, cfg, ("embed", "vocab"))

  def cross_kv(self, encoder_outputs: Array) -> tuple[tuple[Array, ...], tuple[Array, ...]]:
    """Per-layer cross-attention keys and values, each `[batch, input_len, heads, d_kv]`."""
    kvs = [layer.cross_kv(encoder_outputs) for layer in self.layers]
    return tuple(k for k, _ in kvs), tuple(v for _, v in kvs)

  def __call__(self, tokens: Array, encoded: EncodedInputs, deterministic: bool) -> Array:
    """Teacher-forced logits of `tokens [batch, length]` at positions `0 ... length - 1`.

    Returns:
      Logits `[batch, length, vocab]` (compute dtype).
    """
    cfg = self.config
    length = tokens.shape[1]
    positions = jnp.arange(length)[None]  # [1, length]
    self_mask = (positions[0][None, :] <= positions[0][:, None])[None, None]
    self_bias = self.relpos_bias(positions, length)
    cross_mask = encoded.mask[:, None, None, :]
    x = self.embedder(tokens).astype(cfg.compute_dtype)
    x = self.dropout(x, deterministic=deterministic)
    for i, layer in enumerate(self.layers):
      x = layer(x, self_bias=self_bias, self_mask=self_mask, cross_k=encoded.cross_keys[i],
                cross_v=encoded.cross_values[i], cross_mask=cross_mask,
                deterministic=deterministic)
    x = self.dropout(self.decoder_norm(x), deterministic=deterministic)
    if cfg.tie_word_embeddings:
      embedding = self.embedder.embedding.astype(cfg.compute_dtype)
      return jnp.einsum("bkd,vd->bkv", x * cfg.d_model**-0.5, embedding)
    return self.logits_dense(x)


def cached_layout(encoded: EncodedInputs, options: DecodeOptions,
                  rules: LogicalRules | None) -> EncodedInputs:
  """`encoded` with its cross-attention keys/values as the cached decoder reads them: batch
  and heads merged unless `options.split_heads` (`kernels.merge_heads`), and constrained to
  `rules` (a no-op without rules or a multi-device mesh: `kernels.constrain_kv`)."""
  keys, values = kernels.constrain_kv(
      tuple(kernels.merge_heads(k, options.split_heads) for k in encoded.cross_keys),
      tuple(kernels.merge_heads(v, options.split_heads) for v in encoded.cross_values), rules)
  return encoded.replace(cross_keys=keys, cross_values=values)


def token_embedder(cfg: T5Config) -> nn.Embed:
  """The shared `[vocab, d_model]` token embedding (T5X init: N(0, 1))."""
  return nn.Embed(cfg.vocab_size, cfg.d_model, dtype=cfg.compute_dtype,
                  param_dtype=cfg.parameter_dtype,
                  embedding_init=layers.declare(nn.initializers.normal(stddev=1.0),
                                                ("vocab", "embed")))


class Transformer(nn.Module):
  """The T5 encoder-decoder as a Flax module (see `T5Model` for the functional API)."""

  config: T5Config

  def setup(self):
    cfg = self.config
    self.token_embedder = token_embedder(cfg)
    self.encoder = Encoder(cfg, self.token_embedder)
    self.decoder = Decoder(cfg, self.token_embedder)

  def encode(self, tokens: Array, deterministic: bool = True) -> EncodedInputs:
    """`[batch, input_len]` tokens -> `EncodedInputs` (cross K/V for every layer, and the
    encoder's hidden states)."""
    outputs = self.encoder(tokens, deterministic)
    return self.encoded_from_outputs(outputs, tokens != self.config.pad_token_id)

  def encoded_from_outputs(self, outputs: Array, mask: Array) -> EncodedInputs:
    """Encoder outputs `[batch, input_len, d_model]` computed earlier (`mask [batch,
    input_len]`: the real input tokens) -> `EncodedInputs`, as `encode` gives them."""
    keys, values = self.decoder.cross_kv(outputs.astype(self.config.compute_dtype))
    return EncodedInputs(keys, values, mask, outputs)

  def encoder_outputs(self, tokens: Array) -> Array:
    """`[batch, input_len]` -> the encoder's final hidden states `[b, s, d_model]`."""
    return self.encoder(tokens, True)

  def decode(self, encoded: EncodedInputs, decoder_input_tokens: Array,
             deterministic: bool = True) -> Array:
    """Teacher-forced logits `[batch, target_len, vocab]` given `encode`'s output."""
    return self.decoder(decoder_input_tokens, encoded, deterministic)

  def __call__(self, encoder_input_tokens: Array, decoder_input_tokens: Array,
               deterministic: bool = True) -> Array:
    """Teacher-forced logits `[batch, target_len, vocab]`."""
    encoded = self.encode(encoder_input_tokens, deterministic)
    return self.decoder(decoder_input_tokens, encoded, deterministic)


@dataclasses.dataclass(frozen=True)
class T5Model:
  """Functional API around `Transformer`: pure functions of `params`.

  Hashable (by config, rules and options), so it can be a static argument of
  jitted decoders. The methods are jitted themselves (inlined when called
  inside another jit). `params` is the parameter tree without the outer
  `{"params": ...}` level, of plain arrays.

  Attributes:
    config: the architecture.
    axis_rules: logical -> mesh axis rules (`partitioning.axis_rules()`), the
      ones its parameters are sharded by. Under a multi-device mesh, the
      keys/values it creates (`init_cache`, `encode`) are constrained by them;
      None leaves their sharding to propagation. Nothing changes on one device.
    options: how its cached decoder runs (weight kernel, float16 panels, row
      products, cache layout, the loops' compiler options); by default
      `DecodeOptions.for_backend()`, chosen when the model is created. A
      model on a mesh of more than one device takes
      `DecodeOptions.for_backend(devices=mesh.size)`.
  """

  config: T5Config
  axis_rules: LogicalRules | None = None
  options: DecodeOptions = dataclasses.field(default_factory=DecodeOptions.for_backend)

  @property
  def module(self) -> Transformer:
    return Transformer(self.config)

  def init_params(self, rng: Array, input_len: int = 8, target_len: int = 8) -> dict:
    """Randomly initialised parameters (T5X initialisers), plain arrays."""
    inputs = jnp.ones((1, input_len), jnp.int32)
    targets = jnp.ones((1, target_len), jnp.int32)
    return layers.unbox(jax.jit(self.module.init)(rng, inputs, targets)["params"])

  def param_info(self) -> dict:
    """Every parameter's `layers.ParamInfo` (shape, dtype, logical axes), as declared
    where it is created; the tree of `init_params` (nothing is allocated)."""
    return _declared_params(self.config)

  def encode(self, params: dict | PreparedParams, inputs: Array) -> EncodedInputs:
    """Runs the encoder once: `[batch, input_len]` -> `EncodedInputs`."""
    if isinstance(params, PreparedParams):
      params = params.params
    return self._encode(params, inputs)

  @functools.partial(jax.jit, static_argnums=0)
  def _encode(self, params: dict, inputs: Array) -> EncodedInputs:
    encoded = self.module.apply({"params": params}, inputs, method=Transformer.encode)
    return cached_layout(encoded, self.options, self.axis_rules)

  @functools.partial(jax.jit, static_argnums=0)
  def encoded_from_outputs(self, params: dict, outputs: Array, mask: Array) -> EncodedInputs:
    """`EncodedInputs` from encoder outputs computed earlier (e.g. stored, in float16):
    `outputs [batch, input_len, d_model]`, `mask [batch, input_len]`; the encoder is not
    run."""
    encoded = self.module.apply({"params": params}, outputs, mask,
                                method=Transformer.encoded_from_outputs)
    return cached_layout(encoded, self.options, self.axis_rules)

  @functools.partial(jax.jit, static_argnums=0)
  def encoder_outputs(self, params: dict, inputs: Array) -> Array:
    """`[batch, input_len]` -> encoder hidden states `[batch, input_len, d_model]`."""
    return self.module.apply({"params": params}, inputs, method=Transformer.encoder_outputs)

  def prepare(self, params: dict | PreparedParams,
              head_tokens: Array | None = None) -> PreparedParams:
    """`params` with the decoder's weights fused and cast for generation, as `options` say.

    Prepare once per parameter set and hold the result (it copies every decoder
    weight): nothing is remembered, so every call prepares again. The panels
    are float16 where `options.half_panels` and float16 holds every weight
    exactly (`kernels.half_panels`; never for traced parameters).

    Args:
      params: a T5X-layout tree, or an already `PreparedParams` (returned as is).
      head_tokens: None, or int32 `[head]` distinct token ids: the output layer
        scores only these, every other token gets logit -inf
        (`cached_decoder.prepare`).

    Returns:
      `PreparedParams`.

    Raises:
      ValueError: `head_tokens` is not a 1-D array of distinct ids in the vocabulary.
    """
    if isinstance(params, PreparedParams):
      return params
    if head_tokens is not None:
      head_tokens = self._check_head_tokens(head_tokens)
    half = kernels.half_panels(self.options, params["decoder"])
    return PreparedParams(params, self._prepare_decoder(params, half, head_tokens))

  @functools.partial(jax.jit, static_argnums=(0, 2))
  def _prepare_decoder(self, params: dict, half: bool,
                       head_tokens: Array | None) -> DecodeWeights:
    return cached_decoder.prepare(self.config, params, self.options.packs_panels, half,
                                  head_tokens)

  def _check_head_tokens(self, head_tokens: Array) -> np.ndarray:
    ids = np.asarray(head_tokens)
    vocab = self.config.vocab_size
    if (ids.ndim != 1 or ids.size == 0 or not np.issubdtype(ids.dtype, np.integer)
        or ids.min() < 0 or ids.max() >= vocab or np.unique(ids).size != ids.size):
      raise ValueError(f"head_tokens must be a non-empty 1-D array of distinct token ids in "
                       f"[0, {vocab}), got {ids.dtype} of shape {ids.shape}; take them from "
                       "`distillation.head_tokens.frequent_tokens`.")
    return ids.astype(np.int32)

  def init_cache(self, batch_size: int, max_len: int) -> DecoderCache:
    """An empty cache of `max_len` positions per row (all lengths 0), constrained to
    `axis_rules` under a multi-device mesh."""
    cfg = self.config
    return DecoderCache.empty(num_layers=cfg.num_decoder_layers, batch_size=batch_size,
                              heads=cfg.num_heads, head_dim=cfg.d_kv, max_len=max_len,
                              dtype=cfg.compute_dtype, split_heads=self.options.split_heads,
                              axis_rules=self.axis_rules)

  def decode_chunk(self, weights: DecodeWeights | PreparedParams | dict, encoded: EncodedInputs,
                   cache: DecoderCache, tokens: Array, tree: tuple[Array, Array] | None = None
                   ) -> tuple[Array, DecoderCache]:
    """Scores `tokens [batch, k]` at each row's cached length.

    Args:
      weights: the decoder's `DecodeWeights` (`prepare(params).decoder`), or
        anything `prepare` takes.
      encoded: `encode(params, inputs)`.
      cache: the self-attention cache; the caller keeps
        `cache.lengths + k <= cache.max_len`.
      tokens: int32 `[batch, k]`.
      tree: None (the chain), or a token tree's (depths int32 `[batch, k]`,
        ancestors bool `[batch, k, k]`) (`cached_decoder.decode_chunk`).

    Returns:
      float32 logits `[batch, k, vocab]` (logits[:, i] predict the token after
      tokens[:, i], or after the path to node i) and the cache advanced by k.
    """
    if not isinstance(weights, DecodeWeights):
      weights = self.prepare(weights).decoder
    return self._decode_chunk(weights, encoded, cache, tokens, tree)

  @functools.partial(jax.jit, static_argnums=0)
  def _decode_chunk(self, weights: DecodeWeights, encoded: EncodedInputs, cache: DecoderCache,
                    tokens: Array, tree: tuple[Array, Array] | None
                    ) -> tuple[Array, DecoderCache]:
    logits, cache = cached_decoder.decode_chunk(self.config, self.options, weights, encoded,
                                                cache, tokens, tree)
    return logits.astype(jnp.float32), cache

  @functools.partial(jax.jit, static_argnums=0)
  def decode_logits(self, params: dict, encoded: EncodedInputs,
                    decoder_input_tokens: Array) -> Array:
    """Teacher-forced logits `[batch, target_len, vocab]` given `encode(params, inputs)`
    (a teacher that shares its encoder pass with a student runs it once)."""
    return self.module.apply({"params": params}, encoded, decoder_input_tokens,
                             method=Transformer.decode)

  @functools.partial(jax.jit, static_argnums=0)
  def logits(self, params: dict, encoder_input_tokens: Array, decoder_input_tokens: Array,
             *, dropout_rng: Array | None = None) -> Array:
    """Teacher-forced logits `[batch, target_len, vocab]`; dropout iff `dropout_rng`."""
    rngs = None if dropout_rng is None else {"dropout": dropout_rng}
    return self.module.apply({"params": params}, encoder_input_tokens, decoder_input_tokens,
                             deterministic=dropout_rng is None, rngs=rngs)


@functools.cache
def _declared_params(config: T5Config) -> dict:
  """`T5Model.param_info`, once per config."""
  tokens = jax.ShapeDtypeStruct((1, 8), jnp.int32)
  return layers.declared_params(Transformer(config), tokens, tokens)
