"""T5 drafts: a smaller T5 with its own encoder, or a T5 decoder over the target's encoder.

Both are a T5 scorer plus the proposal rule of `decoding.drafts.ScorerDraft`:

  * `T5Draft`: a smaller T5, with its own encoder pass and KV cache.
  * `SharedEncoderDraft`: a T5 decoder that cross-attends to the *target's*
    encoder outputs (`shared_encoder`); no encoder pass of its own.

`make_draft` builds either with its weights prepared once.
"""

from __future__ import annotations

from typing import ClassVar

import jax
from flax import struct

from specdec_jax.decoding.drafts import ScorerDraft
from specdec_jax.models.t5.model import T5Model
from specdec_jax.models.t5.scorer import SharedEncoderScorer, T5Scorer
from specdec_jax.models.t5.shared_encoder import SharedEncoderModel

Array = jax.Array


@struct.dataclass
class T5Draft(ScorerDraft):
  """A smaller T5 model as the draft (the paper's setting): a `T5Scorer` proposing.

  Its state is the scorer's `T5ScorerState`; after `commit`, a row's cached
  length is m or m - 1 (the latter when every proposal was accepted: the last
  one was never fed). A T5X tree is prepared inside the loop's program, on
  every generation and into float32 panels; `make_draft` prepares it once.

  Attributes:
    model: the draft model (static).
    params: its parameters.
    scorer_kind: the `T5Scorer` class its scorer is (a class attribute).

  Raises:
    ValueError: from the constructor, if `model` is not a `T5Model` or its
      config's special token ids lie outside its vocabulary.
  """

  model: T5Model | SharedEncoderModel = struct.field(pytree_node=False)
  params: dict
  scorer_kind: ClassVar[type[T5Scorer]] = T5Scorer

  def __post_init__(self):
    # Static fields only: pytree unflattening calls this with any leaves.
    self.scorer_kind.check_model(self.model, f"{type(self).__name__}'s model")

  @property
  def scorer(self) -> T5Scorer:
    return self.scorer_kind(self.model, self.params)


@struct.dataclass
class SharedEncoderDraft(T5Draft):
  """A T5 decoder that reads the target's encoder outputs (`shared_encoder`).

  Proposals and rewinds are `T5Draft`'s; only the scorer differs
  (`SharedEncoderScorer`): the cross-attention keys/values come from the
  target's encoder outputs, so the draft's `inputs` are not read (the target's
  tokens are what it sees). `model` is a `SharedEncoderModel`.

  Raises:
    ValueError: from the constructor, if `model` is not a `SharedEncoderModel`.
  """

  scorer_kind: ClassVar[type[T5Scorer]] = SharedEncoderScorer


def make_draft(model: T5Model | SharedEncoderModel, params: dict,
               head_tokens: Array | None = None) -> T5Draft:
  """The draft of a model, its weights prepared once, here (`model.prepare`).

  A `SharedEncoderDraft` for a `SharedEncoderModel`, else a `T5Draft`. Prepared
  outside the loop, the weights are packed once instead of on every generation,
  into float16 panels where that is exact (half the bytes a proposal streams).
  With `head_tokens` (int32 `[head]`), the draft proposes only those tokens: its
  output layer scores them alone (`cached_decoder.prepare`), and speculative
  sampling stays exact, since the target's residual covers every other token.
  """
  kind = SharedEncoderDraft if isinstance(model, SharedEncoderModel) else T5Draft
  return kind(model, model.prepare(params, head_tokens))
