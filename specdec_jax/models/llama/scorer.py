"""A decoder-only model behind the scorer interface: `LlamaModel` with its prompt as context.

Where the prompt goes (`scorer.Scorer`'s positions, for a model without an
encoder): `encode` takes the prompts, int32 `[batch, prompt_len]`, each row
right-padded with 0 (a row's length is one past its last nonzero token; 0 is
SmolLM2's "<|endoftext|>", never inside a prompt), and keeps them with their
lengths n. `init_state` prefills each row's first n - 1 tokens into a cache
of `prompt_len - 1 + cache_len` positions and sets the row's cached length to
n - 1 (the padding written beyond it is masked and overwritten: the usual
rewind). The row's LAST prompt token stands at the loops' position 0, in
place of `start_token`: `score` feeds it wherever a chunk reaches position 0,
whatever token the loop put there. So the logits of position 0 predict the
first generated token, as a decoder-only model's next-token logits after its
prompt do, and the loops' positions m = 0, 1, ... are the model's positions
n - 1 + m: `cached_lengths` and `rewind` count from the prompt's end.
`start_token` is only a placeholder (the file's BOS id); the drafts never
rely on it (`NgramDraft` conditions its first proposal on it; prompt lookup
skips position 0).

A prefix every prompt starts with (a chat template's system turn) can be
prefilled once (`LlamaScorer.with_prefix`): `init_state` then copies its keys and
values into every row and prefills only the rest of each prompt.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specdec_jax import validation
from specdec_jax.decoding import trees
from specdec_jax.decoding.scorer import Scorer
from specdec_jax.models.kernels import DecoderCache
from specdec_jax.models.llama.model import LlamaModel, LlamaWeights
from specdec_jax.models.options import DecodeOptions

Array = jax.Array


@struct.dataclass
class LlamaContext:
  """The prompts of one generation, with the weights that score them.

  Attributes:
    weights: the prepared weights (`LlamaModel.prepare`; a layer-skip draft's
      first layers only).
    prompts: int32 `[batch, prompt_len]`, right-padded with 0.
    lengths: int32 `[batch]`, each row's prompt length n >= 1.
  """

  weights: LlamaWeights
  prompts: Array
  lengths: Array

  @property
  def last_tokens(self) -> Array:
    """int32 `[batch]`: each row's last prompt token (the one at the loops' position 0)."""
    return jnp.take_along_axis(self.prompts, self.lengths[:, None] - 1, axis=1)[:, 0]


@struct.dataclass
class LlamaScorerState:
  """State of a `LlamaScorer` in one generation.

  Attributes:
    context: the `LlamaContext` (fixed for the generation).
    cache: the keys and values of every layer the weights hold, `prompt_len - 1
      + cache_len` positions; `cache.lengths` counts from each row's start
      (its prompt included).
  """

  context: LlamaContext
  cache: DecoderCache


@struct.dataclass
class PromptPrefix:
  """The keys and values of tokens that begin every prompt, computed once.

  Attributes:
    tokens: int32 `[P]`.
    keys: per layer, one row's keys at positions 0..P-1 (`[kv_heads, head_dim, P]`,
      or `[1, kv_heads, head_dim, P]` with split heads: `DecodeOptions.split_heads`).
    values: per layer, one row's values (`[kv_heads, P, head_dim]`, or 4-D).
    features: float32 `[P, d_model]`, the final-normed hidden states at 0..P-1
      (`LlamaScorer.init_state_with_features`).
  """

  tokens: Array
  keys: tuple[Array, ...]
  values: tuple[Array, ...]
  features: Array

  @property
  def length(self) -> int:
    return self.tokens.shape[0]

  def fill(self, cache: DecoderCache) -> DecoderCache:
    """`cache` (lengths 0) with the prefix at positions 0..P-1 of every row, lengths P."""
    batch, length = cache.lengths.shape[0], self.length

    def rows(x: Array) -> Array:  # One row's entries for every row (batch-major).
      return jnp.tile(x, (batch,) + (1,) * (x.ndim - 1))

    keys = tuple(k.at[..., :length].set(rows(p)) for k, p in zip(cache.keys, self.keys,
                                                                   strict=True))
    values = tuple(v.at[..., :length, :].set(rows(p)) for v, p in zip(cache.values, self.values,
                                                                       strict=True))
    return DecoderCache(keys, values, jnp.full((batch,), length, jnp.int32))


def prompt_lengths(prompts: Array) -> Array:
  """int32 `[batch]`: one past each row's last nonzero token (at least 1)."""
  width = prompts.shape[1]
  last = width - jnp.argmax(prompts[:, ::-1] != 0, axis=1)  # width when the row is all 0.
  return jnp.where(jnp.any(prompts != 0, axis=1), last, 1).astype(jnp.int32)


def pad_prompts(prompts: list[list[int]], width: int | None = None) -> np.ndarray:
  """Token id lists -> int32 `[batch, width]` right-padded with 0 (`width`: the longest).

  Raises:
    ValueError: a prompt is empty, holds a 0 (the padding id), or is longer than `width`.
  """
  width = max(map(len, prompts)) if width is None else width
  out = np.zeros((len(prompts), width), np.int32)
  for i, ids in enumerate(prompts):
    if not ids or 0 in ids or len(ids) > width:
      raise ValueError(f"prompt {i} has {len(ids)} tokens (need 1..{width}, none of them 0, "
                       "the padding id).")
    out[i, :len(ids)] = ids
  return out


@struct.dataclass
class LlamaScorer(Scorer):
  """A Llama-architecture decoder-only model scoring chunks after its prompt.

  Attributes:
    model: the `LlamaModel` (static).
    weights: its prepared weights (`model.prepare(params)`, once per parameter
      set; a raw tree is prepared in `encode`, inside a traced loop once per
      generation).
    prefix: None, or the prefix every prompt starts with, prefilled once
      (`with_prefix`); the prompts must then start with `prefix.tokens` and be
      longer (`check_prompts`).

  Raises:
    ValueError: from the constructor, if `model` is not a `LlamaModel` or its
      config's special token ids lie outside its vocabulary.
  """

  model: LlamaModel = struct.field(pytree_node=False)
  weights: LlamaWeights | dict
  prefix: PromptPrefix | None = None

  def __post_init__(self):
    # Static fields only: pytree unflattening calls this with any leaves.
    if not isinstance(self.model, LlamaModel):
      raise ValueError(f"{type(self).__name__}'s model must be a "
                       f"specdec_jax.models.llama.LlamaModel, got {type(self.model).__name__}.")
    validation.check_model_config(self.model.config, f"{type(self).__name__}'s model.config")

  @property
  def vocab_size(self) -> int:
    return self.model.config.vocab_size

  @property
  def start_token(self) -> int:
    return self.model.config.bos_token_id

  @property
  def pad_id(self) -> int:
    return self.model.config.pad_token_id

  @property
  def decode_options(self) -> DecodeOptions:
    return self.model.options

  def encode(self, inputs: Array, target_encoded: Any = None) -> LlamaContext:
    """The prompts `[batch, prompt_len]` (0-padded) and the prepared weights."""
    del target_encoded
    return LlamaContext(self.model.prepare(self.weights), inputs, prompt_lengths(inputs))

  def with_prefix(self, tokens: Array) -> LlamaScorer:
    """This scorer with `tokens` (int32 `[P]`, P >= 1) prefilled once, its weights prepared."""
    weights = self.model.prepare(self.weights)
    ids = jnp.asarray(tokens, jnp.int32)[None]                            # [1, P]
    cache = self.model.init_cache(1, ids.shape[1], len(weights.layers))
    _, features, cache = self.model.decode_features(weights, cache, ids)
    return self.replace(weights=weights,
                        prefix=PromptPrefix(ids[0], cache.keys, cache.values, features[0]))

  def check_prompts(self, prompts: np.ndarray) -> None:
    """Raises ValueError unless every prompt (int `[batch, width]`) starts with the prefix
    and is longer than it (nothing to check without a prefix)."""
    if self.prefix is None:
      return
    prefix = np.asarray(self.prefix.tokens)
    prompts = np.asarray(prompts)
    starts = prompts.shape[1] > len(prefix) and np.all(prompts[:, :len(prefix)] == prefix)
    longer = np.all(np.asarray(prompt_lengths(jnp.asarray(prompts))) > len(prefix))
    if not (starts and longer):
      raise ValueError(f"every prompt must start with the scorer's {len(prefix)}-token prefix "
                       "and be longer; build the scorer without `with_prefix` for these.")

  @property
  def feature_size(self) -> int:
    return self.model.config.d_model

  def init_state(self, context: LlamaContext, cache_len: int) -> LlamaScorerState:
    # Inside the loops' jit the features nobody reads are not computed.
    return self.init_state_with_features(context, cache_len)[0]

  def init_state_with_features(self, context: LlamaContext, cache_len: int
                               ) -> tuple[LlamaScorerState, Array]:
    """`init_state`, and float32 features `[batch, prompt_len - 1, d_model]`: the
    final-normed hidden states of the prefill, row b's valid at 0 .. n_b - 2 (its
    prompt but the last token, which stands at the loops' position 0)."""
    batch, width = context.prompts.shape
    cache = self.model.init_cache(batch, width - 1 + cache_len, len(context.weights.layers))
    features = jnp.zeros((batch, 0, self.feature_size), jnp.float32)
    start = 0
    if self.prefix is not None:  # Copied, not computed again.
      cache, start = self.prefix.fill(cache), self.prefix.length
      features = jnp.broadcast_to(self.prefix.features, (batch,) + self.prefix.features.shape)
    if width - 1 > start:  # Prefill the rest but the last prompt column; no logits are used.
      _, rest, cache = self.model.decode_features(context.weights, cache,
                                                  context.prompts[:, start:-1])
      features = jnp.concatenate([features, rest], axis=1)
    return LlamaScorerState(context, cache.rewind(context.lengths - 1)), features[:, :width - 1]

  def score(self, state: LlamaScorerState, tokens: Array) -> tuple[Array, LlamaScorerState]:
    logits, _, state = self.score_with_features(state, tokens)
    return logits, state

  def score_with_features(self, state: LlamaScorerState, tokens: Array
                          ) -> tuple[Array, Array, LlamaScorerState]:
    # A chunk is the chain: the tree whose parents are i - 1.
    return self.score_tree_with_features(state, tokens, trees.chain(tokens.shape[1] - 1))

  def score_tree(self, state: LlamaScorerState, tokens: Array, parents: Array
                 ) -> tuple[Array, LlamaScorerState]:
    logits, _, state = self.score_tree_with_features(state, tokens, parents)
    return logits, state

  def score_tree_with_features(self, state: LlamaScorerState, tokens: Array, parents: Array
                               ) -> tuple[Array, Array, LlamaScorerState]:
    context = state.context
    tree = trees.layout(parents, tokens.shape[0])
    # Only the root can stand at position 0: it is the last prompt token there.
    positions = self.cached_lengths(state)[:, None] + tree.depths
    tokens = jnp.where(positions == 0, context.last_tokens[:, None], tokens)
    logits, features, cache = self.model.decode_features(
        context.weights, state.cache, tokens, (tree.depths, tree.ancestors))
    return logits, features, state.replace(cache=cache)

  def keep_path(self, state: LlamaScorerState, order: Array, lengths: Array
                ) -> LlamaScorerState:
    start = state.cache.lengths - order.shape[1]
    cache = state.cache.keep_path(start, order, lengths + state.context.lengths - 1)
    return state.replace(cache=cache)

  def cached_lengths(self, state: LlamaScorerState) -> Array:
    return state.cache.lengths - (state.context.lengths - 1)

  def rewind(self, state: LlamaScorerState, lengths: Array) -> LlamaScorerState:
    return state.replace(cache=state.cache.rewind(lengths + state.context.lengths - 1))
