"""A Flax T5 encoder-decoder with T5X parameter names and chunked cached decoding.

Parameter tree (T5X layout):

  token_embedder/embedding                                   [vocab, d_model]
  encoder/relpos_bias/rel_embedding                          [heads, buckets]
  encoder/layers_N/pre_attention_layer_norm/scale            [d_model]
  encoder/layers_N/attention/{query,key,value}/kernel        [d_model, heads*d_kv]
  encoder/layers_N/attention/out/kernel                      [heads*d_kv, d_model]
  encoder/layers_N/pre_mlp_layer_norm/scale                  [d_model]
  encoder/layers_N/mlp/{wi | wi_0, wi_1}/kernel, mlp/wo/kernel
  encoder/encoder_norm/scale
  decoder/relpos_bias/rel_embedding
  decoder/layers_N/{pre_self_attention_layer_norm, self_attention,
                    pre_cross_attention_layer_norm, encoder_decoder_attention,
                    pre_mlp_layer_norm, mlp}/...
  decoder/decoder_norm/scale
  decoder/logits_dense/kernel                                [d_model, vocab] (T5.1.1)

Decoding scores a *chunk* of k >= 1 new tokens per row against a `DecoderCache`
whose rows may sit at different lengths; moving a row's length back (rewinding)
needs no copy, because attention masks every cached position at or beyond it
and the next chunk overwrites them.
"""

from __future__ import annotations

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import struct

from specdec_jax.models.config import T5Config
from specdec_jax.models.layers import MLP, Dense, MultiHeadAttention, RelativePositionBias, RMSNorm

Array = jax.Array


@struct.dataclass
class DecoderCache:
  """Self-attention keys/values of every decoder layer, with per-row lengths.

  Attributes:
    keys: one `[batch, max_len, heads, d_kv]` array per decoder layer.
    values: one `[batch, max_len, heads, d_kv]` array per decoder layer.
    lengths: int32 `[batch]`, the number of valid positions of each row; the
      next chunk of a row is written at positions `lengths[row]...`.
  """

  keys: tuple[Array, ...]
  values: tuple[Array, ...]
  lengths: Array

  @property
  def max_len(self) -> int:
    return self.keys[0].shape[1]

  def rewind(self, lengths: Array) -> DecoderCache:
    """Sets each row's valid length (int32 `[batch]`); stale entries are masked."""
    return self.replace(lengths=lengths.astype(jnp.int32))


@struct.dataclass
class EncodedInputs:
  """What the decoder needs from the encoder, computed once per generation.

  Attributes:
    cross_keys: one `[batch, input_len, heads, d_kv]` array per decoder layer.
    cross_values: one `[batch, input_len, heads, d_kv]` array per decoder layer.
    mask: bool `[batch, input_len]`, True at real (non-padding) input tokens.
  """

  cross_keys: tuple[Array, ...]
  cross_values: tuple[Array, ...]
  mask: Array


def _write_chunk(cache: Array, chunk: Array, start: Array) -> Array:
  """Writes `chunk [b, k, h, d]` into `cache [b, T, h, d]` at per-row `start [b]`."""
  return jax.vmap(lambda c, u, s: jax.lax.dynamic_update_slice(c, u, (s, 0, 0)))(
      cache, chunk.astype(cache.dtype), start)


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
               cross_v: Array, cross_mask: Array, cache_kv: tuple[Array, Array] | None,
               write_start: Array | None, deterministic: bool
               ) -> tuple[Array, tuple[Array, Array] | None]:
    """One decoder block over a chunk.

    Args:
      x: `[batch, k, d_model]` chunk activations.
      self_bias: `[batch or 1, heads, k, kv_len]` relative position bias.
      self_mask: bool, broadcastable to `[batch, heads, k, kv_len]`.
      cross_k: `[batch, input_len, heads, d_kv]`; cross_v likewise.
      cross_mask: bool `[batch, 1, 1, input_len]`.
      cache_kv: this layer's cached keys, values `[batch, max_len, heads, d_kv]`,
        or None to attend within the chunk only (training).
      write_start: int32 `[batch]` where the chunk goes in the cache.
      deterministic: disables dropout.

    Returns:
      `[batch, k, d_model]` outputs and the updated `cache_kv`.
    """
    h = self.pre_self_attention_layer_norm(x)
    q = self.self_attention.project_q(h)
    k, v = self.self_attention.project_kv(h)
    if cache_kv is not None:
      k = _write_chunk(cache_kv[0], k, write_start)
      v = _write_chunk(cache_kv[1], v, write_start)
      cache_kv = (k, v)
    h = self.self_attention.attend(q, k, v, self_bias, self_mask, deterministic)
    x = x + self.dropout(h, deterministic=deterministic)
    h = self.pre_cross_attention_layer_norm(x)
    h = self.encoder_decoder_attention.attend(
        self.encoder_decoder_attention.project_q(h), cross_k, cross_v, None, cross_mask,
        deterministic)
    x = x + self.dropout(h, deterministic=deterministic)
    h = self.mlp(self.pre_mlp_layer_norm(x), deterministic)
    return x + self.dropout(h, deterministic=deterministic), cache_kv


class Decoder(nn.Module):
  """T5 decoder stack with chunked cached decoding."""

  config: T5Config
  embedder: nn.Module

  def setup(self):
    cfg = self.config
    self.relpos_bias = RelativePositionBias(cfg, bidirectional=False)
    self.layers = [DecoderLayer(cfg, name=f"layers_{i}") for i in range(cfg.n_decoder_layers)]
    self.decoder_norm = RMSNorm(cfg)
    self.dropout = nn.Dropout(cfg.dropout_rate)
    if not cfg.tie_word_embeddings:
      self.logits_dense = Dense(cfg.vocab_size, cfg)

  def cross_kv(self, encoder_outputs: Array) -> tuple[tuple[Array, ...], tuple[Array, ...]]:
    """Per-layer cross-attention keys and values, each `[batch, input_len, heads, d_kv]`."""
    kvs = [layer.cross_kv(encoder_outputs) for layer in self.layers]
    return tuple(k for k, _ in kvs), tuple(v for _, v in kvs)

  def __call__(self, tokens: Array, encoded: EncodedInputs, cache: DecoderCache | None,
               deterministic: bool) -> tuple[Array, DecoderCache | None]:
    """Scores a chunk of tokens.

    Args:
      tokens: int32 `[batch, k]`. With a cache, row `b` holds the tokens at
        positions `cache.lengths[b] ... cache.lengths[b] + k - 1`; without one,
        positions `0 ... k - 1` (teacher-forced training).
      encoded: the encoder's `EncodedInputs`.
      cache: the self-attention cache, or None.
      deterministic: disables dropout.

    Returns:
      Logits `[batch, k, vocab]` (compute dtype) and the cache with every row's
      length advanced by k (None without a cache).
    """
    cfg = self.config
    k = tokens.shape[1]
    if cache is None:
      positions = jnp.arange(k)[None]  # [1, k]
      kv_len = k
      write_start = None
    else:
      positions = cache.lengths[:, None] + jnp.arange(k)[None]  # [b, k]
      kv_len = cache.max_len
      write_start = cache.lengths
    self_mask = (jnp.arange(kv_len)[None, None, :] <= positions[:, :, None])[:, None]
    self_bias = self.relpos_bias(positions, kv_len)
    cross_mask = encoded.mask[:, None, None, :]
    x = self.embedder(tokens).astype(cfg.compute_dtype)
    x = self.dropout(x, deterministic=deterministic)
    new_keys, new_values = [], []
    for i, layer in enumerate(self.layers):
      cache_kv = None if cache is None else (cache.keys[i], cache.values[i])
      x, cache_kv = layer(x, self_bias=self_bias, self_mask=self_mask,
                          cross_k=encoded.cross_keys[i], cross_v=encoded.cross_values[i],
                          cross_mask=cross_mask, cache_kv=cache_kv, write_start=write_start,
                          deterministic=deterministic)
      if cache_kv is not None:
        new_keys.append(cache_kv[0])
        new_values.append(cache_kv[1])
    x = self.dropout(self.decoder_norm(x), deterministic=deterministic)
    if cfg.tie_word_embeddings:
      # An einsum over the embedding's d_model axis: `attend` (x @ E.T) made
      # XLA:CPU copy the transposed [vocab, d_model] table on every step.
      embedding = self.embedder.embedding.astype(cfg.compute_dtype)
      logits = jnp.einsum("bkd,vd->bkv", x * cfg.d_model**-0.5, embedding)
    else:
      logits = self.logits_dense(x)
    if cache is not None:
      cache = DecoderCache(tuple(new_keys), tuple(new_values), cache.lengths + k)
    return logits, cache


class Transformer(nn.Module):
  """The T5 encoder-decoder as a Flax module (see `T5Model` for the functional API)."""

  config: T5Config

  def setup(self):
    cfg = self.config
    self.token_embedder = nn.Embed(
        cfg.vocab_size, cfg.d_model, dtype=cfg.compute_dtype, param_dtype=cfg.parameter_dtype,
        embedding_init=nn.initializers.normal(stddev=1.0))
    self.encoder = Encoder(cfg, self.token_embedder)
    self.decoder = Decoder(cfg, self.token_embedder)

  def encode(self, tokens: Array, deterministic: bool = True) -> EncodedInputs:
    """`[batch, input_len]` tokens -> `EncodedInputs` (cross K/V for every layer)."""
    outputs = self.encoder(tokens, deterministic)
    keys, values = self.decoder.cross_kv(outputs)
    return EncodedInputs(keys, values, tokens != self.config.pad_token_id)

  def encoder_outputs(self, tokens: Array) -> Array:
    """`[batch, input_len]` -> the encoder's final hidden states `[b, s, d_model]`."""
    return self.encoder(tokens, True)

  def decode(self, tokens: Array, encoded: EncodedInputs, cache: DecoderCache | None,
             deterministic: bool = True) -> tuple[Array, DecoderCache | None]:
    return self.decoder(tokens, encoded, cache, deterministic)

  def __call__(self, encoder_input_tokens: Array, decoder_input_tokens: Array,
               deterministic: bool = True) -> Array:
    """Teacher-forced logits `[batch, target_len, vocab]`."""
    encoded = self.encode(encoder_input_tokens, deterministic)
    logits, _ = self.decoder(decoder_input_tokens, encoded, None, deterministic)
    return logits


@dataclasses.dataclass(frozen=True)
class T5Model:
  """Functional API around `Transformer`: pure functions of `params`.

  Hashable (by config), so it can be a static argument of jitted decoders. The
  methods are jitted themselves (inlined when called inside another jit).
  `params` is the parameter tree without the outer `{"params": ...}` level.
  """

  config: T5Config

  @property
  def module(self) -> Transformer:
    return Transformer(self.config)

  def init_params(self, rng: Array, input_len: int = 8, target_len: int = 8) -> dict:
    """Randomly initialised parameters (T5X initialisers)."""
    inputs = jnp.ones((1, input_len), jnp.int32)
    targets = jnp.ones((1, target_len), jnp.int32)
    return jax.jit(self.module.init)(rng, inputs, targets)["params"]

  @functools.partial(jax.jit, static_argnums=0)
  def encode(self, params: dict, inputs: Array) -> EncodedInputs:
    """Runs the encoder once: `[batch, input_len]` -> `EncodedInputs`."""
    return self.module.apply({"params": params}, inputs, method=Transformer.encode)

  @functools.partial(jax.jit, static_argnums=0)
  def encoder_outputs(self, params: dict, inputs: Array) -> Array:
    """`[batch, input_len]` -> encoder hidden states `[batch, input_len, d_model]`."""
    return self.module.apply({"params": params}, inputs, method=Transformer.encoder_outputs)

  def init_cache(self, batch_size: int, max_len: int) -> DecoderCache:
    """An empty cache of `max_len` positions per row (all lengths 0)."""
    cfg = self.config
    shape = (batch_size, max_len, cfg.num_heads, cfg.d_kv)
    zeros = tuple(jnp.zeros(shape, cfg.compute_dtype) for _ in range(cfg.n_decoder_layers))
    return DecoderCache(zeros, zeros, jnp.zeros((batch_size,), jnp.int32))

  @functools.partial(jax.jit, static_argnums=0)
  def decode_chunk(self, params: dict, encoded: EncodedInputs, cache: DecoderCache,
                   tokens: Array) -> tuple[Array, DecoderCache]:
    """Scores `tokens [batch, k]` at each row's cached length.

    The caller must keep `cache.lengths + k <= cache.max_len`.

    Returns:
      float32 logits `[batch, k, vocab]` (logits[:, i] predict the token after
      tokens[:, i]) and the cache advanced by k.
    """
    logits, cache = self.module.apply({"params": params}, tokens, encoded, cache,
                                      method=Transformer.decode)
    return logits.astype(jnp.float32), cache

  @functools.partial(jax.jit, static_argnums=0)
  def logits(self, params: dict, encoder_input_tokens: Array, decoder_input_tokens: Array,
             *, dropout_rng: Array | None = None) -> Array:
    """Teacher-forced logits `[batch, target_len, vocab]`; dropout iff `dropout_rng`."""
    rngs = None if dropout_rng is None else {"dropout": dropout_rng}
    return self.module.apply({"params": params}, encoder_input_tokens, decoder_input_tokens,
                             deterministic=dropout_rng is None, rngs=rngs)
