"""T5 in Flax with T5X parameter names and chunked cached decoding."""

from specdec_jax.models.config import NAMED_CONFIGS, T5Config, get_config
from specdec_jax.models.t5 import (
    DecoderCache,
    DecodeWeights,
    EncodedInputs,
    PreparedParams,
    T5Model,
    Transformer,
)

__all__ = ["NAMED_CONFIGS", "DecoderCache", "DecodeWeights", "EncodedInputs", "PreparedParams",
           "T5Config", "T5Model", "Transformer", "get_config"]
