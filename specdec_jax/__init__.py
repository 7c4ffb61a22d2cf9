"""specdec_jax: speculative decoding for T5 in JAX/Flax, in the style of T5X."""

__version__ = "0.1.0"
