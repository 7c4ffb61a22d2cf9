"""The Llama-architecture family: the model, its GGUF loader, its scorer and its drafts.

  model.py        `LlamaConfig`, the Flax modules, `LlamaModel` (prepare, cache, decode_chunk)
  gguf_loader.py  a GGUF file (llama.cpp's format) -> config, parameters, vocabulary
  scorer.py       `LlamaScorer`: the model behind `decoding.scorer.Scorer`, its prompt as context
  drafts.py       `LayerSkipDraft`: the target's first layers as the draft
  student.py      `Student`: a small trained draft that reads the target's embedding
  feature_draft.py  `FeatureDraft`: a trained draft that also reads the target's features
  feature_branches.py  `FeatureBranches`: a `FeatureDraft` expanding the tree loop's tree
  student_io.py   a trained draft on disk, tied to its target's file (`load_draft`)
"""

from specdec_jax.models.llama.drafts import LayerSkipDraft
from specdec_jax.models.llama.model import TEST_CONFIG, LlamaConfig, LlamaModel, LlamaWeights
from specdec_jax.models.llama.scorer import (
    LlamaContext,
    LlamaScorer,
    LlamaScorerState,
    pad_prompts,
    prompt_lengths,
)

__all__ = ["TEST_CONFIG", "LayerSkipDraft", "LlamaConfig", "LlamaContext", "LlamaModel",
           "LlamaScorer", "LlamaScorerState", "LlamaWeights", "pad_prompts", "prompt_lengths"]
