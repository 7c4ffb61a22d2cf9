"""A T5 behind the scorer interface: its encoder once per input, its cached decoder per chunk.

`T5Scorer` runs a `T5Model`'s encoder in `encode` and scores chunks with its
cached decoder (`cached_decoder.decode_chunk`); `SharedEncoderScorer` is a T5
decoder that reads the target's encoder outputs instead of encoding the
inputs (`shared_encoder.SharedEncoderModel`). Both fit `decoding.scorer.Scorer`,
so the model-free loops (`decoding.baseline.decode`,
`decoding.speculative.speculative_decode`, `decoding.tree_speculative`) run them.

Both score token trees (`Scorer.score_tree`): each node at the cached length +
its depth, its relative positions taken from there, attending to the cache
and its ancestors only. A chunk is the chain, the tree whose parents are
i - 1: `score` is `score_tree` with `trees.chain`, one code path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import jax
from flax import struct

from specdec_jax import validation
from specdec_jax.decoding import trees
from specdec_jax.decoding.scorer import Scorer
from specdec_jax.models.kernels import DecoderCache
from specdec_jax.models.options import DecodeOptions
from specdec_jax.models.t5.cached_decoder import DecodeWeights, EncodedInputs, PreparedParams
from specdec_jax.models.t5.config import T5Config
from specdec_jax.models.t5.model import T5Model
from specdec_jax.models.t5.shared_encoder import SharedEncoderModel

Array = jax.Array


def check_t5_model(model: Any, name: str) -> T5Config:
  """`validation.check_model` for a T5 (`T5Model`, or anything with a `T5Config` as its
  `config`); returns the config."""
  return validation.check_model(model, name, T5Config)


def check_shared_encoder_model(model: Any, name: str) -> T5Config:
  """Checks that `model` is a `SharedEncoderModel` (a T5 decoder over another's encoder).

  Args:
    model: the model.
    name: the argument's name, for the message.

  Returns:
    Its config, checked by `validation.check_model_config`.

  Raises:
    ValueError: `model` does not read another model's encoder outputs (it has
      no `encoder_d_model`, e.g. a `T5Model`), or its config is bad.
  """
  if not isinstance(getattr(model, "encoder_d_model", None), int):
    raise ValueError(f"{name} must be a specdec_jax.models.t5.SharedEncoderModel "
                     f"(a T5 draft with its own encoder is a T5Draft), got "
                     f"{type(model).__name__}.")
  return check_t5_model(model, name)


@struct.dataclass
class T5Context:
  """What a T5 scorer computes once per generation.

  Attributes:
    weights: the decoder's weights, prepared for generation (`T5Model.prepare`).
    encoded: the encoder's `EncodedInputs`: cross-attention keys/values, one
      `[batch * heads, d_kv, input_len]` / `[batch * heads, input_len, d_kv]`
      pair per decoder layer, and the mask `[batch, input_len]`.
  """

  weights: DecodeWeights
  encoded: EncodedInputs


@struct.dataclass
class T5ScorerState:
  """State of a T5 scorer in one generation.

  Attributes:
    context: the `T5Context` (fixed for the generation).
    cache: the decoder's self-attention `DecoderCache`: keys and values of
      `cache_len` positions per layer, lengths int32 `[batch]`.
  """

  context: T5Context
  cache: DecoderCache


@struct.dataclass
class T5Scorer(Scorer):
  """A T5 encoder-decoder: its encoder once per input, its cached decoder per chunk.

  Attributes:
    model: the `T5Model` (static).
    params: its parameters: `model.prepare(params)` (prepared once per set of
      parameters, outside the loop), or a T5X-layout tree, prepared in
      `encode`: inside a traced loop, once per generation.
    check_model: the check of `model` (`check_t5_model`; a class attribute,
      which the drafts built on this scorer kind also call).

  Raises:
    ValueError: from the constructor, if `model` is not a `T5Model` or its
      config's special token ids lie outside its vocabulary.
  """

  model: T5Model | SharedEncoderModel = struct.field(pytree_node=False)
  params: dict | PreparedParams
  check_model: ClassVar[Callable[[Any, str], T5Config]] = staticmethod(check_t5_model)

  def __post_init__(self):
    # Static fields only: pytree unflattening calls this with any leaves.
    self.check_model(self.model, f"{type(self).__name__}'s model")

  @property
  def vocab_size(self) -> int:
    return self.model.config.vocab_size

  @property
  def encoder_width(self) -> int:
    return self.model.config.d_model

  @property
  def start_token(self) -> int:
    return self.model.config.decoder_start_token_id

  @property
  def pad_id(self) -> int:
    return self.model.config.pad_token_id

  @property
  def decode_options(self) -> DecodeOptions:
    return self.model.options

  def encode(self, inputs: Array, target_encoded: Any = None) -> T5Context:
    del target_encoded
    prepared = self.model.prepare(self.params)
    return T5Context(prepared.decoder, self.model.encode(prepared, inputs))

  def init_state(self, context: T5Context, cache_len: int) -> T5ScorerState:
    batch = context.encoded.mask.shape[0]
    return T5ScorerState(context, self.model.init_cache(batch, cache_len))

  def score(self, state: T5ScorerState, tokens: Array) -> tuple[Array, T5ScorerState]:
    # A chunk is the chain: the tree whose parents are i - 1.
    return self.score_tree(state, tokens, trees.chain(tokens.shape[1] - 1))

  def score_tree(self, state: T5ScorerState, tokens: Array, parents: Array
                 ) -> tuple[Array, T5ScorerState]:
    tree = trees.layout(parents, tokens.shape[0])
    logits, cache = self.model.decode_chunk(state.context.weights, state.context.encoded,
                                            state.cache, tokens, (tree.depths, tree.ancestors))
    return logits, state.replace(cache=cache)

  def keep_path(self, state: T5ScorerState, order: Array, lengths: Array) -> T5ScorerState:
    start = state.cache.lengths - order.shape[1]
    return state.replace(cache=state.cache.keep_path(start, order, lengths))

  def cached_lengths(self, state: T5ScorerState) -> Array:
    return state.cache.lengths

  def rewind(self, state: T5ScorerState, lengths: Array) -> T5ScorerState:
    return state.replace(cache=state.cache.rewind(lengths))

  def encoder_outputs(self, context: T5Context) -> EncodedInputs:
    return context.encoded


@struct.dataclass
class SharedEncoderScorer(T5Scorer):
  """A T5 decoder over the target's encoder outputs (`shared_encoder`).

  Scoring (chains and trees), keeping a path and rewinding are `T5Scorer`'s;
  only `encode` differs: the cross-attention keys/values are projected from
  `target_encoded`, so the inputs themselves are not read. `model` is a
  `SharedEncoderModel`.

  Raises:
    ValueError: from the constructor, if `model` is not a `SharedEncoderModel`.
  """

  check_model: ClassVar[Callable[[Any, str], T5Config]] = staticmethod(
      check_shared_encoder_model)

  @property
  def reads_target_encoder(self) -> bool:
    return True

  def encode(self, inputs: Array, target_encoded: EncodedInputs | None = None) -> T5Context:
    del inputs
    if target_encoded is None:
      raise ValueError(f"{type(self).__name__} needs target_encoded (the target's "
                       "T5Model.encode of the same inputs); speculative_sample passes it.")
    prepared = self.model.prepare(self.params)
    return T5Context(prepared.decoder, self.model.encode(prepared, target_encoded))
