"""specdec_jax: speculative decoding in JAX/Flax, in the style of T5X, for any target and draft.

Two model families run through the same model-free loops (`decoding`): T5 encoder-decoders
(`models.t5`) and Llama-architecture decoder-only models read from GGUF (`models.llama`). The
checked entry points are `decoding.generate.speculative_sample` and, for gamma = 'auto',
`timing.choose_gamma`.
"""

__version__ = "0.1.0"
