"""The gin-configurable architecture of the trained family (no flags, no TensorFlow)."""

from __future__ import annotations

import gin

from specdec_jax.models import T5Config


@gin.configurable
def model_config(*, d_model: int, d_ff: int, num_layers: int, num_heads: int, d_kv: int = 64,
                 num_decoder_layers: int | None = None, dropout_rate: float = 0.1,
                 vocab_size: int = 8192) -> T5Config:
  """A T5.1.1-style config (gated-GELU, untied logits, fp32) for the project vocabulary."""
  return T5Config(vocab_size=vocab_size, d_model=d_model, d_kv=d_kv, d_ff=d_ff,
                  num_layers=num_layers, num_decoder_layers=num_decoder_layers,
                  num_heads=num_heads, dropout_rate=dropout_rate,
                  feed_forward_proj="gated-gelu", tie_word_embeddings=False)
