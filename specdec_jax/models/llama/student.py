"""A small decoder-only draft for a Llama target that reads the target's embedding table.

The paper's recipe for a decoder-only target (Leviathan et al. 2023, Table 3: a 6M
draft for a 97M GPT-like target) is a small model of the same family, trained on the
target's own outputs. A 49,152-token vocabulary would make most of such a draft its
embedding and head, so this one owns neither:

  * input: the target's token embedding `E [vocab, E_dim]` (frozen, read from the
    target), projected to the draft's width by a learned `input_projection`;
  * output: logits over a shortlist of `head` tokens (the target's most frequent
    outputs, `distillation.head_tokens`): `h . (E[shortlist] W_out)^T + bias`, every
    other token at probability 0, which keeps speculative sampling exact (a token the
    draft cannot propose is still reached through the target's residual
    distribution).

In between: Llama blocks (`model.LlamaDecoder`: RMSNorm, RoPE, grouped-query attention,
SwiGLU) of the draft's own width. With `tied_io`, as EAGLE's draft, the blocks run at
the target's own width and there are no projections: the input is the target's
embedding row itself and the head is the target's own tied rows `E[shortlist]`, both
frozen and read from the target's file. Parameter tree (T5X-style names, kernels
`[in, out]`):

  input_projection/kernel                   [E_dim, d_model]   (not with tied_io)
  output_projection/kernel                  [E_dim, d_model]   (not with tied_io)
  logits_bias                               [head]
  decoder/layers_N/...                      as `model.LlamaTransformer`'s
  decoder/decoder_norm/scale                [d_model]
  feature_projection/kernel                 [F, d_model]   (feature_size F > 0 only)
  feature_output/kernel                     [d_model, F]   (feature_size F > 0 only)

With `feature_size` F > 0 the draft also reads its target's features, as EAGLE (Li et
al. 2024) does: the input at position t is the token's projected embedding plus the
projected final-normed hidden state the target computed at position t - 1 (the one
that predicted token t; 0 at position 0), and the draft predicts the target's feature
at t (`feature_output`), which it reads in place of the target's while it proposes
beyond the verified text (`feature_draft.FeatureDraft`).

For generation the draft is a `LlamaModel` of its blocks' config with prepared
`LlamaWeights` (`Student.prepare`): the projected table `E W_in [vocab, d_model]` as
its embedding, `(E[shortlist] W_out)^T [d_model, head]` as its logits matrix (`E` and
`E[shortlist]^T` with `tied_io`),
`logits_bias` and `head_tokens`; `StudentDraft` puts it behind the draft interface.
It reads the same chat prompt as the target (the target's `inputs`).
"""

from __future__ import annotations

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import struct

from specdec_jax.decoding.drafts import ScorerDraft
from specdec_jax.models import layers
from specdec_jax.models.llama.feature_draft import FeatureDraft
from specdec_jax.models.llama.model import LlamaConfig, LlamaDecoder, LlamaModel, LlamaWeights
from specdec_jax.models.llama.scorer import LlamaScorer
from specdec_jax.models.options import DecodeOptions

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class StudentConfig:
  """The shape of a draft that reads its target's embedding table.

  Attributes:
    blocks: the draft's Llama blocks (its `vocab_size` and special ids are the
      target's: the tokens it reads and the ids its outputs carry).
    embed_dim: the width of the target's embedding table.
    head_size: tokens its output layer scores (the shortlist's length).
    feature_size: the width F of the target's features it reads (0: none).
    tied_io: its input is the target's embedding row and its head the target's tied
      rows over the shortlist, without projections (blocks at the target's width).
  """

  blocks: LlamaConfig
  embed_dim: int
  head_size: int
  feature_size: int = 0
  tied_io: bool = False

  def __post_init__(self):
    for name in ("embed_dim", "head_size"):
      if getattr(self, name) < 1:
        raise ValueError(f"StudentConfig.{name} must be >= 1, got {getattr(self, name)}.")
    if self.feature_size < 0:
      raise ValueError(f"StudentConfig.feature_size must be >= 0, got {self.feature_size}.")
    if self.head_size > self.blocks.vocab_size:
      raise ValueError(f"StudentConfig.head_size={self.head_size} exceeds the target's "
                       f"vocabulary ({self.blocks.vocab_size}).")
    if self.tied_io and self.blocks.d_model != self.embed_dim:
      raise ValueError(f"StudentConfig.tied_io needs the blocks at the target's width: "
                       f"d_model={self.blocks.d_model}, the target's {self.embed_dim}; pass "
                       f"d_model={self.embed_dim} or tied_io=False.")

  def to_dict(self) -> dict:
    return {"blocks": dataclasses.asdict(self.blocks), "embed_dim": self.embed_dim,
            "head_size": self.head_size, "feature_size": self.feature_size,
            "tied_io": self.tied_io}

  @classmethod
  def from_dict(cls, d: dict) -> StudentConfig:
    return cls(LlamaConfig(**d["blocks"]), int(d["embed_dim"]), int(d["head_size"]),
               int(d.get("feature_size", 0)), bool(d.get("tied_io", False)))


def student_config(target: LlamaConfig, *, d_model: int, num_layers: int, head_size: int,
                   head_dim: int = 64, kv_groups: int = 2, d_ff: int | None = None,
                   reads_features: bool = False, tied_io: bool = False) -> StudentConfig:
  """A draft's config for `target`: its vocabulary, special ids and RoPE base.

  Args:
    target: the target's config.
    d_model: the draft's width (a multiple of `head_dim`).
    num_layers: its blocks.
    head_size: the shortlist's length.
    head_dim: per attention head.
    kv_groups: query heads per key/value head.
    d_ff: SwiGLU width (default: 8/3 d_model, rounded up to a multiple of 64).
    reads_features: read the target's features (width: its d_model).
    tied_io: the target's embedding and tied head rows as they are (`StudentConfig`).

  Raises:
    ValueError: `d_model` not a multiple of `head_dim`, or heads not a multiple of
      `kv_groups`, or `tied_io` at another width than the target's.
  """
  if d_model % head_dim:
    raise ValueError(f"d_model={d_model} must be a multiple of head_dim={head_dim}.")
  heads = d_model // head_dim
  if heads % kv_groups:
    raise ValueError(f"d_model / head_dim = {heads} heads must be a multiple of "
                     f"kv_groups={kv_groups}.")
  d_ff = d_ff or -(-8 * d_model // 3 // 64) * 64
  blocks = dataclasses.replace(target, d_model=d_model, num_layers=num_layers,
                               num_heads=heads, num_kv_heads=heads // kv_groups,
                               head_dim=head_dim, d_ff=d_ff)
  return StudentConfig(blocks, target.d_model, head_size,
                       target.d_model if reads_features else 0, tied_io)


class StudentTransformer(nn.Module):
  """The draft as a Flax module: teacher-forced logits over the shortlist."""

  config: StudentConfig

  @nn.compact
  def __call__(self, embedding: Array, head_tokens: Array, tokens: Array, positions: Array,
               mask: Array, features: Array | None = None) -> tuple[Array, Array | None]:
    """Logits of every position, and the target features it predicts.

    Args:
      embedding: `[vocab, embed_dim]`, the target's token embedding (not trained).
      head_tokens: int32 `[head]`, the shortlist.
      tokens: int32 `[batch, L]`.
      positions: int32 `[batch, L]`, each token's RoPE position.
      mask: bool `[batch, L, L]`, True where a query may read a key.
      features: `[batch, L, F]`, the target's feature of each token's previous
        position (`feature_inputs`); required iff `feature_size` > 0.

    Returns:
      float32 `[batch, L, head]`: logits[b, i, j] scores head_tokens[j] after tokens[b, i];
      and float32 `[batch, L, F]`, the predicted feature at each position (None
      without features).
    """
    cfg = self.config
    blocks = cfg.blocks
    dtype = blocks.compute_dtype
    init = layers.declare(nn.initializers.lecun_normal(), ("embed", "mlp"))
    projections = None
    if not cfg.tied_io:
      projections = tuple(jnp.asarray(self.param(name, init, (cfg.embed_dim, blocks.d_model),
                                                 blocks.parameter_dtype), dtype)
                          for name in ("input_projection", "output_projection"))
    bias = self.param("logits_bias", layers.declare(nn.initializers.zeros, ("vocab",)),
                      (cfg.head_size,), blocks.parameter_dtype)
    table = jax.lax.stop_gradient(jnp.asarray(embedding, dtype))
    x = jnp.take(table, tokens, axis=0)                                  # [b, L, E_dim]
    if projections:
      x = x @ projections[0]                                             # [b, L, d]
    if cfg.feature_size:
      w_fin = self.param("feature_projection", init, (cfg.feature_size, blocks.d_model),
                         blocks.parameter_dtype)
      x = x + jnp.asarray(features, dtype) @ jnp.asarray(w_fin, dtype)
    x = LlamaDecoder(blocks, name="decoder")(x, positions, mask)
    head = jnp.take(table, head_tokens, axis=0)                         # [head, E_dim]
    if projections:
      head = head @ projections[1]                                       # [head, d]
    logits = (x @ head.T + jnp.asarray(bias, dtype)).astype(jnp.float32)
    if not cfg.feature_size:
      return logits, None
    w_fout = self.param("feature_output", layers.declare(nn.initializers.lecun_normal(),
                                                         ("mlp", "embed")),
                        (blocks.d_model, cfg.feature_size), blocks.parameter_dtype)
    return logits, (x @ jnp.asarray(w_fout, dtype)).astype(jnp.float32)


def prompt_and_outputs(prompts: Array, prompt_lengths: Array, decoder_inputs: Array
                       ) -> tuple[Array, Array, Array]:
  """The tokens, positions and mask a decoder-only model reads for teacher forcing.

  As `LlamaScorer` generates: each row's prompt but its last token is the context
  (positions 0 .. n - 2), then the decoder inputs stand at positions n - 1, n, ...,
  the first of them replaced by the prompt's last token; so the logits at decoder
  position t predict output token t.

  Args:
    prompts: int32 `[batch, Lp]`, right-padded with 0; row b's length n_b >= 1.
    prompt_lengths: int32 `[batch]`.
    decoder_inputs: int32 `[batch, T]`: 0 (any token), then the outputs shifted right.

  Returns:
    tokens int32 `[batch, Lp + T]`, positions int32 `[batch, Lp + T]` and mask bool
    `[batch, Lp + T, Lp + T]`; the logits of columns Lp .. Lp + T - 1 are the decoder
    positions'.
  """
  batch, width = prompts.shape
  length = decoder_inputs.shape[1]
  last = jnp.take_along_axis(prompts, prompt_lengths[:, None] - 1, axis=1)     # [b, 1]
  decoder = decoder_inputs.at[:, :1].set(last)
  tokens = jnp.concatenate([prompts, decoder], axis=1)                         # [b, Lp + T]
  context = jnp.arange(width)[None] < (prompt_lengths - 1)[:, None]           # [b, Lp]
  valid = jnp.concatenate([context, jnp.ones((batch, length), bool)], axis=1)  # [b, Lp + T]
  positions = jnp.concatenate([jnp.broadcast_to(jnp.arange(width), (batch, width)),
                               prompt_lengths[:, None] - 1 + jnp.arange(length)], axis=1)
  causal = positions[:, None, :] <= positions[:, :, None]                      # [b, q, k]
  order = jnp.arange(width + length)
  # Padding keys are never read; a query reads valid keys at or before it.
  mask = causal & valid[:, None, :] & (order[None, :] <= order[:, None])[None]
  return tokens, positions.astype(jnp.int32), mask


def feature_inputs(prompt_features: Array, prompt_lengths: Array, decoder_features: Array
                   ) -> Array:
  """The target features each column of `prompt_and_outputs` reads: its previous position's.

  Args:
    prompt_features: `[batch, Lp, F]`, the target's features at the prompt's positions
      (row b's valid at 0 .. n_b - 2: its prefill).
    prompt_lengths: int32 `[batch]`, n_b >= 1.
    decoder_features: `[batch, T, F]`, the target's features at decoder positions 0 ..
      T - 1 (model positions n - 1, n, ...).

  Returns:
    `[batch, Lp + T, F]`: prompt column i reads position i - 1's (0 at i = 0), decoder
    column 0 the prompt's position n - 2 (0 if n = 1), decoder column t > 0 decoder
    position t - 1's.
  """
  batch, width, size = prompt_features.shape
  zero = jnp.zeros((batch, 1, size), prompt_features.dtype)
  before_last = jnp.take_along_axis(prompt_features, jnp.maximum(prompt_lengths - 2, 0)[:, None,
                                                                                        None],
                                    axis=1)                                   # [b, 1, F]
  before_last = jnp.where((prompt_lengths >= 2)[:, None, None], before_last, 0)
  return jnp.concatenate([zero, prompt_features[:, :width - 1], before_last,
                          decoder_features[:, :-1].astype(prompt_features.dtype)], axis=1)


@dataclasses.dataclass(frozen=True)
class Student:
  """Functional API of a draft that reads its target's embedding (hashable: a static
  argument of jitted steps).

  Attributes:
    config: its shape.
    options: how its generation runs (`LlamaModel.options`; default: this backend's).
  """

  config: StudentConfig
  options: DecodeOptions = dataclasses.field(default_factory=DecodeOptions.for_backend)

  @property
  def module(self) -> StudentTransformer:
    return StudentTransformer(self.config)

  @property
  def llama(self) -> LlamaModel:
    """The `LlamaModel` its prepared weights run in (`prepare`)."""
    return LlamaModel(self.config.blocks, options=self.options)

  def init_params(self, rng: Array) -> dict:
    """Random parameters (the projections fan-in normal, the bias 0)."""
    cfg = self.config
    embedding = jnp.zeros((1, cfg.embed_dim), jnp.float32)
    head = jnp.zeros((cfg.head_size,), jnp.int32)
    tokens = jnp.zeros((1, 4), jnp.int32)
    positions = jnp.arange(4)[None]
    mask = jnp.tril(jnp.ones((4, 4), bool))[None]
    features = jnp.zeros((1, 4, cfg.feature_size), jnp.float32) if cfg.feature_size else None
    params = jax.jit(self.module.init)(rng, embedding, head, tokens, positions, mask, features)
    return layers.unbox(params["params"])

  def param_count(self, params: dict) -> int:
    return sum(int(x.size) for x in jax.tree.leaves(params))

  def logits(self, params: dict, embedding: Array, head_tokens: Array, prompts: Array,
             prompt_lengths: Array, decoder_inputs: Array) -> Array:
    """Teacher-forced float32 logits `[batch, T, head]` after each decoder input
    (`prompt_and_outputs` gives the layout) of a draft without features."""
    return self.outputs(params, embedding, head_tokens, prompts, prompt_lengths,
                        decoder_inputs)[0][:, prompts.shape[1]:]

  @functools.partial(jax.jit, static_argnums=0)
  def outputs(self, params: dict, embedding: Array, head_tokens: Array, prompts: Array,
              prompt_lengths: Array, decoder_inputs: Array, prompt_features: Array | None = None,
              decoder_features: Array | None = None) -> tuple[Array, Array | None]:
    """Teacher-forced outputs of every column of `prompt_and_outputs` (`[batch, Lp + T]`):
    float32 logits `[batch, Lp + T, head]` and the predicted features `[batch, Lp + T, F]`
    (None without). A draft that reads features takes the target's along the prompts
    `[batch, Lp, F]` and along the decoder positions `[batch, T, F]` (`feature_inputs`)."""
    tokens, positions, mask = prompt_and_outputs(prompts, prompt_lengths, decoder_inputs)
    features = None
    if self.config.feature_size:
      features = feature_inputs(prompt_features, prompt_lengths, decoder_features)
    return self.module.apply({"params": params}, embedding, head_tokens, tokens, positions,
                             mask, features)

  def io_matrices(self, params: dict, embedding: Array, head_tokens: Array
                  ) -> tuple[Array, Array]:
    """float32 (the input embedding `[vocab, d_model]`, the head's rows `[head, d_model]`):
    the target's table and shortlist rows, projected unless `tied_io`."""
    table = jnp.asarray(embedding, jnp.float32)
    head = jnp.take(table, jnp.asarray(head_tokens), axis=0)
    if self.config.tied_io:
      return table, head
    return (table @ jnp.asarray(params["input_projection"], jnp.float32),
            head @ jnp.asarray(params["output_projection"], jnp.float32))

  def prepare(self, params: dict, embedding: Array, head_tokens: Array) -> LlamaWeights:
    """The draft's weights for generation (`LlamaModel.decode_chunk` of `self.llama`).

    Args:
      params: the draft's parameters.
      embedding: `[vocab, embed_dim]`, the target's token embedding.
      head_tokens: int32 `[head]`, the shortlist, distinct ids.
    """
    dtype = self.config.blocks.compute_dtype
    projected, head = self.io_matrices(params, embedding, head_tokens)
    tree = {"token_embedder": {"embedding": projected.astype(dtype)},
            "decoder": params["decoder"]}
    weights = self.llama.prepare(tree)
    return weights.replace(logits=head.T.astype(dtype),
                           logits_bias=jnp.asarray(params["logits_bias"], dtype),
                           head_tokens=jnp.asarray(head_tokens, jnp.int32))

  def draft(self, params: dict, embedding: Array, head_tokens: Array
            ) -> StudentDraft | FeatureDraft:
    """The draft for generation (`prepare`'s arguments): a `FeatureDraft` if it reads
    the target's features, else a `StudentDraft`."""
    weights = self.prepare(params, embedding, head_tokens)
    if not self.config.feature_size:
      return StudentDraft(self.llama, weights)
    dtype = self.config.blocks.compute_dtype
    return FeatureDraft(self.llama, weights, jnp.asarray(params["feature_projection"], dtype),
                        jnp.asarray(params["feature_output"], dtype))


@struct.dataclass
class StudentDraft(ScorerDraft):
  """A trained `Student` as the draft: its prepared weights behind a `LlamaScorer`.

  It reads the same prompts as the target (`draft_inputs` = the target's inputs).

  Attributes:
    model: the `LlamaModel` of the draft's blocks (`Student.llama`; static).
    weights: its prepared weights (`Student.prepare`).
  """

  model: LlamaModel = struct.field(pytree_node=False)
  weights: LlamaWeights

  @property
  def scorer(self) -> LlamaScorer:
    return LlamaScorer(self.model, self.weights)
