"""The T5 family: T5 in Flax with T5X parameter names, its cached decoder, scorers and drafts.

  config.py          `T5Config`, the named configs of the public checkpoints
  layers.py          T5's own blocks (gated GELU, MLP, attention, relative position bias)
  model.py           the Flax modules and `T5Model`, the functional API (encode, prepare,
                     init_cache, decode_chunk, teacher-forced logits)
  cached_decoder.py  the decoder for generation: weights prepared once, a chunk per call
  shared_encoder.py  `SharedEncoderModel`: a T5 decoder over another model's encoder outputs
  scorer.py          `T5Scorer`, `SharedEncoderScorer`: the models behind `decoding.scorer.Scorer`
  drafts.py          `T5Draft`, `SharedEncoderDraft`, `make_draft`
  generate.py        `temperature_sample`, `speculative_sample`: checked entry points over the
                     model-free loops of `specdec_jax.decoding`
  checkpoints.py     HuggingFace T5 directories (config.json + safetensors) and our
                     shared-encoder drafts <-> the parameter tree (imported on its own)
"""

from specdec_jax.models.kernels import DecoderCache
from specdec_jax.models.t5.cached_decoder import DecodeWeights, EncodedInputs, PreparedParams
from specdec_jax.models.t5.config import NAMED_CONFIGS, T5Config, get_config
from specdec_jax.models.t5.drafts import SharedEncoderDraft, T5Draft, make_draft
from specdec_jax.models.t5.generate import speculative_sample, temperature_sample
from specdec_jax.models.t5.model import T5Model, Transformer
from specdec_jax.models.t5.scorer import (
    SharedEncoderScorer,
    T5Context,
    T5Scorer,
    T5ScorerState,
    check_shared_encoder_model,
    check_t5_model,
)
from specdec_jax.models.t5.shared_encoder import SharedEncoderModel

__all__ = ["NAMED_CONFIGS", "DecodeWeights", "DecoderCache", "EncodedInputs", "PreparedParams",
           "SharedEncoderDraft", "SharedEncoderModel", "SharedEncoderScorer", "T5Config",
           "T5Context", "T5Draft", "T5Model", "T5Scorer", "T5ScorerState", "Transformer",
           "check_shared_encoder_model", "check_t5_model", "get_config", "make_draft",
           "speculative_sample", "temperature_sample"]
