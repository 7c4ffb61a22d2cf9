"""Drafts for a Llama-architecture target: the target's own first layers.

`LayerSkipDraft` is the target's first L layers with its final norm and head
(Elhoushi et al. 2024's early exit, without training): the same prepared
arrays, a cache of L layers of its own, prefilled from the same prompt.
"""

from __future__ import annotations

from flax import struct

from specdec_jax import validation
from specdec_jax.decoding.drafts import ScorerDraft
from specdec_jax.models.llama.model import LlamaModel, LlamaWeights
from specdec_jax.models.llama.scorer import LlamaScorer


@struct.dataclass
class LayerSkipDraft(ScorerDraft):
  """The target's first `num_layers` layers, its final norm and head as the draft.

  No training and no weights of its own: `weights` are the target's prepared
  ones (`LlamaWeights.first_layers` takes the first L, sharing the arrays).
  Its state is a `LlamaScorerState` whose cache holds L layers; it reads the
  same prompts as the target (`draft_inputs` = the target's `inputs`).

  Attributes:
    model: the target's `LlamaModel` (static).
    weights: the target's prepared weights.
    num_layers: L, the layers the draft runs (static), 1 <= L <= the model's.

  Raises:
    ValueError: from the constructor, for a model that is not a `LlamaModel`
      or L outside [1, num_layers].
  """

  model: LlamaModel = struct.field(pytree_node=False)
  weights: LlamaWeights
  num_layers: int = struct.field(pytree_node=False)

  def __post_init__(self):
    if not isinstance(self.model, LlamaModel):
      raise ValueError(f"{type(self).__name__}'s model must be a "
                       f"specdec_jax.models.llama.LlamaModel, got {type(self.model).__name__}.")
    total = self.model.config.num_layers
    layers = validation.as_int("num_layers", self.num_layers, minimum=1,
                               what="the target's layers the draft runs")
    if layers > total:
      raise ValueError(f"num_layers={layers} exceeds the model's {total} layers.")
    object.__setattr__(self, "num_layers", layers)

  @property
  def scorer(self) -> LlamaScorer:
    return LlamaScorer(self.model, self.model.prepare(self.weights).first_layers(self.num_layers))
