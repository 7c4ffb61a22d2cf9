"""The gin-configurable architecture of the trained family (no flags, no TensorFlow)."""

from __future__ import annotations

import gin

from specdec_jax.models.t5 import T5Config

D_FF_PER_D_MODEL = 3  # The drafts' feed-forward width per model width (d128: d_ff 384).


@gin.configurable
def model_config(*, d_model: int, num_layers: int, d_ff: int | None = None,
                 num_heads: int | None = None, d_kv: int = 64,
                 num_decoder_layers: int | None = None, dropout_rate: float = 0.1,
                 vocab_size: int = 8192) -> T5Config:
  """A T5.1.1-style config (gated-GELU, untied logits, fp32) for the project vocabulary.

  `d_ff` defaults to `D_FF_PER_D_MODEL * d_model` and `num_heads` to `d_model // d_kv`,
  so a family of widths is one `--gin.model_config.d_model=...` apart.

  Raises:
    ValueError: `num_heads` is left to its default and `d_kv` does not divide `d_model`.
  """
  if num_heads is None:
    if d_model % d_kv:
      raise ValueError(f"model_config.num_heads defaults to d_model / d_kv, but d_kv={d_kv} "
                       f"does not divide d_model={d_model}: set model_config.num_heads.")
    num_heads = d_model // d_kv
  return T5Config(vocab_size=vocab_size, d_model=d_model, d_kv=d_kv,
                  d_ff=d_ff or D_FF_PER_D_MODEL * d_model, num_layers=num_layers,
                  num_decoder_layers=num_decoder_layers, num_heads=num_heads,
                  dropout_rate=dropout_rate, feed_forward_proj="gated-gelu",
                  tie_word_embeddings=False)
