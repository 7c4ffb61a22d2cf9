"""A draft decoder that reads the target's encoder: no encoder of its own.

The SpecDec drafter (Xia et al. 2023: deep encoder, shallow decoder), on T5:
the target encodes the input anyway, so the draft is a T5 *decoder* whose
cross-attention keys and values are projected from the target's final encoder
hidden states. It sees the input exactly as the target does and costs only its
decoder layers per token. Its cross-attention `key` / `value` kernels map the
target's width to its own heads (`[encoder_d_model, heads * d_kv]`), so a
d_model 128 decoder reads a d_model 384 encoder directly.

Parameter tree: `model.Transformer`'s without `encoder/` (T5X names; every
parameter with its shape and logical axes: `SharedEncoderModel.param_info()`);
`decoder/layers_N/encoder_decoder_attention/{key,value}/kernel` are
`[encoder_d_model, heads * d_kv]`.

Cached generation is the T5 decoder's own (`cached_decoder`): `prepare`,
`init_cache` and `decode_chunk` are those of a `T5Model` of the same config.
`config.num_layers` (the encoder depth) is unused.
"""

from __future__ import annotations

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from specdec_jax.models import layers
from specdec_jax.models.kernels import DecoderCache
from specdec_jax.models.layers import LogicalRules
from specdec_jax.models.options import DecodeOptions
from specdec_jax.models.t5.cached_decoder import DecodeWeights, EncodedInputs, PreparedParams
from specdec_jax.models.t5.config import T5Config
from specdec_jax.models.t5.model import Decoder, T5Model, cached_layout, token_embedder

Array = jax.Array


class SharedEncoderDecoder(nn.Module):
  """Token embedder and T5 decoder over another model's encoder outputs."""

  config: T5Config

  def setup(self):
    cfg = self.config
    self.token_embedder = token_embedder(cfg)
    self.decoder = Decoder(cfg, self.token_embedder)

  def encode(self, hidden: Array, mask: Array) -> EncodedInputs:
    """The target's `hidden [batch, input_len, encoder_d_model]` and `mask [batch,
    input_len]` -> this decoder's `EncodedInputs`."""
    keys, values = self.decoder.cross_kv(hidden.astype(self.config.compute_dtype))
    return EncodedInputs(keys, values, mask)

  def __call__(self, hidden: Array, mask: Array, decoder_input_tokens: Array,
               deterministic: bool = True) -> Array:
    """Teacher-forced logits `[batch, target_len, vocab]`."""
    return self.decoder(decoder_input_tokens, self.encode(hidden, mask), deterministic)


@dataclasses.dataclass(frozen=True)
class SharedEncoderModel:
  """Functional API of `SharedEncoderDecoder` (hashable: a static jit argument).

  Attributes:
    config: the decoder's T5 config (`num_layers` unused).
    encoder_d_model: width of the encoder outputs it reads (the target's d_model).
    axis_rules: as `T5Model.axis_rules`.
    options: as `T5Model.options` (by default `DecodeOptions.for_backend()`).
  """

  config: T5Config
  encoder_d_model: int
  axis_rules: LogicalRules | None = None
  options: DecodeOptions = dataclasses.field(default_factory=DecodeOptions.for_backend)

  def __post_init__(self):
    if not isinstance(self.encoder_d_model, int) or self.encoder_d_model < 1:
      raise ValueError(f"encoder_d_model must be an int >= 1 (the target's d_model), got "
                       f"{self.encoder_d_model!r}.")

  @property
  def module(self) -> SharedEncoderDecoder:
    return SharedEncoderDecoder(self.config)

  @property
  def _decoder(self) -> T5Model:
    """A T5Model of the same config: its cached decoder is this model's."""
    return T5Model(self.config, self.axis_rules, self.options)

  def init_params(self, rng: Array, input_len: int = 8, target_len: int = 8) -> dict:
    """Randomly initialised parameters (T5X initialisers), plain arrays."""
    hidden = jnp.zeros((1, input_len, self.encoder_d_model), self.config.compute_dtype)
    mask = jnp.ones((1, input_len), bool)
    tokens = jnp.ones((1, target_len), jnp.int32)
    return layers.unbox(jax.jit(self.module.init)(rng, hidden, mask, tokens)["params"])

  def param_info(self) -> dict:
    """Every parameter's `layers.ParamInfo` (shape, dtype, logical axes), as declared
    where it is created; the tree of `init_params` (nothing is allocated)."""
    return _declared_params(self.config, self.encoder_d_model)

  def encode(self, params: dict | PreparedParams, target_encoded: EncodedInputs
             ) -> EncodedInputs:
    """Cross-attention keys/values from the target's `EncodedInputs` (which must hold
    `hidden`, as `T5Model.encode` returns)."""
    if target_encoded.hidden is None:
      raise ValueError("target_encoded.hidden is None: pass the target's "
                       "T5Model.encode(params, inputs), which holds its encoder outputs.")
    if target_encoded.hidden.shape[-1] != self.encoder_d_model:
      raise ValueError(f"The target's encoder outputs are {target_encoded.hidden.shape[-1]} "
                       f"wide, but this draft reads {self.encoder_d_model}: use the draft "
                       "with the target it was trained on.")
    if isinstance(params, PreparedParams):
      params = params.params
    return self._encode(params, target_encoded.hidden, target_encoded.mask)

  @functools.partial(jax.jit, static_argnums=0)
  def _encode(self, params: dict, hidden: Array, mask: Array) -> EncodedInputs:
    encoded = self.module.apply({"params": params}, hidden, mask,
                                method=SharedEncoderDecoder.encode)
    return cached_layout(encoded, self.options, self.axis_rules)

  def prepare(self, params: dict | PreparedParams,
              head_tokens: Array | None = None) -> PreparedParams:
    """See `T5Model.prepare` (the same decoder weights)."""
    return self._decoder.prepare(params, head_tokens)

  def init_cache(self, batch_size: int, max_len: int) -> DecoderCache:
    return self._decoder.init_cache(batch_size, max_len)

  def decode_chunk(self, weights: DecodeWeights | PreparedParams | dict, encoded: EncodedInputs,
                   cache: DecoderCache, tokens: Array, tree: tuple[Array, Array] | None = None
                   ) -> tuple[Array, DecoderCache]:
    """See `T5Model.decode_chunk`."""
    return self._decoder.decode_chunk(weights, encoded, cache, tokens, tree)

  @functools.partial(jax.jit, static_argnums=0)
  def logits(self, params: dict, hidden: Array, mask: Array, decoder_input_tokens: Array, *,
             dropout_rng: Array | None = None) -> Array:
    """Teacher-forced logits `[batch, target_len, vocab]` over the target's `hidden
    [batch, input_len, encoder_d_model]` (`mask [batch, input_len]`)."""
    rngs = None if dropout_rng is None else {"dropout": dropout_rng}
    return self.module.apply({"params": params}, hidden, mask, decoder_input_tokens,
                             deterministic=dropout_rng is None, rngs=rngs)


@functools.cache
def _declared_params(config: T5Config, encoder_d_model: int) -> dict:
  """`SharedEncoderModel.param_info`, once per (config, encoder width)."""
  hidden = jax.ShapeDtypeStruct((1, 8, encoder_d_model), config.compute_dtype)
  mask = jax.ShapeDtypeStruct((1, 8), jnp.bool_)
  tokens = jax.ShapeDtypeStruct((1, 8), jnp.int32)
  return layers.declared_params(SharedEncoderDecoder(config), hidden, mask, tokens)
