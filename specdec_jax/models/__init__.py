"""The models: one package per family, over the pieces every family shares.

  config.py, layers.py   what every family's config and Flax modules share
  kernels.py             the KV cache with per-row lengths and rewind, its writes, the
                         weight products of cached decoding
  panel_dot.py / .cc     the weight product as an XLA:CPU custom call
  t5/                    T5 (encoder-decoder) and its shared-encoder draft
  llama/                 Llama-architecture decoder-only models, read from GGUF

A family package holds its model, loader, `Scorer` and drafts; the decoding
loops (`specdec_jax.decoding`) import none of them.
"""
