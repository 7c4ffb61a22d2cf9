"""Decoding: the sampling distribution, the rejection rule, the decoders."""
