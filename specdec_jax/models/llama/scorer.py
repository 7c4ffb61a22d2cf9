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
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specdec_jax import validation
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

  Raises:
    ValueError: from the constructor, if `model` is not a `LlamaModel` or its
      config's special token ids lie outside its vocabulary.
  """

  model: LlamaModel = struct.field(pytree_node=False)
  weights: LlamaWeights | dict

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

  def init_state(self, context: LlamaContext, cache_len: int) -> LlamaScorerState:
    batch, width = context.prompts.shape
    cache = self.model.init_cache(batch, width - 1 + cache_len, len(context.weights.layers))
    if width > 1:  # Prefill all but the last prompt column; the logits are unused.
      _, cache = self.model.decode_chunk(context.weights, cache, context.prompts[:, :-1])
    return LlamaScorerState(context, cache.rewind(context.lengths - 1))

  def score(self, state: LlamaScorerState, tokens: Array) -> tuple[Array, LlamaScorerState]:
    context = state.context
    positions = self.cached_lengths(state)[:, None] + jnp.arange(tokens.shape[1])
    tokens = jnp.where(positions == 0, context.last_tokens[:, None], tokens)
    logits, cache = self.model.decode_chunk(context.weights, state.cache, tokens)
    return logits, state.replace(cache=cache)

  def cached_lengths(self, state: LlamaScorerState) -> Array:
    return state.cache.lengths - (state.context.lengths - 1)

  def rewind(self, state: LlamaScorerState, lengths: Array) -> LlamaScorerState:
    return state.replace(cache=state.cache.rewind(lengths + state.context.lengths - 1))
