"""The T5 decoder for cached generation: weights prepared once, a chunk scored per call.

`prepare` turns the T5X-layout parameter tree into `DecodeWeights` once per set
of parameters (self-attention query | key | value kernels side by side in one
`[d_model, 3 * heads * d_kv]` matrix, the gated MLP's `wi_0 | wi_1` in one
`[d_model, 2 * d_ff]`, a tied embedding transposed and scaled into a
`[d_model, vocab]` logits matrix, everything cast to the compute dtype), so a
layer costs six weight dots instead of nine (XLA:CPU pays a fixed cost per
op). The math is the Flax modules' own (`layers.rms_norm`, `layers.attention`,
...), so the logits equal `Transformer`'s teacher-forced ones (tested).

`decode_chunk` scores a *chunk* of k >= 1 new tokens per row against a
`kernels.DecoderCache` whose rows may sit at different lengths.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import struct

from specdec_jax.models import kernels, layers
from specdec_jax.models.kernels import DecoderCache
from specdec_jax.models.options import DecodeOptions
from specdec_jax.models.t5.config import T5Config
from specdec_jax.models.t5.layers import gated_gelu, relative_bias

Array = jax.Array


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
  packed it (`kernels.pack_weight`).

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


def prepare(config: T5Config, params: dict, panels: bool = False, half: bool = False,
            head_tokens: Array | None = None) -> DecodeWeights:
  """The decoder weights of a T5X-layout parameter tree, fused and cast for generation.

  With `panels` (`DecodeOptions.packs_panels`), every weight matrix that
  `panel_dot.packable` is stored as `[N / P, K, P]` panels (`kernels.pack_weight`)
  and multiplied by `panel_dot.dot`; in float16 with `half`
  (`kernels.half_panels(options, params)` must hold).

  `head_tokens` (int32 `[head]`, distinct ids) keeps only those columns of the
  logits matrix: a draft whose output layer scores a shortlist of the vocabulary
  (the rest get probability 0, which speculative sampling allows) streams
  `head / vocab` of that matrix per call.
  """
  dtype = config.compute_dtype
  dec = params["decoder"]

  def layout(w: Array, exact_in_half: bool = True) -> Array:
    return kernels.pack_weight(w, panels, half and exact_in_half)

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


def _layer(config: T5Config, w: LayerWeights, x: Array, *, self_bias: Array, self_mask: Array,
           cross_k: Array, cross_v: Array, cross_mask: Array, cache_k: Array, cache_v: Array,
           start: Array, by_row: bool) -> tuple[Array, Array, Array]:
  """One decoder block over a chunk `x [batch, k, d_model]`; returns x and the layer's cache.

  `by_row`: weight products one row at a time (`dense`).
  """
  dtype, eps, heads = config.compute_dtype, config.layer_norm_epsilon, config.num_heads
  inner = heads * config.d_kv
  matmul = functools.partial(kernels.dense, by_row=by_row)
  h = layers.rms_norm(x, w.self_norm, eps, dtype)
  qkv = matmul(h, w.qkv)  # [batch, k, 3 * inner]
  q, k, v = (layers.split_heads(qkv[..., i * inner:(i + 1) * inner], heads) for i in range(3))
  cache_k = kernels.write_positions(cache_k, layers.key_layout(k), start, axis=2)
  cache_v = kernels.write_positions(cache_v, layers.value_layout(v), start, axis=1)
  x = x + matmul(layers.attention(q, cache_k, cache_v, self_bias, self_mask, dtype), w.self_out)
  h = layers.rms_norm(x, w.cross_norm, eps, dtype)
  q = layers.split_heads(matmul(h, w.cross_query), heads)
  x = x + matmul(layers.attention(q, cross_k, cross_v, None, cross_mask, dtype), w.cross_out)
  h = matmul(layers.rms_norm(x, w.mlp_norm, eps, dtype), w.wi)
  h = gated_gelu(h[..., :config.d_ff], h[..., config.d_ff:]) if config.gated else jax.nn.relu(h)
  return x + matmul(h, w.wo), cache_k, cache_v


def decode_chunk(config: T5Config, options: DecodeOptions, weights: DecodeWeights,
                 encoded: EncodedInputs, cache: DecoderCache, tokens: Array,
                 tree: tuple[Array, Array] | None = None) -> tuple[Array, DecoderCache]:
  """Scores `tokens [batch, k]`, row b at positions `cache.lengths[b] ... + k - 1`.

  The chunk is a token tree when `tree` = (depths int32 `[batch, k]`, ancestors
  bool `[batch, k, k]`) is given (`decoding.trees.layout`): node i is written at
  cache entry `cache.lengths + i` but stands at position `cache.lengths +
  depths[i]` (the relative positions of its bias are taken from there:
  `kernels.chunk_positions`), and attends to the cache and to its ancestors
  and itself only (`kernels.chunk_mask`). None is the chain (depths 0 .. k - 1,
  every earlier node an ancestor): the same computation.

  The caller keeps `cache.lengths + k <= cache.max_len`. `options` say how
  many rows an unpacked weight multiplies row by row (`DecodeOptions.row_dots`);
  the weights and the cache were made by them.

  Returns:
    Logits `[batch, k, vocab]` (compute dtype; logits[:, i] predict the token
    after tokens[:, i], or after the path to node i) and the cache with every
    row's length advanced by k.
  """
  dtype = config.compute_dtype
  batch, k = tokens.shape
  by_row = options.row_dots(batch * k)
  if tree is None:
    tree = (jnp.broadcast_to(jnp.arange(k), (batch, k)), kernels.chain_ancestors(batch, k))
  depths, ancestors = tree
  kv_len = cache.max_len
  positions = cache.lengths[:, None] + depths  # [batch, k]
  self_mask = kernels.chunk_mask(cache.lengths, kv_len, ancestors)[:, None]  # [b, 1, k, kv_len]
  self_bias = relative_bias(weights.relpos, positions,
                            kernels.chunk_positions(cache.lengths, kv_len, depths),
                            bidirectional=False,
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
  logits = kernels.dense(x, weights.logits, by_row)
  if weights.head_tokens is not None:
    logits = jnp.full(logits.shape[:-1] + (config.vocab_size,), -jnp.inf, logits.dtype).at[
        ..., weights.head_tokens].set(logits, unique_indices=True)
  return logits, DecoderCache(tuple(keys), tuple(values), cache.lengths + k)
